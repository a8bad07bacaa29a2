# Declarations of DualPath's C kernels (csrc/dp_kernels.h).
from libc.stdint cimport int64_t

cdef extern from "csrc/dp_kernels.h" nogil:
    enum:
        DP_OK
        DP_ERR_ARG
        DP_ERR_BOUNDS
        DP_ERR_NOMEM
        DP_F32
        DP_F16
        DP_Q8_0
        DP_Q4_0

    int dp_kv_write_generic(const float *src, int64_t src_stride, void *cache, int kv_dtype,
                            int64_t num_kv_heads, int64_t capacity, int64_t head_dim,
                            int64_t pos, int64_t num_tokens)
    int dp_attn_f32out_generic(const float *q, int64_t q_stride, const void *k, const void *v,
                               int kv_dtype, float *out, int64_t out_stride,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               int64_t capacity, int64_t pos0, int64_t num_tokens, float scale)
    int dp_embed_generic(const void *table, const float *scales, int dtype, int64_t vocab,
                         int64_t dim, const int64_t *ids, int64_t num_tokens, float *out)
