# Declarations of DualPath's C kernels (csrc/dp_kernels.h).
from libc.stdint cimport int64_t, uint8_t

cdef extern from "csrc/dp_kernels.h" nogil:
    enum:
        DP_OK
        DP_ERR_ARG
        DP_ERR_BOUNDS
        DP_ERR_NOMEM
        DP_ERR_THREAD
        DP_ERR_ALIGN
        DP_ERR_IO
        DP_F32
        DP_F16
        DP_Q8_0
        DP_Q4_0
        DP_MAX_HEAD_DIM
        DP_KV_NUM_DTYPES

    void dp_test_fail_alloc_after(int64_t n)

    int dp_embed_generic(const void *table, const float *scales, int dtype, int64_t vocab,
                         int64_t dim, const int64_t *ids, int64_t num_tokens, float *out)
    int dp_read_rows(int fd, int64_t offset, int64_t row_bytes, int64_t num_rows,
                     const int64_t *ids, int64_t n, uint8_t *out)

cdef extern from "csrc/ggml_repack.h" nogil:
    ctypedef struct dp_ggml_layout:
        const char *name
        int64_t block
        int64_t type_size
        int bits
        int64_t sub
        int zero_points
    const dp_ggml_layout dp_ggml_layouts[]
    const int dp_num_ggml_layouts
    int dp_repack_ggml(const uint8_t *src, int64_t src_bytes, int type, int64_t rows, int64_t cols,
                       uint8_t *blob, int64_t blob_bytes, float *scales, int64_t num_scales,
                       uint8_t *zero_points, int64_t zero_point_bytes, float *mins, int64_t num_mins)

cdef extern from "csrc/dp_attn_ops.h" nogil:
    ctypedef struct dp_attn_ops:
        int64_t (*fma_probe)(int64_t iters, float *sink) noexcept nogil
    ctypedef struct dp_isa:
        const char *name
        unsigned feature
    const dp_isa dp_isas[]
    const int dp_num_isas
    unsigned dp_cpu_features()
    int dp_parse_features(const char *list, unsigned *mask, const char **bad, size_t *bad_len)
    const dp_attn_ops *dp_select_ops(unsigned disabled)
    const dp_attn_ops *dp_ops_by_name(const char *name)
    const char *dp_ops_name(const dp_attn_ops *ops)

cdef extern from "csrc/dp_pool.h" nogil:
    ctypedef struct dp_pool:
        pass
    enum:
        DP_POOL_MAX_THREADS
        DP_POOL_MAX_CPUS
        DP_POOL_MAX_YIELDERS
    int dp_pool_create(int num_threads, dp_pool **out)
    void dp_pool_destroy(dp_pool *pool)
    int dp_pool_num_threads(const dp_pool *pool)
    int dp_pool_set_active(dp_pool *pool, int n)
    int dp_pool_active(const dp_pool *pool)
    int dp_pool_set_affinity(dp_pool *pool, const int *cpus, int num_cpus)
    int dp_pool_worker_tids(const dp_pool *pool, int64_t *tids, int max)
    int dp_pool_set_yielders(dp_pool *pool, const int64_t *tids, int n)
    int dp_pool_warm(dp_pool *pool, const void *p, int64_t bytes)
    int dp_can_unidle()
    unsigned long long dp_read_buffer(dp_pool *pool, const void *buf, int64_t nbytes)
    int dp_run_fma_probe(dp_pool *pool, int64_t (*probe)(int64_t iters, float *sink), int64_t iters,
                         int64_t *flops)
    void dp_test_fail_thread_create_after(int64_t n)

cdef extern from "csrc/lmatmul.h" nogil:
    ctypedef struct dp_lkind_info:
        const char *name
        int64_t sb
        int64_t ggml_bytes
        int64_t header
        int64_t unit
    enum:
        DP_L_NUM_KINDS
    const dp_lkind_info dp_lkinds[]
    int64_t dp_lform_bytes(int kind, int64_t N, int64_t K)
    int dp_lform_from_ggml(int kind, const uint8_t *src, int64_t src_bytes, int64_t N, int64_t K, uint8_t *dst,
                           int64_t dst_bytes)
    int dp_lform_rows(int kind, const uint8_t *w, int64_t w_len, int64_t N, int64_t K, const int64_t *ids,
                      int64_t n, float *out, int64_t out_len)
    ctypedef struct dp_ljob:
        int kind
        const uint8_t *w
        int64_t w_len, N
        float *out
        int64_t out_len, ldo

