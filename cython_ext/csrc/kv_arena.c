/* The dual-path KV arena (kv_arena.h): its allocation, bounds-checked slot and tile
 * access, writes (f32 -> f16 / q8), copies and gathers. Attention over it is kv_attn.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "kv_tile.h"

#define ARENA_ALIGN (2u << 20) /* 2 MiB: lets the kernel back the arena with huge pages */

/* One row of q8 (kv_arena.h): dst[e * dstride] = round(x[e] / s), ties to even, in
 * [-127, 127]; returns s = max |x| / 127 (0 for an all-zero row, whose values are 0).
 * A division per value, not a multiply by 1 / s: one rounding, and no overflow of
 * 1 / s for a tiny s. */
static float quantize_row(const float *x, int64_t n, int8_t *dst, int64_t dstride) {
    float amax = 0.0f;
    for (int64_t e = 0; e < n; e++) amax = fabsf(x[e]) > amax ? fabsf(x[e]) : amax;
    const float s = amax / 127.0f;
    for (int64_t e = 0; e < n; e++) {
        long v = s > 0.0f ? lrintf(x[e] / s) : 0;
        v = v > 127 ? 127 : v < -127 ? -127 : v; /* |x / s| <= 127 but for rounding (and NaN) */
        dst[e * dstride] = (int8_t)v;
    }
    return s;
}

static float store_f16(const dp_attn_ops *ops, const float *x, int64_t n, char *dst, int64_t stride) {
    uint16_t half[DP_MAX_HEAD_DIM];
    if (stride == 1) {
        ops->f32_to_f16(x, (uint16_t *)dst, n);
        return 0.0f;
    }
    ops->f32_to_f16(x, half, n);
    for (int64_t e = 0; e < n; e++) ((uint16_t *)dst)[e * stride] = half[e];
    return 0.0f;
}

static float store_f32(const dp_attn_ops *ops, const float *x, int64_t n, char *dst, int64_t stride) {
    (void)ops;
    if (stride == 1) memcpy(dst, x, (size_t)n * sizeof(float));
    else
        for (int64_t e = 0; e < n; e++) ((float *)dst)[e * stride] = x[e];
    return 0.0f;
}

static float store_q8(const dp_attn_ops *ops, const float *x, int64_t n, char *dst, int64_t stride) {
    (void)ops;
    return quantize_row(x, n, (int8_t *)dst, stride);
}

static void load_f16(const char *src, int64_t n, int64_t stride, float scale, float *dst) {
    (void)scale;
    for (int64_t e = 0; e < n; e++) dst[e] = dp_half_to_float(((const uint16_t *)src)[e * stride]);
}

static void load_f32(const char *src, int64_t n, int64_t stride, float scale, float *dst) {
    (void)scale;
    for (int64_t e = 0; e < n; e++) dst[e] = ((const float *)src)[e * stride];
}

static void load_q8(const char *src, int64_t n, int64_t stride, float scale, float *dst) {
    for (int64_t e = 0; e < n; e++) dst[e] = scale * (float)((const int8_t *)src)[e * stride];
}

/* The one list of KV dtypes: a new one is its value in enum dp_kv_dtype (dp_common.h),
 * its row here, and its kernels in the table of each attn_*.c; the Cython module, the
 * CLI and bench read the names from here (config.py spells them, tests pin it). */
const dp_kv_type dp_kv_types[DP_KV_NUM_DTYPES] = {
    [DP_KV_F16] = {"f16", "IEEE half", 2, 0, 1, store_f16, load_f16},
    [DP_KV_F32] = {"f32", "float", 4, 0, 1, store_f32, load_f32},
    [DP_KV_Q8] = {"q8", "int8 + an f32 scale per token and KV head", 1, sizeof(float), 2, store_q8, load_q8},
};

/* The traits of a kv dtype, NULL when it is none. */
static const dp_kv_type *kv_type(int kv_dtype) {
    return kv_dtype >= 0 && kv_dtype < DP_KV_NUM_DTYPES ? &dp_kv_types[kv_dtype] : NULL;
}

