/* The dual-path KV arena and the generic (scalar) kernels that read it. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "kv_arena.h"
#include "dp_attn_ops.h"
#include "dp_pool.h"

#define ARENA_ALIGN (2u << 20) /* 2 MiB: lets the kernel back the arena with huge pages */
#define DP_MAX_HEAD_DIM 512

static inline int64_t tile_bytes(const dp_arena *a, int64_t P) {
    return 2 * a->num_kv_heads * P * a->head_dim * a->elem_bytes;
}

int dp_arena_init(dp_arena *a, int64_t block_size, int64_t num_blocks, int64_t num_layers,
                  int64_t num_kv_heads, int64_t head_dim, int kv_dtype, int numa_node) {
    if (!a) return DP_ERR_ARG;
    memset(a, 0, sizeof *a);
    if (block_size < 64 || (block_size & (block_size - 1)) || num_blocks <= 0 || num_layers <= 0 ||
        num_kv_heads <= 0 || head_dim <= 0 || head_dim > DP_MAX_HEAD_DIM)
        return DP_ERR_ARG;
    if (kv_dtype != DP_F32 && kv_dtype != DP_F16) return DP_ERR_ARG;
    a->elem_bytes = kv_dtype == DP_F32 ? 4 : 2;
    if (tile_bytes(a, 1) > block_size) return DP_ERR_ARG; /* one token must fit in a block */
    a->block_size = block_size;
    a->num_blocks = num_blocks;
    a->num_layers = num_layers;
    a->num_kv_heads = num_kv_heads;
    a->head_dim = head_dim;
    a->kv_dtype = kv_dtype;
    a->layer_bytes = block_size * num_blocks;
    if (a->layer_bytes / num_blocks != block_size || (INT64_MAX / num_layers) < a->layer_bytes)
        return DP_ERR_ARG;
    size_t total = (size_t)(a->layer_bytes * num_layers);
    void *p = NULL;
    if (posix_memalign(&p, ARENA_ALIGN, total) != 0) return DP_ERR_NOMEM;
#ifdef MADV_HUGEPAGE
    a->hugepages = madvise(p, total, MADV_HUGEPAGE) == 0;
#endif
    a->base = (char *)p;
    a->numa_node = -1;
#ifdef SYS_mbind
    if (numa_node >= 0 && numa_node < 64) {
        /* Bind before first touch so every page lands on the node (MPOL_BIND = 2). */
        unsigned long mask = 1ul << numa_node;
        if (syscall(SYS_mbind, p, total, 2, &mask, 65ul, 0u) == 0) a->numa_node = numa_node;
    }
#endif
    /* Not zeroed: memory is committed as the cache first writes it, and a kernel
     * only reads rows that were written. */
    return DP_OK;
}

void dp_arena_free(dp_arena *a) {
    if (a && a->base) {
        free(a->base);
        a->base = NULL;
    }
}

/* Byte offset of V row `row` of kv head `h` inside a tile of P tokens. */
static inline int64_t v_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h) {
    return (a->num_kv_heads * P * a->head_dim + (h * P + row) * a->head_dim) * a->elem_bytes;
}

/* Byte offset of K element (token `row`, dim 0) of kv head `h`; dim e is e * P further. */
static inline int64_t k_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h) {
    return (h * a->head_dim * P + row) * a->elem_bytes;
}

static int check_slot(const dp_arena *a, const int64_t *s) {
    const int64_t off = s[0], row = s[1], P = s[2];
    if (P <= 0 || row < 0 || row >= P || off < 0) return DP_ERR_BOUNDS;
    if (off + tile_bytes(a, P) > a->layer_bytes) return DP_ERR_BOUNDS;
    if (off / a->block_size != (off + tile_bytes(a, P) - 1) / a->block_size &&
        tile_bytes(a, P) <= a->block_size)
        return DP_ERR_BOUNDS; /* a page never straddles two blocks */
    return DP_OK;
}

