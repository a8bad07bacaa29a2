#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dp_pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- allocation and thread creation, with test-only failure hooks ------------- */
/* Each countdown: -1 inert; n >= 0: n more calls succeed, then every one fails. */
static atomic_llong alloc_countdown = -1, thread_countdown = -1;

static void countdown_set(atomic_llong *c, int64_t n) { atomic_store(c, n < 0 ? -1 : (long long)n); }

/* 1 when this call is to fail. One relaxed load while the hook is inert. */
static int countdown_fails(atomic_llong *c) {
    long long v = atomic_load_explicit(c, memory_order_relaxed);
    while (v > 0 && !atomic_compare_exchange_weak(c, &v, v - 1)) {
    }
    return v == 0;
}

void dp_test_fail_alloc_after(int64_t n) { countdown_set(&alloc_countdown, n); }
void dp_test_fail_thread_create_after(int64_t n) { countdown_set(&thread_countdown, n); }

void *dp_malloc(size_t bytes) { return countdown_fails(&alloc_countdown) ? NULL : malloc(bytes); }

void *dp_calloc(size_t count, size_t bytes) { return countdown_fails(&alloc_countdown) ? NULL : calloc(count, bytes); }

int dp_aligned_alloc(void **p, size_t alignment, size_t bytes) {
    *p = NULL;
    return countdown_fails(&alloc_countdown) ? ENOMEM : posix_memalign(p, alignment, bytes);
}

/* ---- the pool ---------------------------------------------------------------- */
static inline void dp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

_Static_assert(DP_POOL_MAX_CPUS <= CPU_SETSIZE, "a pinned cpu must fit in a cpu_set_t");

typedef struct { dp_pool *pool; int idx; } worker_arg;

struct dp_pool {
    int num_threads;
    atomic_int active;         /* dp_pool_set_active: threads [0, active) take plain jobs */
    int job_active;            /* the current job's, guarded by lock */
    pthread_t threads[DP_POOL_MAX_THREADS];
    worker_arg args[DP_POOL_MAX_THREADS];
    int64_t tids[DP_POOL_MAX_THREADS]; /* workers': written before create returns */
    int cpus[DP_POOL_MAX_THREADS];        /* per thread: cpu or -1 */
    int applied_gen[DP_POOL_MAX_THREADS]; /* the affinity_gen a worker last applied */
    atomic_int affinity_gen;

    pthread_mutex_t run_lock;  /* one dp_pool_run at a time (callers on several threads) */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    uint64_t job;              /* generation counter, guarded by lock */
    atomic_ullong job_seen;    /* the same, published for workers that spin for the next job */
    int stop;
    int started;               /* workers that have published their tid, guarded by lock */
    dp_task_fn fn;
    void *ctx;
    int64_t num_tasks;
    atomic_llong next_task;
    /* Workers inside the current job (low bits) and DP_POOL_CLOSED once the caller has
     * run out of tasks: a worker joins only an open job, so the caller waits for the
     * workers that took tasks, never for one that is still waking up. */
    atomic_int joined;
    atomic_int arrived;        /* workers that woke for the current job (dp_pool_run_all) */
    int all;                   /* the current job is a dp_pool_run_all one, guarded by lock */
    /* dp_pool_warm's region: base NULL when none; warmers counts the workers inside
     * warm_chunk, which a replacement waits out. A line of their own: workers update them
     * while the caller's job fields stay put (the pool is calloc'd: padding, not _Alignas). */
    char warm_pad0[64];
    _Atomic(const uint8_t *) warm_base;
    atomic_llong warm_len, warm_next;
    atomic_int warmers;
    char warm_pad1[64];
    int num_yielders;          /* dp_pool_set_yielders, under run_lock */
    int64_t yielders[DP_POOL_MAX_YIELDERS]; /* tid, 0 once it has exited */
    int yield_policy[DP_POOL_MAX_YIELDERS]; /* the policy each goes back to */
};

#define DP_POOL_CLOSED (1 << 30)