int64_t dp_kv_tile_bytes(int kv_dtype, int64_t num_kv_heads, int64_t head_dim, int64_t P) {
    const dp_kv_type *ty = kv_type(kv_dtype);
    if (!ty || num_kv_heads <= 0 || head_dim <= 0 || head_dim > DP_MAX_HEAD_DIM || P <= 0) return -1;
    const int64_t row = head_dim * ty->elem_bytes + ty->scale_bytes; /* one token of one KV head, K or V */
    if (num_kv_heads > INT64_MAX / (2 * row) || P > INT64_MAX / (2 * row * num_kv_heads)) return -1;
    return 2 * num_kv_heads * P * row;
}

int dp_arena_init(dp_arena *a, int64_t block_size, int64_t num_blocks, int64_t num_layers,
                  int64_t num_kv_heads, int64_t head_dim, int kv_dtype, int numa_node) {
    if (!a) return DP_ERR_ARG;
    memset(a, 0, sizeof *a);
    if (block_size < 64 || (block_size & (block_size - 1)) || num_blocks <= 0 || num_layers <= 0 ||
        num_kv_heads <= 0 || head_dim <= 0 || head_dim > DP_MAX_HEAD_DIM)
        return DP_ERR_ARG;
    const dp_kv_type *ty = kv_type(kv_dtype);
    if (!ty) return DP_ERR_ARG;
    const int64_t elem_bytes = ty->elem_bytes, scale_bytes = ty->scale_bytes;
    /* q8 scales stay 4-byte aligned only with an even head_dim (kv_arena.h). */
    if (head_dim % ty->head_dim_multiple) return DP_ERR_ARG;
    /* One token must fit in a block (divided, not multiplied: no overflow). */
    if (num_kv_heads > block_size / (2 * (head_dim * elem_bytes + scale_bytes))) return DP_ERR_ARG;
    if (num_blocks > INT64_MAX / block_size || num_layers > INT64_MAX / (block_size * num_blocks) ||
        (uint64_t)(block_size * num_blocks * num_layers) > (uint64_t)SIZE_MAX)
        return DP_ERR_ARG;
    a->elem_bytes = elem_bytes;
    a->scale_bytes = scale_bytes;
    a->block_size = block_size;
    a->num_blocks = num_blocks;
    a->num_layers = num_layers;
    a->num_kv_heads = num_kv_heads;
    a->head_dim = head_dim;
    a->kv_dtype = kv_dtype;
    a->layer_bytes = block_size * num_blocks;
    const size_t total = (size_t)(a->layer_bytes * num_layers);
    void *p = NULL;
    if (dp_aligned_alloc(&p, ARENA_ALIGN, total) != 0) {
        memset(a, 0, sizeof *a);
        return DP_ERR_NOMEM;
    }
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

/* Where a tile of P tokens may start: inside the layer region, at a multiple of its
 * size inside its block (so a block is cut into whole tiles from its start, and a
 * tile larger than a block starts one), and, when it fits in a block, not across
 * two. P is bounded before tile_bytes(P) is formed, so nothing overflows. */
static int check_tile(const dp_arena *a, int64_t off, int64_t P) {
    if (P <= 0 || off < 0 || off >= a->layer_bytes) return DP_ERR_BOUNDS;
    if (P > a->layer_bytes / tile_bytes(a, 1)) return DP_ERR_BOUNDS; /* more tokens than a layer holds */
    const int64_t tb = tile_bytes(a, P), in_block = off % a->block_size;
    if (tb > a->layer_bytes - off) return DP_ERR_BOUNDS;
    if (in_block % tb != 0) return DP_ERR_ALIGN;
    if (tb <= a->block_size && in_block + tb > a->block_size) return DP_ERR_ALIGN;
    return DP_OK;
}

int dp_kv_release_tiles(const dp_arena *a, const uint8_t *layers, const int64_t *offsets, int64_t num_tiles,
                        int64_t P) {
    if (!a || !a->base || !layers || (!offsets && num_tiles > 0) || num_tiles < 0) return DP_ERR_ARG;
    for (int64_t i = 0; i < num_tiles; i++) {
        const int st = check_tile(a, offsets[i], P);
        if (st != DP_OK) return st;
    }
    const int64_t os_page = (int64_t)sysconf(_SC_PAGESIZE), tb = num_tiles > 0 ? tile_bytes(a, P) : 0;
    if (os_page <= 0) return DP_ERR_ARG;
    const uintptr_t mask = (uintptr_t)(os_page - 1);
    for (int64_t l = 0; l < a->num_layers; l++) {
        if (!layers[l]) continue;
        for (int64_t i = 0; i < num_tiles; i++) {
            const uintptr_t start = (uintptr_t)(a->base + l * a->layer_bytes + offsets[i]);
            const uintptr_t lo = (start + mask) & ~mask, hi = (start + (uintptr_t)tb) & ~mask;
            if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
        }
    }
    return DP_OK;
}

int dp_kv_small_pages(const dp_arena *a, const uint8_t *layers) {
    if (!a || !a->base || !layers) return DP_ERR_ARG;
#ifdef MADV_NOHUGEPAGE
    for (int64_t l = 0; l < a->num_layers; l++)
        if (layers[l]) madvise(a->base + l * a->layer_bytes, (size_t)a->layer_bytes, MADV_NOHUGEPAGE);
#endif
    return DP_OK;
}

static int check_slot(const dp_arena *a, const int64_t *s) {
    const int64_t row = s[1], P = s[2];
    const int st = check_tile(a, s[0], P);
    if (st != DP_OK) return st;
    return row < 0 || row >= P ? DP_ERR_BOUNDS : DP_OK;
}

int dp_kv_check_slots(const dp_arena *a, const int64_t *slots, int64_t num_tokens, int64_t *bad) {
    if (bad) *bad = -1;
    if (!a || !a->base || (!slots && num_tokens > 0) || num_tokens < 0) return DP_ERR_ARG;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int st = check_slot(a, slots + 3 * t);
        if (st != DP_OK) {
            if (bad) *bad = t;
            return st;
        }
    }
    return DP_OK;
}