int dp_kv_write_slots(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *k,
                      const float *v, int64_t stride, const int64_t *slots, int64_t num_tokens) {
    if (!ops) ops = &dp_ops_generic;
    if (!a || !a->base || !k || !v || !slots || num_tokens < 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    const int64_t hd = a->head_dim;
    if (stride < a->num_kv_heads * hd) return DP_ERR_ARG;
    char *region = a->base + layer * a->layer_bytes;
    uint16_t half[DP_MAX_HEAD_DIM];
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t *s = slots + 3 * t;
        int st = check_slot(a, s);
        if (st != DP_OK) return st;
        const int64_t P = s[2];
        for (int64_t h = 0; h < a->num_kv_heads; h++) {
            const float *ks = k + t * stride + h * hd, *vs = v + t * stride + h * hd;
            char *kd = region + s[0] + k_offset(a, P, s[1], h);
            char *vd = region + s[0] + v_offset(a, P, s[1], h);
            if (a->kv_dtype == DP_F32) {
                memcpy(vd, vs, (size_t)hd * sizeof(float));
                for (int64_t e = 0; e < hd; e++) ((float *)kd)[e * P] = ks[e];
            } else {
                ops->f32_to_f16(vs, (uint16_t *)vd, hd);
                ops->f32_to_f16(ks, half, hd);
                for (int64_t e = 0; e < hd; e++) ((uint16_t *)kd)[e * P] = half[e];
            }
        }
    }
    return DP_OK;
}

static int check_spans(const dp_arena *a, const int64_t *spans, int64_t num_spans, int64_t need) {
    int64_t total = 0;
    for (int64_t i = 0; i < num_spans; i++) {
        const int64_t off = spans[3 * i], n = spans[3 * i + 1], P = spans[3 * i + 2];
        if (P <= 0 || n < 0 || off < 0) return DP_ERR_BOUNDS;
        const int64_t tiles = (n + P - 1) / P;
        if (off + tiles * tile_bytes(a, P) > a->layer_bytes) return DP_ERR_BOUNDS;
        total += n;
    }
    return total < need ? DP_ERR_BOUNDS : DP_OK;
}

static inline void prefetch_tiles(const dp_arena *a, const char *region, const int64_t *spans,
                                  int64_t num_spans, int64_t span, int degree) {
    /* Random path: the next spans are scattered pages; touch their first lines early. */
    for (int d = 1; d <= degree && span + d < num_spans; d++) {
        const char *p = region + spans[3 * (span + d)];
        __builtin_prefetch(p, 0, 1);
        __builtin_prefetch(p + tile_bytes(a, spans[3 * (span + d) + 2]) / 2, 0, 1);
    }
}

#define DP_GSLICE 16  /* query heads of one KV head handled together */
#define DP_RUN 64     /* rows scored at once */

typedef struct {
    const dp_arena *a;
    const dp_attn_ops *ops;
    const char *region;
    const float *q;
    int64_t q_stride;
    float *out;
    int64_t out_stride;
    int64_t num_heads, group, num_gslices;
    const int64_t *spans;
    int64_t num_spans;
    const int64_t *span_start; /* (num_spans + 1,) first position of each span */
    int64_t pos0, num_tokens;
    float scale;
    int prefetch_degree;
    int64_t chunk;      /* context positions per task; chunked only for decode-like calls */
    int64_t num_chunks; /* per (token, kv head, slice) */
    float *partial;     /* chunked: (tasks, DP_GSLICE, head_dim + 2) = o, m, l */
} attn_job;