static void apply_affinity(dp_pool *p, int idx) {
    const int gen = atomic_load(&p->affinity_gen);
    if (p->applied_gen[idx] == gen) return;
    p->applied_gen[idx] = gen;
    const int cpu = p->cpus[idx];
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

/* Bytes of dp_pool_warm's region a worker reads between two looks for the next job: a
 * few hundred nanoseconds of reading, so a job waits no longer than that for it. */
#define DP_POOL_WARM_CHUNK 4096

/* Reads the next chunk of the warm region, if any: 1 when it read one. The loads are real
 * (a prefetch may be dropped when the line-fill buffers are full), summed into a sink. */
static int warm_chunk(dp_pool *p) {
    /* Plain loads while there is nothing (left) to read: a worker that spun on locked
     * updates would take an SMT sibling's issue slots, where a pause gives them back. */
    if (!atomic_load_explicit(&p->warm_base, memory_order_relaxed) ||
        atomic_load_explicit(&p->warm_next, memory_order_relaxed) >= atomic_load_explicit(&p->warm_len, memory_order_relaxed))
        return 0;
    atomic_fetch_add(&p->warmers, 1); /* before the base is read: dp_pool_warm waits for us */
    const uint8_t *b = atomic_load(&p->warm_base);
    int did = 0;
    if (b) {
        const int64_t off = atomic_fetch_add(&p->warm_next, DP_POOL_WARM_CHUNK), len = atomic_load(&p->warm_len);
        if (off < len) {
            const int64_t end = off + DP_POOL_WARM_CHUNK < len ? off + DP_POOL_WARM_CHUNK : len;
            uint8_t sink = 0;
            for (int64_t o = off; o < end; o += 64) sink ^= ((const volatile uint8_t *)b)[o];
            __asm__ __volatile__("" : : "r"(sink));
            did = 1;
        }
    }
    atomic_fetch_sub(&p->warmers, 1);
    return did;
}

int dp_pool_warm(dp_pool *p, const void *base, int64_t bytes) {
    if (!p || p->num_threads == 1) return 0;
    /* One publisher at a time, never inside a job. A region is only worth setting while the
     * pool is free: with another caller's job running, the old one stays. */
    if (base && bytes > 0) {
        if (pthread_mutex_trylock(&p->run_lock) != 0) return 0;
    } else {
        pthread_mutex_lock(&p->run_lock);
    }
    atomic_store(&p->warm_base, NULL);
    while (atomic_load(&p->warmers)) dp_cpu_relax(); /* a chunk at most */
    if (base && bytes > 0) {
        atomic_store(&p->warm_len, bytes);
        atomic_store(&p->warm_next, 0);
        atomic_store(&p->warm_base, (const uint8_t *)base);
    }
    pthread_mutex_unlock(&p->run_lock);
    return 1;
}

/* How long a worker that finished a job spins for the next one before it sleeps: a
 * decode step is dozens of short jobs (a layer's products and attention) with the
 * calling thread's graphs between them, and a worker woken through the scheduler came
 * tens of microseconds late to each (the caller had done most of the job alone by then). */
#define DP_POOL_SPIN_NS 200000

static void spin_for_job(dp_pool *p, uint64_t seen) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 1; atomic_load_explicit(&p->job_seen, memory_order_acquire) == seen; i++) {
        if (!warm_chunk(p)) dp_cpu_relax();
        if (i % 256) continue;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) > DP_POOL_SPIN_NS) return;
    }
}

