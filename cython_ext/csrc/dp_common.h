/* Shared definitions for DualPath's C kernels. C99, no Python.h.
 *
 * Every entry point returns a status code; the Cython layer turns a non-zero
 * code into a Python exception with a message a user understands. C never
 * prints and never exits.
 */
#ifndef DP_COMMON_H
#define DP_COMMON_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

enum dp_status {
    DP_OK = 0,
    DP_ERR_ARG = 1,      /* a size or dtype argument is out of range */
    DP_ERR_BOUNDS = 2,   /* a position, token id or index is outside its buffer */
    DP_ERR_NOMEM = 3,    /* an allocation failed: the call's outputs are not to be used */
    DP_ERR_THREAD = 4,   /* a worker thread could not be started */
    DP_ERR_ALIGN = 5,    /* a slot or span does not start a tile (kv_arena.h) */
    DP_ERR_IO = 6,       /* a file read failed or ended early (errno says which) */
};

/* The largest head_dim the arena and the kernels accept: the one limit, checked
 * by dp_arena_init (and the Cython layer's message); kernels size their stack
 * buffers by it. */
#define DP_MAX_HEAD_DIM 512

/* malloc / calloc / posix_memalign of the kernels' C code: the same, except that a
 * test can make them fail (dp_test_fail_alloc_after). Defined in dp_pool.c, the
 * file every other one links against. */
void *dp_malloc(size_t bytes);
void *dp_calloc(size_t count, size_t bytes);
int dp_aligned_alloc(void **p, size_t alignment, size_t bytes); /* 0, or an errno like posix_memalign */
/* Test only: the next n allocations through these succeed and every one after them
 * fails, until the next call; n < 0 (the default) ends the failures. Inert unless
 * called. */
void dp_test_fail_alloc_after(int64_t n);

enum dp_dtype {
    DP_F32 = 0,
    DP_F16 = 1,
    DP_Q8_0 = 8,   /* MatMulNBits layout: uint8 value+128, fp32 scale per 32 */
    DP_Q4_0 = 2,   /* MatMulNBits layout: two nibbles per byte, low first, value+8 */
};

/* The KV cache's element types: the index of dp_kv_types (kv_arena.c, their storage
 * traits) and of every ISA's kernels (dp_attn_ops.kv). Adding one: a value here, its
 * entry in dp_kv_types, and its kernels in the table of each attn_*.c. */
enum dp_kv_dtype {
    DP_KV_F16 = 0,   /* IEEE half, the default */
    DP_KV_F32 = 1,
    DP_KV_Q8 = 2,    /* int8 with one f32 scale per token and KV head (kv_arena.h) */
    DP_KV_NUM_DTYPES
};

/* IEEE half <-> float, portable bit manipulation (round to nearest even). */
static inline float dp_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while ((mant & 0x400u) == 0) { mant <<= 1; exp--; }
            mant &= 0x3ffu;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t dp_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    }
    if (absx >= 0x477ff000u) { /* overflows half after rounding */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half_m = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_m & 1u))) half_m++;
        return (uint16_t)(sign | half_m);
    }
    uint32_t h = ((absx >> 13) - ((127 - 15) << 10));
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

#endif
