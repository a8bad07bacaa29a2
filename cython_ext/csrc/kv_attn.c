/* Attention over the KV arena (kv_attn.h): a sequence's spans walked in runs of
 * positions, each run scored, softmaxed and accumulated with one ISA's building blocks,
 * split over a thread pool (flash-decoding for a decode step). */
#include <math.h>
#include <stdlib.h>
#include "kv_attn.h"
#include "kv_tile.h"

#define DP_GSLICE 16  /* query heads of one KV head scored in one call */
/* Positions per flash-decoding chunk, at least (but any context of DP_MIN_CHUNK or more
 * is split in two): a decode over 256 positions is split in two, over 1,024 in four, over
 * 2,048 or more in eight, 4 chunks per thread. A chunk's merge costs num_heads *
 * (head_dim + 2) floats; a context left whole runs on one thread while the others wait. */
#define DP_MIN_CHUNK 256
/* Positions per softmax pass, at most; a run may cover several tiles (buffers and the
 * scores' stride are sized for DP_RUN). A decode task (one query token) gathers runs of
 * DP_RUN_DECODE: small runs keep a run's K and V in L1 between the scores and the
 * accumulation, and the reads of the run DP_AHEAD after it (prefetched during it) arrive
 * in time, so a decode streams its context faster than with long runs. A prefill block
 * (many query rows per K/V load) is compute-bound and pays the softmax bookkeeping per
 * run: long runs there (docs/performance.md has the figures). */
#define DP_RUN 128
#define DP_RUN_DECODE 32
/* Runs between a run's prefetch (prefetch_next) and its compute: two runs ahead, not
 * one, gives a decode that streams from DRAM the time its reads need to arrive, at no
 * cost where attention is compute-bound (docs/performance.md). */
#define DP_AHEAD 2

/* A piece of a run: n consecutive positions from row `row` of one tile. */
typedef struct {
    const char *tile;
    int64_t P, row, n;
} run_seg;

typedef struct {
    const dp_arena *a;
    const dp_attn_ops *ops;
    const char *region;
    const float *q;
    int64_t q_stride;
    float *out;
    int64_t out_stride;
    int64_t num_heads, group;
    const int64_t *spans;
    int64_t num_spans;
    const int64_t *span_start; /* (num_spans + 1,) first position of each span */
    int64_t pos0, num_tokens;
    float scale;
    float softcap;        /* > 0: scores become softcap * tanh(score / softcap) */
    int64_t window;       /* > 0: a token at p sees positions > p - window only */
    int prefetch_degree;
    int64_t ctx_lo;       /* first position any query of this job sees */
    int64_t chunk;        /* context positions per task */
    int64_t num_chunks;   /* per query block */
    int64_t block_tokens; /* query tokens per task (prefill blocking; 1 when chunked) */
    int64_t run_len;      /* positions per run: DP_RUN_DECODE in a decode step, else DP_RUN */
    float *partial;     /* chunked: (tasks, num_heads, head_dim + 2) = o, m, l */
    float *scratch;     /* (threads, scratch_stride): pool thread w's q, o, m, l, scores */
    int64_t scratch_stride;
} attn_job;

static inline void prefetch_tile(const dp_arena *a, const char *tile, int64_t P) {
    /* One line per 4 KiB page: the hardware prefetcher follows within a page. */
    const int64_t tb = tile_bytes(a, P);
    for (int64_t off = 0; off < tb; off += 4096) __builtin_prefetch(tile + off, 0, 1);
}

/* Where the next run starts: span s, its tile and row. */
typedef struct {
    int64_t s, pos, span_end, P, tb, row;
    const char *tile;
} run_cursor;

static void cursor_init(const attn_job *J, run_cursor *c, int64_t lo) {
    /* The last span starting at or before lo (span_start is sorted); gather_run enters
     * it, skipping empty spans. */
    int64_t s = 0, lo_s = 0, hi_s = J->num_spans - 1;
    while (lo_s <= hi_s) {
        const int64_t mid = (lo_s + hi_s) / 2;
        if (J->span_start[mid] <= lo) { s = mid; lo_s = mid + 1; } else { hi_s = mid - 1; }
    }
    c->s = s - 1;
    c->pos = lo;
    c->span_end = lo;
    c->P = 1;
    c->tb = 0;
    c->row = 0;
    c->tile = NULL;
}

