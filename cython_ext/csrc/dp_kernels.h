/* DualPath C kernels: generic (scalar) reference versions. */
#ifndef DP_KERNELS_H
#define DP_KERNELS_H

#include "dp_common.h"

/* Write num_tokens new K or V rows into a contiguous per-layer cache.
 *   src:   (num_tokens, num_kv_heads, head_dim) f32, row stride src_stride floats
 *   cache: (num_kv_heads, capacity, head_dim) of kv_dtype (DP_F32 or DP_F16)
 * Rows land at positions [pos, pos + num_tokens). */
int dp_kv_write_generic(const float *src, int64_t src_stride, void *cache, int kv_dtype,
                        int64_t num_kv_heads, int64_t capacity, int64_t head_dim,
                        int64_t pos, int64_t num_tokens);

/* Causal attention for num_tokens queries at positions [pos0, pos0 + num_tokens)
 * over a contiguous cache that already holds keys/values for [0, pos0 + num_tokens).
 *   q:   (num_tokens, num_heads, head_dim) f32, row stride q_stride floats
 *   k,v: (num_kv_heads, capacity, head_dim) of kv_dtype
 *   out: (num_tokens, num_heads, head_dim) f32, row stride out_stride floats
 * Query head h reads KV head h / (num_heads / num_kv_heads) (GQA). */
int dp_attn_f32out_generic(const float *q, int64_t q_stride, const void *k, const void *v,
                           int kv_dtype, float *out, int64_t out_stride,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           int64_t capacity, int64_t pos0, int64_t num_tokens, float scale);

/* Gather embedding rows, dequantizing to f32.
 *   table: DP_F32 (vocab, dim) f32; DP_Q8_0 / DP_Q4_0: MatMulNBits blobs
 *          (vocab, dim/32, 32 or 16) uint8 with scales (vocab * dim/32) f32
 *   ids:   (num_tokens) int64, each in [0, vocab)
 *   out:   (num_tokens, dim) f32 */
int dp_embed_generic(const void *table, const float *scales, int dtype, int64_t vocab,
                     int64_t dim, const int64_t *ids, int64_t num_tokens, float *out);

#endif
