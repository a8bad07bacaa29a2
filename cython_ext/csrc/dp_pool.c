#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dp_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct dp_pool {
    int num_threads;
    pthread_t threads[DP_POOL_MAX_THREADS];
    int64_t tids[DP_POOL_MAX_THREADS];
    int cpus[2][DP_POOL_MAX_THREADS]; /* per phase, per thread: cpu or -1 */
    atomic_int phase;
    int applied_phase[DP_POOL_MAX_THREADS];
    int applied_gen[DP_POOL_MAX_THREADS];
    atomic_int affinity_gen;

    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    uint64_t job;              /* generation counter, guarded by lock */
    int stop;
    dp_task_fn fn;
    void *ctx;
    int64_t num_tasks;
    atomic_llong next_task;
    atomic_int busy;           /* workers still inside the current job */
};

static void apply_affinity(dp_pool *p, int idx) {
    const int phase = atomic_load(&p->phase), gen = atomic_load(&p->affinity_gen);
    if (p->applied_phase[idx] == phase && p->applied_gen[idx] == gen) return;
    p->applied_phase[idx] = phase;
    p->applied_gen[idx] = gen;
    const int cpu = p->cpus[phase][idx];
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void drain(dp_pool *p, int idx) {
    for (;;) {
        const int64_t t = atomic_fetch_add(&p->next_task, 1);
        if (t >= p->num_tasks) break;
        p->fn(p->ctx, t, idx);
    }
}

typedef struct { dp_pool *pool; int idx; } worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    dp_pool *p = wa.pool;
    p->tids[wa.idx] = (int64_t)syscall(SYS_gettid);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (p->job == seen && !p->stop) pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = p->job;
        pthread_mutex_unlock(&p->lock);
        apply_affinity(p, wa.idx);
        drain(p, wa.idx);
        if (atomic_fetch_sub(&p->busy, 1) == 1) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

dp_pool *dp_pool_create(int num_threads) {
    if (num_threads < 1 || num_threads > DP_POOL_MAX_THREADS) return NULL;
    dp_pool *p = (dp_pool *)calloc(1, sizeof *p);
    if (!p) return NULL;
    p->num_threads = num_threads;
    for (int ph = 0; ph < 2; ph++)
        for (int i = 0; i < DP_POOL_MAX_THREADS; i++) p->cpus[ph][i] = -1;
    for (int i = 0; i < DP_POOL_MAX_THREADS; i++) p->applied_phase[i] = p->applied_gen[i] = -1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 1; i < num_threads; i++) {
        worker_arg *wa = (worker_arg *)malloc(sizeof *wa);
        if (!wa) { p->num_threads = i; break; }
        wa->pool = p;
        wa->idx = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->num_threads = i;
            break;
        }
    }
    return p;
}

void dp_pool_destroy(dp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->num_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int dp_pool_num_threads(const dp_pool *p) { return p ? p->num_threads : 0; }

int dp_pool_set_affinity(dp_pool *p, int phase, const int *cpus, int num_cpus) {
    if (!p || phase < 0 || phase > 1 || num_cpus < 0) return 1;
    for (int i = 0; i < p->num_threads; i++) p->cpus[phase][i] = num_cpus ? cpus[i % num_cpus] : -1;
    atomic_fetch_add(&p->affinity_gen, 1);
    return 0;
}

void dp_pool_set_phase(dp_pool *p, int phase) {
    if (p && (phase == 0 || phase == 1)) atomic_store(&p->phase, phase);
}

int dp_pool_worker_tids(const dp_pool *p, int64_t *tids, int max) {
    int n = 0;
    for (int i = 0; p && i < p->num_threads && n < max; i++) tids[n++] = p->tids[i];
    return n;
}

void dp_pool_run(dp_pool *p, int64_t num_tasks, dp_task_fn fn, void *ctx) {
    if (num_tasks <= 0) return;
    if (!p || p->num_threads == 1 || num_tasks == 1) {
        for (int64_t t = 0; t < num_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->tids[0] = (int64_t)syscall(SYS_gettid);
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->num_tasks = num_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->busy, p->num_threads - 1);
    p->job++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    drain(p, 0); /* the caller works too (its affinity is the caller's business) */
    pthread_mutex_lock(&p->lock);
    while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* ---- memory read bandwidth probe (for `dualpath bench kernels`) ---------------- */
typedef struct {
    const uint64_t *buf;
    int64_t words, per_task;
    uint64_t sink[DP_POOL_MAX_THREADS * 8];
} bw_job;

static void bw_task(void *ctx, int64_t task, int worker) {
    bw_job *J = (bw_job *)ctx;
    const int64_t lo = task * J->per_task;
    const int64_t hi = lo + J->per_task < J->words ? lo + J->per_task : J->words;
    /* Eight independent XOR chains: vectorizable, one load per word, no FP. */
    uint64_t x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8)
        for (int j = 0; j < 8; j++) x[j] ^= J->buf[i + j];
    for (; i < hi; i++) x[0] ^= J->buf[i];
    J->sink[worker * 8] ^= x[0] ^ x[1] ^ x[2] ^ x[3] ^ x[4] ^ x[5] ^ x[6] ^ x[7];
}

uint64_t dp_read_buffer(dp_pool *pool, const void *buf, int64_t nbytes) {
    bw_job J;
    memset(&J, 0, sizeof J);
    J.buf = (const uint64_t *)buf;
    J.words = nbytes / 8;
    const int threads = pool ? pool->num_threads : 1;
    const int64_t tasks = threads * 4; /* a few contiguous streams per thread */
    J.per_task = (J.words + tasks - 1) / tasks;
    dp_pool_run(pool, tasks, bw_task, &J);
    uint64_t r = 0;
    for (int i = 0; i < DP_POOL_MAX_THREADS; i++) r ^= J.sink[i * 8];
    return r;
}

/* ---- arithmetic peak probe (for `dualpath bench kernels`) ---------------------- */
typedef struct {
    int64_t (*probe)(int64_t, float *);
    int64_t iters;
    int64_t flops[DP_POOL_MAX_THREADS * 8]; /* per task, a cache line apart */
    float sink[DP_POOL_MAX_THREADS * 16];
} fma_job;

static void fma_task(void *ctx, int64_t task, int worker) {
    (void)worker;
    fma_job *J = (fma_job *)ctx;
    J->flops[task * 8] = J->probe(J->iters, &J->sink[task * 16]);
}

int64_t dp_run_fma_probe(dp_pool *pool, int64_t (*probe)(int64_t iters, float *sink), int64_t iters) {
    if (!probe || iters < 0) return 0;
    fma_job *J = (fma_job *)calloc(1, sizeof *J);
    if (!J) return 0;
    J->probe = probe;
    J->iters = iters;
    /* One task per thread: every thread computes at the same time. */
    const int threads = pool ? pool->num_threads : 1;
    dp_pool_run(pool, threads, fma_task, J);
    int64_t total = 0;
    for (int i = 0; i < threads; i++) total += J->flops[i * 8];
    free(J);
    return total;
}