/* Up to J->run_len positions from c->pos (below hi) as segments of whole tiles' rows,
 * ending at a multiple of J->run_len: runs start on a multiple of it (after a range's
 * first), so their pieces start on a tile's row 0 and fill whole 16-position vectors
 * (a range starting mid-run, as a flash-decoding chunk or a sliding window does, would
 * otherwise leave every run straddling tiles, two partial pieces and their masked
 * tails each, a slower decode step); returns how many. */
static int64_t gather_run(const attn_job *J, run_cursor *c, int64_t hi, run_seg *seg, int64_t *ns) {
    int64_t n_run = 0;
    const int64_t cap = J->run_len - c->pos % J->run_len;
    *ns = 0;
    while (n_run < cap && c->pos < hi) {
        if (c->pos >= c->span_end) { /* enter the span holding pos (dp_kv_check_spans: one exists) */
            do { c->s++; } while (J->span_start[c->s] + J->spans[3 * c->s + 1] <= c->pos);
            c->P = J->spans[3 * c->s + 2];
            c->tb = tile_bytes(J->a, c->P);
            c->span_end = J->span_start[c->s] + J->spans[3 * c->s + 1];
            const int64_t i = c->pos - J->span_start[c->s]; /* index inside the span */
            c->tile = J->region + J->spans[3 * c->s] + (i / c->P) * c->tb;
            c->row = i % c->P;
            /* Random path: the next spans are scattered pages. */
            for (int d = 1; d <= J->prefetch_degree && c->s + d < J->num_spans; d++)
                prefetch_tile(J->a, J->region + J->spans[3 * (c->s + d)], J->spans[3 * (c->s + d) + 2]);
        }
        int64_t n = c->P - c->row; /* rows left in this tile */
        if (n > c->span_end - c->pos) n = c->span_end - c->pos;
        if (n > hi - c->pos) n = hi - c->pos;
        if (n > cap - n_run) n = cap - n_run;
        seg[(*ns)++] = (run_seg){c->tile, c->P, c->row, n};
        c->pos += n;
        n_run += n;
        c->row += n;
        if (c->row == c->P) {
            c->row = 0;
            c->tile += c->tb;
        }
    }
    return n_run;
}

/* The K pass (scores) or the V pass (accumulation) of one run, every KV head.
 * An ISA with run ops takes one KV head's pieces of the whole run in one call, so
 * its accumulators stay in registers across tiles; otherwise each piece is one call,
 * the tiles read in address order (every KV head of a tile, then the next tile). */
/* Prefetch into L2 what the same pass reads for KV head kh in the next run (`next`,
 * nn pieces): a head's K^T rows of a tile (head_dim x P, contiguous) or its V rows.
 * A run's compute covers the latency of the next one's DRAM reads, which the
 * hardware prefetchers do not start early enough: a head's bytes in a tile are a
 * couple of KiB, and the next tile's a tile further on. */
static inline void prefetch_next(const attn_job *J, int values, int64_t kh, const run_seg *next, int64_t nn) {
    const dp_arena *a = J->a;
    const int64_t hd = a->head_dim, eb = a->elem_bytes, nkv = a->num_kv_heads;
    for (int64_t j = 0; j < nn; j++) {
        const char *p;
        int64_t len;
        if (values) {
            p = next[j].tile + ((nkv + kh) * next[j].P + next[j].row) * hd * eb;
            len = next[j].n * hd * eb;
        } else {
            p = next[j].tile + kh * hd * next[j].P * eb;
            len = hd * next[j].P * eb;
        }
        for (int64_t off = 0; off < len; off += 64) __builtin_prefetch(p + off, 0, 2);
        if (a->scale_bytes) /* the piece's scales: n floats */
            __builtin_prefetch(next[j].tile + (values ? vs_offset(a, next[j].P, next[j].row, kh)
                                                      : ks_offset(a, next[j].P, next[j].row, kh)), 0, 2);
    }
}

