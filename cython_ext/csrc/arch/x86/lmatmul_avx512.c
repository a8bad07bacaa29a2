/* AVX-512 layer products (lmatmul.h), built with -mavx512f -mavx512bw -mavx512vl (F16C
 * comes with them) and chosen at run time; the VNNI variant alone is compiled for VNNI
 * (a target attribute, not the file's flags) and runs only where the CPU has it (the
 * avx512_vnni row of dp_isas).
 * A unit's step is one 64-byte vector: 16 rows' 4 values in 16 int32 lanes, multiplied by
 * an int32 broadcast of the activation row's 4 values (dpbusd, or maddubs + madd). A pass
 * takes a group against up to 8 activation rows (lmatmul_avx512_body.h). */
#include <immintrin.h>
#include "../../dp_attn_ops.h"
#include "../../lmatmul.h"

/* Steps 2c and 2c + 1 of a unit as uint8 values (lmatmul.h's planes). */
static inline __attribute__((always_inline)) void unpack2(const int kind, const uint8_t *u, const int c, __m512i *v0,
                                                          __m512i *v1) {
    const __m512i lo = _mm512_set1_epi8(0x0f);
    const __m512i raw = _mm512_loadu_si512(u + 64 * c);
    *v0 = _mm512_and_si512(raw, lo);
    *v1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo);
    if (kind == DP_L_Q5_0) {
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        uint64_t m0, m1;
        memcpy(&m0, u + 256 + 8 * (2 * c), 8);
        memcpy(&m1, u + 256 + 8 * (2 * c + 1), 8);
        *v0 = _mm512_or_si512(*v0, _mm512_maskz_mov_epi8((__mmask64)m0, bit4));
        *v1 = _mm512_or_si512(*v1, _mm512_maskz_mov_epi8((__mmask64)m1, bit4));
    } else if (kind == DP_L_Q6_K) { /* step j's bits 4-5 at bits 2 (j % 4) of plane j / 4 */
        const __m512i hi = _mm512_set1_epi8(0x30);
        const __m512i p = _mm512_loadu_si512(u + 256 + 64 * (c / 2));
        if (c % 2 == 0) {
            *v0 = _mm512_or_si512(*v0, _mm512_and_si512(_mm512_slli_epi16(p, 4), hi));
            *v1 = _mm512_or_si512(*v1, _mm512_and_si512(_mm512_slli_epi16(p, 2), hi));
        } else {
            *v0 = _mm512_or_si512(*v0, _mm512_and_si512(p, hi));
            *v1 = _mm512_or_si512(*v1, _mm512_and_si512(_mm512_srli_epi16(p, 2), hi));
        }
    }
}

