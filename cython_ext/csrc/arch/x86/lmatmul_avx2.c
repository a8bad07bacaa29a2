/* AVX2 layer products (lmatmul.h), built with -mavx2 -mfma -mf16c and chosen at run time;
 * the AVX-VNNI variant alone is compiled for AVX-VNNI (a target attribute) and runs only
 * where the CPU has it (the avx_vnni row of dp_isas).
 * A 64-byte step of the form is two 32-byte halves, rows 0-7 and 8-15; a pass takes one
 * half against up to 4 activation rows (lmatmul_avx2_body.h), two steps unpacked at a
 * time. */
#include <immintrin.h>
#include "../../dp_attn_ops.h"
#include "../../lmatmul.h"

/* Steps 2c and 2c + 1 of a unit's half hf (rows 8 hf .. 8 hf + 7) as uint8 values. */
static inline __attribute__((always_inline)) void unpack2(const int kind, const uint8_t *u, const int hf, const int c,
                                                          __m256i *v0, __m256i *v1) {
    const __m256i lo = _mm256_set1_epi8(0x0f);
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(u + 64 * c + 32 * hf));
    *v0 = _mm256_and_si256(raw, lo);
    *v1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo);
    if (kind == DP_L_Q5_0) { /* 32 bits -> 32 bytes: byte i takes bit i % 8 of byte i / 8 */
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                              3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        __m256i *v[2] = {v0, v1};
        for (int k = 0; k < 2; k++) {
            int32_t m;
            memcpy(&m, u + 256 + 8 * (2 * c + k) + 4 * hf, 4);
            const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(m), pick), bits);
            *v[k] = _mm256_or_si256(*v[k], _mm256_and_si256(_mm256_cmpeq_epi8(b, bits), _mm256_set1_epi8(0x10)));
        }
    } else if (kind == DP_L_Q6_K) { /* step j's bits 4-5 at bits 2 (j % 4) of plane j / 4 */
        const __m256i hi = _mm256_set1_epi8(0x30);
        const __m256i p = _mm256_loadu_si256((const __m256i *)(u + 256 + 64 * (c / 2) + 32 * hf));
        if (c % 2 == 0) {
            *v0 = _mm256_or_si256(*v0, _mm256_and_si256(_mm256_slli_epi16(p, 4), hi));
            *v1 = _mm256_or_si256(*v1, _mm256_and_si256(_mm256_slli_epi16(p, 2), hi));
        } else {
            *v0 = _mm256_or_si256(*v0, _mm256_and_si256(p, hi));
            *v1 = _mm256_or_si256(*v1, _mm256_and_si256(_mm256_srli_epi16(p, 2), hi));
        }
    }
}