cdef extern from "csrc/dp_attn_ops.h" nogil:
    int dp_lmatmul(dp_pool *pool, const dp_attn_ops *ops, const dp_ljob *jobs, int njobs, const float *x,
                   int64_t R, int64_t K, int int8_act)
    int dp_lmatmul_sb256(const dp_attn_ops *ops, const dp_ljob *jobs, int njobs, int64_t R, int64_t K)
    int dp_qmatmul(dp_pool *pool, const dp_attn_ops *ops, const uint8_t *w, int64_t w_len, const float *scales,
                   int64_t scales_len, int64_t bs, int64_t N, int64_t K, const float *x, int64_t R, float *out,
                   int64_t out_len, int64_t ldo, int int8_act)

cdef extern from "csrc/enc_attn.h" nogil:
    int dp_enc_attention(dp_pool *pool, const dp_attn_ops *ops, const float *q, const float *k, const float *v,
                         int64_t ld, int64_t rows, const int64_t *starts, int64_t B, int64_t nh, int64_t hd,
                         float scale, float *out, int64_t ldo)

cdef extern from "csrc/kv_arena.h" nogil:
    ctypedef struct dp_kv_type:
        const char *name
        const char *doc
        int64_t elem_bytes
        int64_t scale_bytes
        int64_t head_dim_multiple
    const dp_kv_type dp_kv_types[]
    ctypedef struct dp_arena:
        char *base
        int64_t block_size
        int64_t num_blocks
        int64_t num_layers
        int64_t num_kv_heads
        int64_t head_dim
        int kv_dtype
        int64_t elem_bytes
        int64_t scale_bytes
        int64_t layer_bytes
        int hugepages
        int numa_node

    int dp_arena_init(dp_arena *a, int64_t block_size, int64_t num_blocks, int64_t num_layers,
                      int64_t num_kv_heads, int64_t head_dim, int kv_dtype, int numa_node)
    void dp_arena_free(dp_arena *a)
    int64_t dp_kv_tile_bytes(int kv_dtype, int64_t num_kv_heads, int64_t head_dim, int64_t P)
    int dp_kv_check_slots(const dp_arena *a, const int64_t *slots, int64_t num_tokens, int64_t *bad)
    int dp_kv_write_slots(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *k,
                          const float *v, int64_t stride, const int64_t *slots, int64_t num_tokens)
    int dp_kv_copy_slots(const dp_arena *a, const int64_t *src, const int64_t *dst, int64_t num_tokens)
    int dp_kv_tiles_io(const dp_arena *a, const int64_t *offsets, int64_t num_tiles, int64_t P, void *buf,
                       int to_arena)
    int dp_kv_release_tiles(const dp_arena *a, const uint8_t *layers, const int64_t *offsets, int64_t num_tiles,
                            int64_t P)
    int dp_kv_small_pages(const dp_arena *a, const uint8_t *layers)
    int dp_kv_gather(const dp_arena *a, int64_t layer, const int64_t *spans, int64_t num_spans,
                     int64_t num_tokens, float *k_out, float *v_out)

cdef extern from "csrc/kv_attn.h" nogil:
    ctypedef struct dp_attn_workspace:
        void *buf
        size_t bytes
    void dp_attn_workspace_free(dp_attn_workspace *ws)
    ctypedef struct dp_attn_params:
        float scale
        float softcap
        int64_t window
        int prefetch_degree
        int decode_on_caller
    int dp_attn_spans(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                      const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                      const int64_t *spans, int64_t num_spans, int64_t pos0, int64_t num_tokens,
                      dp_attn_params params)
    int dp_attn_batch(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                      const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                      int64_t num_rows, const int64_t *seqs, int64_t num_seqs, const int64_t *spans,
                      int64_t spans_len, dp_attn_params params, dp_attn_workspace *ws)
    int dp_step_batch(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer, const float *k,
                      const float *v, int64_t kv_stride, const int64_t *slots, const float *q, int64_t q_stride,
                      float *out, int64_t out_stride, int64_t num_heads, int64_t num_rows, const int64_t *seqs,
                      int64_t num_seqs, const int64_t *spans, int64_t spans_len, dp_attn_params params,
                      dp_attn_workspace *ws)
