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