/* 8 uint8 / int8 / fp16 (one per row) as f32 lanes */
static inline __m256 u8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 i8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 f16_ps(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* An activation's 4 bytes in every lane (LM2_XB, lmatmul_avx2_body.h): the decode streams
 * broadcast them from memory, a load only. There set1 of the value made GCC keep it in a
 * general register, as every stream shares it, and each use took a move to a vector
 * register and a shuffle; a prefill pass, whose rows differ, is a little faster with set1. */
static inline __m256i x4(const int32_t *p) { return _mm256_castps_si256(_mm256_broadcast_ss((const float *)p)); }

/* The chunks (pairs of steps) of part p: Q6_K's two halves of 16 values, else the unit. */
#define LM2_CHUNKS(kind, p, c0, nc)                       \
    const int c0 = (kind) == DP_L_Q6_K ? 2 * (p) : 0;     \
    const int nc = (kind) == DP_L_Q6_K ? 2 : 4

/* The loops over a pass's rows are written out: rows in arrays (acc[RR], t[RR]) went to
 * the stack and back every unit, whatever the unrolling. M(i) is done for i < RR only. */
#define LM2_EACH(M) M(0) M(1) M(2) M(3)

/* An empty asm that claims to change v: GCC's reassociation otherwise turns a row's chain
 * of sums into a tree, and the 4 rows' products, all live at once, went to the stack. */
#define LM2_KEEP(v) __asm__("" : "+x"(v))

/* Without VNNI: maddubs, whose int16 pair sums are at most 2 x 127 x the values' largest,
 * then madd to int32. The int16 sums add up before one madd while they fit in 32,767:
 * 8 steps of Q4_K and Q4_0 (values below 16: 30,480), 4 of Q5_0 (below 32: 31,496), 2 of
 * Q6_K (below 64: 32,004). Q8_0's values reach 255, which maddubs would saturate: its
 * sums are taken on q = v - 128 (|q| times x with q's sign), so its offset is gone.
 * In the scope of the pass: RR, x0..x3 (the rows' activations of the unit as int32) and
 * t0..t3 (the sums). */
#define LM2_Q8_ROW_PLAIN(i)                                                                              \
    if ((i) < RR)                                                                                        \
        t##i = _mm256_add_epi32(t##i, _mm256_madd_epi16(_mm256_maddubs_epi16(                          \
                                          aq, _mm256_sign_epi8(LM2_XB(&x##i[j]), q)), one));
#define LM2_ROW_PLAIN(i)                                                                                 \
    if ((i) < RR) {                                                                                      \
        const __m256i pr = _mm256_add_epi16(_mm256_maddubs_epi16(v0, LM2_XB(&x##i[2 * c])),             \
                                            _mm256_maddubs_epi16(v1, LM2_XB(&x##i[2 * c + 1])));        \
        s16_##i = (c - c0) % fit ? _mm256_add_epi16(s16_##i, pr) : pr;                                  \
        LM2_KEEP(s16_##i);                                                                               \
        if ((c - c0) % fit == fit - 1) t##i = _mm256_add_epi32(t##i, _mm256_madd_epi16(s16_##i, w16));  \
    }
/* The madd that widens the int16 sums to int32 multiplies them by w16, in scope: ones, or
 * where a Q4_K superblock's sums are folded (dp_lact.sb256) the rows' block scales, each row's
 * in both halves of its lane (LM2_FOLD_W), so that the scale costs no instruction of its own:
 * 63 x 2 x 30,480 a unit, 8 units a superblock, stay within an int32. */
#define LM2_SUMS_PLAIN(kind, u, hf, p)                                                                   \
    do {                                                                                                 \
        const __m256i one = _mm256_set1_epi16(1);                                                        \
        if ((kind) == DP_L_Q8_0) {                                                                       \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                        \
                const __m256i q = _mm256_xor_si256(                                                      \
                    _mm256_loadu_si256((const __m256i *)((u) + 64 * j + 32 * (hf))), _mm256_set1_epi8((char)0x80)); \
                const __m256i aq = _mm256_abs_epi8(q);                                                   \
                LM2_EACH(LM2_Q8_ROW_PLAIN)                                                               \
            }                                                                                            \
            break;                                                                                       \
        }                                                                                                \
        const int fit = (kind) == DP_L_Q6_K ? 1 : (kind) == DP_L_Q5_0 ? 2 : 4; /* chunks a sum holds */ \
        LM2_CHUNKS(kind, p, c0, nc);                                                                     \
        __m256i s16_0 = one, s16_1 = one, s16_2 = one, s16_3 = one;                                      \
        _Pragma("GCC unroll 4") for (int c = c0; c < c0 + nc; c++) {                                     \
            __m256i v0, v1;                                                                              \
            unpack2(kind, u, hf, c, &v0, &v1);                                                           \
            LM2_EACH(LM2_ROW_PLAIN)                                                                      \
        }                                                                                                \
    } while (0)

/* A superblock's folded sums: the scales of unit b's 8 rows (u8 at p) as the vector the sums
 * take them in (LM2_FOLD_W), and a unit's sums t with them (LM2_FOLD). */
static inline __m256i sc_epi32(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256i sc_pairs(const uint8_t *p) { /* each row's scale in both int16 halves of its lane */
    const __m256i s = sc_epi32(p);
    return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}

#define LM2_ATTR
#define LM2_SUFFIX(n) n##_plain
#define LM2_SUMS(kind, u, hf, p) LM2_SUMS_PLAIN(kind, u, hf, p)
#define LM2_Q8_ZERO 0
#define LM2_FOLD_W(p) sc_pairs(p)
#define LM2_FOLD(t, w) (t)
#define LM2_FOLD_IN_SUMS 1
#include "lmatmul_avx2_body.h"
#undef LM2_ATTR
#undef LM2_SUFFIX
#undef LM2_SUMS
#undef LM2_Q8_ZERO
#undef LM2_FOLD_W
#undef LM2_FOLD
#undef LM2_FOLD_IN_SUMS

/* AVX-VNNI (VEX dpbusd: Intel's hybrid laptops from Alder Lake on, AMD from Zen 5), only
 * for this loop (a target attribute): uint8 by int8 straight into int32 lanes, Q8_0's
 * values as they are. */
#define LM2_ATTR __attribute__((target("avxvnni")))
#define LM2_SUFFIX(n) n##_vnni
#define LM2_Q8_ROW_VNNI(i) \
    if ((i) < RR) t##i = _mm256_dpbusd_avx_epi32(t##i, v, LM2_XB(&x##i[j]));
#define LM2_ROW_VNNI(i)                                                                                  \
    if ((i) < RR)                                                                                        \
        t##i = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(t##i, v0, LM2_XB(&x##i[2 * c])), v1,     \
                                       LM2_XB(&x##i[2 * c + 1]));
#define LM2_SUMS_VNNI(kind, u, hf, p)                                                                    \
    do {                                                                                                 \
        if ((kind) == DP_L_Q8_0) {                                                                       \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                        \
                const __m256i v = _mm256_loadu_si256((const __m256i *)((u) + 64 * j + 32 * (hf)));       \
                LM2_EACH(LM2_Q8_ROW_VNNI)                                                                \
            }                                                                                            \
            break;                                                                                       \
        }                                                                                                \
        LM2_CHUNKS(kind, p, c0, nc);                                                                     \
        _Pragma("GCC unroll 4") for (int c = c0; c < c0 + nc; c++) {                                     \
            __m256i v0, v1;                                                                              \
            unpack2(kind, u, hf, c, &v0, &v1);                                                           \
            LM2_EACH(LM2_ROW_VNNI)                                                                       \
        }                                                                                                \
    } while (0)
#define LM2_SUMS(kind, u, hf, p) LM2_SUMS_VNNI(kind, u, hf, p)
#define LM2_Q8_ZERO 128
#define LM2_FOLD_W(p) sc_epi32(p)
#define LM2_FOLD(t, w) _mm256_mullo_epi32(t, w) /* dpbusd's sums are int32 already: one multiply */
#define LM2_FOLD_IN_SUMS 0
#include "lmatmul_avx2_body.h"

void dp_lrows_avx2(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    lrows_plain(kind, w, g0, g1, a, out, ldo);
}

void dp_lrows_avx_vnni(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                       int64_t ldo) {
    lrows_vnni(kind, w, g0, g1, a, out, ldo);
}

/* ---- the activations' quantization (dp_lquant_fn) ---- */

/* The largest |v| of n floats (n a multiple of 32), as the reference's loop finds it. */
static inline __attribute__((always_inline)) float lquant_amax(const float *v, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* One block of 32 at d (inv = 1 / d), as the reference: q by cvtps (round to nearest even
 * under the default MXCSR: rintf's) where every |v * inv| < 127.5 (the finite blocks), else
 * 0 and nothing written, for the caller to hand the block to the reference. */
static inline __attribute__((always_inline)) int lquant_at(const float *v, float d, float inv, int8_t *xq, float *xd,
                                                           int32_t *xs, float *xm) {
    const __m256 sign = _mm256_set1_ps(-0.0f), vi = _mm256_set1_ps(inv), lim = _mm256_set1_ps(127.5f);
    __m256 y[4];
    __m256 in = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int i = 0; i < 4; i++) {
        y[i] = _mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), vi);
        in = _mm256_and_ps(in, _mm256_cmp_ps(_mm256_andnot_ps(sign, y[i]), lim, _CMP_LT_OQ));
    }
    if (__builtin_expect(_mm256_movemask_ps(in) != 0xff, 0)) return 0;
    /* packs interleave the 128-bit lanes: (a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7) */
    const __m256i ab = _mm256_packs_epi32(_mm256_cvtps_epi32(y[0]), _mm256_cvtps_epi32(y[1]));
    const __m256i cd = _mm256_packs_epi32(_mm256_cvtps_epi32(y[2]), _mm256_cvtps_epi32(y[3]));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
    _mm256_storeu_si256((__m256i *)xq, q);
    /* the sums of 16 as unsigned (q + 128) byte sums: psadbw against zero, 8 bytes a lane */
    const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
    const __m128i t = _mm_add_epi64(_mm_unpacklo_epi64(lo, hi), _mm_unpackhi_epi64(lo, hi));
    const int32_t a = _mm_cvtsi128_si32(t) - 2048, b = _mm_extract_epi32(t, 2) - 2048;
    *xd = d;
    xs[0] = a;
    xs[1] = b;
    *xm = d * (float)(a + b);
    return 1;
}

/* One block of 32 as lmatmul_avx512.c's: amax to a scalar, d and inv as the reference. */
static inline __attribute__((always_inline)) void lquant_block(const float *v, int8_t *xq, float *xd, int32_t *xs,
                                                               float *xm) {
    const float d = lquant_amax(v, 32) / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    if (!lquant_at(v, d, inv, xq, xd, xs, xm)) dp_lact_quantize(v, 1, 32, xq, xd, xs, xm);
}

void dp_lquant_avx2(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    for (int64_t b = 0; b < R * K / 32; b++) lquant_block(x + 32 * b, xq + 32 * b, xd + b, xs + 2 * b, xm + b);
}

void dp_lquant256_avx2(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    for (int64_t c = 0; c < R * K / 256; c++) {
        const float *v = x + 256 * c;
        const float d = lquant_amax(v, 256) / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        int ok = 1;
        for (int64_t b = 8 * c; b < 8 * c + 8 && ok; b++)
            ok = lquant_at(x + 32 * b, d, inv, xq + 32 * b, xd + b, xs + 2 * b, xm + b);
        if (!ok) dp_lact_quantize256(v, 1, 256, xq + 256 * c, xd + 8 * c, xs + 16 * c, xm + 8 * c);
    }
}
