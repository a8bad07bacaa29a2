/* An encoder's attention (BERT, nomic-bert, XLM-R): every token of a text sees every
 * token of the same text, over the batch's texts packed back to back without padding.
 *
 * ONNX Runtime's MultiHeadAttention needs the texts padded to the longest (a gather in,
 * a gather out, the padding's keys masked) and multiplies through its general f32 GEMM,
 * whose packing dominates at a head_dim of 32 or 64. Here a head of a text is one task:
 * its K^T is packed once into blocks of 16 tokens, and the ISA's enc_rows runs a few
 * query rows at a time with their scores in registers (rows x 16 or 32 tokens), the
 * softmax over the row, and the rows times V read in place.
 *
 *   q, k, v   (rows, ld) f32: head h of token t at [t * ld + h * hd]
 *   starts    (B + 1,) int64: text b is tokens [starts[b], starts[b + 1]), starts[0] = 0,
 *             non-decreasing, starts[B] = rows (an empty text is allowed)
 *   out       (rows, ldo) f32: the heads' outputs at [t * ldo + h * hd]
 *
 * K^T of a head in blocks of 16 tokens, as enc_rows reads it: token r, dim e at
 * kt[(r / 16) * hd * 16 + e * 16 + r % 16]; the tokens past n up to the next 16 are 0. */
#ifndef DP_ENC_ATTN_H
#define DP_ENC_ATTN_H

#include "dp_attn_ops.h"

/* Floats of scratch one enc_rows call needs for n keys of head_dim hd (K^T and scores). */
static inline int64_t dp_enc_scratch_floats(int64_t n, int64_t hd) {
    const int64_t np = (n + 15) & ~(int64_t)15;
    return np * hd + DP_ENC_ROWS * (np + 16);
}

/* out = softmax(scale * q k^T) v per head of every text, on `pool` (NULL: the calling
 * thread), with ops->enc_rows (the generic one where hd is not a multiple of 8).
 * DP_ERR_ARG for a size below 1, a head_dim above DP_MAX_HEAD_DIM or strides narrower
 * than nh * hd; DP_ERR_BOUNDS for starts that are not as above; DP_ERR_NOMEM. Nothing
 * is written before the arguments are checked. */
int dp_enc_attention(dp_pool *pool, const dp_attn_ops *ops, const float *q, const float *k, const float *v,
                     int64_t ld, int64_t rows, const int64_t *starts, int64_t B, int64_t nh, int64_t hd,
                     float scale, float *out, int64_t ldo);

#endif