static void run_pass(const attn_job *J, int values, int64_t rows, const float *q, const run_seg *seg, int64_t ns,
                     const run_seg *next, int64_t nn, float *o, float *sc) {
    const dp_arena *a = J->a;
    const dp_kv_kernels *kk = &J->ops->kv[a->kv_dtype];
    const int64_t hd = a->head_dim, eb = a->elem_bytes, nkv = a->num_kv_heads;
    const int scaled = a->scale_bytes != 0;
    if (kk->scores_run && kk->accum_run) {
        dp_seg ps[DP_RUN];
        for (int64_t kh = 0; kh < nkv; kh++) {
            prefetch_next(J, values, kh, next, nn);
            for (int64_t j = 0; j < ns; j++) {
                const char *t = seg[j].tile;
                const int64_t Pj = seg[j].P, row = seg[j].row;
                ps[j] = values ? (dp_seg){t + ((nkv + kh) * Pj + row) * hd * eb, hd, seg[j].n,
                                          scaled ? (const float *)(t + vs_offset(a, Pj, row, kh)) : NULL}
                               : (dp_seg){t + (kh * hd * Pj + row) * eb, Pj, seg[j].n,
                                          scaled ? (const float *)(t + ks_offset(a, Pj, row, kh)) : NULL};
            }
            for (int64_t r0 = 0; r0 < rows; r0 += DP_GSLICE) {
                const int64_t rn = rows - r0 < DP_GSLICE ? rows - r0 : DP_GSLICE, base = kh * rows + r0;
                float *o_ = o + base * hd, *s_ = sc + base * DP_RUN;
                if (values) kk->accum_run(s_, DP_RUN, rn, hd, ps, ns, o_);
                else kk->scores_run(q + base * hd, rn, hd, ps, ns, J->scale, s_, DP_RUN);
            }
        }
        return;
    }
    for (int64_t kh = 0; kh < nkv; kh++) prefetch_next(J, values, kh, next, nn);
    for (int64_t j = 0, off = 0; j < ns; off += seg[j].n, j++) {
        const int64_t Pj = seg[j].P, row = seg[j].row;
        for (int64_t kh = 0; kh < nkv; kh++) {
            const char *kt = seg[j].tile + (kh * hd * Pj + row) * eb;          /* K^T, ldk = P */
            const char *vr = seg[j].tile + ((nkv + kh) * Pj + row) * hd * eb; /* V rows */
            const float *ks = scaled ? (const float *)(seg[j].tile + ks_offset(a, Pj, row, kh)) : NULL;
            const float *vs = scaled ? (const float *)(seg[j].tile + vs_offset(a, Pj, row, kh)) : NULL;
            for (int64_t r0 = 0; r0 < rows; r0 += DP_GSLICE) {
                const int64_t rn = rows - r0 < DP_GSLICE ? rows - r0 : DP_GSLICE, base = kh * rows + r0;
                float *sg = sc + base * DP_RUN + off;
                if (values) kk->accum(sg, DP_RUN, rn, hd, vr, vs, seg[j].n, o + base * hd);
                else kk->scores(q + base * hd, rn, hd, kt, Pj, ks, seg[j].n, J->scale, sg, DP_RUN);
            }
        }
    }
}

/* One run for every query row: scores (the K pass), the online softmax in L1, then
 * the accumulation (the V pass). */
static void attend_run(const attn_job *J, int64_t t0, int64_t tq, const float *q, const run_seg *seg, int64_t ns,
                       const run_seg *next, int64_t nn, int64_t rpos, int64_t rn_run, float *m, float *l, float *o,
                       float *sc) {
    const int64_t hd = J->a->head_dim, nkv = J->a->num_kv_heads, G = J->group;
    const int64_t rows = tq * G;
    run_pass(J, 0, rows, q, seg, ns, next, nn, o, sc);
    for (int64_t h = 0; h < nkv * rows; h++) {
        float *sg = sc + h * DP_RUN;
        /* Causal: this row's token sees positions < limit; with a sliding window,
         * only those >= first as well (llama.cpp's LLAMA_SWA_TYPE_STANDARD). */
        const int64_t limit = J->pos0 + t0 + (h % rows) / G + 1;
        const int64_t first = J->window > 0 ? limit - J->window : 0;
        if (limit <= rpos || first >= rpos + rn_run) { /* nothing visible in this run: add nothing */
            memset(sg, 0, (size_t)rn_run * sizeof(float));
            continue;
        }
        const int64_t visible = limit - rpos < rn_run ? limit - rpos : rn_run;
        const int64_t skip = first > rpos ? first - rpos : 0; /* masked by the window */
        float *vis = sg + skip;
        const int64_t nvis = visible - skip;
        if (J->softcap > 0.0f) { /* Gemma 2: cap * tanh(s / cap), before the softmax */
            const float cap = J->softcap, inv = 1.0f / J->softcap;
            for (int64_t r = 0; r < nvis; r++) vis[r] = cap * tanhf(vis[r] * inv);
        }
        const float mx = J->ops->max_of(vis, nvis);
        if (mx > m[h]) { /* rescale what was accumulated under the old maximum */
            const float corr = expf(m[h] - mx);
            l[h] *= corr;
            for (int64_t e = 0; e < hd; e++) o[h * hd + e] *= corr;
            m[h] = mx;
        }
        l[h] += J->ops->exp_sum(vis, nvis, m[h]);
        for (int64_t r = 0; r < skip; r++) sg[r] = 0.0f;
        for (int64_t r = visible; r < rn_run; r++) sg[r] = 0.0f;
    }
    run_pass(J, 1, rows, q, seg, ns, next, nn, o, sc);
}

