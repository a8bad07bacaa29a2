/* An encoder's attention over packed texts (enc_attn.h): the tasks, the K^T packing and
 * the checks; the ISA's enc_rows does the arithmetic. */
#include "enc_attn.h"

#include <stdlib.h>

/* K^T of one head: n rows of k (stride ld, hd values each) into kt in blocks of 16. */
static void pack_kt(const float *k, int64_t ld, int64_t n, int64_t hd, float *kt) {
    const int64_t np = (n + 15) & ~(int64_t)15;
    for (int64_t r0 = 0; r0 < np; r0 += 16) {
        float *blk = kt + r0 * hd; /* block r0 / 16 starts at (r0 / 16) * hd * 16 */
        for (int64_t i = 0; i < 16; i++) {
            const int64_t r = r0 + i;
            if (r < n) {
                const float *row = k + r * ld;
                for (int64_t e = 0; e < hd; e++) blk[e * 16 + i] = row[e];
            } else {
                for (int64_t e = 0; e < hd; e++) blk[e * 16 + i] = 0.0f;
            }
        }
    }
}

/* A task: head h of text b, its query rows [q0, q1). */
typedef struct {
    int64_t b, h, q0, q1;
} enc_task;

typedef struct {
    dp_enc_rows_fn fn;
    const float *q, *k, *v;
    int64_t ld, hd, ldo;
    const int64_t *starts;
    float scale;
    float *out;
    const enc_task *tasks;
    float *scratch;       /* per worker: K^T, then the scores */
    int64_t worker_floats; /* floats of scratch per worker */
} enc_run;

static void enc_task_fn(void *ctx, int64_t t, int worker) {
    const enc_run *r = (const enc_run *)ctx;
    const enc_task *task = &r->tasks[t];
    const int64_t s0 = r->starts[task->b], n = r->starts[task->b + 1] - s0, hd = r->hd, off = task->h * hd;
    float *kt = r->scratch + (int64_t)worker * r->worker_floats;
    float *s = kt + ((n + 15) & ~(int64_t)15) * hd;
    pack_kt(r->k + s0 * r->ld + off, r->ld, n, hd, kt);
    r->fn(r->q + (s0 + task->q0) * r->ld + off, r->ld, task->q1 - task->q0, hd, kt, n, r->v + s0 * r->ld + off,
          r->ld, r->scale, s, r->out + (s0 + task->q0) * r->ldo + off, r->ldo);
}

/* Tasks a thread should have at least, so that uneven texts balance across threads. */
#define TASKS_PER_THREAD 4
/* The fewest query rows a task takes when a text's heads are split into pieces: below
 * this the task's packing of K^T (every piece packs its own) costs more than it spreads. */
#define MIN_TASK_ROWS 64

/* The pieces a text of n tokens is cut into: at most `pieces`, and one per MIN_TASK_ROWS
 * tokens begun. */
static int64_t text_pieces(int64_t n, int64_t pieces) {
    const int64_t p = (n + MIN_TASK_ROWS - 1) / MIN_TASK_ROWS;
    return p < pieces ? p : pieces;
}

int dp_enc_attention(dp_pool *pool, const dp_attn_ops *ops, const float *q, const float *k, const float *v,
                     int64_t ld, int64_t rows, const int64_t *starts, int64_t B, int64_t nh, int64_t hd,
                     float scale, float *out, int64_t ldo) {
    if (!ops || !q || !k || !v || !starts || !out || rows < 1 || B < 1 || nh < 1 || hd < 1 ||
        hd > DP_MAX_HEAD_DIM || ld < nh * hd || ldo < nh * hd)
        return DP_ERR_ARG;
    if (starts[0] != 0 || starts[B] != rows) return DP_ERR_BOUNDS;
    int64_t longest = 0, texts = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = starts[b + 1] - starts[b];
        if (n < 0) return DP_ERR_BOUNDS;
        if (n > longest) longest = n;
        texts += n > 0;
    }
    const dp_enc_rows_fn fn = hd % 8 == 0 && ops->enc_rows ? ops->enc_rows : dp_ops_generic.enc_rows;
    const int threads = pool ? dp_pool_num_threads(pool) : 1;
    /* one task per head of a text, unless there are too few of them for the threads: then
     * each is cut into pieces of its query rows */
    const int64_t heads = texts * nh, want = (int64_t)threads * TASKS_PER_THREAD;
    const int64_t pieces = threads > 1 && heads < want ? (want + heads - 1) / heads : 1;
    int64_t ntasks = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = starts[b + 1] - starts[b];
        if (n > 0) ntasks += nh * text_pieces(n, pieces);
    }
    enc_task *tasks = (enc_task *)dp_malloc((size_t)ntasks * sizeof(enc_task));
    const int64_t worker_floats = (dp_enc_scratch_floats(longest, hd) + 15) & ~(int64_t)15;
    void *scratch = NULL;
    if (!tasks || dp_aligned_alloc(&scratch, 64, (size_t)threads * (size_t)worker_floats * sizeof(float))) {
        free(tasks);
        return DP_ERR_NOMEM;
    }
    int64_t t = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = starts[b + 1] - starts[b];
        if (n == 0) continue;
        const int64_t p = text_pieces(n, pieces);
        /* pieces of whole DP_ENC_ROWS rows, as even as that allows */
        const int64_t per = ((n + p - 1) / p + DP_ENC_ROWS - 1) / DP_ENC_ROWS * DP_ENC_ROWS;
        for (int64_t h = 0; h < nh; h++)
            for (int64_t q0 = 0; q0 < n; q0 += per) tasks[t++] = (enc_task){b, h, q0, q0 + per < n ? q0 + per : n};
    }
    enc_run run = {fn, q, k, v, ld, hd, ldo, starts, scale, out, tasks, (float *)scratch, worker_floats};
    if (pool && threads > 1 && t > 1)
        dp_pool_run(pool, t, enc_task_fn, &run);
    else
        for (int64_t i = 0; i < t; i++) enc_task_fn(&run, i, 0);
    free(scratch);
    free(tasks);
    return DP_OK;
}
