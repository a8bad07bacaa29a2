/* The dual-path KV arena and the generic (scalar) kernels that read it. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "kv_arena.h"

#define ARENA_ALIGN (2u << 20) /* 2 MiB: lets the kernel back the arena with huge pages */
#define DP_MAX_HEAD_DIM 512

static float half_table[65536];
static volatile int half_table_ready = 0;

static void init_half_table(void) {
    if (half_table_ready) return;
    for (uint32_t i = 0; i < 65536; i++) half_table[i] = dp_half_to_float((uint16_t)i);
    half_table_ready = 1; /* idempotent: a race only writes the same values twice */
}

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
    if (kv_dtype == DP_F16) init_half_table();
    return DP_OK;
}

void dp_arena_free(dp_arena *a) {
    if (a && a->base) {
        free(a->base);
        a->base = NULL;
    }
}

/* Byte offset of token `row` of kv head `h` (K, or V when is_v) inside a tile of P tokens. */
static inline int64_t row_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h, int is_v) {
    return ((is_v ? a->num_kv_heads * P : 0) + h * P + row) * a->head_dim * a->elem_bytes;
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

int dp_kv_write_slots(const dp_arena *a, int64_t layer, const float *k, const float *v,
                      int64_t stride, const int64_t *slots, int64_t num_tokens) {
    if (!a || !a->base || !k || !v || !slots || num_tokens < 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    const int64_t hd = a->head_dim;
    if (stride < a->num_kv_heads * hd) return DP_ERR_ARG;
    char *region = a->base + layer * a->layer_bytes;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t *s = slots + 3 * t;
        int st = check_slot(a, s);
        if (st != DP_OK) return st;
        for (int is_v = 0; is_v < 2; is_v++) {
            const float *src_row = (is_v ? v : k) + t * stride;
            for (int64_t h = 0; h < a->num_kv_heads; h++) {
                char *dst = region + s[0] + row_offset(a, s[2], s[1], h, is_v);
                const float *src = src_row + h * hd;
                if (a->kv_dtype == DP_F32) {
                    memcpy(dst, src, (size_t)hd * sizeof(float));
                } else {
                    uint16_t *d = (uint16_t *)dst;
                    for (int64_t i = 0; i < hd; i++) d[i] = dp_float_to_half(src[i]);
                }
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

/* Row pointer of K or V for token j of a tile; f16 rows are widened into buf. */
static inline const float *load_row(const dp_arena *a, const char *tile, int64_t P, int64_t row,
                                    int64_t h, int is_v, float *buf) {
    const char *p = tile + row_offset(a, P, row, h, is_v);
    if (a->kv_dtype == DP_F32) return (const float *)p;
    const uint16_t *hp = (const uint16_t *)p;
    for (int64_t i = 0; i < a->head_dim; i++) buf[i] = half_table[hp[i]];
    return buf;
}

static inline float dot(const float *x, const float *y, int64_t n) {
    /* Eight independent partial sums: instruction-level parallelism without -ffast-math. */
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += x[i + j] * y[i + j];
    float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) acc += x[i] * y[i];
    return acc;
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

/* Dot products of q with `n` consecutive K rows starting at `rows`, into scores. */
static inline void score_rows(const dp_arena *a, const float *q, const char *rows, int64_t n,
                              float scale, float *scores, float *m) {
    const int64_t hd = a->head_dim;
    float buf[DP_MAX_HEAD_DIM];
    for (int64_t r = 0; r < n; r++) {
        const float *k;
        if (a->kv_dtype == DP_F32) {
            k = (const float *)rows + r * hd;
        } else {
            const uint16_t *h = (const uint16_t *)rows + r * hd;
            for (int64_t e = 0; e < hd; e++) buf[e] = half_table[h[e]];
            k = buf;
        }
        const float x = dot(q, k, hd) * scale;
        scores[r] = x;
        if (x > *m) *m = x;
    }
}

/* o += sum_r p[r] * V[r] over `n` consecutive V rows starting at `rows`. */
static inline void accumulate_rows(const dp_arena *a, const float *p, const char *rows, int64_t n, float *o) {
    const int64_t hd = a->head_dim;
    for (int64_t r = 0; r < n; r++) {
        const float w = p[r];
        if (a->kv_dtype == DP_F32) {
            const float *v = (const float *)rows + r * hd;
            for (int64_t e = 0; e < hd; e++) o[e] += w * v[e];
        } else {
            const uint16_t *v = (const uint16_t *)rows + r * hd;
            for (int64_t e = 0; e < hd; e++) o[e] += w * half_table[v[e]];
        }
    }
}

/* The one attention core. Both paths are read the same way: spans -> tiles -> a run
 * of contiguous K (then V) rows of one head; they differ only in span length. */
int dp_attn_spans_generic(const dp_arena *a, int64_t layer, const float *q, int64_t q_stride,
                          float *out, int64_t out_stride, int64_t num_heads,
                          const int64_t *spans, int64_t num_spans, int64_t pos0,
                          int64_t num_tokens, float scale, int prefetch_degree) {
    if (!a || !a->base || !q || !out || !spans || num_heads <= 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    const int64_t hd = a->head_dim, nkv = a->num_kv_heads, eb = a->elem_bytes;
    if (num_heads % nkv || q_stride < num_heads * hd || out_stride < num_heads * hd) return DP_ERR_ARG;
    if (pos0 < 0 || num_tokens < 0) return DP_ERR_BOUNDS;
    int st = check_spans(a, spans, num_spans, pos0 + num_tokens);
    if (st != DP_OK) return st;
    const int64_t group = num_heads / nkv;
    const char *region = a->base + layer * a->layer_bytes;
    float *scores = (float *)malloc((size_t)(pos0 + num_tokens + 1) * sizeof(float));
    if (!scores) return DP_ERR_NOMEM;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t n_ctx = pos0 + t + 1; /* causal: tokens [0, pos0 + t] */
        for (int64_t h = 0; h < num_heads; h++) {
            const int64_t kh = h / group;
            const float *qh = q + t * q_stride + h * hd;
            float *o = out + t * out_stride + h * hd;
            /* Pass 1: scores, in position order. */
            float m = -INFINITY;
            int64_t j = 0;
            for (int64_t s = 0; s < num_spans && j < n_ctx; s++) {
                const int64_t P = spans[3 * s + 2], tb = tile_bytes(a, P);
                const int64_t n = spans[3 * s + 1] < n_ctx - j ? spans[3 * s + 1] : n_ctx - j;
                if (prefetch_degree > 0) prefetch_tiles(a, region, spans, num_spans, s, prefetch_degree);
                const char *tile = region + spans[3 * s];
                for (int64_t done = 0; done < n; done += P, tile += tb) {
                    const int64_t rows = n - done < P ? n - done : P;
                    score_rows(a, qh, tile + kh * P * hd * eb, rows, scale, scores + j, &m);
                    j += rows;
                }
            }
            /* Pass 2: softmax weights. */
            float l = 0.0f;
            for (int64_t i = 0; i < n_ctx; i++) {
                scores[i] = expf(scores[i] - m);
                l += scores[i];
            }
            /* Pass 3: weighted sum of values, same walk. */
            for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
            j = 0;
            for (int64_t s = 0; s < num_spans && j < n_ctx; s++) {
                const int64_t P = spans[3 * s + 2], tb = tile_bytes(a, P);
                const int64_t n = spans[3 * s + 1] < n_ctx - j ? spans[3 * s + 1] : n_ctx - j;
                const char *tile = region + spans[3 * s];
                for (int64_t done = 0; done < n; done += P, tile += tb) {
                    const int64_t rows = n - done < P ? n - done : P;
                    accumulate_rows(a, scores + j, tile + (nkv + kh) * P * hd * eb, rows, o);
                    j += rows;
                }
            }
            const float inv = 1.0f / l;
            for (int64_t i = 0; i < hd; i++) o[i] *= inv;
        }
    }
    free(scores);
    return DP_OK;
}

int dp_kv_copy_slots(const dp_arena *a, const int64_t *src, const int64_t *dst, int64_t num_tokens) {
    if (!a || !a->base || !src || !dst || num_tokens < 0) return DP_ERR_ARG;
    const size_t row = (size_t)(a->head_dim * a->elem_bytes);
    for (int64_t t = 0; t < num_tokens; t++) {
        int st = check_slot(a, src + 3 * t);
        if (st == DP_OK) st = check_slot(a, dst + 3 * t);
        if (st != DP_OK) return st;
    }
    for (int64_t l = 0; l < a->num_layers; l++) {
        char *region = a->base + l * a->layer_bytes;
        for (int64_t t = 0; t < num_tokens; t++) {
            const int64_t *s = src + 3 * t, *d = dst + 3 * t;
            for (int is_v = 0; is_v < 2; is_v++)
                for (int64_t h = 0; h < a->num_kv_heads; h++)
                    memmove(region + d[0] + row_offset(a, d[2], d[1], h, is_v),
                            region + s[0] + row_offset(a, s[2], s[1], h, is_v), row);
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
    float buf[DP_MAX_HEAD_DIM];
    int64_t j = 0;
    for (int64_t s = 0; s < num_spans && j < num_tokens; s++) {
        const int64_t P = spans[3 * s + 2], tb = tile_bytes(a, P);
        for (int64_t i = 0; i < spans[3 * s + 1] && j < num_tokens; i++, j++) {
            const char *tile = region + spans[3 * s] + (i / P) * tb;
            for (int64_t h = 0; h < a->num_kv_heads; h++) {
                memcpy(k_out + (h * num_tokens + j) * hd, load_row(a, tile, P, i % P, h, 0, buf), (size_t)hd * 4);
                memcpy(v_out + (h * num_tokens + j) * hd, load_row(a, tile, P, i % P, h, 1, buf), (size_t)hd * 4);
            }
        }
    }
    return DP_OK;
}