/* Online softmax for query tokens [t0, t0 + tq), every head, over positions [lo, hi).
 * The task streams whole tiles (every KV head of P tokens, contiguous) in position
 * order, so reads are sequential, and each K/V row is loaded once for all the query
 * rows that read it: the heads of a GQA group and, in prefill, a block of tokens.
 * Positions go in runs of up to DP_RUN, gathered across tiles and spans (a page of
 * the random path holds only a few tokens), so the softmax bookkeeping and the
 * calls into the ISA's building blocks are paid per run, not per page.
 * Layout of q, o: (num_kv_heads, tq * group, head_dim); m, l: (num_kv_heads, tq * group);
 * row r of KV head kh is token t0 + r / group, query head kh * group + r % group. */
static void attend_range(const attn_job *J, int64_t t0, int64_t tq, const float *q, int64_t lo, int64_t hi,
                         float *m, float *l, float *o, float *sc) {
    const int64_t hd = J->a->head_dim, nkv = J->a->num_kv_heads, rows = tq * J->group; /* rows per KV head */
    for (int64_t r = 0; r < nkv * rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, (size_t)(nkv * rows * hd) * sizeof(float));
    if (lo >= hi) return;
    run_cursor cur;
    run_seg segs[DP_AHEAD + 1][DP_RUN]; /* a ring: this run and the DP_AHEAD after it */
    int64_t ns[DP_AHEAD + 1], n_run[DP_AHEAD + 1], run_pos[DP_AHEAD + 1];
    cursor_init(J, &cur, lo);
    for (int k = 0; k < DP_AHEAD; k++) {
        run_pos[k] = cur.pos;
        n_run[k] = gather_run(J, &cur, hi, segs[k], &ns[k]);
    }
    for (int i = 0; n_run[i] > 0; i = (i + 1) % (DP_AHEAD + 1)) {
        const int nx = (i + DP_AHEAD) % (DP_AHEAD + 1); /* the run whose reads this one's compute covers */
        run_pos[nx] = cur.pos;
        n_run[nx] = gather_run(J, &cur, hi, segs[nx], &ns[nx]);
        attend_run(J, t0, tq, q, segs[i], ns[i], segs[nx], n_run[nx] ? ns[nx] : 0, run_pos[i], n_run[i], m, l,
                   o, sc);
    }
}

/* Floats of a task's scratch: q, o (tq, num_heads, head_dim), m, l (tq, num_heads) and
 * the scores of a run (tq, num_heads, DP_RUN), tq = the job's block of query tokens. */
static int64_t task_scratch_floats(const attn_job *J) {
    const int64_t tq = J->block_tokens, H = J->num_heads;
    return 2 * tq * H * J->a->head_dim + 2 * tq * H + tq * H * DP_RUN;
}

/* Task = (block of query tokens, context chunk), on pool thread `worker`, in that
 * thread's slice of the workspace (tasks run one after another on a thread). */
