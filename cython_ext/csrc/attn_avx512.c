/* AVX-512 (F/BW/VL) attention building blocks. Compiled with -mavx512f -mavx512bw
 * -mavx512vl; called only when dp_cpu_features() reports AVX512 (CPU and OS).
 * Tails use masked loads, so any head_dim works at full width. */
#include <immintrin.h>
#include "dp_attn_ops.h"

static inline __m512 load_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 load_f16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

#define DP_GROUP_TILE 8

#define SCORES_BODY(LOAD)                                                                        \
    for (int64_t g0 = 0; g0 < group; g0 += DP_GROUP_TILE) {                                       \
        const int64_t gn = group - g0 < DP_GROUP_TILE ? group - g0 : DP_GROUP_TILE;               \
        for (int64_t r = 0; r < n; r++) {                                                         \
            __m512 acc[DP_GROUP_TILE];                                                            \
            for (int64_t g = 0; g < gn; g++) acc[g] = _mm512_setzero_ps();                        \
            for (int64_t e = 0; e < hd; e += 16) {                                                \
                const __mmask16 m = hd - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - e)) - 1); \
                const __m512 k = LOAD(rows + r * hd + e, m);                                      \
                for (int64_t g = 0; g < gn; g++)                                                  \
                    acc[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + (g0 + g) * hd + e), k, acc[g]); \
            }                                                                                     \
            for (int64_t g = 0; g < gn; g++)                                                      \
                scores[(g0 + g) * sstride + r] = _mm512_reduce_add_ps(acc[g]) * scale;             \
        }                                                                                         \
    }

static void scores_f32(const float *q, int64_t group, int64_t hd, const float *rows, int64_t n,
                       float scale, float *scores, int64_t sstride) {
    SCORES_BODY(load_f32)
}

static void scores_f16(const float *q, int64_t group, int64_t hd, const uint16_t *rows, int64_t n,
                       float scale, float *scores, int64_t sstride) {
    SCORES_BODY(load_f16)
}

#define ACCUM_BODY(LOAD)                                                                          \
    for (int64_t e = 0; e < hd; e += 16) {                                                        \
        const __mmask16 m = hd - e >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - e)) - 1); \
        for (int64_t g = 0; g < group; g++) {                                                     \
            __m512 acc = _mm512_maskz_loadu_ps(m, o + g * hd + e);                                 \
            const float *pg = p + g * sstride;                                                    \
            for (int64_t r = 0; r < n; r++)                                                       \
                acc = _mm512_fmadd_ps(_mm512_set1_ps(pg[r]), LOAD(rows + r * hd + e, m), acc);    \
            _mm512_mask_storeu_ps(o + g * hd + e, m, acc);                                        \
        }                                                                                         \
    }

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const float *rows,
                      int64_t n, float *o) {
    ACCUM_BODY(load_f32)
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const uint16_t *rows,
                      int64_t n, float *o) {
    ACCUM_BODY(load_f16)
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

const dp_attn_ops dp_ops_avx512 = {"avx512", scores_f32, scores_f16, accum_f32, accum_f16, f32_to_f16, exp_sum};
