/* NEON layer products (lmatmul.h), baseline ARMv8 (no dot-product extension), so every
 * phone's core runs them: a quarter of a step (4 rows x 4 values) times the activations'
 * 4 values repeated 4 times widens to int16 (SMULL: every value fits int8, Q8_0's as
 * q = v - 128) and pair-adds into two int32 accumulators, which one pairwise add turns
 * into the 4 rows' sums. The loops are lmatmul_neon_body.h's. */
#include <arm_neon.h>
#include "../../dp_attn_ops.h"
#include "../../lmatmul.h"

typedef struct {
    int32x4_t a, b, init; /* a: rows 0-1 in pairs of lanes, b: rows 2-3 */
} neon_acc;

static inline __attribute__((always_inline)) void neon_dot(neon_acc *acc, uint8x16_t w, int8x16_t x) {
    const int8x16_t v = vreinterpretq_s8_u8(w);
    acc->a = vpadalq_s16(acc->a, vmull_s8(vget_low_s8(v), vget_low_s8(x)));
    acc->b = vpadalq_s16(acc->b, vmull_high_s8(v, x));
}

#define LN_SUFFIX(n) n##_neon
#define LN_ACC neon_acc
#define LN_ACC_SET(acc, v) ((acc).a = (acc).b = vdupq_n_s32(0), (acc).init = (v))
#define LN_DOT(acc, w, x, lane) \
    neon_dot(&(acc), w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), lane)))
#define LN_ACC_GET(acc) vaddq_s32(vpaddq_s32((acc).a, (acc).b), (acc).init)
#define LN_UNSIGNED_DOT 0
#define LN_MMLA 0
#include "lmatmul_neon_body.h"

void dp_lrows_neon(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    lrows_neon(kind, w, g0, g1, a, out, ldo);
}

/* ---- the activations' quantization (dp_lquant_fn): baseline ARMv8, every NEON ISA's ---- */

/* One block of 32: amax to a scalar (max is exact in any order), d and inv in scalar f32 as
 * the reference computes them, q = vcvtnq (round to nearest, ties to even: rintf's under
 * the default rounding mode) where every |v * inv| < 127.5, else the reference takes the
 * block (an infinity or NaN, or a block so tiny that 1 / d overflows). */
static inline __attribute__((always_inline)) void lquant_block(const float *v, int8_t *xq, float *xd, int32_t *xs,
                                                               float *xm) {
    float32x4_t y[8];
    for (int i = 0; i < 8; i++) y[i] = vld1q_f32(v + 4 * i);
    float32x4_t m = vabsq_f32(y[0]);
    for (int i = 1; i < 8; i++) m = vmaxq_f32(m, vabsq_f32(y[i]));
    const float amax = vmaxvq_f32(m), d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    const float32x4_t vi = vdupq_n_f32(inv), lim = vdupq_n_f32(127.5f);
    uint32x4_t in = vdupq_n_u32(0xffffffffu);
    for (int i = 0; i < 8; i++) {
        y[i] = vmulq_f32(y[i], vi);
        in = vandq_u32(in, vcaltq_f32(y[i], lim));
    }
    if (__builtin_expect(vminvq_u32(in) != 0xffffffffu, 0)) {
        dp_lact_quantize(v, 1, 32, xq, xd, xs, xm);
        return;
    }
    int32x4_t q[8];
    for (int i = 0; i < 8; i++) q[i] = vcvtnq_s32_f32(y[i]);
    for (int h = 0; h < 2; h++) {
        const int32x4_t *p = q + 4 * h;
        const int16x8_t lo = vcombine_s16(vmovn_s32(p[0]), vmovn_s32(p[1]));
        const int16x8_t hi = vcombine_s16(vmovn_s32(p[2]), vmovn_s32(p[3]));
        vst1q_s8(xq + 16 * h, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
        xs[h] = vaddvq_s32(vaddq_s32(vaddq_s32(p[0], p[1]), vaddq_s32(p[2], p[3])));
    }
    *xd = d;
    *xm = d * (float)(xs[0] + xs[1]);
}

void dp_lquant_neon(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    for (int64_t b = 0; b < R * K / 32; b++) lquant_block(x + 32 * b, xq + 32 * b, xd + b, xs + 2 * b, xm + b);
}