/* Online softmax over positions [lo, hi) for query heads g0..g0+gn of KV head kh. */
static void attend_range(const attn_job *J, int64_t t, int64_t kh, int64_t g0, int64_t gn,
                         int64_t lo, int64_t hi, float *m, float *l, float *o) {
    const dp_arena *a = J->a;
    const int64_t hd = a->head_dim, eb = a->elem_bytes, nkv = a->num_kv_heads;
    const int f16 = a->kv_dtype == DP_F16;
    float q[DP_GSLICE * 512];
    float sc[DP_GSLICE * DP_RUN];
    for (int64_t g = 0; g < gn; g++) {
        memcpy(q + g * hd, J->q + t * J->q_stride + (kh * J->group + g0 + g) * hd, (size_t)hd * sizeof(float));
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(o, 0, (size_t)(gn * hd) * sizeof(float));
    if (lo >= hi) return;
    /* The span holding position lo (span_start is sorted). */
    int64_t s = 0, lo_s = 0, hi_s = J->num_spans - 1;
    while (lo_s <= hi_s) {
        const int64_t mid = (lo_s + hi_s) / 2;
        if (J->span_start[mid] <= lo) { s = mid; lo_s = mid + 1; } else { hi_s = mid - 1; }
    }
    int64_t pos = lo;
    for (; s < J->num_spans && pos < hi; s++) {
        const int64_t P = J->spans[3 * s + 2], tb = tile_bytes(a, P);
        const int64_t span_end = J->span_start[s] + J->spans[3 * s + 1];
        if (J->prefetch_degree > 0) prefetch_tiles(a, J->region, J->spans, J->num_spans, s, J->prefetch_degree);
        while (pos < hi && pos < span_end) {
            const int64_t i = pos - J->span_start[s];        /* index inside the span */
            const char *tile = J->region + J->spans[3 * s] + (i / P) * tb;
            const int64_t row = i % P;
            int64_t n = P - row;                              /* rows left in this tile */
            if (n > span_end - pos) n = span_end - pos;
            if (n > hi - pos) n = hi - pos;
            if (n > DP_RUN) n = DP_RUN;
            const char *kt = tile + (kh * hd * P + row) * eb;           /* K^T, ldk = P */
            const char *vrows = tile + ((nkv + kh) * P + row) * hd * eb;
            if (f16) J->ops->scores_f16(q, gn, hd, (const uint16_t *)kt, P, n, J->scale, sc, DP_RUN);
            else J->ops->scores_f32(q, gn, hd, (const float *)kt, P, n, J->scale, sc, DP_RUN);
            for (int64_t g = 0; g < gn; g++) {
                float *sg = sc + g * DP_RUN;
                const float mx = J->ops->max_of(sg, n);
                if (mx > m[g]) { /* rescale what was accumulated under the old maximum */
                    const float corr = expf(m[g] - mx);
                    l[g] *= corr;
                    for (int64_t e = 0; e < hd; e++) o[g * hd + e] *= corr;
                    m[g] = mx;
                }
                l[g] += J->ops->exp_sum(sg, n, m[g]);
            }
            if (f16) J->ops->accum_f16(sc, DP_RUN, gn, hd, (const uint16_t *)vrows, n, o);
            else J->ops->accum_f32(sc, DP_RUN, gn, hd, (const float *)vrows, n, o);
            pos += n;
        }
    }
}

static void attn_task(void *ctx, int64_t task, int worker) {
    (void)worker;
    const attn_job *J = (const attn_job *)ctx;
    const int64_t hd = J->a->head_dim, nkv = J->a->num_kv_heads;
    int64_t rest = task;
    const int64_t c = rest % J->num_chunks; rest /= J->num_chunks;
    const int64_t gs = rest % J->num_gslices; rest /= J->num_gslices;
    const int64_t kh = rest % nkv;
    const int64_t t = rest / nkv;
    const int64_t g0 = gs * DP_GSLICE;
    const int64_t gn = J->group - g0 < DP_GSLICE ? J->group - g0 : DP_GSLICE;
    const int64_t n_ctx = J->pos0 + t + 1; /* causal: positions [0, pos0 + t] */
    float m[DP_GSLICE], l[DP_GSLICE];
    if (J->num_chunks == 1) {
        float o[DP_GSLICE * 512];
        attend_range(J, t, kh, g0, gn, 0, n_ctx, m, l, o);
        for (int64_t g = 0; g < gn; g++) {
            float *dst = J->out + t * J->out_stride + (kh * J->group + g0 + g) * hd;
            const float inv = 1.0f / l[g];
            for (int64_t e = 0; e < hd; e++) dst[e] = o[g * hd + e] * inv;
        }
        return;
    }
    float *part = J->partial + task * DP_GSLICE * (hd + 2);
    const int64_t lo = c * J->chunk, hi = (c + 1) * J->chunk < n_ctx ? (c + 1) * J->chunk : n_ctx;
    float o[DP_GSLICE * 512];
    attend_range(J, t, kh, g0, gn, lo, hi, m, l, o);
    for (int64_t g = 0; g < gn; g++) {
        memcpy(part + g * (hd + 2), o + g * hd, (size_t)hd * sizeof(float));
        part[g * (hd + 2) + hd] = m[g];
        part[g * (hd + 2) + hd + 1] = l[g];
    }
}

/* Flash-decoding merge: combine the chunks' (o, m, l) of every (token, head). */
static void merge_chunks(const attn_job *J) {
    const int64_t hd = J->a->head_dim, nkv = J->a->num_kv_heads;
    for (int64_t t = 0; t < J->num_tokens; t++)
        for (int64_t kh = 0; kh < nkv; kh++)
            for (int64_t gs = 0; gs < J->num_gslices; gs++) {
                const int64_t g0 = gs * DP_GSLICE;
                const int64_t gn = J->group - g0 < DP_GSLICE ? J->group - g0 : DP_GSLICE;
                const int64_t base = ((t * nkv + kh) * J->num_gslices + gs) * J->num_chunks;
                for (int64_t g = 0; g < gn; g++) {
                    float M = -INFINITY, L = 0.0f;
                    for (int64_t c = 0; c < J->num_chunks; c++) {
                        const float mc = J->partial[(base + c) * DP_GSLICE * (hd + 2) + g * (hd + 2) + hd];
                        M = mc > M ? mc : M;
                    }
                    float *dst = J->out + t * J->out_stride + (kh * J->group + g0 + g) * hd;
                    for (int64_t e = 0; e < hd; e++) dst[e] = 0.0f;
                    for (int64_t c = 0; c < J->num_chunks; c++) {
                        const float *pc = J->partial + (base + c) * DP_GSLICE * (hd + 2) + g * (hd + 2);
                        if (pc[hd + 1] == 0.0f) continue; /* empty chunk (past this token) */
                        const float w = expf(pc[hd] - M);
                        L += pc[hd + 1] * w;
                        for (int64_t e = 0; e < hd; e++) dst[e] += pc[e] * w;
                    }
                    const float inv = 1.0f / L;
                    for (int64_t e = 0; e < hd; e++) dst[e] *= inv;
                }
            }
}

int dp_attn_spans(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                  const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                  const int64_t *spans, int64_t num_spans, int64_t pos0, int64_t num_tokens, float scale,
                  int prefetch_degree) {
    if (!a || !a->base || !ops || !q || !out || !spans || num_heads <= 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    const int64_t hd = a->head_dim, nkv = a->num_kv_heads;
    if (num_heads % nkv || q_stride < num_heads * hd || out_stride < num_heads * hd) return DP_ERR_ARG;
    if (pos0 < 0 || num_tokens < 0) return DP_ERR_BOUNDS;
    if (num_tokens == 0) return DP_OK;
    int st = check_spans(a, spans, num_spans, pos0 + num_tokens);
    if (st != DP_OK) return st;
    attn_job J;
    memset(&J, 0, sizeof J);
    J.a = a; J.ops = ops; J.region = a->base + layer * a->layer_bytes;
    J.q = q; J.q_stride = q_stride; J.out = out; J.out_stride = out_stride;
    J.num_heads = num_heads; J.group = num_heads / nkv;
    J.num_gslices = (J.group + DP_GSLICE - 1) / DP_GSLICE;
    J.spans = spans; J.num_spans = num_spans; J.pos0 = pos0; J.num_tokens = num_tokens;
    J.scale = scale; J.prefetch_degree = prefetch_degree;
    int64_t *starts = (int64_t *)malloc((size_t)(num_spans + 1) * sizeof(int64_t));
    if (!starts) return DP_ERR_NOMEM;
    starts[0] = 0;
    for (int64_t i = 0; i < num_spans; i++) starts[i + 1] = starts[i] + spans[3 * i + 1];
    J.span_start = starts;
    /* Enough independent (token, kv head, slice) rows to feed the pool? Else split
     * the context too (flash-decoding) and merge the chunks afterwards. */
    const int threads = pool ? dp_pool_num_threads(pool) : 1;
    const int64_t rows = num_tokens * nkv * J.num_gslices;
    const int64_t n_ctx = pos0 + num_tokens;
    J.num_chunks = 1;
    J.chunk = n_ctx;
    if (rows < 4 * threads && n_ctx >= 1024) {
        int64_t chunks = (4 * threads + rows - 1) / rows;
        if (chunks > n_ctx / 512) chunks = n_ctx / 512;
        if (chunks > 1) {
            J.num_chunks = chunks;
            J.chunk = (n_ctx + chunks - 1) / chunks;
        }
    }
    const int64_t tasks = rows * J.num_chunks;
    if (J.num_chunks > 1) {
        J.partial = (float *)malloc((size_t)tasks * DP_GSLICE * (hd + 2) * sizeof(float));
        if (!J.partial) { free(starts); return DP_ERR_NOMEM; }
    }
    dp_pool_run(pool, tasks, attn_task, &J);
    if (J.num_chunks > 1) merge_chunks(&J);
    free(J.partial);
    free(starts);
    return DP_OK;
}

int dp_kv_copy_slots(const dp_arena *a, const int64_t *src, const int64_t *dst, int64_t num_tokens) {
    if (!a || !a->base || !src || !dst || num_tokens < 0) return DP_ERR_ARG;
    const size_t row = (size_t)(a->head_dim * a->elem_bytes), eb = (size_t)a->elem_bytes;
    for (int64_t t = 0; t < num_tokens; t++) {
        int st = check_slot(a, src + 3 * t);
        if (st == DP_OK) st = check_slot(a, dst + 3 * t);
        if (st != DP_OK) return st;
    }
    for (int64_t l = 0; l < a->num_layers; l++) {
        char *region = a->base + l * a->layer_bytes;
        for (int64_t t = 0; t < num_tokens; t++) {
            const int64_t *s = src + 3 * t, *d = dst + 3 * t;
            for (int64_t h = 0; h < a->num_kv_heads; h++) {
                memmove(region + d[0] + v_offset(a, d[2], d[1], h), region + s[0] + v_offset(a, s[2], s[1], h), row);
                for (int64_t e = 0; e < a->head_dim; e++)
                    memmove(region + d[0] + k_offset(a, d[2], d[1], h) + e * d[2] * (int64_t)eb,
                            region + s[0] + k_offset(a, s[2], s[1], h) + e * s[2] * (int64_t)eb, eb);
            }
        }
    }
    return DP_OK;
}

int dp_kv_gather(const dp_arena *a, int64_t layer, const int64_t *spans, int64_t num_spans,
                 int64_t num_tokens, float *k_out, float *v_out) {
    if (!a || !a->base || !spans || !k_out || !v_out || num_tokens < 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    int st = check_spans(a, spans, num_spans, num_tokens);
    if (st != DP_OK) return st;
    const char *region = a->base + layer * a->layer_bytes;
    const int64_t hd = a->head_dim;
    int64_t j = 0;
    for (int64_t s = 0; s < num_spans && j < num_tokens; s++) {
        const int64_t P = spans[3 * s + 2], tb = tile_bytes(a, P);
        for (int64_t i = 0; i < spans[3 * s + 1] && j < num_tokens; i++, j++) {
            const char *tile = region + spans[3 * s] + (i / P) * tb;
            for (int64_t h = 0; h < a->num_kv_heads; h++) {
                const char *vs = tile + v_offset(a, P, i % P, h), *ks = tile + k_offset(a, P, i % P, h);
                float *vd = v_out + (h * num_tokens + j) * hd, *kd = k_out + (h * num_tokens + j) * hd;
                for (int64_t e = 0; e < hd; e++) {
                    if (a->kv_dtype == DP_F32) {
                        vd[e] = ((const float *)vs)[e];
                        kd[e] = ((const float *)ks)[e * P];
                    } else {
                        vd[e] = dp_half_to_float(((const uint16_t *)vs)[e]);
                        kd[e] = dp_half_to_float(((const uint16_t *)ks)[e * P]);
                    }
                }
            }
        }
    }
    return DP_OK;
}
