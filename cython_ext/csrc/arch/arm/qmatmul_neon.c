/* NEON classifier rows (qmatmul.h): baseline ARMv8 (no dot-product extension), so every
 * phone's core runs them. 16 values a step: the values as int8 (w ^ 0x80 = w - 128) times
 * the activations widen to int16 (|q x| <= 2^14) and pair-add into 4 int32 lanes; a
 * block (16 or 32 values) is then scaled once. */
#include <arm_neon.h>
#include "../../qmatmul.h"

void dp_qrows_neon(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                   const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    const int64_t nb = K / bs;
    const uint8x16_t bias = vdupq_n_u8(0x80);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w + n * K;
        const float *sc = scales + n * nb;
        for (int64_t r = 0; r < R; r++) {
            const int8_t *x = xq + r * K;
            const float *dx = xd + r * nb;
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                int32x4_t s = vdupq_n_s32(0);
                __builtin_prefetch(row + b * bs + DP_QMATMUL_PREFETCH);
                for (int64_t v = b * bs; v < (b + 1) * bs; v += 16) {
                    const int8x16_t q = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(row + v), bias));
                    const int8x16_t xv = vld1q_s8(x + v);
                    s = vpadalq_s16(s, vmull_s8(vget_low_s8(q), vget_low_s8(xv)));
                    s = vpadalq_s16(s, vmull_s8(vget_high_s8(q), vget_high_s8(xv)));
                }
                acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), sc[b] * dx[b]);
            }
            out[r * ldo + n] = vaddvq_f32(acc);
        }
    }
}
