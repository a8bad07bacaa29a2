/* NEON layer products with the dot-product extension (ARMv8.2-A SDOT: Cortex-A55/A75 and
 * every phone core since), built with -march=armv8.2-a+fp16+dotprod and chosen only where
 * the OS reports HWCAP_ASIMDDP. One SDOT by lane multiplies a quarter of a step (4 rows x
 * 4 values) by 4 activations: 16 multiply-adds an instruction. The loops are
 * lmatmul_neon_body.h's; the classifier's 8-bit rows (qmatmul.h) are here too. */
#include <arm_neon.h>
#include "../../dp_attn_ops.h"
#include "../../lmatmul.h"

#define LN_SUFFIX(n) n##_dotprod
#define LN_ACC int32x4_t
#define LN_ACC_SET(acc, v) ((acc) = (v))
#define LN_DOT(acc, w, x, lane) ((acc) = vdotq_laneq_s32(acc, vreinterpretq_s8_u8(w), x, lane))
#define LN_ACC_GET(acc) (acc)
#define LN_UNSIGNED_DOT 0
#define LN_MMLA 0
#include "lmatmul_neon_body.h"

void dp_lrows_neon_dotprod(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                           int64_t ldo) {
    lrows_dotprod(kind, w, g0, g1, a, out, ldo);
}

#define QN_SUFFIX(n) n##_dotprod
#define QN_DOT(acc, w, x) vdotq_s32(acc, vreinterpretq_s8_u8(veorq_u8(w, vdupq_n_u8(0x80))), x)
#define QN_BIAS 0
#include "qmatmul_neon_body.h"

void dp_qrows_neon_dotprod(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                           const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    qrows_dotprod(w, scales, bs, n0, n1, K, xq, xd, R, out, ldo);
}