/* 16 uint8 / int8 (one per row) as f32 lanes */
static inline __m512 u8_ps(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __m512 i8_ps(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* The chunks (pairs of steps) of part p: Q6_K's two halves of 16 values, else the unit. */
#define LM_CHUNKS(kind, p, c0, nc)                    \
    const int c0 = (kind) == DP_L_Q6_K ? 2 * (p) : 0; \
    const int nc = (kind) == DP_L_Q6_K ? 2 : 4

/* The loops over a pass's rows are written out, as in lmatmul_avx2.c. M(i) is done for
 * i < RR only. */
#define LM_EACH(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define LM_KEEP(v) __asm__("" : "+v"(v))

/* Without VNNI (as lmatmul_avx2.c's, whose comment gives the int16 bounds): maddubs, the
 * int16 sums of 8 steps of Q4_K and Q4_0, 4 of Q5_0 and 2 of Q6_K added before one madd;
 * Q8_0 on q = v - 128 (|q| times x with q's sign, a masked negation). In the scope of the
 * pass: RR, x0..x7 (the rows' activations of the unit as int32) and t0..t7 (the sums). */
#define LM_Q8_ROW_BW(i)                                                                                   \
    if ((i) < RR) {                                                                                       \
        const __m512i xb = _mm512_set1_epi32(x##i[j]);                                                    \
        t##i = _mm512_add_epi32(                                                                          \
            t##i, _mm512_madd_epi16(_mm512_maddubs_epi16(aq, _mm512_mask_sub_epi8(xb, neg, zero, xb)), one)); \
    }
#define LM_ROW_BW(i)                                                                                      \
    if ((i) < RR) {                                                                                       \
        const __m512i pr = _mm512_add_epi16(_mm512_maddubs_epi16(v0, _mm512_set1_epi32(x##i[2 * c])),    \
                                            _mm512_maddubs_epi16(v1, _mm512_set1_epi32(x##i[2 * c + 1]))); \
        s16_##i = (c - c0) % fit ? _mm512_add_epi16(s16_##i, pr) : pr;                                   \
        LM_KEEP(s16_##i);                                                                                 \
        if ((c - c0) % fit == fit - 1) t##i = _mm512_add_epi32(t##i, _mm512_madd_epi16(s16_##i, one));   \
    }
#define LM_SUMS_BW(kind, u, p)                                                                            \
    do {                                                                                                  \
        const __m512i one = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();                          \
        if ((kind) == DP_L_Q8_0) {                                                                        \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                         \
                const __m512i q = _mm512_xor_si512(_mm512_loadu_si512((u) + 64 * j), _mm512_set1_epi8((char)0x80)); \
                const __m512i aq = _mm512_abs_epi8(q);                                                    \
                const __mmask64 neg = _mm512_movepi8_mask(q);                                             \
                LM_EACH(LM_Q8_ROW_BW)                                                                     \
            }                                                                                             \
            break;                                                                                        \
        }                                                                                                 \
        const int fit = (kind) == DP_L_Q6_K ? 1 : (kind) == DP_L_Q5_0 ? 2 : 4; /* chunks a sum holds */  \
        LM_CHUNKS(kind, p, c0, nc);                                                                       \
        __m512i s16_0 = one, s16_1 = one, s16_2 = one, s16_3 = one, s16_4 = one, s16_5 = one, s16_6 = one, \
                s16_7 = one;                                                                              \
        _Pragma("GCC unroll 4") for (int c = c0; c < c0 + nc; c++) {                                      \
            __m512i v0, v1;                                                                               \
            unpack2(kind, u, c, &v0, &v1);                                                                \
            LM_EACH(LM_ROW_BW)                                                                            \
        }                                                                                                 \
    } while (0)

#define LM_ATTR
#define LM_SUFFIX(n) n##_bw
#define LM_SUMS(kind, u, p) LM_SUMS_BW(kind, u, p)
#define LM_Q8_ZERO 0
#include "lmatmul_avx512_body.h"
#undef LM_ATTR
#undef LM_SUFFIX
#undef LM_SUMS
#undef LM_Q8_ZERO

/* VNNI: dpbusd multiplies uint8 by int8 straight into int32 lanes, Q8_0's stored q + 128
 * as they are (its offset is taken off with the others'). */
#define LM_Q8_ROW_VNNI(i) \
    if ((i) < RR) t##i = _mm512_dpbusd_epi32(t##i, v, _mm512_set1_epi32(x##i[j]));
#define LM_ROW_VNNI(i)                                                                                    \
    if ((i) < RR)                                                                                         \
        t##i = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t##i, v0, _mm512_set1_epi32(x##i[2 * c])), v1,    \
                                   _mm512_set1_epi32(x##i[2 * c + 1]));
#define LM_SUMS_VNNI(kind, u, p)                                                                          \
    do {                                                                                                  \
        if ((kind) == DP_L_Q8_0) {                                                                        \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                         \
                const __m512i v = _mm512_loadu_si512((u) + 64 * j);                                       \
                LM_EACH(LM_Q8_ROW_VNNI)                                                                   \
            }                                                                                             \
            break;                                                                                        \
        }                                                                                                 \
        LM_CHUNKS(kind, p, c0, nc);                                                                       \
        _Pragma("GCC unroll 4") for (int c = c0; c < c0 + nc; c++) {                                      \
            __m512i v0, v1;                                                                               \
            unpack2(kind, u, c, &v0, &v1);                                                                \
            LM_EACH(LM_ROW_VNNI)                                                                          \
        }                                                                                                 \
    } while (0)

#define LM_ATTR __attribute__((target("avx512vnni")))
#define LM_SUFFIX(n) n##_vnni
#define LM_SUMS(kind, u, p) LM_SUMS_VNNI(kind, u, p)
#define LM_Q8_ZERO 128
#include "lmatmul_avx512_body.h"

void dp_lrows_avx512(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                     int64_t ldo) {
    lrows_bw(kind, w, g0, g1, a, out, ldo);
}

void dp_lrows_avx512_vnni(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                          int64_t ldo) {
    lrows_vnni(kind, w, g0, g1, a, out, ldo);
}

/* ---- the activations' quantization (dp_lquant_fn) ---- */

/* One block of 32: amax over both halves to a scalar (max is exact in any order), d and inv
 * in scalar f32 as the reference computes them, q = cvtps (round to nearest even under the
 * default MXCSR: rintf's) where every |v * inv| < 127.5, else the reference takes the block
 * (an infinity or NaN, or a block so tiny that 1 / d overflows, where the reference's
 * conversion of an out-of-range float decides the bytes). */
static inline __attribute__((always_inline)) void lquant_block(const float *v, int8_t *xq, float *xd, int32_t *xs,
                                                               float *xm) {
    const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1));
    const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4), d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    const __m512 vi = _mm512_set1_ps(inv), lim = _mm512_set1_ps(127.5f);
    const __m512 y0 = _mm512_mul_ps(v0, vi), y1 = _mm512_mul_ps(v1, vi);
    const __mmask16 in0 = _mm512_cmp_ps_mask(_mm512_abs_ps(y0), lim, _CMP_LT_OQ);
    const __mmask16 in1 = _mm512_cmp_ps_mask(_mm512_abs_ps(y1), lim, _CMP_LT_OQ);
    if (__builtin_expect((in0 & in1) != 0xffff, 0)) {
        dp_lact_quantize(v, 1, 32, xq, xd, xs, xm);
        return;
    }
    const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(y0));
    const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(y1));
    _mm_storeu_si128((__m128i *)xq, q0);
    _mm_storeu_si128((__m128i *)(xq + 16), q1);
    /* the sums of 16 as unsigned (q + 128) byte sums: psadbw against zero */
    const __m128i flip = _mm_set1_epi8((char)0x80), z = _mm_setzero_si128();
    const __m128i s0 = _mm_sad_epu8(_mm_xor_si128(q0, flip), z), s1 = _mm_sad_epu8(_mm_xor_si128(q1, flip), z);
    const __m128i s = _mm_add_epi64(_mm_unpacklo_epi64(s0, s1), _mm_unpackhi_epi64(s0, s1));
    const int32_t a = _mm_cvtsi128_si32(s) - 2048, b = _mm_extract_epi32(s, 2) - 2048;
    *xd = d;
    xs[0] = a;
    xs[1] = b;
    *xm = d * (float)(a + b);
}

void dp_lquant_avx512(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    for (int64_t b = 0; b < R * K / 32; b++) lquant_block(x + 32 * b, xq + 32 * b, xd + b, xs + 2 * b, xm + b);
}