static void *worker_main(void *arg) {
    const worker_arg wa = *(const worker_arg *)arg;
    dp_pool *p = wa.pool;
    uint64_t seen = 0;
    int spin = 0; /* after a job it worked on: the next one is likely soon */
    pthread_mutex_lock(&p->lock);
    p->tids[wa.idx] = (int64_t)syscall(SYS_gettid);
    p->started++;
    pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->lock);
    for (;;) {
        if (spin) spin_for_job(p, seen);
        pthread_mutex_lock(&p->lock);
        while (p->job == seen && !p->stop) pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = p->job;
        const int all = p->all, skip = wa.idx >= p->job_active;
        pthread_mutex_unlock(&p->lock);
        spin = !skip;
        if (skip) continue; /* not among the job's threads: asleep until the next job */
        apply_affinity(p, wa.idx);
        if (all) { /* awake and pinned for job `seen`: counted under the lock, and only while
                    * that job is still the current one (a late worker counts for the job it
                    * then finds); a plain job's workers take no lock here */
            pthread_mutex_lock(&p->lock);
            if (p->job == seen && atomic_fetch_add(&p->arrived, 1) == p->num_threads - 2)
                pthread_cond_broadcast(&p->done); /* the last one: the caller goes on */
            pthread_mutex_unlock(&p->lock);
        }
        /* Join the job unless the caller already closed it (took the last task). */
        int v = atomic_load(&p->joined);
        while (!(v & DP_POOL_CLOSED) && !atomic_compare_exchange_weak(&p->joined, &v, v + 1)) {
        }
        if (v & DP_POOL_CLOSED) continue;
        drain(p, wa.idx);
        if (atomic_fetch_sub(&p->joined, 1) == (DP_POOL_CLOSED | 1)) { /* the last, caller waiting */
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

int dp_pool_create(int num_threads, dp_pool **out) {
    if (!out) return DP_ERR_ARG;
    *out = NULL;
    if (num_threads < 1 || num_threads > DP_POOL_MAX_THREADS) return DP_ERR_ARG;
    dp_pool *p = (dp_pool *)dp_calloc(1, sizeof *p);
    if (!p) return DP_ERR_NOMEM;
    for (int i = 0; i < DP_POOL_MAX_THREADS; i++) p->cpus[i] = p->applied_gen[i] = -1;
    atomic_store(&p->active, num_threads);
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->num_threads = 1; /* the threads started so far, the caller's slot included */
    for (int i = 1; i < num_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (countdown_fails(&thread_countdown) || pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            dp_pool_destroy(p); /* stops and joins threads [1, i) */
            return DP_ERR_THREAD;
        }
        p->num_threads = i + 1;
    }
    /* Every worker's tid is in place before anyone can ask for it. */
    pthread_mutex_lock(&p->lock);
    while (p->started < num_threads - 1) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    *out = p;
    return DP_OK;
}

void dp_pool_destroy(dp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    atomic_store(&p->job_seen, UINT64_MAX); /* a spinning worker goes to the lock and sees stop */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->num_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int dp_pool_num_threads(const dp_pool *p) { return p ? p->num_threads : 0; }

int dp_pool_set_affinity(dp_pool *p, const int *cpus, int num_cpus) {
    if (!p || num_cpus < 0 || (num_cpus > 0 && !cpus)) return DP_ERR_ARG;
    for (int i = 0; i < num_cpus; i++)
        if (cpus[i] < -1 || cpus[i] >= DP_POOL_MAX_CPUS) return DP_ERR_ARG; /* nothing changed */
    for (int i = 0; i < p->num_threads; i++) p->cpus[i] = num_cpus ? cpus[i % num_cpus] : -1;
    atomic_fetch_add(&p->affinity_gen, 1);
    return DP_OK;
}

int dp_pool_worker_tids(const dp_pool *p, int64_t *tids, int max) {
    int n = 0;
    for (int i = 0; p && i < p->num_threads && n < max; i++) tids[n++] = p->tids[i];
    return n;
}

/* The yielders under SCHED_IDLE (idle = 1) or back under their own policy. */
static void yielders_idle(dp_pool *p, int idle) {
    const struct sched_param zero = {0};
    for (int i = 0; i < p->num_yielders; i++) {
        if (!p->yielders[i]) continue;
        if (sched_setscheduler((pid_t)p->yielders[i], idle ? SCHED_IDLE : p->yield_policy[i], &zero) != 0 &&
            errno == ESRCH)
            p->yielders[i] = 0; /* exited */
    }
}

int dp_pool_set_yielders(dp_pool *p, const int64_t *tids, int n) {
    if (!p || n < 0 || n > DP_POOL_MAX_YIELDERS || (n > 0 && !tids)) return DP_ERR_ARG;
    for (int i = 0; i < n; i++)
        if (tids[i] <= 0) return DP_ERR_ARG;
    pthread_mutex_lock(&p->run_lock); /* not while a job runs */
    p->num_yielders = 0;
    for (int i = 0; i < n; i++) {
        const int policy = sched_getscheduler((pid_t)tids[i]);
        if (policy != SCHED_OTHER && policy != SCHED_BATCH) continue; /* exited, real-time or idle already */
        p->yielders[p->num_yielders] = tids[i];
        p->yield_policy[p->num_yielders++] = policy;
    }
    pthread_mutex_unlock(&p->run_lock);
    return DP_OK;
}

static void *unidle_probe(void *arg) {
    const struct sched_param zero = {0};
    *(int *)arg = sched_setscheduler(0, SCHED_IDLE, &zero) == 0 && sched_setscheduler(0, SCHED_OTHER, &zero) == 0;
    return NULL;
}

int dp_can_unidle(void) {
    int ok = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, unidle_probe, &ok) != 0) return 0;
    pthread_join(t, NULL);
    return ok;
}

static void pool_run(dp_pool *p, int64_t num_tasks, dp_task_fn fn, void *ctx, int all) {
    if (num_tasks <= 0) return;
    if (!p || p->num_threads == 1 || (!all && (num_tasks == 1 || atomic_load(&p->active) == 1))) {
        for (int64_t t = 0; t < num_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    p->tids[0] = (int64_t)syscall(SYS_gettid);
    yielders_idle(p, 1); /* before our workers wake: they take the yielders' cores */
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->num_tasks = num_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->joined, 0); /* open: the previous job closed with no worker inside */
    atomic_store(&p->arrived, 0);
    p->all = all;
    p->job_active = all ? p->num_threads : atomic_load(&p->active);
    p->job++;
    atomic_store_explicit(&p->job_seen, p->job, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    if (all) /* every worker awake (and pinned) before any task is taken */
        while (atomic_load(&p->arrived) < p->num_threads - 1) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    drain(p, 0); /* the caller works too (its affinity is the caller's business) */
    /* No task is left to take: close the job, then wait for the workers inside it,
     * which are running their last tasks. A worker woken after this finds it closed:
     * waiting for its wake-up (tens of microseconds through the scheduler) cost more
     * than a short job itself. The wait spins first (those tasks are short), then
     * sleeps. */
    if (atomic_fetch_or(&p->joined, DP_POOL_CLOSED) != 0) {
        for (int spin = 0; spin < 20000 && atomic_load(&p->joined) != DP_POOL_CLOSED; spin++) dp_cpu_relax();
        pthread_mutex_lock(&p->lock);
        while (atomic_load(&p->joined) != DP_POOL_CLOSED) pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    yielders_idle(p, 0);
    pthread_mutex_unlock(&p->run_lock);
}

void dp_pool_run(dp_pool *p, int64_t num_tasks, dp_task_fn fn, void *ctx) { pool_run(p, num_tasks, fn, ctx, 0); }

int dp_pool_set_active(dp_pool *p, int n) {
    if (!p || n < 1 || n > p->num_threads) return DP_ERR_ARG;
    atomic_store(&p->active, n);
    return DP_OK;
}

int dp_pool_active(const dp_pool *p) { return p ? atomic_load(&((dp_pool *)p)->active) : 1; }

void dp_pool_run_all(dp_pool *p, int64_t num_tasks, dp_task_fn fn, void *ctx) { pool_run(p, num_tasks, fn, ctx, 1); }

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
    dp_pool_run_all(pool, tasks, bw_task, &J);
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

int dp_run_fma_probe(dp_pool *pool, int64_t (*probe)(int64_t iters, float *sink), int64_t iters, int64_t *flops) {
    if (!flops) return DP_ERR_ARG;
    *flops = 0;
    if (!probe || iters < 0) return DP_ERR_ARG;
    fma_job *J = (fma_job *)dp_calloc(1, sizeof *J);
    if (!J) return DP_ERR_NOMEM;
    J->probe = probe;
    J->iters = iters;
    /* One task per thread: every thread computes at the same time. */
    const int threads = pool ? pool->num_threads : 1;
    dp_pool_run_all(pool, threads, fma_task, J);
    for (int i = 0; i < threads; i++) *flops += J->flops[i * 8];
    free(J);
    return DP_OK;
}
