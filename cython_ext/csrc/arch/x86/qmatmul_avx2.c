/* AVX2 classifier rows (qmatmul.h), built with -mavx2 -mfma and chosen at run time; the
 * AVX-VNNI variant (dp_qrows_avx_vnni) is compiled for it alone (a target attribute).
 * 32 values a step: the values as int8 (w ^ 0x80 = w - 128), their products with the
 * activations summed in integers (maddubs on |q| and x with q's sign: |q| <= 128,
 * |x| <= 127, so a pair stays under 2^15), then madd into 8 int32 lanes of 4 values
 * each: one block of 32, or two of 16 (lanes 0-3, 4-7). Each lane then takes its block's
 * scale (weight scale x activation scale, 8 blocks at a time, permuted into place). */
#include <immintrin.h>
#include "../../qmatmul.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i dot32_plain(const uint8_t *w, const int8_t *x) {
    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)w), _mm256_set1_epi8((char)0x80));
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* AVX-VNNI: dpbusd of the stored values w = q + 128, less 128 x the sums of each 4
 * activations (a dpbusd of ones). */
__attribute__((target("avxvnni"))) static inline __m256i dot32_vnni(const uint8_t *w, const int8_t *x) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x), zero = _mm256_setzero_si256();
    const __m256i wx = _mm256_dpbusd_avx_epi32(zero, _mm256_loadu_si256((const __m256i *)w), xv);
    const __m256i xs = _mm256_dpbusd_avx_epi32(zero, _mm256_set1_epi8(1), xv);
    return _mm256_sub_epi32(wx, _mm256_slli_epi32(xs, 7));
}

#define QROWS_AVX2(NAME, ATTR, DOT)                                                                       \
    ATTR void NAME(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,    \
                   const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {                 \
        qrows_body(w, scales, bs, n0, n1, K, xq, xd, R, out, ldo, DOT);                                     \
    }

static inline __attribute__((always_inline)) void qrows_body(const uint8_t *w, const float *scales, int64_t bs,
                                                             int64_t n0, int64_t n1, int64_t K, const int8_t *xq,
                                                             const float *xd, int64_t R, float *out, int64_t ldo,
                                                             __m256i (*dot32)(const uint8_t *, const int8_t *)) {
    const int64_t nb = K / bs, per = 32 / bs; /* blocks a step of 32 values covers */
    /* lane -> block within the 8 of c: for step 0, then + per a step */
    const __m256i idx0 = per == 1 ? _mm256_setzero_si256() : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i inc = _mm256_set1_epi32((int)per);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w + n * K;
        const float *sc = scales + n * nb;
        for (int64_t r = 0; r < R; r++) {
            const int8_t *x = xq + r * K;
            const float *dx = xd + r * nb;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            for (int64_t b0 = 0; b0 < nb; b0 += 8) {  /* 8 blocks: 8 steps (bs 32) or 4 (bs 16) */
                float c[8] = {0};
                const int64_t m = nb - b0 < 8 ? nb - b0 : 8;
                if (m == 8)
                    _mm256_storeu_ps(c, _mm256_mul_ps(_mm256_loadu_ps(sc + b0), _mm256_loadu_ps(dx + b0)));
                else
                    for (int64_t i = 0; i < m; i++) c[i] = sc[b0 + i] * dx[b0 + i];
                const __m256 cv = _mm256_loadu_ps(c);
                __m256i idx = idx0;
                for (int64_t k = 0; k < m / per; k++, idx = _mm256_add_epi32(idx, inc)) {
                    const int64_t v0 = (b0 + k * per) * bs;  /* first value of the step */
                    _mm_prefetch((const char *)(row + v0) + DP_QMATMUL_PREFETCH, _MM_HINT_T0);
                    const __m256 f = _mm256_cvtepi32_ps(dot32(row + v0, x + v0));
                    if (k & 1)
                        acc1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(cv, idx), f, acc1);
                    else
                        acc0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(cv, idx), f, acc0);
                }
            }
            out[r * ldo + n] = hsum(_mm256_add_ps(acc0, acc1));
        }
    }
}

QROWS_AVX2(dp_qrows_avx2, , dot32_plain)
QROWS_AVX2(dp_qrows_avx_vnni, __attribute__((target("avxvnni"))), dot32_vnni)
