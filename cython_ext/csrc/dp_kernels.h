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

/* Copy rows ids of a table stored in file fd (num_rows rows of row_bytes from byte
 * offset) into out (n, row_bytes), by pread: the rows come from the page cache and
 * map nothing into the process (an embedding table that ONNX Runtime also packed
 * for the classifier is then resident once). DP_ERR_IO (errno set) if a read fails
 * or the file ends early. */
int dp_read_rows(int fd, int64_t offset, int64_t row_bytes, int64_t num_rows,
                 const int64_t *ids, int64_t n, uint8_t *out);

#endif
