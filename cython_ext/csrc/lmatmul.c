/* A layer's matrix products (lmatmul.h): the form's conversion from GGML blocks, the
 * activations' quantization, the scalar reference and the driver that splits the groups
 * of rows over a pool. */
#include <math.h>
#include <stdlib.h>
#include "dp_attn_ops.h"
#include "dp_pool.h"
#include "lmatmul.h"

#define LKIND(kind, name, ggml_bytes) [kind] = {name, dp_lkind_sb(kind), ggml_bytes, dp_lkind_header(kind), dp_lkind_unit(kind)}
const dp_lkind_info dp_lkinds[DP_L_NUM_KINDS] = {
    LKIND(DP_L_Q4_K, "Q4_K", 144), LKIND(DP_L_Q6_K, "Q6_K", 210), LKIND(DP_L_Q5_0, "Q5_0", 22),
    LKIND(DP_L_Q8_0, "Q8_0", 34), LKIND(DP_L_Q4_0, "Q4_0", 18),
};
#undef LKIND

static int64_t sb_bytes(const dp_lkind_info *k) { return k->header + k->sb / 32 * k->unit; }

int64_t dp_lform_bytes(int kind, int64_t N, int64_t K) {
    if (kind < 0 || kind >= DP_L_NUM_KINDS || N < 16 || K < 1 || N % 16 || K % dp_lkinds[kind].sb) return 0;
    const dp_lkind_info *k = &dp_lkinds[kind];
    if (N / 16 > INT64_MAX / (K / k->sb) / sb_bytes(k)) return 0;
    return N / 16 * (K / k->sb) * sb_bytes(k);
}

/* ---- conversion: one row's GGML block -> values u and header fields ---- */

typedef struct {
    uint8_t u[256];
    uint16_t d, dmin; /* fp16 bits, as in the file */
    int8_t sc[16];    /* Q4_K: 8 six-bit scales; Q6_K: 16 int8 */
    uint8_t m[8];     /* Q4_K's six-bit mins */
} lblock;

