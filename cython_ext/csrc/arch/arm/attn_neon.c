/* AArch64 Advanced SIMD attention building blocks (baseline ARMv8-A: every aarch64
 * CPU has them). f16 rows are widened with FCVTL, which is baseline too. */
#include <arm_neon.h>
#include "../../dp_attn_ops.h"

static inline float32x4_t load_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

#define F32_ID(x) (x)
#define Q8_TAIL(x) ((float)(x))

/* Scores of 4 tokens at a time (one vector of K^T per dimension) for G query heads:
 * accumulators stay in registers, no horizontal reductions; tails are scalar. */
#define DEFINE_SCORES(NAME, T, LOAD, TAIL)                                                        \
    static inline __attribute__((always_inline)) void NAME##_blk(                                  \
        const float *q, const int G, int64_t hd, const T *kt, int64_t ldk, const float *ks, int64_t n, \
        float scale, float *scores, int64_t sstride) {                                             \
        int64_t r0 = 0;                                                                            \
        for (; r0 + 4 <= n; r0 += 4) {                                                             \
            float32x4_t acc[8];                                                                    \
            for (int g = 0; g < G; g++) acc[g] = vdupq_n_f32(0.0f);                                \
            for (int64_t e = 0; e < hd; e++) {                                                     \
                const float32x4_t k = LOAD(kt + e * ldk + r0);                                     \
                for (int g = 0; g < G; g++) acc[g] = vfmaq_n_f32(acc[g], k, q[g * hd + e]);        \
            }                                                                                      \
            for (int g = 0; g < G; g++) vst1q_f32(scores + g * sstride + r0, vmulq_n_f32(acc[g], scale)); \
        }                                                                                          \
        DP_SCORES_SCALAR_TAIL(TAIL)                                                                \
    }                                                                                              \
    DP_DEFINE_SCORES_GROUPS(NAME, T)

DEFINE_SCORES(scores_f32, float, vld1q_f32, F32_ID)
DEFINE_SCORES(scores_f16, uint16_t, load_f16, dp_half_to_float)

/* 8 int8 values widened to two f32 vectors (SXTL, SXTL, SCVTF): exact. */
static inline void load_q8x8(const int8_t *p, float32x4_t *lo, float32x4_t *hi) {
    const int16x8_t w = vmovl_s8(vld1_s8(p));
    *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
    *hi = vcvtq_f32_s32(vmovl_high_s16(w));
}

/* q8 scores: 8 tokens per step (one 8-byte load of K^T per dimension, two f32
 * vectors) for G <= 8 query heads, 2 * G accumulators in registers; the tokens'
 * scales multiply the finished dot products once. Tails are scalar. */
static inline __attribute__((always_inline)) void scores_q8_blk(const float *q, const int G, int64_t hd,
                                                                const int8_t *kt, int64_t ldk, const float *ks,
                                                                int64_t n, float scale, float *scores,
                                                                int64_t sstride) {
    int64_t r0 = 0;
    for (; r0 + 8 <= n; r0 += 8) {
        float32x4_t lo[8], hi[8];
        for (int g = 0; g < G; g++) lo[g] = hi[g] = vdupq_n_f32(0.0f);
        for (int64_t e = 0; e < hd; e++) {
            float32x4_t kl, kh;
            load_q8x8(kt + e * ldk + r0, &kl, &kh);
            for (int g = 0; g < G; g++) {
                lo[g] = vfmaq_n_f32(lo[g], kl, q[g * hd + e]);
                hi[g] = vfmaq_n_f32(hi[g], kh, q[g * hd + e]);
            }
        }
        const float32x4_t sl = vmulq_n_f32(vld1q_f32(ks + r0), scale), sh = vmulq_n_f32(vld1q_f32(ks + r0 + 4), scale);
        for (int g = 0; g < G; g++) {
            vst1q_f32(scores + g * sstride + r0, vmulq_f32(lo[g], sl));
            vst1q_f32(scores + g * sstride + r0 + 4, vmulq_f32(hi[g], sh));
        }
    }
    DP_SCORES_SCALAR_TAIL(Q8_TAIL)
}
DP_DEFINE_SCORES_GROUPS_SCALED(scores_q8, int8_t)

#define ACCUM_BODY(LOAD, TAIL)                                                                    \
    int64_t e = 0;                                                                                \
    for (; e + 4 <= hd; e += 4) {                                                                 \
        for (int64_t g = 0; g < group; g++) {                                                     \
            float32x4_t acc = vld1q_f32(o + g * hd + e);                                           \
            const float *pg = p + g * sstride;                                                    \
            for (int64_t r = 0; r < n; r++) acc = vfmaq_n_f32(acc, LOAD(rows + r * hd + e), pg[r]); \
            vst1q_f32(o + g * hd + e, acc);                                                       \
        }                                                                                         \
    }                                                                                             \
    for (; e < hd; e++)                                                                           \
        for (int64_t g = 0; g < group; g++)                                                       \
            for (int64_t r = 0; r < n; r++) o[g * hd + e] += p[g * sstride + r] * TAIL(rows[r * hd + e]);

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                      const float *vs, int64_t n, float *o) {
    const float *rows = (const float *)rows_;
    (void)vs;
    ACCUM_BODY(vld1q_f32, F32_ID)
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                      const float *vs, int64_t n, float *o) {
    const uint16_t *rows = (const uint16_t *)rows_;
    (void)vs;
    ACCUM_BODY(load_f16, dp_half_to_float)
}

