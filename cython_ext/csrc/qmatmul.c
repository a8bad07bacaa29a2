/* The classifier's product (qmatmul.h): the scalar reference, the activations'
 * quantization and the driver that splits the rows of w over a pool. */
#include <math.h>
#include <stdlib.h>
#include "dp_attn_ops.h"
#include "dp_pool.h"
#include "qmatmul.h"

void dp_quantize_act(const float *x, int64_t R, int64_t K, int64_t bs, int8_t *xq, float *xd) {
    for (int64_t b = 0; b < R * K / bs; b++) {
        const float *v = x + b * bs;
        float amax = 0.0f;
        for (int64_t i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        xd[b] = d;
        for (int64_t i = 0; i < bs; i++) xq[b * bs + i] = (int8_t)rintf(v[i] * inv);
    }
}

void dp_qrows_generic(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                      const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    const int64_t nb = K / bs;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *q = w + n * K + b * bs;
                const int8_t *x = xq + r * K + b * bs;
                int32_t s = 0;
                for (int64_t i = 0; i < bs; i++) s += ((int32_t)q[i] - 128) * x[i];
                acc += scales[n * nb + b] * xd[r * nb + b] * (float)s;
            }
            out[r * ldo + n] = acc;
        }
}

/* f32 activations (accuracy levels below 4): the values widened as they are read. */
static void qrows_f32(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                      const float *x, int64_t R, float *out, int64_t ldo) {
    const int64_t nb = K / bs;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *q = w + n * K + b * bs;
                const float *xr = x + r * K + b * bs;
                float s = 0.0f;
                for (int64_t i = 0; i < bs; i++) s += (float)((int32_t)q[i] - 128) * xr[i];
                acc += scales[n * nb + b] * s;
            }
            out[r * ldo + n] = acc;
        }
}

#define QROWS_PER_TASK 256 /* rows of w a task takes: 160 KiB of a 640-wide table; 64 and 1,024 were
                              * slower here (dualpath bench classifier, docs/performance.md) */

/* Below this many bytes of w the calling thread alone is faster than waking the pool
 * (a small table on the pool was several times slower than ONNX Runtime's product;
 * docs/performance-log.md). */
#define QMATMUL_POOL_BYTES (1 << 20)

typedef struct {
    dp_qrows_fn fn;
    const uint8_t *w;
    const float *scales;
    int64_t bs, N, K, R, ldo;
    const int8_t *xq;
    const float *xd, *x;
    float *out;
} qjob;

static void qtask(void *ctx, int64_t t, int worker) {
    (void)worker;
    const qjob *j = (const qjob *)ctx;
    const int64_t n0 = t * QROWS_PER_TASK, n1 = n0 + QROWS_PER_TASK < j->N ? n0 + QROWS_PER_TASK : j->N;
    if (j->xq)
        j->fn(j->w, j->scales, j->bs, n0, n1, j->K, j->xq, j->xd, j->R, j->out, j->ldo);
    else
        qrows_f32(j->w, j->scales, j->bs, n0, n1, j->K, j->x, j->R, j->out, j->ldo);
}

int dp_qmatmul(dp_pool *pool, const dp_attn_ops *ops, const uint8_t *w, int64_t w_len, const float *scales,
               int64_t scales_len, int64_t bs, int64_t N, int64_t K, const float *x, int64_t R, float *out,
               int64_t out_len, int64_t ldo, int int8_act) {
    if (!ops || !ops->qrows || !w || !scales || !x || !out || (bs != 16 && bs != 32) || N < 1 || K < 1 ||
        R < 1 || K % 32 || ldo < N || N > INT64_MAX / K)
        return DP_ERR_ARG;
    if (w_len < N * K || scales_len < N * (K / bs) || out_len < (R - 1) * ldo + N) return DP_ERR_BOUNDS;
    qjob j = {ops->qrows, w, scales, bs, N, K, R, ldo, NULL, NULL, x, out};
    void *buf = NULL;
    if (int8_act) {
        buf = dp_malloc((size_t)(R * K / bs) * sizeof(float) + (size_t)(R * K));
        if (!buf) return DP_ERR_NOMEM;
        j.xd = (const float *)buf;
        j.xq = (const int8_t *)((float *)buf + R * K / bs);
        dp_quantize_act(x, R, K, bs, (int8_t *)j.xq, (float *)j.xd);
    }
    const int64_t tasks = (N + QROWS_PER_TASK - 1) / QROWS_PER_TASK;
    if (pool && N * K >= QMATMUL_POOL_BYTES)
        dp_pool_run(pool, tasks, qtask, &j);
    else
        for (int64_t t = 0; t < tasks; t++) qtask(&j, t, 0);
    free(buf);
    return DP_OK;
}
