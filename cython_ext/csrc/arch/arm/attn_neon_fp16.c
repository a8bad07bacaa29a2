/* AArch64 with FP16 arithmetic (ARMv8.2-A asimdhp). Compiled with
 * -march=armv8.2-a+fp16 and called only when getauxval(AT_HWCAP) has HWCAP_ASIMDHP:
 * on a Cortex-A53 these instructions raise SIGILL.
 *
 * f16 K: each product q[g, e] * k is formed in f16 (q rounded once, relative error
 * about 2^-10 per product), then widened and summed in f32: eight tokens per
 * instruction instead of four. Everything else is the baseline NEON code. */
#include <arm_neon.h>
#include "../../dp_attn_ops.h"

extern const dp_attn_ops dp_ops_neon;

static void scores_f16(const float *q, int64_t group, int64_t hd, const void *kt_, int64_t ldk, const float *ks,
                       int64_t n, float scale, float *scores, int64_t sstride) {
    /* 8 tokens per vector: q[g, e] (rounded to f16) times a row of K^T in f16, then
     * widened and summed in f32. Tails go to the baseline kernel. */
    const uint16_t *kt = (const uint16_t *)kt_;
    const int64_t n8 = n / 8 * 8;
    for (int64_t g = 0; g < group; g++) {
        for (int64_t r0 = 0; r0 < n8; r0 += 8) {
            float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
            for (int64_t e = 0; e < hd; e++) {
                const float16x8_t k = vld1q_f16((const float16_t *)(kt + e * ldk + r0));
                const float16x8_t prod = vmulq_n_f16(k, (float16_t)q[g * hd + e]);
                lo = vaddq_f32(lo, vcvt_f32_f16(vget_low_f16(prod)));
                hi = vaddq_f32(hi, vcvt_high_f32_f16(prod));
            }
            vst1q_f32(scores + g * sstride + r0, vmulq_n_f32(lo, scale));
            vst1q_f32(scores + g * sstride + r0 + 4, vmulq_n_f32(hi, scale));
        }
    }
    if (n8 < n)
        dp_ops_neon.kv[DP_KV_F16].scores(q, group, hd, kt + n8, ldk, ks, n - n8, scale, scores + n8, sstride);
}

/* The rest is the baseline NEON code (q8: int8 widens to f32; FP16 arithmetic has
 * nothing to add), called through its table. */
static void scores_f32(const float *q, int64_t group, int64_t hd, const void *kt, int64_t ldk, const float *ks,
                       int64_t n, float scale, float *scores, int64_t sstride) {
    dp_ops_neon.kv[DP_KV_F32].scores(q, group, hd, kt, ldk, ks, n, scale, scores, sstride);
}

static void scores_q8(const float *q, int64_t group, int64_t hd, const void *kt, int64_t ldk, const float *ks,
                      int64_t n, float scale, float *scores, int64_t sstride) {
    dp_ops_neon.kv[DP_KV_Q8].scores(q, group, hd, kt, ldk, ks, n, scale, scores, sstride);
}

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows,
                      const float *vs, int64_t n, float *o) {
    dp_ops_neon.kv[DP_KV_F32].accum(p, sstride, group, hd, rows, vs, n, o);
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows,
                      const float *vs, int64_t n, float *o) {
    dp_ops_neon.kv[DP_KV_F16].accum(p, sstride, group, hd, rows, vs, n, o);
}

static void accum_q8(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows,
                     const float *vs, int64_t n, float *o) {
    dp_ops_neon.kv[DP_KV_Q8].accum(p, sstride, group, hd, rows, vs, n, o);
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) { dp_ops_neon.f32_to_f16(src, dst, n); }

static float exp_sum(float *x, int64_t n, float max) { return dp_ops_neon.exp_sum(x, n, max); }

static float max_of(const float *x, int64_t n) { return dp_ops_neon.max_of(x, n); }

static int64_t fma_probe(int64_t iters, float *sink) { return dp_ops_neon.fma_probe(iters, sink); }

static void enc_rows(const float *q, int64_t ldq, int64_t m, int64_t hd, const float *kt, int64_t n, const float *v,
                     int64_t ldv, float scale, float *s, float *out, int64_t ldo) {
    dp_ops_neon.enc_rows(q, ldq, m, hd, kt, n, v, ldv, scale, s, out, ldo);
}

#define NEON_FP16_KV                                                                     \
    .kv = {[DP_KV_F16] = {scores_f16, accum_f16}, [DP_KV_F32] = {scores_f32, accum_f32}, \
           [DP_KV_Q8] = {scores_q8, accum_q8}}

const dp_attn_ops dp_ops_neon_fp16 = {NEON_FP16_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_neon, .lrows = dp_lrows_neon,
                                      .lquant = dp_lquant_neon};

/* The cores with the dot-product extension all have FP16 arithmetic (ARMv8.2-A): their
 * ISAs share this attention and bring their own products. */
const dp_attn_ops dp_ops_neon_dotprod = {NEON_FP16_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_neon_dotprod,
                                         .lrows = dp_lrows_neon_dotprod, .lquant = dp_lquant_neon};
const dp_attn_ops dp_ops_neon_i8mm = {NEON_FP16_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_neon_i8mm,
                                      .lrows = dp_lrows_neon_i8mm, .lact_pairs = 1, .lquant = dp_lquant_neon};
