/* The classifier's product in our kernels, over the 8-bit MatMulNBits form the model
 * cache already holds (uint8 values + 128, one f32 scale per block of 16 or 32: GGUF's
 * Q8_0, Q6_K, Q5_0 ... tables, models/quants.py), read in place from the entry's mapping.
 * ONNX Runtime packs its own copy of such a matrix at 10.7 (blocks of 32) or 12.8 (16)
 * bits a value against this form's 9 and 10 (docs/performance.md, memory): for a 262,144
 * x 640 classifier that copy is the largest allocation of the load.
 *
 * Activations are quantized as MatMulNBits at accuracy level 4 quantizes them: int8 per
 * block of the weight's block size, d = max|x| / 127, q = round(x / d) (ties to even), so
 * the product equals the graphs' up to f32 summation order. int8_act = 0 (accuracy levels
 * below 4) multiplies the f32 activations as they are.
 *
 *   w:      (N, K) uint8, value + 128;   scales: (N, K / bs) f32
 *   x:      (R, K) f32;                  out:    (R, ldo) f32, columns [0, N) written
 */
#ifndef DP_QMATMUL_H
#define DP_QMATMUL_H

#include "dp_common.h"

/* Bytes of w ahead of the step that a kernel prefetches: the hardware prefetcher alone
 * left one thread well below 2 KiB ahead's rate, and 512 B and 4 KiB were slower
 * (docs/performance-log.md). */
#define DP_QMATMUL_PREFETCH 2048

/* out[r * ldo + n] = sum_b scales[n, b] * xd[r, b] * sum_i (w[n, bs b + i] - 128) * xq[r, bs b + i]
 * for n in [n0, n1), r < R; xq (R, K) int8, xd (R, K / bs) f32. bs is 16 or 32 and K a
 * multiple of 32: dp_qmatmul checks, an ISA's entry trusts its arguments. */
typedef void (*dp_qrows_fn)(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1,
                            int64_t K, const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo);

void dp_qrows_generic(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                      const float *, int64_t, float *, int64_t);
void dp_qrows_avx2(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                   const float *, int64_t, float *, int64_t);
void dp_qrows_avx512(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                     const float *, int64_t, float *, int64_t);
void dp_qrows_avx512_vnni(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                          const float *, int64_t, float *, int64_t);
void dp_qrows_avx_vnni(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                       const float *, int64_t, float *, int64_t);
void dp_qrows_neon(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                   const float *, int64_t, float *, int64_t);
void dp_qrows_neon_dotprod(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                           const float *, int64_t, float *, int64_t);
void dp_qrows_neon_i8mm(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                        const float *, int64_t, float *, int64_t);

/* Quantize R rows of K f32 values into xq (R, K) int8 and xd (R, K / bs) f32. */
void dp_quantize_act(const float *x, int64_t R, int64_t K, int64_t bs, int8_t *xq, float *xd);

#endif