int dp_kv_check_write(const dp_arena *a, int64_t layer, const float *k, const float *v, int64_t stride,
                            const int64_t *slots, int64_t num_tokens) {
    if (!a || !a->base || !k || !v || !slots || num_tokens < 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    if (stride < a->num_kv_heads * a->head_dim) return DP_ERR_ARG;
    return dp_kv_check_slots(a, slots, num_tokens, NULL);
}


/* The writes of dp_kv_write_slots, every slot already checked. */
void dp_kv_write_rows(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *k, const float *v,
                       int64_t stride, const int64_t *slots, int64_t num_tokens) {
    const int64_t hd = a->head_dim;
    const dp_kv_type *ty = &dp_kv_types[a->kv_dtype];
    char *region = a->base + layer * a->layer_bytes;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t *s = slots + 3 * t;
        const int64_t P = s[2];
        for (int64_t h = 0; h < a->num_kv_heads; h++) {
            const float *ks = k + t * stride + h * hd, *vs = v + t * stride + h * hd;
            char *kd = region + s[0] + k_offset(a, P, s[1], h);
            char *vd = region + s[0] + v_offset(a, P, s[1], h);
            const float kscale = ty->store_row(ops, ks, hd, kd, P), vscale = ty->store_row(ops, vs, hd, vd, 1);
            if (a->scale_bytes) {
                char *tile = region + s[0];
                *(float *)(tile + ks_offset(a, P, s[1], h)) = kscale;
                *(float *)(tile + vs_offset(a, P, s[1], h)) = vscale;
            }
        }
    }
}

int dp_kv_write_slots(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *k,
                      const float *v, int64_t stride, const int64_t *slots, int64_t num_tokens) {
    if (!ops) ops = &dp_ops_generic; /* f32_to_f16 only: needs no table */
    const int st = dp_kv_check_write(a, layer, k, v, stride, slots, num_tokens);
    if (st != DP_OK) return st; /* nothing written */
    dp_kv_write_rows(a, ops, layer, k, v, stride, slots, num_tokens);
    return DP_OK;
}

int dp_kv_check_spans(const dp_arena *a, const int64_t *spans, int64_t num_spans, int64_t need) {
    int64_t total = 0;
    for (int64_t i = 0; i < num_spans; i++) {
        const int64_t off = spans[3 * i], n = spans[3 * i + 1], P = spans[3 * i + 2];
        const int st = check_tile(a, off, P); /* its first tile; P is bounded from here on */
        if (st != DP_OK) return st;
        if (n < 0 || n / P + (n % P != 0) > (a->layer_bytes - off) / tile_bytes(a, P)) return DP_ERR_BOUNDS;
        if (n > INT64_MAX - total) return DP_ERR_BOUNDS;
        total += n;
    }
    return total < need ? DP_ERR_BOUNDS : DP_OK;
}