static uint16_t u16_at(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static void decode_block(int kind, const uint8_t *in, lblock *o) {
    switch (kind) {
    case DP_L_Q4_K: { /* d, dmin, 12 bytes of 6-bit scales and mins, 4 chunks of 32 bytes */
        o->d = u16_at(in);
        o->dmin = u16_at(in + 2);
        const uint8_t *q = in + 4;
        for (int j = 0; j < 8; j++) {
            o->sc[j] = (int8_t)(j < 4 ? q[j] & 63 : (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4);
            o->m[j] = (uint8_t)(j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | (q[j] >> 6) << 4);
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                o->u[64 * c + l] = in[16 + 32 * c + l] & 0x0f;
                o->u[64 * c + 32 + l] = in[16 + 32 * c + l] >> 4;
            }
        return;
    }
    case DP_L_Q6_K: /* ql[128], qh[64], 16 int8 scales, d: value e takes nibble of ql and 2 bits of qh */
        o->d = u16_at(in + 208);
        for (int j = 0; j < 16; j++) o->sc[j] = (int8_t)in[192 + j];
        for (int e = 0; e < 256; e++) {
            const int lo = (in[64 * (e / 128) + e % 64] >> (4 * ((e % 128) / 64))) & 0x0f;
            const int hi = (in[128 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            o->u[e] = (uint8_t)(lo | hi << 4);
        }
        return;
    case DP_L_Q8_0:
        o->d = u16_at(in);
        for (int i = 0; i < 32; i++) o->u[i] = in[2 + i] ^ 0x80; /* int8 q -> q + 128 */
        return;
    default: { /* Q5_0: d, qh (a little-endian uint32: bit 4 of value j), qs; Q4_0: d, qs */
        o->d = u16_at(in);
        const uint8_t *qs = in + (kind == DP_L_Q5_0 ? 6 : 2);
        const uint32_t h = kind == DP_L_Q5_0 ? (uint32_t)in[2] | (uint32_t)in[3] << 8 | (uint32_t)in[4] << 16 |
                                                   (uint32_t)in[5] << 24
                                             : 0;
        for (int j = 0; j < 16; j++) {
            o->u[j] = (uint8_t)((qs[j] & 0x0f) | ((h >> j) & 1u) << 4);
            o->u[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1u) << 4);
        }
        return;
    }
    }
}

/* Store value v of row l, position k (0..31) of a unit (lmatmul.h's planes). */
static void put_value(int kind, uint8_t *unit, int l, int k, uint8_t v) {
    const int j = k / 4, i = k % 4, lane = 4 * l + i;
    if (kind == DP_L_Q8_0) {
        unit[64 * j + lane] = v;
        return;
    }
    unit[64 * (j / 2) + lane] |= (uint8_t)((v & 0x0f) << (4 * (j % 2)));
    if (kind == DP_L_Q5_0)
        unit[256 + 8 * j + lane / 8] |= (uint8_t)(((v >> 4) & 1) << (lane % 8));
    else if (kind == DP_L_Q6_K)
        unit[256 + 64 * (j / 4) + lane] |= (uint8_t)(((v >> 4) & 3) << (2 * (j % 4)));
}

int dp_lform_from_ggml(int kind, const uint8_t *src, int64_t src_bytes, int64_t N, int64_t K, uint8_t *dst,
                       int64_t dst_bytes) {
    const int64_t bytes = dp_lform_bytes(kind, N, K);
    if (!bytes || !src || !dst) return DP_ERR_ARG;
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t nsb = K / k->sb, sbb = sb_bytes(k);
    if (src_bytes < N * nsb * k->ggml_bytes || dst_bytes < bytes) return DP_ERR_BOUNDS;
    memset(dst, 0, (size_t)bytes);
    lblock b;
    for (int64_t n = 0; n < N; n++) {
        const int l = (int)(n % 16);
        for (int64_t s = 0; s < nsb; s++) {
            decode_block(kind, src + (n * nsb + s) * k->ggml_bytes, &b);
            uint8_t *h = dst + (n / 16 * nsb + s) * sbb;
            memcpy(h + 2 * l, &b.d, 2);  /* fp16 bits, little-endian as the file's */
            if (kind == DP_L_Q4_K) {
                memcpy(h + 32 + 2 * l, &b.dmin, 2);
                for (int j = 0; j < 8; j++) {
                    h[64 + 16 * j + l] = (uint8_t)b.sc[j];
                    h[192 + 16 * j + l] = b.m[j];
                }
            } else if (kind == DP_L_Q6_K) {
                for (int j = 0; j < 16; j++) h[32 + 16 * j + l] = (uint8_t)b.sc[j];
            }
            for (int64_t e = 0; e < k->sb; e++)
                put_value(kind, h + k->header + e / 32 * k->unit, l, (int)(e % 32), b.u[e]);
        }
    }
    return DP_OK;
}

/* ---- activations ---- */

/* One block of 32 at d (inv = 1 / d, 0 for d = 0), as dp_lact_quantize takes it. */
static void lact_block(const float *v, float d, float inv, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    int32_t s0 = 0, s1 = 0;
    for (int i = 0; i < 32; i++) {
        const int8_t q = (int8_t)rintf(v[i] * inv);
        xq[i] = q;
        if (i < 16) s0 += q;
        else s1 += q;
    }
    *xd = d;
    xs[0] = s0;
    xs[1] = s1;
    *xm = d * (float)(s0 + s1);
}

void dp_lact_quantize(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    for (int64_t b = 0; b < R * K / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) { /* not fmaxf, a call where NaN rules stop vectorizing */
            const float m = fabsf(v[i]);
            amax = m > amax ? m : amax;
        }
        const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        lact_block(v, d, inv, xq + b * 32, xd + b, xs + 2 * b, xm + b);
    }
}

void dp_lact_quantize256(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm) {
    for (int64_t c = 0; c < R * K / 256; c++) {
        const float *v = x + c * 256;
        float amax = 0.0f;
        for (int i = 0; i < 256; i++) {
            const float m = fabsf(v[i]);
            amax = m > amax ? m : amax;
        }
        const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        for (int64_t b = 8 * c; b < 8 * c + 8; b++) lact_block(x + 32 * b, d, inv, xq + 32 * b, xd + b, xs + 2 * b, xm + b);
    }
}

void dp_lact_pairs(const dp_lact *a, uint8_t *out) {
    const int64_t nb = a->K / 32;
    for (int64_t i = 0; i < a->R / 2; i++)
        for (int64_t kb = 0; kb < nb; kb++) {
            uint8_t *o = out + (i * nb + kb) * DP_LPAIR_BYTES;
            int32_t s0[4], s1[4];
            float dx[4], t[4];
            for (int r = 0; r < 2; r++) {
                const int64_t row = 2 * i + r;
                for (int p = 0; p < 4; p++) memcpy(o + 16 * p + 8 * r, a->xq + row * a->K + 32 * kb + 8 * p, 8);
                const int32_t *xs = a->xs + row * (a->K / 16) + 2 * kb;
                const float d = a->xd[row * nb + kb];
                s0[r] = s0[r + 2] = xs[0];
                s1[r] = s1[r + 2] = xs[1];
                dx[r] = dx[r + 2] = d;
                t[r] = t[r + 2] = a->xm[row * nb + kb];
            }
            memcpy(o + 64, s0, 16);
            memcpy(o + 80, s1, 16);
            memcpy(o + 96, dx, 16);
            memcpy(o + 112, t, 16);
        }
}

/* ---- the scalar reference ---- */

static int value_at(int kind, const uint8_t *unit, int l, int k) {
    const int j = k / 4, lane = 4 * l + k % 4;
    if (kind == DP_L_Q8_0) return unit[64 * j + lane];
    int v = (unit[64 * (j / 2) + lane] >> (4 * (j % 2))) & 0x0f;
    if (kind == DP_L_Q5_0) v |= ((unit[256 + 8 * j + lane / 8] >> (lane % 8)) & 1) << 4;
    if (kind == DP_L_Q6_K) v |= ((unit[256 + 64 * (j / 4) + lane] >> (2 * (j % 4))) & 3) << 4;
    return v;
}

static float f16(const uint8_t *p) { return dp_half_to_float(u16_at(p)); }

/* Row l's value of unit b (of the superblock whose header is h) is sc[i] * u - off[i] in
 * its half i of 16 values. */
static void unit_scales(int kind, const uint8_t *h, int64_t b, int l, float sc[2], float off[2]) {
    const float d = f16(h + 2 * l);
    sc[0] = sc[1] = d;
    if (kind == DP_L_Q4_K) {
        sc[0] = sc[1] = d * (float)h[64 + 16 * b + l];
        off[0] = off[1] = f16(h + 32 + 2 * l) * (float)h[192 + 16 * b + l];
        return;
    }
    if (kind == DP_L_Q6_K)
        for (int i = 0; i < 2; i++) sc[i] = d * (float)(int8_t)h[32 + 16 * (2 * b + i) + l];
    off[0] = sc[0] * (float)dp_lkind_zero_point(kind), off[1] = sc[1] * (float)dp_lkind_zero_point(kind);
}

/* The scalar loop: the reference of every ISA (int8 activations: a), and the one loop of
 * f32 activations (xf, accuracy levels below 4: an exactness mode). */
static void rows_scalar(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, const float *xf,
                        float *out, int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t K = a->K, nsb = K / k->sb, sbb = sb_bytes(k), units = k->sb / 32;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t r = 0; r < a->R; r++)
            for (int l = 0; l < 16; l++) {
                float acc = 0.0f;
                for (int64_t s = 0; s < nsb; s++) {
                    const uint8_t *h = w + (g * nsb + s) * sbb;
                    for (int64_t b = 0; b < units; b++) {
                        const uint8_t *unit = h + k->header + b * k->unit;
                        const int64_t kb = s * units + b; /* the block of 32 in the row */
                        float sc[2], off[2];
                        unit_scales(kind, h, b, l, sc, off);
                        if (xf) {
                            for (int i = 0; i < 32; i++)
                                acc += (sc[i / 16] * (float)value_at(kind, unit, l, i) - off[i / 16]) *
                                       xf[r * K + 32 * kb + i];
                            continue;
                        }
                        const int8_t *x = a->xq + r * K + 32 * kb;
                        const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;
                        int32_t dot[2] = {0, 0};
                        for (int i = 0; i < 32; i++) dot[i / 16] += value_at(kind, unit, l, i) * x[i];
                        acc += a->xd[r * (K / 32) + kb] * (sc[0] * (float)dot[0] + sc[1] * (float)dot[1] -
                                                           off[0] * (float)xs[0] - off[1] * (float)xs[1]);
                    }
                }
                out[r * ldo + 16 * g + l] = acc;
            }
}

void dp_lrows_generic(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                      int64_t ldo) {
    rows_scalar(kind, w, g0, g1, a, NULL, out, ldo);
}

int dp_lform_rows(int kind, const uint8_t *w, int64_t w_len, int64_t N, int64_t K, const int64_t *ids, int64_t n,
                  float *out, int64_t out_len) {
    const int64_t bytes = dp_lform_bytes(kind, N, K);
    if (!bytes || !w || (n && (!ids || !out)) || n < 0) return DP_ERR_ARG;
    if (w_len < bytes || out_len < n * K) return DP_ERR_BOUNDS;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= N) return DP_ERR_BOUNDS;
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t nsb = K / k->sb, sbb = sb_bytes(k), units = k->sb / 32;
    for (int64_t i = 0; i < n; i++) {
        const int64_t g = ids[i] / 16;
        const int l = (int)(ids[i] % 16);
        for (int64_t s = 0; s < nsb; s++) {
            const uint8_t *h = w + (g * nsb + s) * sbb;
            for (int64_t b = 0; b < units; b++) {
                float sc[2], off[2];
                unit_scales(kind, h, b, l, sc, off);
                float *o = out + i * K + (s * units + b) * 32;
                const uint8_t *unit = h + k->header + b * k->unit;
                const int z = dp_lkind_zero_point(kind);
                for (int v = 0; v < 32; v++) /* as gguf-py: s * u - dmin * m, or s * (u - z) */
                    o[v] = kind == DP_L_Q4_K ? sc[v / 16] * (float)value_at(kind, unit, l, v) - off[v / 16]
                                             : sc[v / 16] * (float)(value_at(kind, unit, l, v) - z);
            }
        }
    }
    return DP_OK;
}

