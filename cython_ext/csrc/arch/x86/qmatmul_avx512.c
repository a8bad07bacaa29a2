/* AVX-512 classifier rows (qmatmul.h), built with -mavx512f -mavx512bw -mavx512vl and
 * chosen at run time; the VNNI loop alone is compiled for VNNI (a target attribute, not
 * the file's flags) and runs only where the CPU has it (the avx512_vnni row of dp_isas).
 * 64 values a step, 16 int32 lanes of 4 values: two blocks of 32 (8 lanes each) or four
 * of 16 (4 each). With VNNI, dpbusd multiplies the stored uint8 values (w = q + 128)
 * by the int8 activations straight into int32 lanes that start at -128 x the sum of their
 * 4 activations (made once per activation row), which leaves sum q x; without it, maddubs
 * on |q| and x with q's sign, as the AVX2 file. Each lane then takes its block's scale (16
 * blocks at a time, permuted). */
#include <immintrin.h>
#include "../../qmatmul.h"

static inline __m512i dot64_bw(__m512i wv, __m512i xv) {
    const __m512i q = _mm512_xor_si512(wv, _mm512_set1_epi8((char)0x80));
    const __mmask64 neg = _mm512_movepi8_mask(q);
    const __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), sx), _mm512_set1_epi16(1));
}

/* sum q x for q = w - 128: dpbusd of the stored values onto -128 x the activations'
 * sums of 4 (corr, made once per activation row) */
__attribute__((target("avx512vnni"))) static inline __m512i dot64_vnni(__m512i wv, __m512i xv, __m512i corr) {
    return _mm512_dpbusd_epi32(corr, wv, xv);
}

/* Lane -> block index within a group of 16 blocks: idx for step 0, then + per a step. */
static inline __m512i first_idx(int64_t per) {
    return per == 2 ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                    : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
}

/* One row n of w against activation row r, with two FMA chains. */
#define QROWS_AVX512_ROW(DOT)                                                                          \
    {                                                                                              \
        const uint8_t *row = w + n * K;                                                            \
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};                                \
        for (int64_t s0 = 0; s0 < steps; s0 += 16 / per) { /* 16 blocks of scales */              \
            const int64_t b0 = s0 * per, m = nb - b0 < 16 ? nb - b0 : 16;                           \
            const __mmask16 mk = (__mmask16)((1u << m) - 1u);                                      \
            const __m512 cv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, scales + n * nb + b0),       \
                                            _mm512_maskz_loadu_ps(mk, dx + b0));                   \
            const int64_t s1 = s0 + (m + per - 1) / per;                                           \
            __m512i idx = idx0;                                                                    \
            for (int64_t s = s0; s < s1; s++, idx = _mm512_add_epi32(idx, inc)) {                  \
                /* a last step of 32 values (K is whole 32s) reads its half: zeros add nothing */ \
                const int half = 64 * s + 64 > K;                                                  \
                const __mmask64 bm = half ? 0xffffffffull : ~0ull;                                 \
                const __mmask16 lm = half ? 0x00ff : 0xffff;                                       \
                const __m512i xv = _mm512_maskz_loadu_epi8(bm, x + 64 * s);                        \
                const __m512i wv = _mm512_maskz_loadu_epi8(bm, row + 64 * s);                      \
                (void)lm;                                                                          \
                _mm_prefetch((const char *)(row + 64 * s) + DP_QMATMUL_PREFETCH, _MM_HINT_T0);     \
                const __m512 f = _mm512_cvtepi32_ps(DOT);                                          \
                acc[s & 1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, cv), f, acc[s & 1]);       \
            }                                                                                      \
        }                                                                                          \
        out[r * ldo + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));                    \
    }

#define QROWS_AVX512(NAME, ATTR, DOT)                                                                  \
    ATTR static void NAME(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K, \
                          const int8_t *xq, const float *xd, const int32_t *corr, int64_t R, float *out,  \
                          int64_t ldo) {                                                               \
        const int64_t nb = K / bs, per = 64 / bs; /* blocks a step of 64 values covers */          \
        const int64_t steps = (K + 63) / 64;                                                       \
        const __m512i idx0 = first_idx(per), inc = _mm512_set1_epi32((int)per);                   \
        for (int64_t r = 0; r < R; r++) {                                                          \
            const int8_t *x = xq + r * K;                                                          \
            const float *dx = xd + r * nb;                                                         \
            const int32_t *cr = corr ? corr + r * (K / 4) : NULL;                                  \
            (void)cr;                                                                              \
            for (int64_t n = n0; n < n1; n++) QROWS_AVX512_ROW(DOT)                                \
        }                                                                                          \
    }

QROWS_AVX512(qrows_bw, , dot64_bw(wv, xv))
QROWS_AVX512(qrows_vnni, __attribute__((target("avx512vnni"))),
             dot64_vnni(wv, xv, _mm512_maskz_loadu_epi32(lm, cr + 16 * s)))

void dp_qrows_avx512(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                     const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    qrows_bw(w, scales, bs, n0, n1, K, xq, xd, NULL, R, out, ldo);
}

void dp_qrows_avx512_vnni(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                          const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    /* -128 x the sum of each 4 activations, once for all the task's rows of w; in
     * chunks of rows so that it stays on the stack (K / 4 int32 a row). */
    int32_t corr[2048];
    const int64_t per_chunk = K / 4 <= 2048 ? 2048 / (K / 4) : 0;
    if (!per_chunk) {  /* K above 8,192: without the precomputed sums */
        qrows_bw(w, scales, bs, n0, n1, K, xq, xd, NULL, R, out, ldo);
        return;
    }
    for (int64_t r0 = 0; r0 < R; r0 += per_chunk) {
        const int64_t rn = R - r0 < per_chunk ? R - r0 : per_chunk;
        for (int64_t i = 0; i < rn * K / 4; i++) {
            const int8_t *x = xq + r0 * K + 4 * i;
            corr[i] = -128 * (x[0] + x[1] + x[2] + x[3]);
        }
        qrows_vnni(w, scales, bs, n0, n1, K, xq + r0 * K, xd + r0 * (K / bs), corr, rn, out + r0 * ldo, ldo);
    }
}