static void attn_task(void *ctx, int64_t task, int worker) {
    const attn_job *J = (const attn_job *)ctx;
    const int64_t hd = J->a->head_dim, H = J->num_heads, nkv = J->a->num_kv_heads, G = J->group;
    const int64_t c = task % J->num_chunks, b = task / J->num_chunks;
    const int64_t t0 = b * J->block_tokens;
    const int64_t tq = J->num_tokens - t0 < J->block_tokens ? J->num_tokens - t0 : J->block_tokens;
    const int64_t rows = tq * G, n_ctx = J->pos0 + t0 + tq; /* the block's last token sees [0, n_ctx) */
    float *scratch = J->scratch + (int64_t)worker * J->scratch_stride;
    float *q = scratch, *o = q + tq * H * hd, *m = o + tq * H * hd, *l = m + tq * H, *sc = l + tq * H;
    for (int64_t tl = 0; tl < tq; tl++)  /* (token, head) -> (kv head, token, group member) */
        for (int64_t kh = 0; kh < nkv; kh++)
            memcpy(q + (kh * rows + tl * G) * hd, J->q + (t0 + tl) * J->q_stride + kh * G * hd,
                   (size_t)(G * hd) * sizeof(float));
    int64_t lo = J->ctx_lo + c * J->chunk;
    const int64_t hi = J->ctx_lo + (c + 1) * J->chunk < n_ctx ? J->ctx_lo + (c + 1) * J->chunk : n_ctx;
    if (J->window > 0 && lo < J->pos0 + t0 + 1 - J->window) /* before the block's first window */
        lo = J->pos0 + t0 + 1 - J->window;
    attend_range(J, t0, tq, q, lo, hi, m, l, o, sc);
    for (int64_t tl = 0; tl < tq; tl++)
        for (int64_t kh = 0; kh < nkv; kh++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = kh * rows + tl * G + g, h = kh * G + g;
                if (J->num_chunks == 1) {
                    float *dst = J->out + (t0 + tl) * J->out_stride + h * hd;
                    const float inv = 1.0f / l[r];
                    for (int64_t e = 0; e < hd; e++) dst[e] = o[r * hd + e] * inv;
                } else { /* decode: one token per task */
                    float *part = J->partial + (task * H + h) * (hd + 2);
                    memcpy(part, o + r * hd, (size_t)hd * sizeof(float));
                    part[hd] = m[r];
                    part[hd + 1] = l[r];
                }
            }
}

/* Flash-decoding merge: combine the chunks' (o, m, l) of every (token, head). */
static void merge_chunks(const attn_job *J) {
    const int64_t hd = J->a->head_dim, H = J->num_heads;
    for (int64_t t = 0; t < J->num_tokens; t++)
        for (int64_t h = 0; h < H; h++) {
            float M = -INFINITY, L = 0.0f;
            for (int64_t c = 0; c < J->num_chunks; c++) {
                const float *pc = J->partial + ((t * J->num_chunks + c) * H + h) * (hd + 2);
                if (pc[hd + 1] > 0.0f && pc[hd] > M) M = pc[hd];
            }
            float *dst = J->out + t * J->out_stride + h * hd;
            for (int64_t e = 0; e < hd; e++) dst[e] = 0.0f;
            for (int64_t c = 0; c < J->num_chunks; c++) {
                const float *pc = J->partial + ((t * J->num_chunks + c) * H + h) * (hd + 2);
                if (pc[hd + 1] == 0.0f) continue; /* empty chunk (past this token) */
                const float w = expf(pc[hd] - M);
                L += pc[hd + 1] * w;
                for (int64_t e = 0; e < hd; e++) dst[e] += pc[e] * w;
            }
            const float inv = 1.0f / L;
            for (int64_t e = 0; e < hd; e++) dst[e] *= inv;
        }
}

/* Plan one sequence's job (no allocation): chunking and blocking depend only on this
 * sequence and the thread count, never on what else is in the batch, so a sequence's
 * result is bit-identical alone or batched. Returns its task count; attn_bind then
 * points it at its buffers. */
