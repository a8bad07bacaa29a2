/* AVX-512 layer products (lmatmul.h), built with -mavx512f -mavx512bw -mavx512vl (F16C
 * comes with them) and chosen at run time; the VNNI variant alone is compiled for VNNI
 * (a target attribute, not the file's flags) and runs only where the CPU has it (the
 * avx512_vnni row of dp_isas).
 * A unit's step is one 64-byte vector: 16 rows' 4 values in 16 int32 lanes, multiplied by
 * an int32 broadcast of the activation row's 4 values (dpbusd, or maddubs + madd). */
#include <immintrin.h>
#include "dp_attn_ops.h"
#include "lmatmul.h"

/* A unit's 8 steps as uint8 values (lmatmul.h's planes). */
static inline __attribute__((always_inline)) void unpack(const int kind, const uint8_t *u, __m512i v[8]) {
    if (kind == DP_L_Q8_0) {
        for (int j = 0; j < 8; j++) v[j] = _mm512_loadu_si512(u + 64 * j);
        return;
    }
    const __m512i lo = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        const __m512i raw = _mm512_loadu_si512(u + 64 * c);
        v[2 * c] = _mm512_and_si512(raw, lo);
        v[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo);
    }
    if (kind == DP_L_Q5_0) {
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        for (int j = 0; j < 8; j++) {
            uint64_t m;
            memcpy(&m, u + 256 + 8 * j, 8);
            v[j] = _mm512_or_si512(v[j], _mm512_maskz_mov_epi8((__mmask64)m, bit4));
        }
    } else if (kind == DP_L_Q6_K) {
        const __m512i hi = _mm512_set1_epi8(0x30);
        for (int c = 0; c < 2; c++) {
            const __m512i p = _mm512_loadu_si512(u + 256 + 64 * c);
            v[4 * c + 0] = _mm512_or_si512(v[4 * c + 0], _mm512_and_si512(_mm512_slli_epi16(p, 4), hi));
            v[4 * c + 1] = _mm512_or_si512(v[4 * c + 1], _mm512_and_si512(_mm512_slli_epi16(p, 2), hi));
            v[4 * c + 2] = _mm512_or_si512(v[4 * c + 2], _mm512_and_si512(p, hi));
            v[4 * c + 3] = _mm512_or_si512(v[4 * c + 3], _mm512_and_si512(_mm512_srli_epi16(p, 2), hi));
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

/* Without VNNI: maddubs pairs (|v x| <= 63 x 128 x 2 fits int16), madd to int32. Q8_0's
 * values reach 255, which maddubs would saturate: they go as int8 q = v - 128 (|q| and x
 * with q's sign), plus 128 x the 4 activations' sum. */
static inline __m512i dot_bw(__m512i a, __m512i v, __m512i x) {
    return _mm512_add_epi32(a, _mm512_madd_epi16(_mm512_maddubs_epi16(v, x), _mm512_set1_epi16(1)));
}
static inline __m512i wide_dot_bw(__m512i a, __m512i v, __m512i x) {
    const __m512i q = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
    const __m512i qx = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), sx), _mm512_set1_epi16(1));
    const __m512i xsum = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), x), _mm512_set1_epi16(1));
    return _mm512_add_epi32(a, _mm512_add_epi32(qx, _mm512_slli_epi32(xsum, 7)));
}

#define LM_ATTR
#define LM_SUFFIX(n) n##_bw
#define LM_DOT(a, v, x) dot_bw(a, v, x)
#define LM_WIDE_DOT(a, v, x) wide_dot_bw(a, v, x)
#include "lmatmul_avx512_body.h"
#undef LM_ATTR
#undef LM_SUFFIX
#undef LM_DOT
#undef LM_WIDE_DOT

#define LM_ATTR __attribute__((target("avx512vnni")))
#define LM_SUFFIX(n) n##_vnni
#define LM_DOT(a, v, x) _mm512_dpbusd_epi32(a, v, x)
#define LM_WIDE_DOT(a, v, x) _mm512_dpbusd_epi32(a, v, x)
#include "lmatmul_avx512_body.h"

void dp_lrows_avx512(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                     int64_t ldo) {
    lrows_bw(kind, w, g0, g1, a, out, ldo);
}

void dp_lrows_avx512_vnni(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                          int64_t ldo) {
    lrows_vnni(kind, w, g0, g1, a, out, ldo);
}
