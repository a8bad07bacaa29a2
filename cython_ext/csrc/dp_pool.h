/* A small pthread pool owned by the extension: N-1 workers plus the calling thread.
 *
 * Each worker has one CPU (or none); dp_pool_set_affinity makes every worker re-pin
 * itself before its next job. The power-aware scheduler gives every core set its own
 * pool (as ONNX Runtime has a session set per core set), so a pool never moves.
 * dp_pool_run blocks until every task has run; tasks are handed out through an
 * atomic counter (dynamic scheduling: uneven tasks balance themselves).
 */
#ifndef DP_POOL_H
#define DP_POOL_H

#include <stdint.h>
#include "dp_common.h"

#define DP_POOL_MAX_THREADS 256
#define DP_POOL_MAX_CPUS 1024 /* a pin names a cpu in [0, DP_POOL_MAX_CPUS): glibc's CPU_SETSIZE */

typedef struct dp_pool dp_pool;
/* A task reports a failure through its ctx (the pool has no status of its own). */
typedef void (*dp_task_fn)(void *ctx, int64_t task, int worker);

/* num_threads counts the caller: 1 means no worker threads. On success *out is
 * the pool, every worker started; otherwise *out is NULL and the status is
 * DP_ERR_ARG, DP_ERR_NOMEM or DP_ERR_THREAD (pthread_create failed: the workers
 * already started are stopped and joined, never a smaller pool). */
int dp_pool_create(int num_threads, dp_pool **out);
void dp_pool_destroy(dp_pool *pool);
int dp_pool_num_threads(const dp_pool *pool);
/* cpus[i % num_cpus] = the cpu thread i (0 = caller, pinned by the caller) runs on;
 * -1 = unpinned; num_cpus = 0 unpins all. DP_ERR_ARG (and nothing changed) for a cpu
 * outside [-1, DP_POOL_MAX_CPUS). */
int dp_pool_set_affinity(dp_pool *pool, const int *cpus, int num_cpus);
/* Threads a job runs on from now on, the caller included: the first n of the pool's, the
 * others asleep until it is raised again (a pool sharing its cores with other work: a
 * chat's decode beside an image's encode). n = num_threads (the default): all of them.
 * DP_ERR_ARG for n outside [1, num_threads] (nothing changed). Takes effect at the next
 * job; never while one runs. */
int dp_pool_set_active(dp_pool *pool, int n);
int dp_pool_active(const dp_pool *pool);
/* Linux thread ids of the workers (tids[0] is the caller's slot, 0 until it runs). */
int dp_pool_worker_tids(const dp_pool *pool, int64_t *tids, int max);
/* Runs fn(ctx, t, worker) for every t in [0, num_tasks), the caller included, and
 * returns when all have run. Callers on several threads take turns. A worker that
 * wakes after the caller took the last task skips the job (the caller does not wait
 * for its wake-up). */
void dp_pool_run(dp_pool *pool, int64_t num_tasks, dp_task_fn fn, void *ctx);
/* The same, but no task starts before every worker is awake and has applied its
 * affinity: the probes (every thread at once) and the placement warm-up use it. */
void dp_pool_run_all(dp_pool *pool, int64_t num_tasks, dp_task_fn fn, void *ctx);
/* Bytes [p, p + bytes) for the pool's workers to read into their caches while they spin
 * for the next job: the next product's weights, read during the caller's graph parts
 * between two products, when the memory bus is otherwise idle. They read it a few KiB at a
 * time, front to back, and stop at its end or as a job comes (the region stays set: after
 * the job they go on where they were). Replacing or clearing (p = NULL) returns once no
 * worker reads the old region any more, so that the caller may then free it; 1 then. A
 * replacement while another caller's job runs is skipped (0: the old region stays), a clear
 * waits for that job. Workers that do not spin (none ran the last job, or their spin ended)
 * read nothing. A pool of one thread has no region (0). */
int dp_pool_warm(dp_pool *pool, const void *p, int64_t bytes);
/* Threads that yield their cores to this pool's jobs: ONNX Runtime's shared-pool
 * workers, which spin for tens of milliseconds after a Run returns, right through our
 * attention between two Runs. While a job that wakes this
 * pool's workers runs, each yielder is under SCHED_IDLE (a woken worker of ours
 * preempts it at once instead of sharing its core half and half); when the job ends it
 * is back under the policy it had when registered. A yielder that is not under
 * SCHED_OTHER or SCHED_BATCH then is left alone, and one that has exited is dropped.
 * Taking a thread out of SCHED_IDLE needs CAP_SYS_NICE or RLIMIT_NICE: register only
 * where dp_can_unidle() says so. n = 0 clears; DP_ERR_ARG for n outside
 * [0, DP_POOL_MAX_YIELDERS] or a tid <= 0 (nothing changed). */
#define DP_POOL_MAX_YIELDERS 64
int dp_pool_set_yielders(dp_pool *pool, const int64_t *tids, int n);
/* 1 when this process may put a thread back under SCHED_OTHER after SCHED_IDLE:
 * tried on a throwaway thread, the only thread it changes. */
int dp_can_unidle(void);
/* Read nbytes of buf once on the pool (a bandwidth probe); returns a checksum. */
uint64_t dp_read_buffer(dp_pool *pool, const void *buf, int64_t nbytes);
/* Run `probe` (an ISA's fma_probe) for `iters` rounds on every thread at once (an
 * arithmetic peak probe); *flops = the flops done by all threads together.
 * DP_ERR_ARG or DP_ERR_NOMEM (then *flops = 0). */
int dp_run_fma_probe(dp_pool *pool, int64_t (*probe)(int64_t iters, float *sink), int64_t iters, int64_t *flops);

/* Test only: the next n pthread_create calls of dp_pool_create succeed and every
 * one after them fails, until the next call; n < 0 (the default) ends the
 * failures. Inert unless called. */
void dp_test_fail_thread_create_after(int64_t n);

#endif