/* ---- the driver ---- */

/* Groups of 16 rows a task takes: as many as leave every thread of the pool 4 tasks or
 * more of the whole product (dynamic scheduling balances them), at most 16 (256 rows,
 * 300 KB of a 2,048-wide Q4_K matrix): longer runs of one thread through its rows stream
 * faster (docs/performance-log.md). */
#define LGROUPS_PER_TASK_MAX 16
/* Below this many bytes of weights the calling thread alone is faster than waking the
 * pool, whose workers spin for the next job; a threshold as high as the classifier's made
 * a small model's step slower (Gemma 3 270M's q | k | v ran on the caller alone;
 * docs/performance-log.md). */
#define LMATMUL_POOL_BYTES (128 << 10)
#define LMATMUL_MAX_JOBS 8

/* Int8 activation bytes of a block of rows that a task's groups all pass over (a prefill's
 * or a batch's rows in blocks: the block stays in L2 while its task's groups read it,
 * instead of every group streaming all R rows from farther away; 96 KB, 32 to 256 rows,
 * ran faster than 48 KB and no slower than 192 KB: docs/performance-log.md). Rows a block
 * takes: a multiple of 8, so that the ISAs' passes over rows (8, 4, 2 rows; pairs) start
 * where they start over all R rows, and each output is summed as without blocks (the same
 * bytes). */
