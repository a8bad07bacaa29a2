/* A small pthread pool owned by the extension: N-1 workers plus the calling thread.
 *
 * Each worker has one affinity mask per phase (prefill, decode); dp_pool_set_phase
 * makes every worker re-pin itself before its next job, so the power-aware
 * scheduler can move the pool between big and little cores between steps.
 * dp_pool_run blocks until every task has run; tasks are handed out through an
 * atomic counter (dynamic scheduling: uneven tasks balance themselves).
 */
#ifndef DP_POOL_H
#define DP_POOL_H

#include <stdint.h>

#define DP_POOL_MAX_THREADS 256
enum { DP_PHASE_PREFILL = 0, DP_PHASE_DECODE = 1 };

typedef struct dp_pool dp_pool;
typedef void (*dp_task_fn)(void *ctx, int64_t task, int worker);

/* num_threads counts the caller: 1 means no worker threads. NULL on failure. */
dp_pool *dp_pool_create(int num_threads);
void dp_pool_destroy(dp_pool *pool);
int dp_pool_num_threads(const dp_pool *pool);
/* cpus[i] = the cpu thread i (0 = caller) runs on in `phase`; -1 = unpinned. */
int dp_pool_set_affinity(dp_pool *pool, int phase, const int *cpus, int num_cpus);
void dp_pool_set_phase(dp_pool *pool, int phase);
/* Linux thread ids of the workers (tids[0] is the caller's slot, 0 until it runs). */
int dp_pool_worker_tids(const dp_pool *pool, int64_t *tids, int max);
void dp_pool_run(dp_pool *pool, int64_t num_tasks, dp_task_fn fn, void *ctx);
/* Read nbytes of buf once on the pool (a bandwidth probe); returns a checksum. */
uint64_t dp_read_buffer(dp_pool *pool, const void *buf, int64_t nbytes);
/* Run `probe` (an ISA's fma_probe) for `iters` rounds on every thread at once (an
 * arithmetic peak probe); returns the flops done by all threads together. */
int64_t dp_run_fma_probe(dp_pool *pool, int64_t (*probe)(int64_t iters, float *sink), int64_t iters);

#endif