static int64_t attn_plan(attn_job *J, const dp_arena *a, const dp_attn_ops *ops, int64_t layer,
                         const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                         const int64_t *spans, int64_t num_spans, int64_t pos0, int64_t num_tokens,
                         dp_attn_params params, int threads) {
    memset(J, 0, sizeof *J);
    J->a = a; J->ops = ops; J->region = a->base + layer * a->layer_bytes;
    J->q = q; J->q_stride = q_stride; J->out = out; J->out_stride = out_stride;
    J->num_heads = num_heads; J->group = num_heads / a->num_kv_heads;
    J->spans = spans; J->num_spans = num_spans; J->pos0 = pos0; J->num_tokens = num_tokens;
    J->scale = params.scale; J->prefetch_degree = params.prefetch_degree;
    J->softcap = params.softcap; J->window = params.window;
    /* Tasks are (token, context chunk). A decode step has too few tokens to feed
     * the pool: split its context into chunks (flash-decoding) and merge after. */
    const int64_t n_ctx = pos0 + num_tokens;
    /* A sliding window hides everything before the first query's window: the
     * context split covers only [ctx_lo, n_ctx). */
    J->ctx_lo = params.window > 0 && pos0 + 1 > params.window ? pos0 + 1 - params.window : 0;
    const int64_t n_seen = n_ctx - J->ctx_lo;
    J->num_chunks = 1;
    J->chunk = n_seen;
    if (!params.decode_on_caller && num_tokens < 4 * threads && threads > 1 && n_seen >= DP_MIN_CHUNK) {
        int64_t chunks = (4 * threads + num_tokens - 1) / num_tokens;
        const int64_t most = n_seen / DP_MIN_CHUNK > 2 ? n_seen / DP_MIN_CHUNK : 2;
        if (chunks > most) chunks = most;
        if (chunks > 1) {
            J->num_chunks = chunks;
            J->chunk = (n_seen + chunks - 1) / chunks;
        }
    }
    /* Prefill: a block of tokens shares each K/V load (about 16 query rows per KV head). */
    J->block_tokens = 1;
    if (J->num_chunks == 1) {
        J->block_tokens = 16 / J->group > 1 ? 16 / J->group : 1;
        while (J->block_tokens > 1 && (num_tokens + J->block_tokens - 1) / J->block_tokens < 2 * threads)
            J->block_tokens /= 2;
    }
    J->run_len = num_tokens < 8 ? DP_RUN_DECODE : DP_RUN; /* decode steps: short runs (see DP_RUN) */
    return (num_tokens + J->block_tokens - 1) / J->block_tokens * J->num_chunks;
}

/* Floats of a planned job's flash-decoding partials (0 when its context is not split). */
static int64_t partial_floats(const attn_job *J, int64_t tasks) {
    return J->num_chunks > 1 ? tasks * J->num_heads * (J->a->head_dim + 2) : 0;
}

/* Point a planned job at its buffers: starts (num_spans + 1), partial, the threads'
 * scratch. */
static void attn_bind(attn_job *J, int64_t *starts, float *partial, float *scratch, int64_t scratch_stride) {
    starts[0] = 0;
    for (int64_t i = 0; i < J->num_spans; i++) starts[i + 1] = starts[i] + J->spans[3 * i + 1];
    J->span_start = starts;
    J->partial = partial;
    J->scratch = scratch;
    J->scratch_stride = scratch_stride;
}

void dp_attn_workspace_free(dp_attn_workspace *ws) {
    if (!ws) return;
    free(ws->buf);
    ws->buf = NULL;
    ws->bytes = 0;
}

/* Make ws hold at least `bytes` (64-byte aligned; its contents are not kept). */
static int workspace_reserve(dp_attn_workspace *ws, size_t bytes) {
    if (ws->bytes >= bytes) return DP_OK;
    dp_attn_workspace_free(ws);
    void *p = NULL;
    if (dp_aligned_alloc(&p, 64, bytes) != 0) return DP_ERR_NOMEM;
    ws->buf = p;
    ws->bytes = bytes;
    return DP_OK;
}

static int check_attn_args(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *q,
                           int64_t q_stride, const float *out, int64_t out_stride, int64_t num_heads,
                           const int64_t *spans) {
    if (!a || !a->base || !ops || !q || !out || !spans || num_heads <= 0) return DP_ERR_ARG;
    if (layer < 0 || layer >= a->num_layers) return DP_ERR_BOUNDS;
    const int64_t hd = a->head_dim;
    if (num_heads % a->num_kv_heads || q_stride < num_heads * hd || out_stride < num_heads * hd) return DP_ERR_ARG;
    return DP_OK;
}

/* seqs rows (row0, num_tokens, pos0, span0, num_spans) inside q/out and spans, and
 * every sequence's spans inside the arena, covering its positions. Sums are
 * compared as differences: nothing overflows. */
