/* AVX2 layer products (lmatmul.h), built with -mavx2 -mfma -mf16c and chosen at run time;
 * the AVX-VNNI variant alone is compiled for AVX-VNNI (a target attribute) and runs only
 * where the CPU has it (the avx_vnni row of dp_isas).
 * A 64-byte step of the form is two 32-byte halves, rows 0-7 and 8-15; with 16 vector
 * registers a pass takes one half against 2 activation rows, its 8 steps unpacked once
 * (lmatmul_avx2_body.h). Without VNNI: maddubs pairs (|v x| <= 63 x 128 x 2 fits int16)
 * then madd to int32 lanes; Q8_0's values reach 255, which maddubs would saturate: they go
 * as int8 q = v - 128 (|q| and x with q's sign), plus 128 x the 4 activations' sum. */
#include <immintrin.h>
#include "dp_attn_ops.h"
#include "lmatmul.h"

/* Half `hf` (rows 8 hf .. 8 hf + 7) of a unit's 8 steps as uint8 values. */
static inline __attribute__((always_inline)) void unpack(const int kind, const uint8_t *u, const int hf,
                                                         __m256i v[8]) {
    if (kind == DP_L_Q8_0) {
        for (int j = 0; j < 8; j++) v[j] = _mm256_loadu_si256((const __m256i *)(u + 64 * j + 32 * hf));
        return;
    }
    const __m256i lo = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(u + 64 * c + 32 * hf));
        v[2 * c] = _mm256_and_si256(raw, lo);
        v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo);
    }
    if (kind == DP_L_Q5_0) { /* 32 bits -> 32 bytes: byte i takes bit i % 8 of byte i / 8 */
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                              3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        for (int j = 0; j < 8; j++) {
            int32_t m;
            memcpy(&m, u + 256 + 8 * j + 4 * hf, 4);
            const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(m), pick), bits);
            v[j] = _mm256_or_si256(v[j], _mm256_and_si256(_mm256_cmpeq_epi8(b, bits), _mm256_set1_epi8(0x10)));
        }
    } else if (kind == DP_L_Q6_K) {
        const __m256i hi = _mm256_set1_epi8(0x30);
        for (int c = 0; c < 2; c++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(u + 256 + 64 * c + 32 * hf));
            v[4 * c + 0] = _mm256_or_si256(v[4 * c + 0], _mm256_and_si256(_mm256_slli_epi16(p, 4), hi));
            v[4 * c + 1] = _mm256_or_si256(v[4 * c + 1], _mm256_and_si256(_mm256_slli_epi16(p, 2), hi));
            v[4 * c + 2] = _mm256_or_si256(v[4 * c + 2], _mm256_and_si256(p, hi));
            v[4 * c + 3] = _mm256_or_si256(v[4 * c + 3], _mm256_and_si256(_mm256_srli_epi16(p, 2), hi));
        }
    }
}

static inline __m256i dot(const int kind, __m256i a, __m256i v, __m256i x) {
    const __m256i one = _mm256_set1_epi16(1);
    if (kind != DP_L_Q8_0) return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), one));
    const __m256i q = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    const __m256i qx = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)), one);
    const __m256i xsum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), one);
    return _mm256_add_epi32(a, _mm256_add_epi32(qx, _mm256_slli_epi32(xsum, 7)));
}

/* 8 uint8 / int8 / fp16 (one per row) as f32 lanes */
static inline __m256 u8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 i8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 f16_ps(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Four steps without VNNI. maddubs' int16 pair sums are at most 2 x 31 x 127 = 7,874 for
 * values below 32 (Q4_K, Q4_0, Q5_0), so four steps add up in int16 before one madd widens
 * them; Q6_K's (below 64: 16,002) two at a time; Q8_0's one at a time (dot). */
static inline __attribute__((always_inline)) __m256i dot4(const int kind, __m256i a, const __m256i *v,
                                                          const int32_t *x) {
    const __m256i one = _mm256_set1_epi16(1);
#define P(j) _mm256_maddubs_epi16(v[j], _mm256_set1_epi32(x[j]))
    if (kind == DP_L_Q8_0) {
        for (int j = 0; j < 4; j++) a = dot(kind, a, v[j], _mm256_set1_epi32(x[j]));
        return a;
    }
    if (kind == DP_L_Q6_K) {
        a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_add_epi16(P(0), P(1)), one));
        return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_add_epi16(P(2), P(3)), one));
    }
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(P(0), P(1)),
                                                                  _mm256_add_epi16(P(2), P(3))), one));
#undef P
}

#define LM2_ATTR
#define LM2_SUFFIX(n) n##_plain
#define LM2_DOT4(kind, a, v, x) dot4(kind, a, v, x)
#include "lmatmul_avx2_body.h"
#undef LM2_ATTR
#undef LM2_SUFFIX
#undef LM2_DOT4

/* AVX-VNNI (VEX dpbusd: Intel's hybrid laptops from Alder Lake on, AMD from Zen 5), only
 * for this loop (a target attribute): uint8 by int8 straight into int32 lanes, Q8_0's
 * values as they are. */
#define LM2_ATTR __attribute__((target("avxvnni")))
#define LM2_SUFFIX(n) n##_vnni
__attribute__((target("avxvnni"))) static inline __m256i dot4_vnni(__m256i a, const __m256i *v, const int32_t *x) {
    for (int j = 0; j < 4; j++) a = _mm256_dpbusd_avx_epi32(a, v[j], _mm256_set1_epi32(x[j]));
    return a;
}
#define LM2_DOT4(kind, a, v, x) dot4_vnni(a, v, x)
#include "lmatmul_avx2_body.h"

void dp_lrows_avx2(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    lrows_plain(kind, w, g0, g1, a, out, ldo);
}

void dp_lrows_avx_vnni(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                       int64_t ldo) {
    lrows_vnni(kind, w, g0, g1, a, out, ldo);
}
