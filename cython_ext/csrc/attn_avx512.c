/* AVX-512 (F/BW/VL) attention building blocks. Compiled with -mavx512f -mavx512bw
 * -mavx512vl; called only when dp_cpu_features() reports AVX512 (CPU and OS).
 * Tails use masked loads, so any head_dim works at full width. */
#include <immintrin.h>
#include <math.h>
#include "dp_attn_ops.h"

static inline __m512 load_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 load_f16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* Scores of up to 16 tokens (one vector of K^T per dimension) for G query heads:
 * G accumulators stay in registers; no horizontal reductions anywhere. */
#define DEFINE_SCORES(NAME, T, LOAD)                                                              \
    static inline __attribute__((always_inline)) void NAME##_blk(                                  \
        const float *q, const int G, int64_t hd, const T *kt, int64_t ldk, int64_t n, float scale,  \
        float *scores, int64_t sstride) {                                                          \
        for (int64_t r0 = 0; r0 < n; r0 += 16) {                                                   \
            const __mmask16 m = n - r0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - r0)) - 1); \
            __m512 acc[8];                                                                         \
            for (int g = 0; g < G; g++) acc[g] = _mm512_setzero_ps();                              \
            for (int64_t e = 0; e < hd; e++) {                                                     \
                const __m512 k = LOAD(kt + e * ldk + r0, m);                                       \
                for (int g = 0; g < G; g++)                                                        \
                    acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + e]), k, acc[g]);            \
            }                                                                                      \
            for (int g = 0; g < G; g++)                                                            \
                _mm512_mask_storeu_ps(scores + g * sstride + r0, m, _mm512_mul_ps(acc[g], _mm512_set1_ps(scale))); \
        }                                                                                          \
    }                                                                                              \
    static void NAME(const float *q, int64_t group, int64_t hd, const T *kt, int64_t ldk, int64_t n, \
                     float scale, float *scores, int64_t sstride) {                               \
        int64_t g = 0;                                                                             \
        for (; g + 8 <= group; g += 8) NAME##_blk(q + g * hd, 8, hd, kt, ldk, n, scale, scores + g * sstride, sstride); \
        if (group - g >= 4) { NAME##_blk(q + g * hd, 4, hd, kt, ldk, n, scale, scores + g * sstride, sstride); g += 4; } \
        if (group - g >= 2) { NAME##_blk(q + g * hd, 2, hd, kt, ldk, n, scale, scores + g * sstride, sstride); g += 2; } \
        if (group - g >= 1) NAME##_blk(q + g * hd, 1, hd, kt, ldk, n, scale, scores + g * sstride, sstride); \
    }

DEFINE_SCORES(scores_f32, float, load_f32)
DEFINE_SCORES(scores_f16, uint16_t, load_f16)

/* o[g] += sum_r p[g, r] * V[r] from f32 rows. Blocks of GB query heads x C vectors of
 * head_dim (the last one masked, so any head_dim works) stay in registers
 * (GB * C <= 16 accumulators); each V row is loaded once per block, and GB * C
 * independent FMA chains keep the FMA units busy. */
static inline __attribute__((always_inline)) void accum_blk(const float *p, int64_t sstride, const int GB,
                                                            const int C, int64_t hd, __mmask16 last,
                                                            const float *rows, int64_t n, float *o) {
    __m512 acc[16];
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < C; c++)
            acc[g * C + c] = _mm512_maskz_loadu_ps(c == C - 1 ? last : (__mmask16)0xffff, o + g * hd + 16 * c);
    for (int64_t r = 0; r < n; r++) {
        __m512 v[8];
        for (int c = 0; c < C; c++)
            v[c] = _mm512_maskz_loadu_ps(c == C - 1 ? last : (__mmask16)0xffff, rows + r * hd + 16 * c);
        for (int g = 0; g < GB; g++) {
            const __m512 w = _mm512_set1_ps(p[g * sstride + r]);
            for (int c = 0; c < C; c++) acc[g * C + c] = _mm512_fmadd_ps(w, v[c], acc[g * C + c]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < C; c++)
            _mm512_mask_storeu_ps(o + g * hd + 16 * c, c == C - 1 ? last : (__mmask16)0xffff, acc[g * C + c]);
}

static void accum_f32_any(const float *p, int64_t sstride, int64_t group, int64_t hd, const float *rows,
                          int64_t n, float *o) {
    for (int64_t e = 0; e < hd; e += 16) {
        const __mmask16 m = hd - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - e)) - 1);
        for (int64_t g = 0; g < group; g++) {
            __m512 acc = _mm512_maskz_loadu_ps(m, o + g * hd + e);
            const float *pg = p + g * sstride;
            for (int64_t r = 0; r < n; r++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(pg[r]), _mm512_maskz_loadu_ps(m, rows + r * hd + e), acc);
            _mm512_mask_storeu_ps(o + g * hd + e, m, acc);
        }
    }
}

#define ACCUM_CASE(CC, GBB)                                                                        \
    case CC:                                                                                       \
        for (; g + GBB <= group; g += GBB)                                                         \
            accum_blk(p + g * sstride, sstride, GBB, CC, hd, last, rows, n, o + g * hd);           \
        for (; g < group; g++) accum_blk(p + g * sstride, sstride, 1, CC, hd, last, rows, n, o + g * hd); \
        break;

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const float *rows,
                      int64_t n, float *o) {
    const __mmask16 last = hd % 16 ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;
    int64_t g = 0;
    switch ((hd + 15) / 16) {
        ACCUM_CASE(1, 8)
        ACCUM_CASE(2, 8)
        ACCUM_CASE(3, 5)
        ACCUM_CASE(4, 4)
        ACCUM_CASE(5, 3)
        ACCUM_CASE(6, 2)
        ACCUM_CASE(7, 2)
        ACCUM_CASE(8, 2)
        default: accum_f32_any(p, sstride, group, hd, rows, n, o);
    }
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const uint16_t *rows,
                      int64_t n, float *o) {
    /* Widen each V row once (not once per query head), then accumulate from L1. */
    float buf[8192];
    const int64_t step = 8192 / hd;
    for (int64_t r0 = 0; r0 < n; r0 += step) {
        const int64_t m = n - r0 < step ? n - r0 : step;
        const int64_t total = m * hd;
        for (int64_t i = 0; i < total; i += 16) {
            const __mmask16 k = total - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (total - i)) - 1);
            _mm512_mask_storeu_ps(buf + i, k, load_f16(rows + r0 * hd + i, k));
        }
        accum_f32(p + r0, sstride, group, hd, buf, m, o);
    }
}

static float max_of(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
    }
    return _mm512_reduce_max_ps(m);
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
    }
}


/* exp(x) for x <= 0 (Cephes-style): 2^k * P(r), |rel err| < 2e-7; x < -87 gives 0. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

static float exp_sum(float *x, int64_t n, float max) {
    const __m512 m = _mm512_set1_ps(max);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
        _mm512_mask_storeu_ps(x + i, k, v);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, v));
    }
    return _mm512_reduce_add_ps(acc);
}

const dp_attn_ops dp_ops_avx512 = {"avx512", scores_f32, scores_f16, accum_f32, accum_f16, f32_to_f16, exp_sum, max_of};
