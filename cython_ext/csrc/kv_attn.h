/* Attention over the KV arena (kv_arena.h): the span walk of kv_attn.c.
 *
 * A call reads a sequence through its spans, in position order, in runs of
 * positions gathered across tiles and spans, and hands every run to the building
 * blocks of one ISA (dp_attn_ops.h), on a thread pool (dp_pool.h).
 */
#ifndef DP_KV_ATTN_H
#define DP_KV_ATTN_H

#include "kv_arena.h"
#include "dp_attn_ops.h"
#include "dp_pool.h"

/* How a layer attends (the same for every query of a call):
 *   scale:   multiplies q.k (usually 1/sqrt(head_dim));
 *   softcap: > 0 caps the scaled scores as softcap * tanh(score / softcap) (Gemma 2), 0 = off;
 *   window:  > 0 is a sliding window: a query at position p sees positions p - window + 1 .. p
 *            (llama.cpp's LLAMA_SWA_TYPE_STANDARD), 0 = the whole causal context;
 *   prefetch_degree: spans prefetched ahead (random path);
 *   decode_on_caller: see below (the model runner sets it where ONNX Runtime's shared pool
 *            spins on between its parts: a second pool's workers would only contend with it). */
typedef struct {
    float scale;
    float softcap;
    int64_t window;
    int prefetch_degree;
    int decode_on_caller; /* 1: a step with too few tokens to feed the pool (decode) is not split
                           * over the context (flash-decoding) but run by the calling thread
                           * alone; 0 (the default): split */
} dp_attn_params;

/* Scratch of an attention call: the batch's jobs, span starts, flash-decoding partials
 * and one slice per pool thread (q, o, m, l and a run's scores of a task), owned by
 * the caller and reused call after call. A call grows it when it needs more (one
 * aligned allocation, before anything is written; it never shrinks), so with a warm
 * workspace a layer step allocates nothing. One call at a time per workspace; inside
 * a call each pool thread works in its own slice. A call given NULL allocates one for
 * itself and frees it before it returns. Zero-initialize, free with
 * dp_attn_workspace_free (which leaves it empty and reusable). */
typedef struct {
    void *buf;
    size_t bytes;
} dp_attn_workspace;
void dp_attn_workspace_free(dp_attn_workspace *ws);

/* Causal attention (see dp_attn_params) for num_tokens queries at positions [pos0, pos0 + num_tokens)
 * over the sequence described by `spans` (num_spans, 3), which covers at least
 * pos0 + num_tokens tokens, with the building blocks `ops`, on `pool` (NULL = the
 * calling thread only).
 *   q, out: (num_tokens, num_heads * head_dim) f32, row strides q_stride / out_stride
 * Work is split over (token, KV head, slice of its query heads); a decode with
 * too few of those also splits the context (flash-decoding) and merges.
 * DP_ERR_NOMEM when its one allocation (a workspace, see dp_attn_workspace) fails:
 * then `out` is untouched. */
int dp_attn_spans(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                  const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                  const int64_t *spans, int64_t num_spans, int64_t pos0, int64_t num_tokens,
                  dp_attn_params params);

/* The same for a batch of sequences in one call (one pool run covers them all).
 * seqs: (num_seqs, 5) int64 rows (row0, num_tokens, pos0, span0, num_spans): the
 * sequence's queries are rows [row0, row0 + num_tokens) of q/out (which have
 * num_rows rows), its kernel view is spans[span0 : span0 + num_spans]. Each
 * sequence is split exactly as dp_attn_spans would split it alone, so its output
 * does not depend on the rest of the batch. Scratch comes from `ws` (NULL: one
 * allocation for this call). */
int dp_attn_batch(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                  const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                  int64_t num_rows, const int64_t *seqs, int64_t num_seqs, const int64_t *spans,
                  int64_t spans_len, dp_attn_params params, dp_attn_workspace *ws);

/* One step of a layer: write rows [0, num_rows) of k, v (row stride kv_stride) at
 * `slots` (num_rows, 3), then dp_attn_batch. Slots, sequences and spans are all
 * checked, and the workspace made big enough, before the first write, and nothing
 * after it can fail: a failing step leaves the arena as it was. */
int dp_step_batch(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer, const float *k,
                  const float *v, int64_t kv_stride, const int64_t *slots, const float *q, int64_t q_stride,
                  float *out, int64_t out_stride, int64_t num_heads, int64_t num_rows, const int64_t *seqs,
                  int64_t num_seqs, const int64_t *spans, int64_t spans_len, dp_attn_params params,
                  dp_attn_workspace *ws);

#endif