#define LROW_BLOCK_BYTES (96 << 10)
#define LROW_BLOCK_MIN 32
#define LROW_BLOCK_MAX 256

typedef struct {
    dp_lrows_fn fn;
    const dp_ljob *jobs;
    int njobs;
    int64_t first[LMATMUL_MAX_JOBS + 1]; /* a job's first task in a block of rows; first[njobs] = all */
    int64_t per_task;                    /* groups a task takes */
    int64_t block, blocks;               /* rows of a block of rows (the last: the rest), blocks */
    dp_lact act;
    const float *x; /* f32 activations (int8_act = 0), else NULL */
} ljob_run;

static void ltask(void *ctx, int64_t t, int worker) {
    (void)worker;
    const ljob_run *j = (const ljob_run *)ctx;
    const int64_t rb = t / j->first[j->njobs];
    t -= rb * j->first[j->njobs];
    int i = 0;
    while (t >= j->first[i + 1]) i++;
    const dp_ljob *jb = &j->jobs[i];
    const int64_t g0 = (t - j->first[i]) * j->per_task, groups = jb->N / 16;
    const int64_t g1 = g0 + j->per_task < groups ? g0 + j->per_task : groups;
    if (j->x) {
        rows_scalar(jb->kind, jb->w, g0, g1, &j->act, j->x, jb->out, jb->ldo);
        return;
    }
    const dp_lact *a = &j->act;
    const int64_t r0 = rb * j->block, r1 = rb + 1 == j->blocks ? a->R : r0 + j->block, K = a->K;
    const dp_lact rows = {.xq = a->xq + r0 * K, .xd = a->xd + r0 * K / 32, .xs = a->xs + r0 * K / 16, .R = r1 - r0,
                          .K = K, .pairs = a->pairs ? a->pairs + r0 / 2 * (K / 32) * DP_LPAIR_BYTES : NULL,
                          .xm = a->xm + r0 * K / 32, .sb256 = a->sb256};
    j->fn(jb->kind, jb->w, g0, g1, &rows, jb->out + r0 * jb->ldo, jb->ldo);
}