/* q8: for up to 8 query heads and 128 rows at a time, each row's scale first folds
 * into the weights (w, 4 rows per multiply); then blocks of 8 dims x those heads stay
 * in registers (16 accumulators) while each V row's 8 values are widened once. The
 * rest of head_dim (< 8 dims) is scalar. */
static void accum_q8(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                     const float *vs, int64_t n, float *o) {
    const int8_t *rows = (const int8_t *)rows_;
    enum { HEADS = 8, ROWS = 128 };
    float w[HEADS * ROWS]; /* (heads, ROWS): p * vs */
    for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
        const int64_t m = n - r0 < ROWS ? n - r0 : ROWS;
        const int8_t *rw = rows + r0 * hd;
        for (int64_t g0 = 0; g0 < group; g0 += HEADS) {
            const int64_t gn = group - g0 < HEADS ? group - g0 : HEADS;
            for (int64_t g = 0; g < gn; g++) {
                const float *pg = p + (g0 + g) * sstride + r0;
                int64_t r = 0;
                for (; r + 4 <= m; r += 4) vst1q_f32(w + g * ROWS + r, vmulq_f32(vld1q_f32(pg + r), vld1q_f32(vs + r0 + r)));
                for (; r < m; r++) w[g * ROWS + r] = pg[r] * vs[r0 + r];
            }
            int64_t e = 0;
            for (; e + 8 <= hd; e += 8) {
                float32x4_t lo[HEADS], hi[HEADS];
                for (int64_t g = 0; g < gn; g++) {
                    lo[g] = vld1q_f32(o + (g0 + g) * hd + e);
                    hi[g] = vld1q_f32(o + (g0 + g) * hd + e + 4);
                }
                for (int64_t r = 0; r < m; r++) {
                    float32x4_t vl, vh;
                    load_q8x8(rw + r * hd + e, &vl, &vh);
                    for (int64_t g = 0; g < gn; g++) {
                        lo[g] = vfmaq_n_f32(lo[g], vl, w[g * ROWS + r]);
                        hi[g] = vfmaq_n_f32(hi[g], vh, w[g * ROWS + r]);
                    }
                }
                for (int64_t g = 0; g < gn; g++) {
                    vst1q_f32(o + (g0 + g) * hd + e, lo[g]);
                    vst1q_f32(o + (g0 + g) * hd + e + 4, hi[g]);
                }
            }
            for (; e < hd; e++)
                for (int64_t g = 0; g < gn; g++)
                    for (int64_t r = 0; r < m; r++) o[(g0 + g) * hd + e] += w[g * ROWS + r] * (float)rw[r * hd + e];
        }
    }
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) dst[i] = dp_float_to_half(src[i]);
}

static inline float32x4_t fma4(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); }
static inline float32x4_t fnms4(float32x4_t a, float32x4_t b, float32x4_t c) { return vfmsq_f32(c, a, b); }
static inline float32x4_t pow2_4(float32x4_t k) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23));
}
DP_DEFINE_EXP(exp4, float32x4_t, vdupq_n_f32, vmaxq_f32, vmulq_f32, vaddq_f32, fma4, fnms4, vrndnq_f32, pow2_4)

DP_DEFINE_EXP_SUM_VECTORS(exp_vectors, float32x4_t, 4, vdupq_n_f32, vld1q_f32, vst1q_f32, vsubq_f32, vaddq_f32, exp4)

static float exp_sum(float *x, int64_t n, float max) {
    int64_t i;
    float s = vaddvq_f32(exp_vectors(x, n, max, &i));
    for (; i < n; i++) {
        x[i] = vgetq_lane_f32(exp4(vdupq_n_f32(x[i] - max)), 0);
        s += x[i];
    }
    return s;
}

static float max_of(const float *x, int64_t n) {
    int64_t i = 0;
    float32x4_t m = vdupq_n_f32(x[0]);
    for (; i + 4 <= n; i += 4) m = vmaxq_f32(m, vld1q_f32(x + i));
    float r = vmaxvq_f32(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* 16 independent chains: enough to cover the FMA latency on two FMA units. */
static inline float32x4_t neon_fma(float32x4_t x, float32x4_t m, float32x4_t c) { return vfmaq_f32(c, x, m); }
DP_DEFINE_FMA_PROBE(float32x4_t, 16, 4, vdupq_n_f32, neon_fma, vaddq_f32, vaddvq_f32)

/* An encoder's attention: 6 query rows x 16 tokens of scores, 6 rows x 16 dims of V
 * (24 accumulators of the 32 registers). */
#define EA_VT float32x4_t
#define EA_VL 4
#define EA_LOAD vld1q_f32
#define EA_STORE vst1q_f32
#define EA_SET1 vdupq_n_f32
#define EA_ZERO() vdupq_n_f32(0.0f)
#define EA_MUL vmulq_f32
#define EA_FMA fma4
#define EA_ROWS 6
#define EA_KB 1
#define EA_DV 4
#include "../../enc_attn_body.h"

const dp_attn_ops dp_ops_neon = {
    .kv = {[DP_KV_F16] = {scores_f16, accum_f16}, [DP_KV_F32] = {scores_f32, accum_f32},
           [DP_KV_Q8] = {scores_q8, accum_q8}},
    DP_ATTN_OPS_COMMON,
    .qrows = dp_qrows_neon,
    .lrows = dp_lrows_neon,
    .lquant = dp_lquant_neon,
};