int dp_kv_copy_slots(const dp_arena *a, const int64_t *src, const int64_t *dst, int64_t num_tokens) {
    if (!a || !a->base || !src || !dst || num_tokens < 0) return DP_ERR_ARG;
    const size_t row = (size_t)(a->head_dim * a->elem_bytes), eb = (size_t)a->elem_bytes;
    int st = dp_kv_check_slots(a, src, num_tokens, NULL);
    if (st == DP_OK) st = dp_kv_check_slots(a, dst, num_tokens, NULL);
    if (st != DP_OK) return st; /* nothing copied */
    for (int64_t l = 0; l < a->num_layers; l++) {
        char *region = a->base + l * a->layer_bytes;
        for (int64_t t = 0; t < num_tokens; t++) {
            const int64_t *s = src + 3 * t, *d = dst + 3 * t;
            for (int64_t h = 0; h < a->num_kv_heads; h++) {
                memmove(region + d[0] + v_offset(a, d[2], d[1], h), region + s[0] + v_offset(a, s[2], s[1], h), row);
                for (int64_t e = 0; e < a->head_dim; e++)
                    memmove(region + d[0] + k_offset(a, d[2], d[1], h) + e * d[2] * (int64_t)eb,
                            region + s[0] + k_offset(a, s[2], s[1], h) + e * s[2] * (int64_t)eb, eb);
                if (a->scale_bytes) {
                    memmove(region + d[0] + ks_offset(a, d[2], d[1], h), region + s[0] + ks_offset(a, s[2], s[1], h),
                            sizeof(float));
                    memmove(region + d[0] + vs_offset(a, d[2], d[1], h), region + s[0] + vs_offset(a, s[2], s[1], h),
                            sizeof(float));
                }
            }
        }
    }
    return DP_OK;
}

int dp_kv_tiles_io(const dp_arena *a, const int64_t *offsets, int64_t num_tiles, int64_t P, void *buf,
                   int to_arena) {
    if (!a || !a->base || (!offsets && num_tiles > 0) || (!buf && num_tiles > 0) || num_tiles < 0) return DP_ERR_ARG;
    for (int64_t i = 0; i < num_tiles; i++) {
        const int st = check_tile(a, offsets[i], P);
        if (st != DP_OK) return st; /* nothing copied */
    }
    const size_t tb = (size_t)tile_bytes(a, P);
    char *b = (char *)buf;
    for (int64_t i = 0; i < num_tiles; i++)
        for (int64_t l = 0; l < a->num_layers; l++, b += tb) {
            char *tile = a->base + l * a->layer_bytes + offsets[i];
            if (to_arena) memcpy(tile, b, tb);
            else memcpy(b, tile, tb);
        }
    return DP_OK;
}

int dp_kv_gather(const dp_arena *a, int64_t layer, const int64_t *spans, int64_t num_spans,
                 int64_t num_tokens, float *k_out, float *v_out) {
    if (!a || !a->base || !spans || !k_out || !v_out || num_tokens < 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    int st = dp_kv_check_spans(a, spans, num_spans, num_tokens);
    if (st != DP_OK) return st;
    const char *region = a->base + layer * a->layer_bytes;
    const int64_t hd = a->head_dim;
    const dp_kv_type *ty = &dp_kv_types[a->kv_dtype];
    int64_t j = 0;
    for (int64_t s = 0; s < num_spans && j < num_tokens; s++) {
        const int64_t P = spans[3 * s + 2], tb = tile_bytes(a, P);
        for (int64_t i = 0; i < spans[3 * s + 1] && j < num_tokens; i++, j++) {
            const char *tile = region + spans[3 * s] + (i / P) * tb;
            for (int64_t h = 0; h < a->num_kv_heads; h++) {
                const char *vs = tile + v_offset(a, P, i % P, h), *ks = tile + k_offset(a, P, i % P, h);
                float *vd = v_out + (h * num_tokens + j) * hd, *kd = k_out + (h * num_tokens + j) * hd;
                const float kscale = a->scale_bytes ? *(const float *)(tile + ks_offset(a, P, i % P, h)) : 0.0f;
                const float vscale = a->scale_bytes ? *(const float *)(tile + vs_offset(a, P, i % P, h)) : 0.0f;
                ty->load_row(vs, hd, 1, vscale, vd);
                ty->load_row(ks, hd, P, kscale, kd);
            }
        }
    }
    return DP_OK;
}
