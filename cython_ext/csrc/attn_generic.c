/* Scalar reference of every attention building block: always built, no flags. */
#include <math.h>
#include <pthread.h>
#include "dp_attn_ops.h"

/* f16 bits -> f32, filled once by dp_ops_generic_prepare before any kernel can be
 * dispatched to. pthread_once orders the fill before every return of every call, so
 * a thread that got the ops through dispatch (or was handed work by one that did,
 * through the pool's lock) sees the whole table, on ARM as on x86. */
static float half_table[65536];
static pthread_once_t half_table_once = PTHREAD_ONCE_INIT;

static void fill_half_table(void) {
    for (uint32_t i = 0; i < 65536; i++) half_table[i] = dp_half_to_float((uint16_t)i);
}

void dp_ops_generic_prepare(void) { pthread_once(&half_table_once, fill_half_table); }

static void scores_f32(const float *q, int64_t group, int64_t hd, const void *kt_, int64_t ldk, const float *ks,
                       int64_t n, float scale, float *scores, int64_t sstride) {
    const float *kt = (const float *)kt_;
    (void)ks;
    for (int64_t g = 0; g < group; g++) {
        float *sg = scores + g * sstride;
        for (int64_t r = 0; r < n; r++) sg[r] = 0.0f;
        for (int64_t e = 0; e < hd; e++) {
            const float qe = q[g * hd + e];
            const float *k = kt + e * ldk;
            for (int64_t r = 0; r < n; r++) sg[r] += qe * k[r];
        }
        for (int64_t r = 0; r < n; r++) sg[r] *= scale;
    }
}

static void scores_f16(const float *q, int64_t group, int64_t hd, const void *kt_, int64_t ldk, const float *ks,
                       int64_t n, float scale, float *scores, int64_t sstride) {
    const uint16_t *kt = (const uint16_t *)kt_;
    (void)ks;
    float buf[64];
    for (int64_t g = 0; g < group; g++)
        for (int64_t r = 0; r < n; r++) scores[g * sstride + r] = 0.0f;
    for (int64_t e = 0; e < hd; e++) {
        for (int64_t r0 = 0; r0 < n; r0 += 64) {
            const int64_t m = n - r0 < 64 ? n - r0 : 64;
            for (int64_t r = 0; r < m; r++) buf[r] = half_table[kt[e * ldk + r0 + r]];
            for (int64_t g = 0; g < group; g++) {
                const float qe = q[g * hd + e];
                float *sg = scores + g * sstride + r0;
                for (int64_t r = 0; r < m; r++) sg[r] += qe * buf[r];
            }
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t r = 0; r < n; r++) scores[g * sstride + r] *= scale;
}

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                      const float *vs, int64_t n, float *o) {
    const float *rows = (const float *)rows_;
    (void)vs;
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < group; g++) {
            const float w = p[g * sstride + r];
            float *og = o + g * hd;
            for (int64_t e = 0; e < hd; e++) og[e] += w * rows[r * hd + e];
        }
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                      const float *vs, int64_t n, float *o) {
    const uint16_t *rows = (const uint16_t *)rows_;
    (void)vs;
    float buf[DP_MAX_HEAD_DIM]; /* one V row */
    for (int64_t r = 0; r < n; r++) {
        for (int64_t e = 0; e < hd; e++) buf[e] = half_table[rows[r * hd + e]];
        for (int64_t g = 0; g < group; g++) {
            const float w = p[g * sstride + r];
            float *og = o + g * hd;
            for (int64_t e = 0; e < hd; e++) og[e] += w * buf[e];
        }
    }
}

/* q8: the dot product of the int8 values (exact in f32), times scale * ks[r] once per token. */
static void scores_q8(const float *q, int64_t group, int64_t hd, const void *kt_, int64_t ldk, const float *ks,
                      int64_t n, float scale, float *scores, int64_t sstride) {
    const int8_t *kt = (const int8_t *)kt_;
    for (int64_t g = 0; g < group; g++) {
        float *sg = scores + g * sstride;
        for (int64_t r = 0; r < n; r++) sg[r] = 0.0f;
        for (int64_t e = 0; e < hd; e++) {
            const float qe = q[g * hd + e];
            const int8_t *k = kt + e * ldk;
            for (int64_t r = 0; r < n; r++) sg[r] += qe * (float)k[r];
        }
        for (int64_t r = 0; r < n; r++) sg[r] *= scale * ks[r];
    }
}

/* q8: each row's scale folded into its weight, once per (query head, token). */
static void accum_q8(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                     const float *vs, int64_t n, float *o) {
    const int8_t *rows = (const int8_t *)rows_;
    float buf[DP_MAX_HEAD_DIM]; /* one V row, widened */
    for (int64_t r = 0; r < n; r++) {
        for (int64_t e = 0; e < hd; e++) buf[e] = (float)rows[r * hd + e];
        for (int64_t g = 0; g < group; g++) {
            const float w = p[g * sstride + r] * vs[r];
            float *og = o + g * hd;
            for (int64_t e = 0; e < hd; e++) og[e] += w * buf[e];
        }
    }
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dp_float_to_half(src[i]);
}

static float exp_sum(float *x, int64_t n, float max) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        s += x[i];
    }
    return s;
}

static float max_of(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* 8 scalar chains: the reference's own rate, not the machine's vector peak. */
static inline float scalar_set(float v) { return v; }
static inline float scalar_fma(float x, float m, float c) { return x * m + c; }
static inline float scalar_add(float a, float b) { return a + b; }
DP_DEFINE_FMA_PROBE(float, 8, 1, scalar_set, scalar_fma, scalar_add, scalar_set)

/* An encoder's attention (enc_attn.h), one query row at a time: the reference of the
 * ISAs' enc_rows, and the one for a head_dim that is not a multiple of 8. */
static void enc_rows(const float *q, int64_t ldq, int64_t m, int64_t hd, const float *kt, int64_t n, const float *v,
                     int64_t ldv, float scale, float *s, float *out, int64_t ldo) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t r = 0; r < n; r++) {
            const float *kb = kt + (r / 16) * hd * 16 + r % 16;
            float d = 0.0f;
            for (int64_t e = 0; e < hd; e++) d += q[i * ldq + e] * kb[e * 16];
            s[r] = d * scale;
        }
        const float inv = 1.0f / exp_sum(s, n, max_of(s, n));
        float *o = out + i * ldo;
        for (int64_t e = 0; e < hd; e++) o[e] = 0.0f;
        for (int64_t r = 0; r < n; r++)
            for (int64_t e = 0; e < hd; e++) o[e] += s[r] * v[r * ldv + e];
        for (int64_t e = 0; e < hd; e++) o[e] *= inv;
    }
}

const dp_attn_ops dp_ops_generic = {
    .kv = {[DP_KV_F16] = {scores_f16, accum_f16}, [DP_KV_F32] = {scores_f32, accum_f32},
           [DP_KV_Q8] = {scores_q8, accum_q8}},
    DP_ATTN_OPS_COMMON,
    .qrows = dp_qrows_generic,
    .lrows = dp_lrows_generic,
    .lquant = dp_lact_quantize,
};