static int check_seqs(const dp_arena *a, int64_t num_rows, const int64_t *seqs, int64_t num_seqs,
                      const int64_t *spans, int64_t spans_len) {
    if (!seqs || num_seqs < 0 || num_rows < 0 || spans_len < 0) return DP_ERR_ARG;
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t *d = seqs + 5 * i;
        if (d[0] < 0 || d[1] < 1 || d[0] > num_rows - d[1] || d[2] < 0 || d[2] > INT64_MAX - d[1] || d[3] < 0 ||
            d[4] < 0 || d[3] > spans_len - d[4])
            return DP_ERR_BOUNDS;
        const int st = dp_kv_check_spans(a, spans + 3 * d[3], d[4], d[2] + d[1]);
        if (st != DP_OK) return st;
    }
    return DP_OK;
}

/* One pool run over every sequence of a batch. */
typedef struct {
    attn_job *jobs;     /* (num_seqs,) */
    int64_t *task_end;  /* (num_seqs,) running task totals: job i has tasks [task_end[i-1], task_end[i]) */
    int64_t num_seqs;
    int64_t num_tasks;
} batch_job;

static void batch_task(void *ctx, int64_t task, int worker) {
    const batch_job *B = (const batch_job *)ctx;
    int64_t lo = 0, hi = B->num_seqs - 1; /* the first job whose task_end > task */
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (B->task_end[mid] > task) hi = mid; else lo = mid + 1;
    }
    attn_task(&B->jobs[lo], task - (lo ? B->task_end[lo - 1] : 0), worker);
}

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Plan the batch (the arguments already checked) and carve everything it needs out of
 * ws, growing it when it is too small: DP_OK, or DP_ERR_NOMEM with nothing planned.
 * Workspace layout, each part 64-byte aligned: jobs (num_seqs), task_end (num_seqs),
 * span starts (sum of num_spans + 1), partials (sum over split jobs), then one scratch
 * slice per pool thread (the largest any job's task needs; slices 64-byte aligned, so
 * threads never share a cache line). */
static int batch_prepare(batch_job *B, const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                         const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                         const int64_t *seqs, int64_t num_seqs, const int64_t *spans, dp_attn_params params,
                         dp_attn_workspace *ws) {
    memset(B, 0, sizeof *B);
    const int threads = pool ? dp_pool_num_threads(pool) : 1;
    const uint64_t limit = (uint64_t)1 << 56; /* any part past this fails as out of memory, before it overflows */
    uint64_t n_starts = 0, n_partial = 0, max_scratch = 0;
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t *d = seqs + 5 * i;
        attn_job J;
        const int64_t tasks = attn_plan(&J, a, ops, layer, q, q_stride, out, out_stride, num_heads, spans + 3 * d[3],
                                        d[4], d[2], d[1], params, threads);
        if ((uint64_t)tasks > limit / ((uint64_t)num_heads * (uint64_t)(a->head_dim + 2) + (uint64_t)DP_RUN))
            return DP_ERR_NOMEM;
        n_starts += (uint64_t)d[4] + 1;
        n_partial += (uint64_t)partial_floats(&J, tasks);
        const uint64_t sf = (uint64_t)task_scratch_floats(&J);
        max_scratch = sf > max_scratch ? sf : max_scratch;
        if (n_starts > limit || n_partial > limit || max_scratch > limit) return DP_ERR_NOMEM;
    }
    const uint64_t stride = (max_scratch + 15) & ~(uint64_t)15; /* floats per thread: whole cache lines */
    const size_t jobs_b = round64((size_t)num_seqs * sizeof(attn_job)), ends_b = round64((size_t)num_seqs * sizeof(int64_t));
    const size_t starts_b = round64((size_t)n_starts * sizeof(int64_t)), partial_b = round64((size_t)n_partial * sizeof(float));
    const size_t total = jobs_b + ends_b + starts_b + partial_b + (size_t)threads * (size_t)stride * sizeof(float);
    if (workspace_reserve(ws, total) != DP_OK) return DP_ERR_NOMEM;
    char *base = (char *)ws->buf;
    B->jobs = (attn_job *)base;
    B->task_end = (int64_t *)(base + jobs_b);
    int64_t *starts = (int64_t *)(base + jobs_b + ends_b);
    float *partial = (float *)(base + jobs_b + ends_b + starts_b);
    float *scratch = (float *)(base + jobs_b + ends_b + starts_b + partial_b);
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t *d = seqs + 5 * i;
        attn_job *J = &B->jobs[i];
        const int64_t tasks = attn_plan(J, a, ops, layer, q + d[0] * q_stride, q_stride, out + d[0] * out_stride,
                                        out_stride, num_heads, spans + 3 * d[3], d[4], d[2], d[1], params, threads);
        const int64_t pf = partial_floats(J, tasks);
        attn_bind(J, starts, pf ? partial : NULL, scratch, (int64_t)stride);
        starts += d[4] + 1;
        partial += pf;
        B->num_tasks += tasks;
        B->task_end[i] = B->num_tasks;
    }
    B->num_seqs = num_seqs;
    return DP_OK;
}

