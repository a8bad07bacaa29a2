/* NEON layer products with the int8 matrix extension (ARMv8.6-A I8MM: Cortex-A510/A710/X2
 * and every phone core since), built with -march=armv8.2-a+fp16+dotprod+i8mm and chosen
 * only where the OS reports HWCAP2_I8MM. USDOT multiplies unsigned by signed bytes, so
 * Q8_0's stored values v = q + 128 go in as they are, less 128 x the activations' sum,
 * with no sign flip per vector. The loops are lmatmul_neon_body.h's; the classifier's
 * 8-bit rows (qmatmul.h) are here too. */
#include <arm_neon.h>
#include "../../dp_attn_ops.h"
#include "../../lmatmul.h"

#define LN_SUFFIX(n) n##_i8mm
#define LN_ACC int32x4_t
#define LN_ACC_SET(acc, v) ((acc) = (v))
#define LN_DOT(acc, w, x, lane) ((acc) = vusdotq_laneq_s32(acc, w, x, lane))
#define LN_ACC_GET(acc) (acc)
#define LN_UNSIGNED_DOT 1
#define LN_MMLA 1
#include "lmatmul_neon_body.h"

void dp_lrows_neon_i8mm(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                        int64_t ldo) {
    lrows_i8mm(kind, w, g0, g1, a, out, ldo);
}

#define QN_SUFFIX(n) n##_i8mm
#define QN_DOT(acc, w, x) vusdotq_s32(acc, w, x)
#define QN_BIAS 128
#include "qmatmul_neon_body.h"

void dp_qrows_neon_i8mm(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                        const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    qrows_i8mm(w, scales, bs, n0, n1, K, xq, xd, R, out, ldo);
}
