/* AVX2 layer products (lmatmul.h), built with -mavx2 -mfma -mf16c and chosen at run time.
 * A 64-byte step of the form is two 32-byte halves, rows 0-7 and 8-15; with 16 vector
 * registers a pass takes one half against 2 activation rows, its 8 steps unpacked once:
 * maddubs pairs (|v x| <= 63 x 128 x 2 fits int16) then madd to int32 lanes. Q8_0's values
 * reach 255, which maddubs would saturate: they go as int8 q = v - 128 (|q| and x with
 * q's sign), plus 128 x the 4 activations' sum. */
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

static inline __attribute__((always_inline)) void pass(const int kind, const uint8_t *gw, const int hf,
                                                       const dp_lact *a, const int64_t r0, const int RR, float *out,
                                                       const int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t K = a->K, nsb = K / k->sb, units = k->sb / 32, sbb = k->header + units * k->unit;
    __m256 acc[2], macc[2];
    for (int i = 0; i < RR; i++) acc[i] = macc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        const __m256 d = f16_ps(h + 16 * hf);
        if (hf == 0 && r0 == 0) dp_lprefetch(h, k->header);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + k->header + b * k->unit;
            if (hf == 0 && r0 == 0) dp_lprefetch(unit, k->unit);
            __m256i v[8];
            unpack(kind, unit, hf, v);
            const int64_t kb = s * units + b;
            __m256 s0 = d, s1 = d, o = d;
            if (kind == DP_L_Q4_K) {
                s0 = _mm256_mul_ps(d, u8_ps(h + 64 + 16 * b + 8 * hf));
                o = _mm256_mul_ps(f16_ps(h + 32 + 16 * hf), u8_ps(h + 192 + 16 * b + 8 * hf));
            } else if (kind == DP_L_Q6_K) {
                s0 = _mm256_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b) + 8 * hf));
                s1 = _mm256_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + 1) + 8 * hf));
            }
            for (int i = 0; i < RR; i++) {
                const int64_t r = r0 + i;
                const int32_t *x = (const int32_t *)(a->xq + r * K + 32 * kb);
                const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;
                const __m256 dx = _mm256_set1_ps(a->xd[r * (K / 32) + kb]);
                __m256i d0 = _mm256_setzero_si256(), d1 = _mm256_setzero_si256();
                for (int j = 0; j < 4; j++) d0 = dot(kind, d0, v[j], _mm256_set1_epi32(x[j]));
                for (int j = 4; j < 8; j++) d1 = dot(kind, d1, v[j], _mm256_set1_epi32(x[j]));
                if (kind == DP_L_Q6_K) { /* two scales: the halves of 16 apart */
                    d0 = _mm256_sub_epi32(d0, _mm256_set1_epi32(32 * xs[0]));
                    d1 = _mm256_sub_epi32(d1, _mm256_set1_epi32(32 * xs[1]));
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(d0), acc[i]);
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(s1, dx), _mm256_cvtepi32_ps(d1), acc[i]);
                    continue;
                }
                __m256i dt = _mm256_add_epi32(d0, d1);
                const int32_t sum = xs[0] + xs[1];
                if (kind == DP_L_Q4_K) {
                    macc[i] = _mm256_fmadd_ps(o, _mm256_mul_ps(dx, _mm256_set1_ps((float)sum)), macc[i]);
                } else {
                    const int32_t z = dp_lkind_zero_point(kind);
                    dt = _mm256_sub_epi32(dt, _mm256_set1_epi32(z * sum));
                }
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(dt), acc[i]);
            }
        }
    }
    for (int i = 0; i < RR; i++) _mm256_storeu_ps(out + (r0 + i) * ldo + 8 * hf, _mm256_sub_ps(acc[i], macc[i]));
}

static inline __attribute__((always_inline)) void groups(const int kind, const uint8_t *w, int64_t g0, int64_t g1,
                                                         const dp_lact *a, float *out, int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t gstride = a->K / k->sb * (k->header + k->sb / 32 * k->unit);
    for (int64_t g = g0; g < g1; g++)
        for (int hf = 0; hf < 2; hf++) {
            int64_t r = 0;
            for (; r + 2 <= a->R; r += 2) pass(kind, w + g * gstride, hf, a, r, 2, out + 16 * g, ldo);
            if (r < a->R) pass(kind, w + g * gstride, hf, a, r, 1, out + 16 * g, ldo);
        }
}

void dp_lrows_avx2(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    DP_LKIND_DISPATCH(kind, groups, w, g0, g1, a, out, ldo)
}
