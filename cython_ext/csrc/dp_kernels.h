/* DualPath C kernels: generic (scalar) reference versions. */
#ifndef DP_KERNELS_H
#define DP_KERNELS_H

#include "dp_common.h"

/* Gather embedding rows, dequantizing to f32.
 *   table: DP_F32 (vocab, dim) f32; DP_Q8_0 / DP_Q4_0: MatMulNBits blobs
 *          (vocab, dim/32, 32 or 16) uint8 with scales (vocab * dim/32) f32
 *   ids:   (num_tokens) int64, each in [0, vocab)
 *   out:   (num_tokens, dim) f32 */
int dp_embed_generic(const void *table, const float *scales, int dtype, int64_t vocab,
                     int64_t dim, const int64_t *ids, int64_t num_tokens, float *out);

#endif
