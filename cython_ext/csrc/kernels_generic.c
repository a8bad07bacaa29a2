/* Scalar reference kernels: always built, the twin of every SIMD kernel. */
#include <math.h>
#include <stdlib.h>
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

/* Half -> float through a 256 KiB table (fits in L2): the scalar twin has no F16C. */
static float half_table[65536];
static volatile int half_table_ready = 0;

static void init_half_table(void) {
    if (half_table_ready) return;
    for (uint32_t i = 0; i < 65536; i++) half_table[i] = dp_half_to_float((uint16_t)i);
    half_table_ready = 1; /* idempotent: a race only writes the same values twice */
}

/* Load head_dim values of row `row` (f32 or f16) as float into dst. */
static inline const float *kv_row(const void *base, int kv_dtype, int64_t row, int64_t head_dim, float *dst) {
    if (kv_dtype == DP_F32) return (const float *)base + row * head_dim;
    const uint16_t *h = (const uint16_t *)base + row * head_dim;
    for (int64_t i = 0; i < head_dim; i++) dst[i] = half_table[h[i]];
    return dst;
}

static inline float dot(const float *a, const float *b, int64_t n) {
    /* Eight independent partial sums: instruction-level parallelism without -ffast-math. */
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

#define DP_MAX_HEAD_DIM 512

int dp_attn_f32out_generic(const float *q, int64_t q_stride, const void *k, const void *v,
                           int kv_dtype, float *out, int64_t out_stride,
                           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           int64_t capacity, int64_t pos0, int64_t num_tokens, float scale) {
    if (!q || !k || !v || !out) return DP_ERR_ARG;
    if (num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || num_heads % num_kv_heads)
        return DP_ERR_ARG;
    if (head_dim > DP_MAX_HEAD_DIM) return DP_ERR_ARG;
    if (kv_dtype != DP_F32 && kv_dtype != DP_F16) return DP_ERR_ARG;
    if (q_stride < num_heads * head_dim || out_stride < num_heads * head_dim) return DP_ERR_ARG;
    if (pos0 < 0 || num_tokens < 0 || pos0 + num_tokens > capacity) return DP_ERR_BOUNDS;
    if (kv_dtype == DP_F16) init_half_table();
    const int64_t group = num_heads / num_kv_heads;
    /* scores: (pos0 + num_tokens) floats, reused for every (token, head). */
    float *scores = (float *)malloc((size_t)(pos0 + num_tokens) * sizeof(float));
    if (!scores) return DP_ERR_NOMEM;
    float row_buf[DP_MAX_HEAD_DIM];
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t n_ctx = pos0 + t + 1; /* causal: keys [0, pos0 + t] */
        for (int64_t h = 0; h < num_heads; h++) {
            const float *qh = q + t * q_stride + h * head_dim;
            float *o = out + t * out_stride + h * head_dim;
            const int64_t kv_row0 = (h / group) * capacity;
            /* Pass 1: scores and their maximum. */
            float m = -INFINITY;
            for (int64_t j = 0; j < n_ctx; j++) {
                const float s = dot(qh, kv_row(k, kv_dtype, kv_row0 + j, head_dim, row_buf), head_dim) * scale;
                scores[j] = s;
                if (s > m) m = s;
            }
            /* Pass 2: softmax weights. */
            float l = 0.0f;
            for (int64_t j = 0; j < n_ctx; j++) {
                scores[j] = expf(scores[j] - m);
                l += scores[j];
            }
            /* Pass 3: weighted sum of values. */
            for (int64_t i = 0; i < head_dim; i++) o[i] = 0.0f;
            for (int64_t j = 0; j < n_ctx; j++) {
                const float p = scores[j];
                const float *vr = kv_row(v, kv_dtype, kv_row0 + j, head_dim, row_buf);
                for (int64_t i = 0; i < head_dim; i++) o[i] += p * vr[i];
            }
            const float inv = 1.0f / l;
            for (int64_t i = 0; i < head_dim; i++) o[i] *= inv;
        }
    }
    free(scores);
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
