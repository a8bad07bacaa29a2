/* Scalar reference kernels: always built, the twin of every SIMD kernel. */
#include <math.h>
#include "dp_kernels.h"

int dp_kv_write_generic(const float *src, int64_t src_stride, void *cache, int kv_dtype,
                        int64_t num_kv_heads, int64_t capacity, int64_t head_dim,
                        int64_t pos, int64_t num_tokens) {
    if (!src || !cache || num_kv_heads <= 0 || head_dim <= 0 || num_tokens < 0)
        return DP_ERR_ARG;
    if (src_stride < num_kv_heads * head_dim) return DP_ERR_ARG;
    if (pos < 0 || pos + num_tokens > capacity) return DP_ERR_BOUNDS;
    for (int64_t t = 0; t < num_tokens; t++) {
        for (int64_t kh = 0; kh < num_kv_heads; kh++) {
            const float *row = src + t * src_stride + kh * head_dim;
            int64_t dst = (kh * capacity + pos + t) * head_dim;
            if (kv_dtype == DP_F32) {
                memcpy((float *)cache + dst, row, (size_t)head_dim * sizeof(float));
            } else if (kv_dtype == DP_F16) {
                uint16_t *d = (uint16_t *)cache + dst;
                for (int64_t i = 0; i < head_dim; i++) d[i] = dp_float_to_half(row[i]);
            } else {
                return DP_ERR_ARG;
            }
        }
    }
    return DP_OK;
}

static inline float kv_at(const void *base, int kv_dtype, int64_t i) {
    return kv_dtype == DP_F32 ? ((const float *)base)[i]
                              : dp_half_to_float(((const uint16_t *)base)[i]);
}

int dp_attn_f32out_generic(const float *q, int64_t q_stride, const void *k, const void *v,
                           int kv_dtype, float *out, int64_t out_stride,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           int64_t capacity, int64_t pos0, int64_t num_tokens, float scale) {
    if (!q || !k || !v || !out) return DP_ERR_ARG;
    if (num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || num_heads % num_kv_heads)
        return DP_ERR_ARG;
    if (kv_dtype != DP_F32 && kv_dtype != DP_F16) return DP_ERR_ARG;
    if (q_stride < num_heads * head_dim || out_stride < num_heads * head_dim) return DP_ERR_ARG;
    if (pos0 < 0 || num_tokens < 0 || pos0 + num_tokens > capacity) return DP_ERR_BOUNDS;
    const int64_t group = num_heads / num_kv_heads;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t n_ctx = pos0 + t + 1; /* causal: keys [0, pos0 + t] */
        for (int64_t h = 0; h < num_heads; h++) {
            const float *qh = q + t * q_stride + h * head_dim;
            float *o = out + t * out_stride + h * head_dim;
            const int64_t kv_base = (h / group) * capacity * head_dim;
            /* Online softmax: running max m, running denominator l, o as accumulator. */
            float m = -INFINITY, l = 0.0f;
            for (int64_t i = 0; i < head_dim; i++) o[i] = 0.0f;
            for (int64_t j = 0; j < n_ctx; j++) {
                const int64_t row = kv_base + j * head_dim;
                float s = 0.0f;
                for (int64_t i = 0; i < head_dim; i++) s += qh[i] * kv_at(k, kv_dtype, row + i);
                s *= scale;
                float m_new = s > m ? s : m;
                float corr = expf(m - m_new);
                float p = expf(s - m_new);
                l = l * corr + p;
                for (int64_t i = 0; i < head_dim; i++)
                    o[i] = o[i] * corr + p * kv_at(v, kv_dtype, row + i);
                m = m_new;
            }
            const float inv = 1.0f / l;
            for (int64_t i = 0; i < head_dim; i++) o[i] *= inv;
        }
    }
    return DP_OK;
}

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
