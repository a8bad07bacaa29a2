/* Scalar reference kernels that do not touch the KV arena: always built. */
#include <math.h>
#include <stdlib.h>
#include "dp_kernels.h"

int dp_embed_generic(const void *table, const float *scales, int dtype, int64_t vocab,
                     int64_t dim, const int64_t *ids, int64_t num_tokens, float *out) {
    if (!table || !ids || !out || vocab <= 0 || dim <= 0 || num_tokens < 0) return DP_ERR_ARG;
    if ((dtype == DP_Q8_0 || dtype == DP_Q4_0) && (dim % 32 != 0 || !scales)) return DP_ERR_ARG;
    const int64_t nblocks = dim / 32;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t id = ids[t];
        if (id < 0 || id >= vocab) return DP_ERR_BOUNDS;
        float *o = out + t * dim;
        if (dtype == DP_F32) {
            memcpy(o, (const float *)table + id * dim, (size_t)dim * sizeof(float));
        } else if (dtype == DP_Q8_0) {
            const uint8_t *row = (const uint8_t *)table + id * dim;
            for (int64_t b = 0; b < nblocks; b++) {
                const float d = scales[id * nblocks + b];
                for (int i = 0; i < 32; i++) o[b * 32 + i] = d * (float)((int)row[b * 32 + i] - 128);
            }
        } else if (dtype == DP_Q4_0) {
            const uint8_t *row = (const uint8_t *)table + id * (dim / 2);
            for (int64_t b = 0; b < nblocks; b++) {
                const float d = scales[id * nblocks + b];
                for (int i = 0; i < 16; i++) {
                    const uint8_t byte = row[b * 16 + i];
                    o[b * 32 + 2 * i] = d * (float)((int)(byte & 0x0f) - 8);
                    o[b * 32 + 2 * i + 1] = d * (float)((int)(byte >> 4) - 8);
                }
            }
        } else {
            return DP_ERR_ARG;
        }
    }
    return DP_OK;
}

int dp_repack_ggml(const uint8_t *src, int64_t src_bytes, int dtype, int64_t num_blocks,
                   uint8_t *blob, int64_t blob_bytes, float *scales, int64_t num_scales) {
    if (!src || !blob || !scales || num_blocks < 0) return DP_ERR_ARG;
    if (dtype != DP_Q8_0 && dtype != DP_Q4_0) return DP_ERR_ARG;
    const int64_t in_bytes = dtype == DP_Q8_0 ? 34 : 18;   /* fp16 scale + 32 int8 | 16 nibble bytes */
    const int64_t out_bytes = in_bytes - 2;
    if (src_bytes < num_blocks * in_bytes || blob_bytes < num_blocks * out_bytes || num_scales < num_blocks)
        return DP_ERR_BOUNDS;
    for (int64_t b = 0; b < num_blocks; b++) {
        const uint8_t *in = src + b * in_bytes;
        uint8_t *out = blob + b * out_bytes;
        scales[b] = dp_half_to_float((uint16_t)(in[0] | (in[1] << 8)));
        const uint8_t *q = in + 2;
        if (dtype == DP_Q8_0) {
            for (int i = 0; i < 32; i++) out[i] = q[i] ^ 0x80;       /* int8 q -> uint8 q + 128 */
        } else {
            /* GGML: byte j holds x[j] (low) and x[j + 16] (high). MatMulNBits: byte m
             * holds x[2m] (low) and x[2m + 1] (high). */
            for (int m = 0; m < 8; m++)    /* x[2m], x[2m+1]: low nibbles of q[2m], q[2m+1] */
                out[m] = (uint8_t)((q[2 * m] & 0x0f) | (q[2 * m + 1] << 4));
            for (int m = 8; m < 16; m++)   /* x[2m], x[2m+1]: high nibbles of q[2m-16], q[2m-15] */
                out[m] = (uint8_t)((q[2 * m - 16] >> 4) | (q[2 * m - 15] & 0xf0));
        }
    }
    return DP_OK;
}