/* f32 activation bytes a task of the quantization takes (whole rows, an even number so that
 * a task also builds its rows' pairs): a pass over memory long enough to amortize the
 * task's hand-out, short enough that a prefill chunk's 512 rows split over every thread. */
#define LQUANT_TASK_BYTES (64 << 10)

/* The activations' quantization (and pairs) over the pool, rows at a time: blocks and
 * pairs of rows are independent, so the bytes are those of one pass on the caller. */
typedef struct {
    dp_lquant_fn fn;
    const float *x;
    int8_t *xq;
    float *xd, *xm;
    int32_t *xs;
    uint8_t *pairs; /* NULL: the ISA takes no pairs */
    int64_t R, K, rows;
} lquant_run;

static void lquant_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const lquant_run *q = (const lquant_run *)ctx;
    const int64_t r0 = t * q->rows, n = r0 + q->rows < q->R ? q->rows : q->R - r0, K = q->K;
    int8_t *xq = q->xq + r0 * K;
    float *xd = q->xd + r0 * K / 32, *xm = q->xm + r0 * K / 32;
    int32_t *xs = q->xs + r0 * K / 16;
    q->fn(q->x + r0 * K, n, K, xq, xd, xs, xm);
    if (q->pairs) {
        const dp_lact rows = {.xq = xq, .xd = xd, .xs = xs, .R = n, .K = K, .xm = xm};
        dp_lact_pairs(&rows, q->pairs + r0 / 2 * (K / 32) * DP_LPAIR_BYTES);
    }
}

int dp_lmatmul_sb256(const dp_attn_ops *ops, const dp_ljob *jobs, int njobs, int64_t R, int64_t K) {
    if (!ops || !ops->lquant256 || ops->lact_pairs || R < 2 || K % 256 || njobs < 1) return 0;
    for (int i = 0; i < njobs; i++)
        if (jobs[i].kind != DP_L_Q4_K) return 0;
    return 1;
}

