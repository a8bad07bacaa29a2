/* NEON layer products (lmatmul.h): baseline ARMv8 (no dot-product extension), so every
 * phone's core runs them. A 64-byte step of the form is four 16-byte quarters of 4 rows x
 * 4 values; each quarter times the activations' 4 values (repeated 4 times) widens to
 * int16 (vmull_s8: every value fits int8, Q8_0's as q = v - 128) and pair-adds into two
 * int32 accumulators, which a block ends with one pairwise add: 4 rows' sums. */
#include <arm_neon.h>
#include "dp_attn_ops.h"
#include "lmatmul.h"

/* Quarter `qd` (rows 4 qd .. 4 qd + 3) of step j of a unit, as int8 values. */
static inline __attribute__((always_inline)) int8x16_t step(const int kind, const uint8_t *u, int j, int qd) {
    if (kind == DP_L_Q8_0) return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u + 64 * j + 16 * qd), vdupq_n_u8(0x80)));
    const uint8x16_t raw = vld1q_u8(u + 64 * (j / 2) + 16 * qd);
    uint8x16_t v = j % 2 ? vshrq_n_u8(raw, 4) : vandq_u8(raw, vdupq_n_u8(0x0f));
    if (kind == DP_L_Q5_0) { /* byte i takes bit i % 8 of the quarter's byte i / 8 */
        const uint8_t *m = u + 256 + 8 * j + 2 * qd;
        static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint8x16_t t = vtstq_u8(vcombine_u8(vdup_n_u8(m[0]), vdup_n_u8(m[1])), vld1q_u8(bits));
        v = vorrq_u8(v, vandq_u8(t, vdupq_n_u8(0x10)));
    } else if (kind == DP_L_Q6_K) {
        const uint8x16_t p = vld1q_u8(u + 256 + 64 * (j / 4) + 16 * qd);
        const uint8x16_t sh = vshlq_u8(p, vdupq_n_s8((int8_t)(4 - 2 * (j % 4))));
        v = vorrq_u8(v, vandq_u8(sh, vdupq_n_u8(0x30)));
    }
    return vreinterpretq_s8_u8(v);
}

static inline void dot4(int32x4_t acc[2], int8x16_t w, int8x16_t x) {
    acc[0] = vpadalq_s16(acc[0], vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    acc[1] = vpadalq_s16(acc[1], vmull_high_s8(w, x));
}

static inline float32x4_t u8x4_ps(const uint8_t *p) {
    return (float32x4_t){(float)p[0], (float)p[1], (float)p[2], (float)p[3]};
}
static inline float32x4_t i8x4_ps(const uint8_t *p) {
    return (float32x4_t){(float)(int8_t)p[0], (float)(int8_t)p[1], (float)(int8_t)p[2], (float)(int8_t)p[3]};
}
static inline float32x4_t f16x4_ps(const uint8_t *p) {
    uint16_t h[4];
    memcpy(h, p, 8);
    return (float32x4_t){dp_half_to_float(h[0]), dp_half_to_float(h[1]), dp_half_to_float(h[2]),
                         dp_half_to_float(h[3])};
}

static inline __attribute__((always_inline)) void groups(const int kind, const uint8_t *w, int64_t g0, int64_t g1,
                                                         const dp_lact *a, float *out, int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t K = a->K, nsb = K / k->sb, units = k->sb / 32, sbb = k->header + units * k->unit;
    /* Q8_0 goes as q = v - 128 (its offset already out); the others as stored, less z */
    const int32_t z = kind == DP_L_Q8_0 ? 0 : dp_lkind_zero_point(kind);
    for (int64_t g = g0; g < g1; g++)
        for (int64_t r = 0; r < a->R; r++)
            for (int qd = 0; qd < 4; qd++) {
                float32x4_t acc = vdupq_n_f32(0.0f), macc = vdupq_n_f32(0.0f);
                for (int64_t s = 0; s < nsb; s++) {
                    const uint8_t *h = w + (g * nsb + s) * sbb;
                    const float32x4_t d = f16x4_ps(h + 8 * qd);
                    if (r == 0 && qd == 0) dp_lprefetch(h, k->header);
                    for (int64_t b = 0; b < units; b++) {
                        const uint8_t *unit = h + k->header + b * k->unit;
                        if (r == 0 && qd == 0) dp_lprefetch(unit, k->unit);
                        const int64_t kb = s * units + b;
                        const int32_t *x = (const int32_t *)(a->xq + r * K + 32 * kb);
                        const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;
                        const float dx = a->xd[r * (K / 32) + kb];
                        int32x4_t h0[2] = {vdupq_n_s32(0), vdupq_n_s32(0)}, h1[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
                        for (int j = 0; j < 8; j++)
                            dot4(j < 4 ? h0 : h1, step(kind, unit, j, qd), vreinterpretq_s8_s32(vdupq_n_s32(x[j])));
                        int32x4_t d0 = vpaddq_s32(h0[0], h0[1]), d1 = vpaddq_s32(h1[0], h1[1]);
                        if (kind == DP_L_Q6_K) {
                            d0 = vsubq_s32(d0, vdupq_n_s32(32 * xs[0]));
                            d1 = vsubq_s32(d1, vdupq_n_s32(32 * xs[1]));
                            const float32x4_t s0 = vmulq_f32(d, i8x4_ps(h + 32 + 16 * (2 * b) + 4 * qd));
                            const float32x4_t s1 = vmulq_f32(d, i8x4_ps(h + 32 + 16 * (2 * b + 1) + 4 * qd));
                            acc = vfmaq_f32(acc, vmulq_n_f32(s0, dx), vcvtq_f32_s32(d0));
                            acc = vfmaq_f32(acc, vmulq_n_f32(s1, dx), vcvtq_f32_s32(d1));
                            continue;
                        }
                        const int32_t sum = xs[0] + xs[1];
                        int32x4_t dt = vaddq_s32(d0, d1);
                        float32x4_t s0 = d;
                        if (kind == DP_L_Q4_K) {
                            s0 = vmulq_f32(d, u8x4_ps(h + 64 + 16 * b + 4 * qd));
                            const float32x4_t o = vmulq_f32(f16x4_ps(h + 32 + 8 * qd), u8x4_ps(h + 192 + 16 * b + 4 * qd));
                            macc = vfmaq_n_f32(macc, o, dx * (float)sum);
                        } else {
                            dt = vsubq_s32(dt, vdupq_n_s32(z * sum));
                        }
                        acc = vfmaq_f32(acc, vmulq_n_f32(s0, dx), vcvtq_f32_s32(dt));
                    }
                }
                vst1q_f32(out + r * ldo + 16 * g + 4 * qd, vsubq_f32(acc, macc));
            }
}

void dp_lrows_neon(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    DP_LKIND_DISPATCH(kind, groups, w, g0, g1, a, out, ldo)
}
