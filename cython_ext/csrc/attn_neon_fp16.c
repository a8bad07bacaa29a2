/* AArch64 with FP16 arithmetic (ARMv8.2-A asimdhp). Compiled with
 * -march=armv8.2-a+fp16 and called only when getauxval(AT_HWCAP) has HWCAP_ASIMDHP:
 * on a Cortex-A53 these instructions raise SIGILL.
 *
 * f16 K rows: q is rounded to f16 once per call and each product is formed in f16
 * (one rounding, relative error <= 2^-11), then widened and summed in f32, eight
 * lanes per instruction instead of four. Everything else is the baseline NEON code. */
#include <arm_neon.h>
#include "dp_attn_ops.h"

extern const dp_attn_ops dp_ops_neon;

static void scores_f16(const float *q, int64_t group, int64_t hd, const uint16_t *rows, int64_t n,
                       float scale, float *scores, int64_t sstride) {
    if (hd % 8 || hd > 512 || group > 64) {
        dp_ops_neon.scores_f16(q, group, hd, rows, n, scale, scores, sstride);
        return;
    }
    for (int64_t g = 0; g < group; g++) {
        float16_t qh[512];
        for (int64_t e = 0; e < hd; e += 4)
            vst1_f16(qh + e, vcvt_f16_f32(vld1q_f32(q + g * hd + e)));
        for (int64_t r = 0; r < n; r++) {
            const float16_t *k = (const float16_t *)(rows + r * hd);
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (int64_t e = 0; e < hd; e += 8) {
                const float16x8_t prod = vmulq_f16(vld1q_f16(qh + e), vld1q_f16(k + e));
                acc = vaddq_f32(acc, vcvt_f32_f16(vget_low_f16(prod)));
                acc = vaddq_f32(acc, vcvt_high_f32_f16(prod));
            }
            scores[g * sstride + r] = vaddvq_f32(acc) * scale;
        }
    }
}

static void scores_f32(const float *q, int64_t group, int64_t hd, const float *rows, int64_t n,
                       float scale, float *scores, int64_t sstride) {
    dp_ops_neon.scores_f32(q, group, hd, rows, n, scale, scores, sstride);
}

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const float *rows,
                      int64_t n, float *o) {
    dp_ops_neon.accum_f32(p, sstride, group, hd, rows, n, o);
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const uint16_t *rows,
                      int64_t n, float *o) {
    dp_ops_neon.accum_f16(p, sstride, group, hd, rows, n, o);
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) { dp_ops_neon.f32_to_f16(src, dst, n); }

static float exp_sum(float *x, int64_t n, float max) { return dp_ops_neon.exp_sum(x, n, max); }

const dp_attn_ops dp_ops_neon_fp16 = {"neon_fp16", scores_f32, scores_f16, accum_f32, accum_f16, f32_to_f16, exp_sum};