/* The pool run, then the flash-decoding merges. Nothing in it can fail: every buffer
 * was carved out before. */
static void batch_run(batch_job *B, dp_pool *pool) {
    dp_pool_run(pool, B->num_tasks, batch_task, B);
    for (int64_t i = 0; i < B->num_seqs; i++)
        if (B->jobs[i].num_chunks > 1) merge_chunks(&B->jobs[i]);
}

int dp_attn_batch(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                  const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                  int64_t num_rows, const int64_t *seqs, int64_t num_seqs, const int64_t *spans,
                  int64_t spans_len, dp_attn_params params, dp_attn_workspace *ws) {
    int st = check_attn_args(a, ops, layer, q, q_stride, out, out_stride, num_heads, spans);
    if (st == DP_OK) st = check_seqs(a, num_rows, seqs, num_seqs, spans, spans_len);
    if (st != DP_OK || num_seqs == 0) return st;
    dp_attn_workspace own = {NULL, 0}; /* no workspace given: one allocation for this call */
    dp_attn_workspace *w = ws ? ws : &own;
    batch_job B;
    st = batch_prepare(&B, a, ops, pool, layer, q, q_stride, out, out_stride, num_heads, seqs, num_seqs, spans,
                       params, w);
    if (st == DP_OK) batch_run(&B, pool);
    dp_attn_workspace_free(&own);
    return st;
}

int dp_attn_spans(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer,
                  const float *q, int64_t q_stride, float *out, int64_t out_stride, int64_t num_heads,
                  const int64_t *spans, int64_t num_spans, int64_t pos0, int64_t num_tokens,
                  dp_attn_params params) {
    int st = check_attn_args(a, ops, layer, q, q_stride, out, out_stride, num_heads, spans);
    if (st != DP_OK) return st;
    if (pos0 < 0 || num_tokens < 0 || num_spans < 0) return DP_ERR_BOUNDS;
    if (num_tokens == 0) return DP_OK;
    const int64_t seq[5] = {0, num_tokens, pos0, 0, num_spans}; /* a batch of one */
    return dp_attn_batch(a, ops, pool, layer, q, q_stride, out, out_stride, num_heads, num_tokens, seq, 1, spans,
                         num_spans, params, NULL);
}

int dp_step_batch(const dp_arena *a, const dp_attn_ops *ops, dp_pool *pool, int64_t layer, const float *k,
                  const float *v, int64_t kv_stride, const int64_t *slots, const float *q, int64_t q_stride,
                  float *out, int64_t out_stride, int64_t num_heads, int64_t num_rows, const int64_t *seqs,
                  int64_t num_seqs, const int64_t *spans, int64_t spans_len, dp_attn_params params,
                  dp_attn_workspace *ws) {
    int st = check_attn_args(a, ops, layer, q, q_stride, out, out_stride, num_heads, spans);
    if (st == DP_OK) st = dp_kv_check_write(a, layer, k, v, kv_stride, slots, num_rows);
    if (st == DP_OK) st = check_seqs(a, num_rows, seqs, num_seqs, spans, spans_len);
    if (st != DP_OK) return st; /* nothing written */
    if (num_seqs == 0) {
        dp_kv_write_rows(a, ops, layer, k, v, kv_stride, slots, num_rows);
        return DP_OK;
    }
    dp_attn_workspace own = {NULL, 0};
    dp_attn_workspace *w = ws ? ws : &own;
    batch_job B;
    st = batch_prepare(&B, a, ops, pool, layer, q, q_stride, out, out_stride, num_heads, seqs, num_seqs, spans,
                       params, w);
    if (st == DP_OK) { /* else nothing written */
        dp_kv_write_rows(a, ops, layer, k, v, kv_stride, slots, num_rows);
        batch_run(&B, pool);
    }
    dp_attn_workspace_free(&own);
    return st;
}
