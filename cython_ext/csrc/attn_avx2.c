/* AVX2 + FMA + F16C attention building blocks. Compiled with -mavx2 -mfma -mf16c;
 * called only when dp_cpu_features() reports AVX2 (CPU and OS). */
#include <immintrin.h>
#include "dp_attn_ops.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

#define DP_GROUP_TILE 8 /* query heads per pass: accumulators stay in registers */

#define SCORES_BODY(LOAD, TAIL)                                                                  \
    for (int64_t g0 = 0; g0 < group; g0 += DP_GROUP_TILE) {                                       \
        const int64_t gn = group - g0 < DP_GROUP_TILE ? group - g0 : DP_GROUP_TILE;               \
        for (int64_t r = 0; r < n; r++) {                                                         \
            __m256 acc[DP_GROUP_TILE];                                                            \
            for (int64_t g = 0; g < gn; g++) acc[g] = _mm256_setzero_ps();                        \
            int64_t e = 0;                                                                        \
            for (; e + 8 <= hd; e += 8) {                                                         \
                const __m256 k = LOAD(rows + r * hd + e);                                         \
                for (int64_t g = 0; g < gn; g++)                                                  \
                    acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (g0 + g) * hd + e), k, acc[g]); \
            }                                                                                     \
            for (int64_t g = 0; g < gn; g++) {                                                    \
                float s = hsum(acc[g]);                                                           \
                for (int64_t t = e; t < hd; t++) s += q[(g0 + g) * hd + t] * TAIL(rows[r * hd + t]); \
                scores[(g0 + g) * sstride + r] = s * scale;                                       \
            }                                                                                     \
        }                                                                                         \
    }

#define F32_ID(x) (x)

static void scores_f32(const float *q, int64_t group, int64_t hd, const float *rows, int64_t n,
                       float scale, float *scores, int64_t sstride) {
    SCORES_BODY(_mm256_loadu_ps, F32_ID)
}

static void scores_f16(const float *q, int64_t group, int64_t hd, const uint16_t *rows, int64_t n,
                       float scale, float *scores, int64_t sstride) {
    SCORES_BODY(load_f16, dp_half_to_float)
}

#define ACCUM_BODY(LOAD, TAIL)                                                                    \
    int64_t e = 0;                                                                                \
    for (; e + 8 <= hd; e += 8) {                                                                 \
        for (int64_t g = 0; g < group; g++) {                                                     \
            __m256 acc = _mm256_loadu_ps(o + g * hd + e);                                          \
            const float *pg = p + g * sstride;                                                    \
            for (int64_t r = 0; r < n; r++)                                                       \
                acc = _mm256_fmadd_ps(_mm256_set1_ps(pg[r]), LOAD(rows + r * hd + e), acc);       \
            _mm256_storeu_ps(o + g * hd + e, acc);                                                \
        }                                                                                         \
    }                                                                                             \
    for (; e < hd; e++)                                                                           \
        for (int64_t g = 0; g < group; g++)                                                       \
            for (int64_t r = 0; r < n; r++) o[g * hd + e] += p[g * sstride + r] * TAIL(rows[r * hd + e]);

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const float *rows,
                      int64_t n, float *o) {
    ACCUM_BODY(_mm256_loadu_ps, F32_ID)
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const uint16_t *rows,
                      int64_t n, float *o) {
    ACCUM_BODY(load_f16, dp_half_to_float)
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = dp_float_to_half(src[i]);
}


/* exp(x) for x <= 0 (Cephes-style): 2^k * P(r), |rel err| < 2e-7; x < -87 gives 0. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static float exp_sum(float *x, int64_t n, float max) {
    const __m256 m = _mm256_set1_ps(max);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    float s = hsum(acc);
    for (; i < n; i++) {
        float t[8] = {x[i] - max, 0, 0, 0, 0, 0, 0, 0};
        _mm256_storeu_ps(t, exp256(_mm256_loadu_ps(t)));
        x[i] = t[0];
        s += t[0];
    }
    return s;
}

const dp_attn_ops dp_ops_avx2 = {"avx2", scores_f32, scores_f16, accum_f32, accum_f16, f32_to_f16, exp_sum};