int dp_lmatmul(dp_pool *pool, const dp_attn_ops *ops, const dp_ljob *jobs, int njobs, const float *x, int64_t R,
               int64_t K, int int8_act) {
    if (!ops || !ops->lrows || !jobs || njobs < 1 || njobs > LMATMUL_MAX_JOBS || !x || R < 1 || K < 32 || K % 32 ||
        R > INT64_MAX / K)
        return DP_ERR_ARG;
    ljob_run run = {.fn = ops->lrows, .jobs = jobs, .njobs = njobs, .block = R, .blocks = 1};
    int64_t bytes = 0, groups = 0;
    for (int i = 0; i < njobs; i++) {
        const dp_ljob *jb = &jobs[i];
        const int64_t need = dp_lform_bytes(jb->kind, jb->N, K);
        if (!need || !jb->w || !jb->out || jb->ldo < jb->N) return DP_ERR_ARG;
        if (jb->w_len < need || jb->out_len < (R - 1) * jb->ldo + jb->N) return DP_ERR_BOUNDS;
        bytes += need;
        groups += jb->N / 16;
    }
    if (int8_act) {
        int64_t block = LROW_BLOCK_BYTES / K / 8 * 8;
        block = block < LROW_BLOCK_MIN ? LROW_BLOCK_MIN : block > LROW_BLOCK_MAX ? LROW_BLOCK_MAX : block;
        /* the last block takes the rest of the rows: never a block of one row, which would
         * take the ISAs' decode loops (summed otherwise) */
        if (R >= 2 * block) {
            run.block = block;
            run.blocks = R / block;
        }
    }
    const int threads = pool ? dp_pool_num_threads(pool) : 1;
    run.per_task = groups * run.blocks / (4 * threads);
    run.per_task = run.per_task < 1 ? 1 : run.per_task > LGROUPS_PER_TASK_MAX ? LGROUPS_PER_TASK_MAX : run.per_task;
    for (int i = 0; i < njobs; i++)
        run.first[i + 1] = run.first[i] + (jobs[i].N / 16 + run.per_task - 1) / run.per_task;
    const int on_pool = pool && (bytes >= LMATMUL_POOL_BYTES || bytes * R >= 4 * LMATMUL_POOL_BYTES);
    void *buf = NULL;
    run.act = (dp_lact){.R = R, .K = K};
    if (int8_act) {
        /* pairs first: its records are 16-byte vectors */
        const size_t pair_bytes = ops->lact_pairs && R >= 2 ? (size_t)(R / 2 * (K / 32)) * DP_LPAIR_BYTES : 0;
        buf = dp_malloc(pair_bytes + (size_t)(R * K) + 2 * (size_t)(R * K / 32) * sizeof(float) +
                        (size_t)(R * K / 16) * sizeof(int32_t));
        if (!buf) return DP_ERR_NOMEM;
        uint8_t *pairs = (uint8_t *)buf;
        float *xd = (float *)(pairs + pair_bytes), *xm = xd + R * K / 32;
        int32_t *xs = (int32_t *)(xm + R * K / 32);
        int8_t *xq = (int8_t *)(xs + R * K / 16);
        const int sb256 = dp_lmatmul_sb256(ops, jobs, njobs, R, K);
        lquant_run q = {sb256 ? ops->lquant256 : ops->lquant ? ops->lquant : dp_lact_quantize, x, xq, xd, xm, xs,
                        pair_bytes ? pairs : NULL, R, K};
        q.rows = LQUANT_TASK_BYTES / (4 * K);
        q.rows = q.rows < 2 ? 2 : q.rows + q.rows % 2;
        const int64_t qtasks = (R + q.rows - 1) / q.rows;
        /* on the pool only when the products go there too, and in two tasks or more:
         * decode's few rows stay on the caller */
        if (on_pool && qtasks >= 2)
            dp_pool_run(pool, qtasks, lquant_task, &q);
        else
            for (int64_t t = 0; t < qtasks; t++) lquant_task(&q, t, 0);
        run.act = (dp_lact){.xq = xq, .xd = xd, .xs = xs, .R = R, .K = K, .pairs = q.pairs, .xm = xm, .sb256 = sb256};
    } else {
        run.x = x;
    }
    const int64_t tasks = run.blocks * run.first[njobs];
    if (on_pool)
        dp_pool_run(pool, tasks, ltask, &run);
    else
        for (int64_t t = 0; t < tasks; t++) ltask(&run, t, 0);
    free(buf);
    return DP_OK;
}
