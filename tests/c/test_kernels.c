/* C parity test for DualPath's kernels: every ISA this CPU runs, against a double-
 * precision reference, through the same span walker the extension uses.
 * Built and run by .ci/run natively, under -fsanitize=address,undefined, and
 * cross-compiled for aarch64 under qemu (with and without FP16 arithmetic).
 * Prints one line per check and a final "N passed, N failed" line; exit 1 on failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* SCHED_IDLE, syscall */
#endif
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../cython_ext/csrc/dp_attn_ops.h"
#include "../../cython_ext/csrc/dp_pool.h"
#include "../../cython_ext/csrc/enc_attn.h"
#include "../../cython_ext/csrc/ggml_repack.h"
#include "../../cython_ext/csrc/kv_arena.h"
#include "../../cython_ext/csrc/kv_attn.h"
#include "../../cython_ext/csrc/qmatmul.h"
#include "../../cython_ext/csrc/lmatmul.h"

#define DP_PARAMS(s, pd) ((dp_attn_params){.scale = (s), .softcap = 0.0f, .window = 0, .prefetch_degree = (pd)})

static int passed = 0, failed = 0;
static uint64_t rng_state = 88172645463325252ull;

static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1u << 23) - 1.0f;
}

static int verbose; /* DP_TEST_VERBOSE=1: print the passing checks too */

static void check(int ok, const char *what) {
    if (ok) passed++;
    else { failed++; printf("FAIL %s\n", what); }
    if (ok && verbose) printf("ok %s\n", what);
}

/* The largest |ref[i] - got[i]|, relative to the largest |ref[i]| (error against the
 * largest output: sums cancel, so elementwise relative errors mean nothing). */
static double worst_rel_err(const float *ref, const float *got, int64_t n) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fabs((double)ref[i]) > scale ? fabs((double)ref[i]) : scale;
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs((double)ref[i] - got[i]) / scale;
        worst = err > worst ? err : worst;
    }
    return worst;
}


/* Reference: causal attention over dense K/V (nkv, n, hd) in double. */
static void reference(const float *q, const float *k, const float *v, int64_t T, int64_t H, int64_t nkv,
                      int64_t n, int64_t hd, int64_t pos0, float *out) {
    const int64_t group = H / nkv;
    double *s = (double *)malloc((size_t)n * sizeof(double));
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t kh = h / group, ctx = pos0 + t + 1;
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < ctx; j++) {
                double d = 0;
                for (int64_t e = 0; e < hd; e++) d += (double)q[(t * H + h) * hd + e] * k[(kh * n + j) * hd + e];
                s[j] = d / sqrt((double)hd);
                if (s[j] > m) m = s[j];
            }
            for (int64_t j = 0; j < ctx; j++) { s[j] = exp(s[j] - m); l += s[j]; }
            for (int64_t e = 0; e < hd; e++) {
                double o = 0;
                for (int64_t j = 0; j < ctx; j++) o += s[j] * v[(kh * n + j) * hd + e];
                out[(t * H + h) * hd + e] = (float)(o / l);
            }
        }
    free(s);
}

/* The reference reads the K/V the arena returns (dp_kv_gather: f16 widened, q8
 * dequantized), so the tolerance is the kernel's arithmetic alone: f32 and q8
 * (int8 widens exactly, f32 FMAs, one scale multiply per token) like f32; f16 looser
 * for neon_fp16's f16 products. */
static void run_case(const dp_attn_ops *ops, dp_pool *pool, int kv_dtype, int64_t hd, int64_t group,
                     int64_t n_ctx, int64_t T, int scattered) {
    const int64_t nkv = 2, H = nkv * group, P = 16;
    dp_arena a;
    const int64_t block = 1 << 17;
    const int64_t pages_needed = (n_ctx + P - 1) / P;
    const int64_t page_bytes = dp_kv_tile_bytes(kv_dtype, nkv, hd, P);
    const int64_t ppb = block / page_bytes;
    const int64_t nblocks = (pages_needed + ppb - 1) / ppb * 2 + 1;
    if (dp_arena_init(&a, block, nblocks, 1, nkv, hd, kv_dtype, -1) != DP_OK) { check(0, "arena init"); return; }
    int64_t *slots = (int64_t *)malloc((size_t)n_ctx * 3 * sizeof(int64_t));
    int64_t *spans = (int64_t *)malloc((size_t)pages_needed * 3 * sizeof(int64_t));
    float *k = (float *)malloc((size_t)(n_ctx * nkv * hd) * sizeof(float));
    float *v = (float *)malloc((size_t)(n_ctx * nkv * hd) * sizeof(float));
    float *kd = (float *)malloc((size_t)(n_ctx * nkv * hd) * sizeof(float));
    float *vd = (float *)malloc((size_t)(n_ctx * nkv * hd) * sizeof(float));
    float *q = (float *)malloc((size_t)(T * H * hd) * sizeof(float));
    float *out = (float *)malloc((size_t)(T * H * hd) * sizeof(float));
    float *want = (float *)malloc((size_t)(T * H * hd) * sizeof(float));
    for (int64_t i = 0; i < n_ctx * nkv * hd; i++) { k[i] = frand(); v[i] = frand(); }
    for (int64_t i = 0; i < T * H * hd; i++) q[i] = frand();
    for (int64_t p = 0; p < pages_needed; p++) {
        /* scattered: every other page, in reverse order */
        const int64_t page = scattered ? (pages_needed - 1 - p) * 2 : p;
        spans[3 * p] = (page / ppb) * block + (page % ppb) * page_bytes;
        spans[3 * p + 1] = n_ctx - p * P < P ? n_ctx - p * P : P;
        spans[3 * p + 2] = P;
    }
    for (int64_t j = 0; j < n_ctx; j++) {
        slots[3 * j] = spans[3 * (j / P)];
        slots[3 * j + 1] = j % P;
        slots[3 * j + 2] = P;
    }
    check(dp_kv_write_slots(&a, ops, 0, k, v, nkv * hd, slots, n_ctx) == DP_OK, "write");
    check(dp_kv_gather(&a, 0, spans, pages_needed, n_ctx, kd, vd) == DP_OK, "gather");
    const int64_t pos0 = n_ctx - T;
    int st = dp_attn_spans(&a, ops, pool, 0, q, H * hd, out, H * hd, H, spans, pages_needed, pos0, T,
                           DP_PARAMS(1.0f / sqrtf((float)hd), 4));
    check(st == DP_OK, "attention status");
    reference(q, kd, vd, T, H, nkv, n_ctx, hd, pos0, want);
    const double tol = kv_dtype == DP_KV_F16 ? 2e-3 : 1e-5;
    double worst = 0;
    for (int64_t i = 0; i < T * H * hd; i++) {
        const double err = fabs(out[i] - want[i]) / (tol * (1 + fabs(want[i])));
        if (err > worst) worst = err;
    }
    char what[200];
    snprintf(what, sizeof what, "%s %s hd=%lld group=%lld ctx=%lld T=%lld %s pool=%d worst=%.3g", dp_ops_name(ops),
             dp_kv_types[kv_dtype].name, (long long)hd, (long long)group, (long long)n_ctx, (long long)T,
             scattered ? "paged" : "contiguous", pool ? dp_pool_num_threads(pool) : 1, worst);
    check(worst <= 1.0, what);
    /* Out-of-bounds requests are refused, never read. */
    check(dp_attn_spans(&a, ops, pool, 0, q, H * hd, out, H * hd, H, spans, pages_needed, pos0 + 1, T,
                        DP_PARAMS(1.0f, 0)) == DP_ERR_BOUNDS, "bounds: positions past the spans");
    check(dp_attn_spans(&a, ops, pool, 1, q, H * hd, out, H * hd, H, spans, pages_needed, pos0, T,
                        DP_PARAMS(1.0f, 0)) == DP_ERR_BOUNDS, "bounds: layer");
    free(slots); free(spans); free(k); free(v); free(kd); free(vd); free(q); free(out); free(want);
    dp_arena_free(&a);
}

/* An ISA's run ops equal its per-piece ops over the same pieces: scores bit for bit
 * (each 16-token vector is one dot product either way), accumulation to rounding
 * (partial sums are reduced once per run instead of once per piece). Pieces of
 * uneven length, tile pitch and offset, as gather_run hands them over. */
static void run_ops_case(const dp_attn_ops *ops, int64_t group, int64_t hd) {
    const dp_kv_kernels *kk = &ops->kv[DP_KV_F16];
    enum { NS = 7 };
    const int64_t lens[NS] = {5, 16, 16, 11, 1, 16, 9}, lds[NS] = {16, 16, 32, 16, 16, 64, 16};
    int64_t total = 0;
    for (int j = 0; j < NS; j++) total += lens[j];
    const int64_t sstride = total + 3;
    uint16_t *kt[NS], *vr[NS];
    dp_seg ks[NS], vs[NS];
    for (int j = 0; j < NS; j++) {
        const int64_t row = lds[j] - lens[j]; /* the piece ends at its tile's last row */
        kt[j] = (uint16_t *)malloc((size_t)(hd * lds[j]) * sizeof(uint16_t));
        vr[j] = (uint16_t *)malloc((size_t)(lens[j] * hd) * sizeof(uint16_t));
        for (int64_t i = 0; i < hd * lds[j]; i++) kt[j][i] = dp_float_to_half(frand());
        for (int64_t i = 0; i < lens[j] * hd; i++) vr[j][i] = dp_float_to_half(frand());
        ks[j] = (dp_seg){kt[j] + row, lds[j], lens[j], NULL};
        vs[j] = (dp_seg){vr[j], hd, lens[j], NULL};
    }
    float *q = (float *)malloc((size_t)(group * hd) * sizeof(float));
    float *s1 = (float *)calloc((size_t)(group * sstride), sizeof(float));
    float *s2 = (float *)calloc((size_t)(group * sstride), sizeof(float));
    float *o1 = (float *)malloc((size_t)(group * hd) * sizeof(float));
    float *o2 = (float *)malloc((size_t)(group * hd) * sizeof(float));
    for (int64_t i = 0; i < group * hd; i++) { q[i] = frand(); o1[i] = o2[i] = frand(); }
    int64_t off = 0;
    for (int j = 0; j < NS; off += lens[j], j++)
        kk->scores(q, group, hd, ks[j].ptr, lds[j], NULL, lens[j], 0.3f, s1 + off, sstride);
    kk->scores_run(q, group, hd, ks, NS, 0.3f, s2, sstride);
    check(memcmp(s1, s2, (size_t)(group * sstride) * sizeof(float)) == 0, "run scores == per-piece scores");
    off = 0;
    for (int j = 0; j < NS; off += lens[j], j++)
        kk->accum(s1 + off, sstride, group, hd, vr[j], NULL, lens[j], o1);
    kk->accum_run(s1, sstride, group, hd, vs, NS, o2);
    const double worst = worst_rel_err(o1, o2, group * hd);
    char what[120];
    snprintf(what, sizeof what, "%s run accumulation == per-piece group=%lld hd=%lld (worst %.2g)", dp_ops_name(ops),
             (long long)group, (long long)hd, worst);
    check(worst < 1e-5, what);
    for (int j = 0; j < NS; j++) { free(kt[j]); free(vr[j]); }
    free(q); free(s1); free(s2); free(o1); free(o2);
}

/* The same for q8 pieces: int8 K^T / V with a scale per row, carried by the pieces. */
static void run_ops_case_q8(const dp_attn_ops *ops, int64_t group, int64_t hd) {
    const dp_kv_kernels *kk = &ops->kv[DP_KV_Q8];
    enum { NS = 7 };
    const int64_t lens[NS] = {5, 16, 16, 11, 1, 16, 9}, lds[NS] = {16, 16, 32, 16, 16, 64, 16};
    int64_t total = 0;
    for (int j = 0; j < NS; j++) total += lens[j];
    const int64_t sstride = total + 3;
    int8_t *kt[NS], *vr[NS];
    float *ksc[NS], *vsc[NS];
    dp_seg ks[NS], vs[NS];
    for (int j = 0; j < NS; j++) {
        const int64_t row = lds[j] - lens[j];
        kt[j] = (int8_t *)malloc((size_t)(hd * lds[j]));
        vr[j] = (int8_t *)malloc((size_t)(lens[j] * hd));
        ksc[j] = (float *)malloc((size_t)lds[j] * sizeof(float));
        vsc[j] = (float *)malloc((size_t)lens[j] * sizeof(float));
        for (int64_t i = 0; i < hd * lds[j]; i++) kt[j][i] = (int8_t)(127 * frand());
        for (int64_t i = 0; i < lens[j] * hd; i++) vr[j][i] = (int8_t)(127 * frand());
        for (int64_t i = 0; i < lds[j]; i++) ksc[j][i] = 0.01f * (1.5f + frand());
        for (int64_t i = 0; i < lens[j]; i++) vsc[j][i] = 0.01f * (1.5f + frand());
        ks[j] = (dp_seg){kt[j] + row, lds[j], lens[j], ksc[j] + row};
        vs[j] = (dp_seg){vr[j], hd, lens[j], vsc[j]};
    }
    float *q = (float *)malloc((size_t)(group * hd) * sizeof(float));
    float *s1 = (float *)calloc((size_t)(group * sstride), sizeof(float));
    float *s2 = (float *)calloc((size_t)(group * sstride), sizeof(float));
    float *o1 = (float *)malloc((size_t)(group * hd) * sizeof(float));
    float *o2 = (float *)malloc((size_t)(group * hd) * sizeof(float));
    for (int64_t i = 0; i < group * hd; i++) { q[i] = frand(); o1[i] = o2[i] = frand(); }
    int64_t off = 0;
    for (int j = 0; j < NS; off += lens[j], j++)
        kk->scores(q, group, hd, ks[j].ptr, lds[j], ks[j].scales, lens[j], 0.3f, s1 + off, sstride);
    kk->scores_run(q, group, hd, ks, NS, 0.3f, s2, sstride);
    check(memcmp(s1, s2, (size_t)(group * sstride) * sizeof(float)) == 0, "q8 run scores == per-piece scores");
    off = 0;
    for (int j = 0; j < NS; off += lens[j], j++) kk->accum(s1 + off, sstride, group, hd, vr[j], vsc[j], lens[j], o1);
    kk->accum_run(s1, sstride, group, hd, vs, NS, o2);
    const double worst = worst_rel_err(o1, o2, group * hd);
    char what[120];
    snprintf(what, sizeof what, "%s q8 run accumulation == per-piece group=%lld hd=%lld (worst %.2g)", dp_ops_name(ops),
             (long long)group, (long long)hd, worst);
    check(worst < 1e-5, what);
    for (int j = 0; j < NS; j++) { free(kt[j]); free(vr[j]); free(ksc[j]); free(vsc[j]); }
    free(q); free(s1); free(s2); free(o1); free(o2);
}

/* q8 storage: every element of a written row comes back (dp_kv_gather) within half
 * its row's scale s = max|x| / 127 (plus the f32 rounding of s * value), whatever the
 * row's magnitude; an all-zero row comes back as zeros; copies are bit-exact, with
 * their scales. Also the ops against a double-precision dequantized reference. */
static void q8_storage_cases(void) {
    const int64_t nkv = 3, hd = 48, P = 16, n = 40, block = 1 << 16;
    dp_arena a;
    check(dp_arena_init(&a, block, 4, 2, nkv, hd, DP_KV_Q8, -1) == DP_OK, "q8 arena");
    check(dp_kv_tile_bytes(DP_KV_Q8, nkv, hd, P) == 2 * nkv * P * (hd + 4), "q8 tile: int8 values + f32 scale per row");
    float *k = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float)), *v = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float));
    float *kd = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float)), *vd = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float));
    float *kc = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float)), *vc = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float));
    for (int64_t t = 0; t < n; t++) {
        const float mag = t == 3 ? 0.0f : powf(10.0f, (float)(t % 9) - 5.0f); /* 1e-5 .. 1e3, one zero row */
        for (int64_t i = 0; i < nkv * hd; i++) {
            k[t * nkv * hd + i] = mag * frand();
            v[t * nkv * hd + i] = mag * frand() * (i % 7 == 0 ? 30.0f : 1.0f); /* an outlier every 7 dims */
        }
    }
    const int64_t tb = dp_kv_tile_bytes(DP_KV_Q8, nkv, hd, P);
    int64_t slots[3 * 40], dst[3 * 40], spans[3 * 3], dspans[3 * 3];
    for (int64_t t = 0; t < n; t++) {
        slots[3 * t] = (t / P) * tb, slots[3 * t + 1] = t % P, slots[3 * t + 2] = P;
        dst[3 * t] = block + (t / P) * tb, dst[3 * t + 1] = t % P, dst[3 * t + 2] = P;
    }
    for (int64_t p = 0; p < 3; p++) {
        spans[3 * p] = p * tb, spans[3 * p + 1] = n - p * P < P ? n - p * P : P, spans[3 * p + 2] = P;
        dspans[3 * p] = block + p * tb, dspans[3 * p + 1] = spans[3 * p + 1], dspans[3 * p + 2] = P;
    }
    check(dp_kv_write_slots(&a, NULL, 1, k, v, nkv * hd, slots, n) == DP_OK, "q8 write");
    check(dp_kv_gather(&a, 1, spans, 3, n, kd, vd) == DP_OK, "q8 gather");
    double worst = 0;
    int zeros = 1;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < nkv; h++)
            for (int kv = 0; kv < 2; kv++) {
                const float *x = (kv ? v : k) + t * nkv * hd + h * hd, *y = (kv ? vd : kd) + (h * n + t) * hd;
                float amax = 0.0f;
                for (int64_t e = 0; e < hd; e++) amax = fabsf(x[e]) > amax ? fabsf(x[e]) : amax;
                const double s = amax / 127.0f;
                for (int64_t e = 0; e < hd; e++) {
                    if (t == 3) { zeros &= y[e] == 0.0f; continue; }
                    /* s / 2, and the f32 roundings of x / s and s * value (each about 2^-24 relative) */
                    const double err = fabs((double)x[e] - y[e]) / (0.5 * s + 2e-7 * amax);
                    worst = err > worst ? err : worst;
                }
            }
    char what[120];
    snprintf(what, sizeof what, "q8 round trip: |x - dequant| <= scale / 2 (worst %.4f of the bound)", worst);
    check(worst <= 1.0, what);
    check(zeros, "q8: an all-zero row stays zero (scale 0)");
    check(dp_kv_copy_slots(&a, slots, dst, n) == DP_OK, "q8 copy");
    for (int l = 0; l < 2; l++) { /* layer 0 was never written: compare what the copy moved */
        float *k0 = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float)), *v0 = (float *)malloc((size_t)(n * nkv * hd) * sizeof(float));
        check(dp_kv_gather(&a, l, spans, 3, n, k0, v0) == DP_OK && dp_kv_gather(&a, l, dspans, 3, n, kc, vc) == DP_OK,
              "q8 gather after copy");
        check(memcmp(k0, kc, (size_t)(n * nkv * hd) * sizeof(float)) == 0 &&
              memcmp(v0, vc, (size_t)(n * nkv * hd) * sizeof(float)) == 0, "q8 copy moves values and scales");
        free(k0); free(v0);
    }
    /* A copy with one bad slot changes nothing. */
    const size_t bytes = (size_t)(a.layer_bytes * a.num_layers);
    char *before = (char *)malloc(bytes);
    memcpy(before, a.base, bytes);
    dst[3 * 7] = tb / 2;
    check(dp_kv_copy_slots(&a, dst, slots, n) == DP_ERR_ALIGN && memcmp(before, a.base, bytes) == 0,
          "q8 copy with a bad slot: refused, arena unchanged");
    free(before);
    free(k); free(v); free(kd); free(vd); free(kc); free(vc);
    dp_arena_free(&a);
    check(dp_arena_init(&a, block, 4, 1, nkv, 47, DP_KV_Q8, -1) == DP_ERR_ARG, "q8 refuses an odd head_dim");
    check(dp_arena_init(&a, block, 4, 1, nkv, 47, DP_KV_F16, -1) == DP_OK, "f16 takes an odd head_dim");
    dp_arena_free(&a);
    check(dp_arena_init(&a, 1 << 12, 1, 1, 32, 60, DP_KV_Q8, -1) == DP_OK, "q8: a token of 2 x 32 x (60 + 4) bytes fits 4 KiB");
    dp_arena_free(&a);
    check(dp_arena_init(&a, 1 << 12, 1, 1, 32, 62, DP_KV_Q8, -1) == DP_ERR_ARG, "q8: the scales count in a token's bytes");
    check(dp_kv_tile_bytes(7, 2, 64, 16) == -1 && dp_kv_tile_bytes(DP_KV_Q8, 2, 64, INT64_MAX / 4) == -1,
          "tile bytes: unknown dtype, overflow");
}

/* Whole tiles out of the arena and back (the prefix cache on disk): every layer round
 * trips, and a bad offset among good ones copies nothing either way. */
static void tile_io_cases(void) {
    dp_arena a;
    const int64_t block = 1 << 14, P = 16;
    check(dp_arena_init(&a, block, 4, 3, 2, 64, DP_KV_Q8, -1) == DP_OK, "tile io: arena");
    const int64_t tb = dp_kv_tile_bytes(DP_KV_Q8, 2, 64, P);
    const size_t bytes = (size_t)(a.layer_bytes * a.num_layers);
    for (size_t i = 0; i < bytes; i++) a.base[i] = (char)(i * 7 + 3);
    const int64_t src[2] = {0, tb}, dst[2] = {block, 2 * block};
    char *buf = (char *)malloc((size_t)(2 * 3 * tb)), *before = (char *)malloc(bytes);
    check(dp_kv_tiles_io(&a, src, 2, P, buf, 0) == DP_OK && dp_kv_tiles_io(&a, dst, 2, P, buf, 1) == DP_OK,
          "tile io: read, write");
    int same = 1;
    for (int64_t l = 0; l < 3; l++)
        for (int t = 0; t < 2; t++)
            same &= memcmp(a.base + l * a.layer_bytes + src[t], a.base + l * a.layer_bytes + dst[t], (size_t)tb) == 0;
    check(same, "tile io: every layer's tile arrives");
    memcpy(before, a.base, bytes);
    const int64_t bad[][2] = {{0, tb / 2}, {0, 4 * block}, {0, -tb}, {0, block - tb / 2}};
    for (int b = 0; b < 4; b++) {
        check(dp_kv_tiles_io(&a, bad[b], 2, P, buf, 1) != DP_OK && memcmp(before, a.base, bytes) == 0,
              "tile io: a bad offset is refused, arena unchanged");
        check(dp_kv_tiles_io(&a, bad[b], 2, P, buf, 0) != DP_OK, "tile io: a bad offset is refused on read");
    }
    check(dp_kv_tiles_io(&a, src, 2, 0, buf, 0) == DP_ERR_BOUNDS && dp_kv_tiles_io(&a, src, -1, P, buf, 0) == DP_ERR_ARG &&
          dp_kv_tiles_io(&a, src, 2, P, NULL, 0) == DP_ERR_ARG, "tile io: bad arguments");
    free(buf);
    free(before);
    dp_arena_free(&a);
}

/* ---- errors: allocation failures, thread creation, bad slots ------------------ */

/* An arena of one or more layers with n_ctx tokens written to layer 0 through pages
 * of P = 16 (every other page, so the pages between stay free), and queries. */
typedef struct {
    dp_arena a;
    int64_t nkv, hd, H, n_ctx, T, num_pages;
    int64_t *spans; /* (num_pages, 3) */
    int64_t *slots; /* (n_ctx, 3) */
    float *k, *v;   /* (n_ctx, nkv * hd) */
    float *q, *out; /* (T, H * hd) */
} fixture;

static int fixture_init(fixture *f, const dp_attn_ops *ops, int kv_dtype, int64_t num_layers, int64_t n_ctx,
                        int64_t T) {
    memset(f, 0, sizeof *f);
    f->nkv = 2, f->hd = 64, f->H = 4, f->n_ctx = n_ctx, f->T = T;
    const int64_t P = 16, block = 1 << 16, page = dp_kv_tile_bytes(kv_dtype, f->nkv, f->hd, P);
    f->num_pages = (n_ctx + P - 1) / P;
    const int64_t ppb = block / page, nblocks = (2 * f->num_pages + ppb - 1) / ppb + 1;
    if (dp_arena_init(&f->a, block, nblocks, num_layers, f->nkv, f->hd, kv_dtype, -1) != DP_OK) return 0;
    memset(f->a.base, 0x5a, (size_t)(f->a.layer_bytes * num_layers)); /* a known picture of the arena */
    f->spans = (int64_t *)malloc((size_t)f->num_pages * 3 * sizeof(int64_t));
    f->slots = (int64_t *)malloc((size_t)n_ctx * 3 * sizeof(int64_t));
    f->k = (float *)malloc((size_t)(n_ctx * f->nkv * f->hd) * sizeof(float));
    f->v = (float *)malloc((size_t)(n_ctx * f->nkv * f->hd) * sizeof(float));
    f->q = (float *)malloc((size_t)(T * f->H * f->hd) * sizeof(float));
    f->out = (float *)malloc((size_t)(T * f->H * f->hd) * sizeof(float));
    for (int64_t i = 0; i < n_ctx * f->nkv * f->hd; i++) { f->k[i] = frand(); f->v[i] = frand(); }
    for (int64_t i = 0; i < T * f->H * f->hd; i++) f->q[i] = frand();
    for (int64_t p = 0; p < f->num_pages; p++) {
        const int64_t pg = 2 * p;
        f->spans[3 * p] = (pg / ppb) * block + (pg % ppb) * page;
        f->spans[3 * p + 1] = n_ctx - p * P < P ? n_ctx - p * P : P;
        f->spans[3 * p + 2] = P;
    }
    for (int64_t j = 0; j < n_ctx; j++) {
        f->slots[3 * j] = f->spans[3 * (j / P)];
        f->slots[3 * j + 1] = j % P;
        f->slots[3 * j + 2] = P;
    }
    return dp_kv_write_slots(&f->a, ops, 0, f->k, f->v, f->nkv * f->hd, f->slots, n_ctx) == DP_OK;
}

static void fixture_free(fixture *f) {
    free(f->spans); free(f->slots); free(f->k); free(f->v); free(f->q); free(f->out);
    dp_arena_free(&f->a);
}

static int attend(fixture *f, const dp_attn_ops *ops, dp_pool *pool) {
    return dp_attn_spans(&f->a, ops, pool, 0, f->q, f->H * f->hd, f->out, f->H * f->hd, f->H, f->spans,
                         f->num_pages, f->n_ctx - f->T, f->T, DP_PARAMS(0.125f, 2));
}

/* An attention call without a workspace makes one allocation (its own workspace):
 * failing, it is reported as DP_ERR_NOMEM, never as DP_OK with stale output; once it
 * succeeds the output equals an undisturbed call's. With a warm workspace the same
 * call allocates nothing at all, on the pool's workers included. */
static void alloc_failure_case(const dp_attn_ops *ops, dp_pool *pool, int64_t n_ctx, int64_t T) {
    fixture f;
    if (!fixture_init(&f, ops, DP_KV_F16, 1, n_ctx, T)) { check(0, "alloc failure fixture"); fixture_free(&f); return; }
    const size_t out_bytes = (size_t)(T * f.H * f.hd) * sizeof(float);
    float *want = (float *)malloc(out_bytes);
    check(attend(&f, ops, pool) == DP_OK, "undisturbed attention");
    memcpy(want, f.out, out_bytes);
    int64_t n = 0; /* allocations the call makes: the first count that lets it through */
    int all_nomem = 1;
    for (; n < 1000; n++) {
        dp_test_fail_alloc_after(n);
        memcpy(f.out, want, out_bytes); /* stale output that looks right: the status must tell */
        const int st = attend(&f, ops, pool);
        if (st == DP_OK) break;
        all_nomem &= st == DP_ERR_NOMEM;
    }
    dp_test_fail_alloc_after(-1);
    char what[160];
    snprintf(what, sizeof what, "%s ctx=%lld T=%lld pool=%d: allocations 0..%lld failing each give DP_ERR_NOMEM",
             dp_ops_name(ops), (long long)n_ctx, (long long)T, pool ? dp_pool_num_threads(pool) : 1, (long long)n - 1);
    check(all_nomem, what);
    check(n == 1, "an attention call without a workspace allocates once");
    memset(f.out, 0, out_bytes);
    check(attend(&f, ops, pool) == DP_OK && memcmp(f.out, want, out_bytes) == 0, "attention after the failures");
    /* A workspace: the first call grows it (or fails, out untouched), later ones allocate nothing. */
    dp_attn_workspace ws = {NULL, 0};
    const int64_t seq[5] = {0, T, f.n_ctx - T, 0, f.num_pages};
    dp_test_fail_alloc_after(0);
    memset(f.out, 0x7f, out_bytes);
    int st = dp_attn_batch(&f.a, ops, pool, 0, f.q, f.H * f.hd, f.out, f.H * f.hd, f.H, T, seq, 1, f.spans,
                           f.num_pages, DP_PARAMS(0.125f, 2), &ws);
    float *untouched = (float *)malloc(out_bytes);
    memset(untouched, 0x7f, out_bytes);
    check(st == DP_ERR_NOMEM && ws.bytes == 0 && memcmp(f.out, untouched, out_bytes) == 0,
          "a cold workspace that cannot grow: DP_ERR_NOMEM, out untouched");
    dp_test_fail_alloc_after(-1);
    st = dp_attn_batch(&f.a, ops, pool, 0, f.q, f.H * f.hd, f.out, f.H * f.hd, f.H, T, seq, 1, f.spans, f.num_pages,
                       DP_PARAMS(0.125f, 2), &ws);
    check(st == DP_OK && ws.bytes > 0 && memcmp(f.out, want, out_bytes) == 0, "the first call grows the workspace");
    const size_t grown = ws.bytes;
    dp_test_fail_alloc_after(0); /* from here on any allocation would fail the call */
    memset(f.out, 0, out_bytes);
    st = dp_attn_batch(&f.a, ops, pool, 0, f.q, f.H * f.hd, f.out, f.H * f.hd, f.H, T, seq, 1, f.spans, f.num_pages,
                       DP_PARAMS(0.125f, 2), &ws);
    const int64_t fewer[5] = {0, 1, f.n_ctx - 1, 0, f.num_pages}; /* a smaller call fits too */
    const int st2 = dp_attn_batch(&f.a, ops, pool, 0, f.q + (T - 1) * f.H * f.hd, f.H * f.hd, untouched,
                                  f.H * f.hd, f.H, 1, fewer, 1, f.spans, f.num_pages, DP_PARAMS(0.125f, 2), &ws);
    dp_test_fail_alloc_after(-1);
    snprintf(what, sizeof what, "%s ctx=%lld T=%lld: a warm workspace: no allocation, same output", dp_ops_name(ops),
             (long long)n_ctx, (long long)T);
    check(st == DP_OK && st2 == DP_OK && ws.bytes == grown && memcmp(f.out, want, out_bytes) == 0, what);
    dp_attn_workspace_free(&ws);
    check(ws.buf == NULL && ws.bytes == 0, "a freed workspace is empty");
    free(untouched);
    free(want);
    fixture_free(&f);
}

/* A step that cannot allocate writes nothing; with a warm workspace it allocates nothing. */
static void step_alloc_failure_case(dp_pool *pool) {
    const dp_attn_ops *ops = dp_ops_by_name("generic");
    fixture f;
    if (!fixture_init(&f, ops, DP_KV_F32, 1, 300, 4)) { check(0, "step fixture"); fixture_free(&f); return; }
    const size_t bytes = (size_t)f.a.layer_bytes;
    char *before = (char *)malloc(bytes);
    memcpy(before, f.a.base, bytes);
    /* New rows for the last 4 positions (their slots are already in the fixture). */
    const int64_t r0 = f.n_ctx - f.T, seq[5] = {0, f.T, r0, 0, f.num_pages};
    float *k = f.k + r0 * f.nkv * f.hd, *v = f.v + r0 * f.nkv * f.hd;
    for (int64_t i = 0; i < f.T * f.nkv * f.hd; i++) k[i] += 1.0f;
    dp_test_fail_alloc_after(0);
    dp_attn_workspace ws = {NULL, 0};
    int st = dp_step_batch(&f.a, ops, pool, 0, k, v, f.nkv * f.hd, f.slots + 3 * r0, f.q, f.H * f.hd, f.out,
                           f.H * f.hd, f.H, f.T, seq, 1, f.spans, f.num_pages, DP_PARAMS(0.125f, 0), NULL);
    check(st == DP_ERR_NOMEM && memcmp(before, f.a.base, bytes) == 0, "step: out of memory writes nothing");
    st = dp_step_batch(&f.a, ops, pool, 0, k, v, f.nkv * f.hd, f.slots + 3 * r0, f.q, f.H * f.hd, f.out,
                       f.H * f.hd, f.H, f.T, seq, 1, f.spans, f.num_pages, DP_PARAMS(0.125f, 0), &ws);
    check(st == DP_ERR_NOMEM && ws.bytes == 0 && memcmp(before, f.a.base, bytes) == 0,
          "step: a workspace that cannot grow writes nothing");
    dp_test_fail_alloc_after(-1);
    st = dp_step_batch(&f.a, ops, pool, 0, k, v, f.nkv * f.hd, f.slots + 3 * r0, f.q, f.H * f.hd, f.out,
                       f.H * f.hd, f.H, f.T, seq, 1, f.spans, f.num_pages, DP_PARAMS(0.125f, 0), &ws);
    check(st == DP_OK && memcmp(before, f.a.base, bytes) != 0, "step writes and attends");
    dp_test_fail_alloc_after(0);
    st = dp_step_batch(&f.a, ops, pool, 0, k, v, f.nkv * f.hd, f.slots + 3 * r0, f.q, f.H * f.hd, f.out,
                       f.H * f.hd, f.H, f.T, seq, 1, f.spans, f.num_pages, DP_PARAMS(0.125f, 0), &ws);
    dp_test_fail_alloc_after(-1);
    check(st == DP_OK, "step with a warm workspace allocates nothing");
    dp_attn_workspace_free(&ws);
    /* A batch of two sequences (its jobs and task ends allocated), every allocation failing in turn. */
    const int64_t two[10] = {0, 2, r0, 0, f.num_pages, 2, 2, r0 + 2, 0, f.num_pages};
    int64_t n = 0;
    int all_nomem = 1;
    for (; n < 1000; n++) {
        dp_test_fail_alloc_after(n);
        st = dp_attn_batch(&f.a, ops, pool, 0, f.q, f.H * f.hd, f.out, f.H * f.hd, f.H, f.T, two, 2, f.spans,
                           f.num_pages, DP_PARAMS(0.125f, 0), NULL);
        if (st == DP_OK) break;
        all_nomem &= st == DP_ERR_NOMEM;
    }
    dp_test_fail_alloc_after(-1);
    check(all_nomem && n == 1, "batch of two: its one allocation failing gives DP_ERR_NOMEM");
    free(before);
    fixture_free(&f);
}

/* Pool creation fails whole (never a smaller pool) and says why; so does the probe. */
static void pool_failure_cases(void) {
    dp_pool *p = (dp_pool *)1;
    dp_test_fail_thread_create_after(2); /* workers 1 and 2 start, worker 3 does not */
    check(dp_pool_create(4, &p) == DP_ERR_THREAD && p == NULL, "pool: pthread_create failure is DP_ERR_THREAD");
    dp_test_fail_thread_create_after(0);
    check(dp_pool_create(2, &p) == DP_ERR_THREAD && p == NULL, "pool: first worker failing");
    check(dp_pool_create(1, &p) == DP_OK && p != NULL, "pool of 1 starts no thread");
    dp_pool_destroy(p);
    dp_test_fail_thread_create_after(-1);
    dp_test_fail_alloc_after(0);
    check(dp_pool_create(3, &p) == DP_ERR_NOMEM && p == NULL, "pool: allocation failure is DP_ERR_NOMEM");
    dp_test_fail_alloc_after(-1);
    check(dp_pool_create(3, &p) == DP_OK && dp_pool_num_threads(p) == 3, "pool after the failures");
    int64_t tids[3] = {0, 0, 0}, flops = -1;
    check(dp_pool_worker_tids(p, tids, 3) == 3 && tids[1] > 0 && tids[2] > 0 && tids[1] != tids[2],
          "pool: every worker's tid is known once create returns");
    dp_test_fail_alloc_after(0);
    check(dp_run_fma_probe(p, dp_ops_generic.fma_probe, 10, &flops) == DP_ERR_NOMEM && flops == 0,
          "fma probe: allocation failure is DP_ERR_NOMEM, not 0 flops");
    dp_test_fail_alloc_after(-1);
    const int good[2] = {0, -1}, bad[2] = {0, DP_POOL_MAX_CPUS};
    check(dp_pool_set_affinity(p, good, 2) == DP_OK, "affinity: cpus in range");
    check(dp_pool_set_affinity(p, bad, 2) == DP_ERR_ARG, "affinity: cpu past DP_POOL_MAX_CPUS");
    dp_pool_destroy(p);
    dp_arena a;
    dp_test_fail_alloc_after(0);
    check(dp_arena_init(&a, 1 << 16, 4, 1, 2, 64, DP_KV_F16, -1) == DP_ERR_NOMEM && a.base == NULL,
          "arena: allocation failure is DP_ERR_NOMEM");
    dp_test_fail_alloc_after(-1);
}

/* The pool's job protocol under churn: jobs of 1..64 tasks back to back, with and
 * without gaps that let the workers fall asleep. Every task runs exactly once, and
 * once dp_pool_run returns no worker touches that job any more: the next job reuses
 * the same counters, so a late write shows up as a wrong count. */
typedef struct { atomic_int runs[64]; atomic_int stray; int64_t num_tasks; } pool_job;

static void pool_job_task(void *ctx, int64_t task, int worker) {
    pool_job *J = (pool_job *)ctx;
    if (task < 0 || task >= J->num_tasks || worker < 0 || worker >= 4) atomic_fetch_add(&J->stray, 1);
    else atomic_fetch_add(&J->runs[task], 1);
}

/* A fresh job of n tasks in J (its counters reused from the last one). */
static void pool_job_reset(pool_job *J, int64_t n) {
    J->num_tasks = n;
    for (int t = 0; t < 64; t++) atomic_store(&J->runs[t], 0);
    atomic_store(&J->stray, 0);
}

/* 1 when every task of J ran exactly once and nothing else ran. */
static int pool_job_exact(pool_job *J) {
    int ok = atomic_load(&J->stray) == 0;
    for (int t = 0; t < 64; t++) ok &= atomic_load(&J->runs[t]) == (t < J->num_tasks);
    return ok;
}

static void pool_protocol_cases(void) {
    dp_pool *p = NULL;
    check(dp_pool_create(4, &p) == DP_OK, "pool of 4 for the protocol cases");
    pool_job J;
    int ok = 1;
    for (int it = 0; it < 3000 && ok; it++) {
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        pool_job_reset(&J, 1 + (int64_t)((rng_state >> 33) % 64));
        if (it % 100 == 0) { /* workers asleep by now */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        if (it % 3) dp_pool_run(p, J.num_tasks, pool_job_task, &J);
        else dp_pool_run_all(p, J.num_tasks, pool_job_task, &J); /* every worker awake first */
        ok &= pool_job_exact(&J);
    }
    check(ok, "pool: 3,000 jobs of 1..64 tasks (a third run_all), every task exactly once, none after the job returned");
    dp_pool_destroy(p);
}

/* Active threads: the first n take a plain job's tasks (the others sleep through it), a
 * run_all job still has all of them, and out-of-range counts are refused. */
typedef struct { atomic_int runs[64]; atomic_int by_worker[4]; int64_t num_tasks; } active_job;

static void active_task(void *ctx, int64_t task, int worker) {
    active_job *J = (active_job *)ctx;
    if (task >= 0 && task < J->num_tasks) atomic_fetch_add(&J->runs[task], 1);
    if (worker >= 0 && worker < 4) atomic_fetch_add(&J->by_worker[worker], 1);
}

static int active_round(dp_pool *p, int64_t num_tasks, int all, int most_workers) {
    active_job J;
    J.num_tasks = num_tasks;
    for (int t = 0; t < 64; t++) atomic_store(&J.runs[t], 0);
    for (int w = 0; w < 4; w++) atomic_store(&J.by_worker[w], 0);
    if (all) dp_pool_run_all(p, num_tasks, active_task, &J);
    else dp_pool_run(p, num_tasks, active_task, &J);
    int ok = 1;
    for (int t = 0; t < 64; t++) ok &= atomic_load(&J.runs[t]) == (t < num_tasks);
    for (int w = most_workers; w < 4; w++) ok &= atomic_load(&J.by_worker[w]) == 0;
    return ok;
}

static void pool_active_cases(void) {
    dp_pool *p = NULL;
    check(dp_pool_create(4, &p) == DP_OK, "pool of 4 for the active cases");
    check(dp_pool_active(p) == 4, "active: all threads at first");
    check(dp_pool_set_active(p, 0) == DP_ERR_ARG && dp_pool_set_active(p, 5) == DP_ERR_ARG &&
              dp_pool_set_active(NULL, 1) == DP_ERR_ARG && dp_pool_active(p) == 4,
          "active: 0, 5 and no pool refused, nothing changed");
    int ok = 1;
    for (int n = 1; n <= 4 && ok; n++) {
        check(dp_pool_set_active(p, n) == DP_OK && dp_pool_active(p) == n, "active: set");
        for (int it = 0; it < 300 && ok; it++) ok &= active_round(p, 1 + it % 64, 0, n);
        ok &= active_round(p, 64, 1, 4); /* a run_all job: every thread */
    }
    check(ok, "active: 1..4 threads, 300 jobs each, every task once and on the first n threads only");
    dp_pool_destroy(p);
}

/* Read-ahead (dp_pool_warm): workers that spin after a job read every page of the region
 * (fresh anonymous pages in small pages, resident only once read: mincore sees each read),
 * jobs run exactly as without it, and a region replaced or cleared is never read again: it
 * is unmapped right after, so a late read would die with SIGSEGV (and ASan sees its frees). */
static int resident_pages(const uint8_t *p, int64_t bytes) {
    unsigned char v[64];
    const int64_t pages = bytes / 4096;
    if (pages > 64 || mincore((void *)p, (size_t)bytes, v) != 0) return -1;
    int n = 0;
    for (int64_t i = 0; i < pages; i++) n += v[i] & 1;
    return n;
}

typedef struct { dp_pool *pool; atomic_int started, release; } busy_job;

static void busy_task(void *ctx, int64_t task, int worker) {
    (void)task;
    (void)worker;
    busy_job *B = (busy_job *)ctx;
    atomic_store(&B->started, 1);
    while (!atomic_load(&B->release)) sched_yield();
}

static void *busy_caller(void *arg) {
    busy_job *B = (busy_job *)arg;
    dp_pool_run(B->pool, 4, busy_task, B);
    return NULL;
}

static void pool_warm_cases(void) {
    dp_pool *p = NULL, *one = NULL;
    check(dp_pool_create(3, &p) == DP_OK && dp_pool_create(1, &one) == DP_OK, "pools of 3 and 1 for read-ahead");
    static uint8_t small[256];
    check(dp_pool_warm(NULL, small, sizeof small) == 0 && dp_pool_warm(one, small, sizeof small) == 0,
          "read-ahead: no pool and a pool of 1 (no workers) take no region");
    check(dp_pool_warm(p, small, 0) == 1 && dp_pool_warm(p, NULL, 64) == 1, "read-ahead: 0 bytes and NULL clear");
    const int64_t bytes = 16 * 4096;
    int read_all = 0;
    for (int attempt = 0; attempt < 20 && !read_all; attempt++) {
        uint8_t *r = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r == MAP_FAILED) break;
        madvise(r, (size_t)bytes, MADV_NOHUGEPAGE);
        const int before = resident_pages(r, bytes);
        pool_job J;
        pool_job_reset(&J, 16);
        dp_pool_run_all(p, J.num_tasks, pool_job_task, &J); /* every worker ran it: they spin now */
        if (dp_pool_warm(p, r, bytes) != 1) break;
        for (int i = 0; i < 2000 && resident_pages(r, bytes) < 16; i++) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        read_all = before == 0 && resident_pages(r, bytes) == 16;
        dp_pool_warm(p, NULL, 0);
        munmap(r, (size_t)bytes);
    }
    check(read_all, "read-ahead: spinning workers read every page of a 16-page region");
    int ok = 1;
    for (int it = 0; it < 400 && ok; it++) {
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t len = 4096 * (1 + (int64_t)((rng_state >> 33) % 64));
        uint8_t *r = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r == MAP_FAILED) { ok = 0; break; }
        memset(r, it, (size_t)len);
        pool_job J;
        pool_job_reset(&J, 1 + it % 32);
        dp_pool_run(p, J.num_tasks, pool_job_task, &J);
        dp_pool_warm(p, r, len);
        if (it % 2) { /* a job while the region is read */
            ok &= pool_job_exact(&J);
            pool_job_reset(&J, J.num_tasks);
            dp_pool_run(p, J.num_tasks, pool_job_task, &J);
        }
        ok &= pool_job_exact(&J);
        if (it % 3) dp_pool_warm(p, NULL, 0); /* else the next region replaces it */
        else dp_pool_warm(p, small, sizeof small);
        munmap(r, (size_t)len);
    }
    check(ok, "read-ahead: 400 regions set, read under jobs, replaced or cleared and unmapped at once");
    /* Another caller's job on the pool: a new region is skipped, not waited for. */
    busy_job B = {.pool = p};
    atomic_store(&B.started, 0);
    atomic_store(&B.release, 0);
    pthread_t t;
    check(pthread_create(&t, NULL, busy_caller, &B) == 0, "read-ahead: a second caller");
    while (!atomic_load(&B.started)) sched_yield();
    const int skipped = dp_pool_warm(p, small, sizeof small) == 0;
    atomic_store(&B.release, 1);
    pthread_join(t, NULL);
    check(skipped && dp_pool_warm(p, small, sizeof small) == 1,
          "read-ahead: skipped while another caller's job runs, set once it is done");
    dp_pool_warm(p, NULL, 0);
    dp_pool_destroy(p);
    dp_pool_destroy(one);
}

/* Yielders: a thread blocked on a pipe is under SCHED_IDLE while a job of several tasks
 * runs (every task sees it so), back under SCHED_OTHER after; one task runs on the
 * caller and leaves it alone; an exited thread is skipped. */
typedef struct { int fd; atomic_llong tid; } sleeper;
typedef struct { pid_t tid; atomic_int idle, other; } yield_job;

static void *sleeper_main(void *arg) {
    sleeper *s = (sleeper *)arg;
    atomic_store(&s->tid, (long long)syscall(SYS_gettid));
    char c;
    while (read(s->fd, &c, 1) < 0) {
    }
    return NULL;
}

static void yield_task(void *ctx, int64_t task, int worker) {
    (void)task;
    (void)worker;
    yield_job *J = (yield_job *)ctx;
    atomic_fetch_add(sched_getscheduler(J->tid) == SCHED_IDLE ? &J->idle : &J->other, 1);
}

static void pool_yielder_cases(void) {
    int64_t bad = 0;
    dp_pool *p = NULL;
    check(dp_pool_create(2, &p) == DP_OK, "pool of 2 for the yielder cases");
    check(dp_pool_set_yielders(p, &bad, 1) == DP_ERR_ARG && dp_pool_set_yielders(p, NULL, 1) == DP_ERR_ARG &&
              dp_pool_set_yielders(p, &bad, DP_POOL_MAX_YIELDERS + 1) == DP_ERR_ARG,
          "yielders: tid <= 0, NULL or too many refused");
    if (!dp_can_unidle()) {
        printf("skip: yielders (this process may not leave SCHED_IDLE)\n");
        dp_pool_destroy(p);
        return;
    }
    int fds[2];
    sleeper s = {0, 0};
    pthread_t t;
    check(pipe(fds) == 0, "pipe for the sleeper");
    s.fd = fds[0];
    pthread_create(&t, NULL, sleeper_main, &s);
    while (!atomic_load(&s.tid)) sched_yield();
    yield_job J = {(pid_t)atomic_load(&s.tid), 0, 0};
    const int64_t tids[2] = {J.tid, 999999999}; /* the second names no thread: skipped */
    check(dp_pool_set_yielders(p, tids, 2) == DP_OK, "yielders: set");
    dp_pool_run(p, 8, yield_task, &J);
    check(atomic_load(&J.idle) == 8 && atomic_load(&J.other) == 0, "yielders: SCHED_IDLE during a job of 8 tasks");
    check(sched_getscheduler(J.tid) == SCHED_OTHER, "yielders: SCHED_OTHER again after the job");
    atomic_store(&J.idle, 0);
    dp_pool_run(p, 1, yield_task, &J);
    check(atomic_load(&J.idle) == 0 && atomic_load(&J.other) == 1, "yielders: a one-task job (the caller's) leaves them be");
    check(write(fds[1], "x", 1) == 1, "wake the sleeper");
    pthread_join(t, NULL);
    dp_pool_run(p, 8, yield_task, &J); /* it has exited: nothing to set, nothing fails */
    check(dp_pool_set_yielders(p, NULL, 0) == DP_OK, "yielders: cleared");
    close(fds[0]);
    close(fds[1]);
    dp_pool_destroy(p);
}

static void check_head_dim_limit(void) {
    dp_arena a;
    check(dp_arena_init(&a, 1 << 16, 1, 1, 1, DP_MAX_HEAD_DIM, DP_KV_F16, -1) == DP_OK, "head_dim = DP_MAX_HEAD_DIM");
    dp_arena_free(&a);
    check(dp_arena_init(&a, 1 << 16, 1, 1, 1, DP_MAX_HEAD_DIM + 1, DP_KV_F16, -1) == DP_ERR_ARG,
          "head_dim = DP_MAX_HEAD_DIM + 1 is refused");
    check(dp_arena_init(&a, 1 << 16, 1, 1, INT64_MAX / 4, 64, DP_KV_F16, -1) == DP_ERR_ARG,
          "num_kv_heads too large for a block (no overflow)");
    check(dp_arena_init(&a, 1 << 16, INT64_MAX / 1024, 1, 1, 64, DP_KV_F16, -1) == DP_ERR_ARG,
          "num_blocks * block_size overflowing is refused");
}

/* A batch with one bad slot in the middle is refused whole: the arena is unchanged. */
static void bad_slot_cases(const dp_attn_ops *ops) {
    fixture f;
    if (!fixture_init(&f, ops, DP_KV_F16, 2, 64, 1)) { check(0, "bad slot fixture"); fixture_free(&f); return; }
    const int64_t P = 16, tb = 2 * f.nkv * P * f.hd * 2, n = 8, mid = 5;
    const int64_t tb24 = 2 * f.nkv * 24 * f.hd * 2; /* 12 KiB: a 64 KiB block holds 5 and a part */
    const size_t bytes = (size_t)(f.a.layer_bytes * f.a.num_layers);
    char *before = (char *)malloc(bytes);
    memcpy(before, f.a.base, bytes);
    const struct { int64_t off, row, P; int status; const char *what; } bad[] = {
        {-tb, 0, 16, DP_ERR_BOUNDS, "negative offset"},
        {0, 0, 0, DP_ERR_BOUNDS, "P = 0"},
        {0, 16, 16, DP_ERR_BOUNDS, "row past its tile"},
        {0, -1, 16, DP_ERR_BOUNDS, "negative row"},
        {0, 0, INT64_MAX / 2, DP_ERR_BOUNDS, "P so large tile_bytes would overflow"},
        {0, INT64_MAX / 4, INT64_MAX / 2, DP_ERR_BOUNDS, "row and P so large offsets would overflow"},
        {f.a.layer_bytes - tb / 2, 0, 16, DP_ERR_BOUNDS, "tile past the layer"},
        {f.a.layer_bytes, 0, 16, DP_ERR_BOUNDS, "offset at the layer's end"},
        {tb / 2, 0, 16, DP_ERR_ALIGN, "offset inside a tile"},
        {2, 0, 16, DP_ERR_ALIGN, "offset not a multiple of the element size"},
        {f.a.block_size / tb24 * tb24, 0, 24, DP_ERR_ALIGN, "tile straddling two blocks"},
    };
    int64_t slots[3 * 8], dst[3 * 8];
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        for (int64_t t = 0; t < n; t++) { /* good slots in pages nothing else uses */
            slots[3 * t] = f.spans[3 * (t % 2)] + tb, slots[3 * t + 1] = t, slots[3 * t + 2] = P;
            dst[3 * t] = slots[3 * t], dst[3 * t + 1] = t + 8, dst[3 * t + 2] = P;
        }
        slots[3 * mid] = bad[b].off, slots[3 * mid + 1] = bad[b].row, slots[3 * mid + 2] = bad[b].P;
        int64_t where = -2;
        char what[160];
        snprintf(what, sizeof what, "bad slot (%s): write refused, arena unchanged", bad[b].what);
        int st = dp_kv_write_slots(&f.a, ops, 1, f.k, f.v, f.nkv * f.hd, slots, n);
        check(st == bad[b].status && memcmp(before, f.a.base, bytes) == 0, what);
        snprintf(what, sizeof what, "bad slot (%s): check names slot %d", bad[b].what, (int)mid);
        check(dp_kv_check_slots(&f.a, slots, n, &where) == bad[b].status && where == mid, what);
        snprintf(what, sizeof what, "bad slot (%s): copy refused (bad src), arena unchanged", bad[b].what);
        st = dp_kv_copy_slots(&f.a, slots, dst, n);
        check(st == bad[b].status && memcmp(before, f.a.base, bytes) == 0, what);
        snprintf(what, sizeof what, "bad slot (%s): copy refused (bad dst), arena unchanged", bad[b].what);
        st = dp_kv_copy_slots(&f.a, dst, slots, n);
        check(st == bad[b].status && memcmp(before, f.a.base, bytes) == 0, what);
        const int64_t seq[5] = {0, n, f.n_ctx - n, 0, f.num_pages};
        float *q = (float *)calloc((size_t)(n * f.H * f.hd), sizeof(float)), *o = (float *)malloc((size_t)(n * f.H * f.hd) * sizeof(float));
        snprintf(what, sizeof what, "bad slot (%s): step refused, arena unchanged", bad[b].what);
        st = dp_step_batch(&f.a, ops, NULL, 0, f.k, f.v, f.nkv * f.hd, slots, q, f.H * f.hd, o, f.H * f.hd, f.H, n,
                           seq, 1, f.spans, f.num_pages, DP_PARAMS(0.125f, 0), NULL);
        check(st == bad[b].status && memcmp(before, f.a.base, bytes) == 0, what);
        free(q); free(o);
    }
    check(dp_kv_check_slots(&f.a, f.slots, f.n_ctx, NULL) == DP_OK, "the fixture's own slots are good");
    /* A step whose spans are bad writes none of its (good) slots. */
    for (int64_t t = 0; t < n; t++) slots[3 * t] = f.spans[0] + tb, slots[3 * t + 1] = t, slots[3 * t + 2] = P;
    const int64_t seq[5] = {0, n, 0, 0, 1}, bad_span[3] = {tb / 2, n, P};
    float *q = (float *)calloc((size_t)(n * f.H * f.hd), sizeof(float)), *o = (float *)malloc((size_t)(n * f.H * f.hd) * sizeof(float));
    check(dp_step_batch(&f.a, ops, NULL, 0, f.k, f.v, f.nkv * f.hd, slots, q, f.H * f.hd, o, f.H * f.hd, f.H, n, seq,
                        1, bad_span, 1, DP_PARAMS(0.125f, 0), NULL) == DP_ERR_ALIGN && memcmp(before, f.a.base, bytes) == 0,
          "step with a misaligned span writes nothing");
    const int64_t short_seq[5] = {0, n, 60, 0, 1}; /* positions 60.. but the span holds 8 tokens */
    const int64_t good_span[3] = {f.spans[0] + tb, n, P};
    check(dp_step_batch(&f.a, ops, NULL, 0, f.k, f.v, f.nkv * f.hd, slots, q, f.H * f.hd, o, f.H * f.hd, f.H, n,
                        short_seq, 1, good_span, 1, DP_PARAMS(0.125f, 0), NULL) == DP_ERR_BOUNDS && memcmp(before, f.a.base, bytes) == 0,
          "step with positions past its spans writes nothing");
    free(q); free(o);
    free(before);
    fixture_free(&f);
}

/* DUALPATH_DISABLE_CPU_FEATURES: every ISA with a feature by name, commas or spaces
 * between; a name that is no feature (generic included) is refused and pointed at. */
static void parse_features_cases(void) {
    unsigned mask = 7;
    const char *bad = NULL;
    size_t bad_len = 0;
    check(dp_parse_features(NULL, &mask, &bad, &bad_len) == DP_OK && mask == 0, "features: NULL is none");
    check(dp_parse_features(" , ", &mask, &bad, &bad_len) == DP_OK && mask == 0, "features: separators only");
    check(dp_parse_features("avx512, avx2 neon,neon_fp16", &mask, &bad, &bad_len) == DP_OK &&
              mask == (DP_CPU_AVX2 | DP_CPU_AVX512 | DP_CPU_NEON | DP_CPU_NEON_FP16),
          "features: every ISA's name, any separators");
    const char *list = "avx2,avx5121,neon";
    check(dp_parse_features(list, &mask, &bad, &bad_len) == DP_ERR_ARG && bad == list + 5 && bad_len == 7,
          "features: an unknown name is refused and pointed at");
    check(dp_parse_features("generic", &mask, &bad, &bad_len) == DP_ERR_ARG && bad_len == 7,
          "features: generic is no feature");
    check(dp_parse_features("avx", &mask, &bad, &bad_len) == DP_ERR_ARG, "features: a prefix is no name");
}

/* GGML -> MatMulNBits: every type on exactly sized heap buffers (ASan sees any byte read
 * or written outside them), values below 2^bits, a row's spare zero-point nibble zero,
 * and every size, type and shape checked before anything is written. */
static void ggml_repack_cases(void) {
    for (int t = 0; t < dp_num_ggml_layouts; t++) {
        const dp_ggml_layout *L = &dp_ggml_layouts[t];
        const int64_t rows = 3, cols = L->block == 32 ? 96 : 512, nb = cols / L->sub;
        const int64_t src_bytes = rows * cols / L->block * L->type_size, blob_bytes = rows * cols * L->bits / 8;
        const int64_t zp_row = (nb * L->bits + 7) / 8;
        uint8_t *src = malloc((size_t)src_bytes), *blob = malloc((size_t)blob_bytes);
        uint8_t *zp = malloc((size_t)(rows * zp_row));
        float *scales = malloc((size_t)(rows * nb) * sizeof(float)), *mins = malloc((size_t)(rows * nb) * sizeof(float));
        uint64_t state = 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1);
        for (int64_t i = 0; i < src_bytes; i++) src[i] = (uint8_t)((state = state * 6364136223846793005ull + 1) >> 56);
        for (int64_t b = 0; b < src_bytes / L->type_size; b++) /* finite fp16 fields: clear the top exponent bit */
            for (int64_t i = 1; i < L->type_size; i += 2) src[b * L->type_size + i] &= 0xbf;
        char what[120];
        snprintf(what, sizeof what, "repack %s: converts exactly sized buffers", L->name);
        check(dp_repack_ggml(src, src_bytes, t, rows, cols, blob, blob_bytes, scales, rows * nb, zp, rows * zp_row,
                             mins, rows * nb) == DP_OK, what);
        int ok = 1;
        if (L->zero_points && L->bits == 4 && nb % 2)
            for (int64_t r = 0; r < rows; r++) ok &= (zp[r * zp_row + zp_row - 1] >> 4) == 0;
        snprintf(what, sizeof what, "repack %s: a row's spare zero-point nibble is zero", L->name);
        check(ok, what);
        const int64_t n = rows * nb;
        int bounds = 1;
        bounds &= dp_repack_ggml(src, src_bytes - 1, t, rows, cols, blob, blob_bytes, scales, n, zp, rows * zp_row,
                                 mins, n) == DP_ERR_BOUNDS;
        bounds &= dp_repack_ggml(src, src_bytes, t, rows, cols, blob, blob_bytes - 1, scales, n, zp, rows * zp_row,
                                 mins, n) == DP_ERR_BOUNDS;
        bounds &= dp_repack_ggml(src, src_bytes, t, rows, cols, blob, blob_bytes, scales, n - 1, zp, rows * zp_row,
                                 mins, n) == DP_ERR_BOUNDS;
        if (L->zero_points) {
            bounds &= dp_repack_ggml(src, src_bytes, t, rows, cols, blob, blob_bytes, scales, n, zp,
                                     rows * zp_row - 1, mins, n) == DP_ERR_BOUNDS;
            bounds &= dp_repack_ggml(src, src_bytes, t, rows, cols, blob, blob_bytes, scales, n, zp, rows * zp_row,
                                     mins, n - 1) == DP_ERR_BOUNDS;
            bounds &= dp_repack_ggml(src, src_bytes, t, rows, cols, blob, blob_bytes, scales, n, NULL, 0, mins,
                                     n) == DP_ERR_ARG;
        }
        bounds &= dp_repack_ggml(src, src_bytes, t, rows, cols + 16, blob, blob_bytes, scales, n, zp, rows * zp_row,
                                 mins, n) == DP_ERR_ARG;
        bounds &= dp_repack_ggml(src, src_bytes, t, INT64_MAX / 2, cols, blob, blob_bytes, scales, n, zp,
                                 rows * zp_row, mins, n) == DP_ERR_ARG;
        snprintf(what, sizeof what, "repack %s: short buffers, a partial block and overflow are refused", L->name);
        check(bounds, what);
        free(src); free(blob); free(zp); free(scales); free(mins);
    }
    uint8_t in[34] = {0x00, 0x3c}, out[32]; /* Q8_0, d = 1: int8 q -> q + 128 */
    float s = 0.0f;
    in[2] = 0x80; in[3] = 0x7f; in[4] = 0xff;
    check(dp_repack_ggml(in, 34, 0, 1, 32, out, 32, &s, 1, NULL, 0, NULL, 0) == DP_OK && s == 1.0f && out[0] == 0 &&
              out[1] == 255 && out[2] == 127 && out[3] == 128, "repack Q8_0: q + 128, scale d");
    check(dp_repack_ggml(in, 34, dp_num_ggml_layouts, 1, 32, out, 32, &s, 1, NULL, 0, NULL, 0) == DP_ERR_ARG &&
              dp_repack_ggml(in, 34, -1, 1, 32, out, 32, &s, 1, NULL, 0, NULL, 0) == DP_ERR_ARG,
          "repack: an unknown type is refused");
}

/* The classifier's product (qmatmul.h) against a double-precision reference over the
 * same quantized activations (int8) or the f32 ones: every ISA, blocks of 16 and 32, K
 * with and without a rest past whole 64s (and past the AVX-512 VNNI kernel's stack of
 * activation sums), on the pool and on the caller. */
static void qmatmul_case(const dp_attn_ops *ops, dp_pool *pool, int64_t bs, int64_t N, int64_t K, int64_t R,
                         int int8_act, const char *isa) {
    const int64_t nb = K / bs;
    uint8_t *w = malloc((size_t)(N * K));
    float *sc = malloc((size_t)(N * nb) * sizeof(float)), *x = malloc((size_t)(R * K) * sizeof(float));
    float *got = malloc((size_t)(R * N) * sizeof(float)), *ref = malloc((size_t)(R * N) * sizeof(float));
    int8_t *xq = malloc((size_t)(R * K));
    float *xd = malloc((size_t)(R * nb) * sizeof(float));
    for (int64_t i = 0; i < N * K; i++) w[i] = (uint8_t)(128.0f + 127.9f * frand() + (i % 7 == 0 ? 0.5f : 0.0f));
    w[0] = 0, w[N * K - 1] = 255; /* q = -128 and 127: the sign trick's extremes */
    for (int64_t i = 0; i < N * nb; i++) sc[i] = 0.01f + 0.01f * frand();
    for (int64_t i = 0; i < R * K; i++) x[i] = frand() * 3.0f;
    dp_quantize_act(x, R, K, bs, xq, xd);
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t v = 0; v < K; v++) {
                const double a = int8_act ? (double)xq[r * K + v] * xd[r * nb + v / bs] : (double)x[r * K + v];
                acc += sc[n * nb + v / bs] * ((double)w[n * K + v] - 128.0) * a;
            }
            ref[r * N + n] = (float)acc;
        }
    const int st = dp_qmatmul(pool, ops, w, N * K, sc, N * nb, bs, N, K, x, R, got, R * N, N, int8_act);
    char what[160];
    snprintf(what, sizeof what, "qmatmul %s bs %lld N %lld K %lld R %lld %s %s", isa, (long long)bs, (long long)N,
             (long long)K, (long long)R, int8_act ? "int8" : "f32", pool ? "pool" : "caller");
    check(st == DP_OK && worst_rel_err(ref, got, R * N) < 2e-5, what);
    free(w), free(sc), free(x), free(got), free(ref), free(xq), free(xd);
}

static void qmatmul_arg_cases(const dp_attn_ops *ops) {
    uint8_t w[4 * 64] = {0};
    float sc[16] = {0}, x[2 * 64] = {0}, out[8] = {0};
    check(dp_qmatmul(NULL, ops, w, 256, sc, 8, 8, 4, 64, x, 1, out, 8, 4, 1) == DP_ERR_ARG, "qmatmul: bs 8 refused");
    check(dp_qmatmul(NULL, ops, w, 256, sc, 8, 16, 4, 48, x, 1, out, 8, 4, 1) == DP_ERR_ARG,
          "qmatmul: K not whole 32s refused");
    check(dp_qmatmul(NULL, ops, w, 255, sc, 8, 32, 4, 64, x, 1, out, 8, 4, 1) == DP_ERR_BOUNDS,
          "qmatmul: short w refused");
    check(dp_qmatmul(NULL, ops, w, 256, sc, 7, 32, 4, 64, x, 1, out, 8, 4, 1) == DP_ERR_BOUNDS,
          "qmatmul: short scales refused");
    check(dp_qmatmul(NULL, ops, w, 256, sc, 8, 32, 4, 64, x, 2, out, 7, 4, 1) == DP_ERR_BOUNDS,
          "qmatmul: short out refused");
    check(dp_qmatmul(NULL, ops, w, 256, sc, 8, 32, 4, 64, x, 1, out, 8, 3, 1) == DP_ERR_ARG,
          "qmatmul: ldo below N refused");
    dp_test_fail_alloc_after(0);
    check(dp_qmatmul(NULL, ops, w, 256, sc, 8, 32, 4, 64, x, 1, out, 8, 4, 1) == DP_ERR_NOMEM,
          "qmatmul: a failed allocation is reported");
    dp_test_fail_alloc_after(-1);
}

static void qmatmul_cases(dp_pool *pool) {
    for (int i = 0; i < dp_num_isas; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(dp_isas[i].name);
        if (!ops) continue;
        check(ops->qrows != NULL, "every ISA has classifier rows");
        const int64_t Ks[] = {32, 96, 640, 2048};
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < 4; k++)
                for (int a = 0; a < 2; a++) {
                    qmatmul_case(ops, (k + a) % 2 ? pool : NULL, b ? 32 : 16, 133, Ks[k], 1 + 2 * a, !a || k % 2,
                                 dp_isas[i].name);
                }
        qmatmul_case(ops, pool, 16, 1, 64, 1, 1, dp_isas[i].name);
        qmatmul_case(ops, pool, 32, 70, 8192, 2, 1, dp_isas[i].name);  /* K / 4 fills the VNNI sums' stack */
        qmatmul_case(ops, NULL, 32, 9, 8224, 1, 1, dp_isas[i].name);   /* past it */
        qmatmul_arg_cases(ops);
    }
}

/* A layer's product (lmatmul.h): random GGML blocks converted to the form, multiplied by
 * every ISA, against a double-precision reference over the same quantized activations
 * whose weights come from dp_repack_ggml (checked against gguf-py in tests/models/): every
 * kind, 1 to 9 activation rows (the AVX-512 passes of 4 and their rest), 1 and 3 groups,
 * one and several superblocks, on the pool and on the caller, several jobs at once. */
static int ggml_type_index(const char *name) {
    for (int t = 0; t < dp_num_ggml_layouts; t++)
        if (!strcmp(dp_ggml_layouts[t].name, name)) return t;
    return -1;
}

static uint8_t *random_ggml(int kind, int64_t N, int64_t K, uint64_t seed, int64_t *bytes) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    *bytes = N * K / k->sb * k->ggml_bytes;
    uint8_t *src = malloc((size_t)*bytes);
    for (int64_t i = 0; i < *bytes; i++) src[i] = (uint8_t)((seed = seed * 6364136223846793005ull + 1) >> 56);
    for (int64_t b = 0; b < *bytes / k->ggml_bytes; b++) /* finite, modest fp16 fields */
        for (int64_t i = 1; i < k->ggml_bytes; i += 2) src[b * k->ggml_bytes + i] &= 0x3b;
    return src;
}

/* w (N, K) f32: the values dp_repack_ggml decodes (scale x (u - zero point) - min). */
static float *dequantized_ggml(int kind, const uint8_t *src, int64_t src_bytes, int64_t N, int64_t K) {
    const int t = ggml_type_index(dp_lkinds[kind].name);
    const dp_ggml_layout *L = &dp_ggml_layouts[t];
    const int64_t nb = K / L->sub, zp_row = (nb * L->bits + 7) / 8;
    uint8_t *blob = malloc((size_t)(N * K * L->bits / 8)), *zp = malloc((size_t)(N * zp_row));
    float *sc = malloc((size_t)(N * nb) * sizeof(float)), *mins = malloc((size_t)(N * nb) * sizeof(float));
    float *w = malloc((size_t)(N * K) * sizeof(float));
    dp_repack_ggml(src, src_bytes, t, N, K, blob, N * K * L->bits / 8, sc, N * nb, zp, N * zp_row, mins, N * nb);
    for (int64_t n = 0; n < N; n++)
        for (int64_t v = 0; v < K; v++) {
            const int64_t i = n * K + v, b = n * nb + v / L->sub, zi = v / L->sub;
            const int u = L->bits == 8 ? blob[i] : (blob[i / 2] >> (4 * (i % 2))) & 0x0f;
            const int z = !L->zero_points ? 1 << (L->bits - 1)
                          : L->bits == 8 ? zp[n * zp_row + zi] : (zp[n * zp_row + zi / 2] >> (4 * (zi % 2))) & 0x0f;
            w[i] = (float)((double)sc[b] * (u - z) - (L->zero_points ? mins[b] : 0.0f));
        }
    free(blob), free(zp), free(sc), free(mins);
    return w;
}

static void lmatmul_case(const dp_attn_ops *ops, dp_pool *pool, int kind, int64_t N, int64_t K, int64_t R,
                         int int8_act, const char *isa) {
    int64_t src_bytes;
    uint8_t *src = random_ggml(kind, N, K, 0x9e3779b97f4a7c15ull * (uint64_t)(kind + 1) + (uint64_t)(N * K), &src_bytes);
    const int64_t fb = dp_lform_bytes(kind, N, K);
    uint8_t *form = malloc((size_t)fb);
    float *w = dequantized_ggml(kind, src, src_bytes, N, K);
    float *x = malloc((size_t)(R * K) * sizeof(float)), *xd = malloc((size_t)(R * K / 32) * sizeof(float));
    float *xm = malloc((size_t)(R * K / 32) * sizeof(float));
    int8_t *xq = malloc((size_t)(R * K));
    int32_t *xs = malloc((size_t)(R * K / 16) * sizeof(int32_t));
    const int64_t ldo = N + 5; /* the output's rows are strided: columns past N stay untouched */
    float *got = malloc((size_t)(R * ldo) * sizeof(float));
    for (int64_t i = 0; i < R * K; i++) x[i] = frand() * 3.0f;
    for (int64_t i = 0; i < R * ldo; i++) got[i] = -7.0f;
    int ok = dp_lform_from_ggml(kind, src, src_bytes, N, K, form, fb) == DP_OK;
    const dp_ljob job = {kind, form, fb, N, got, R * ldo, ldo};
    const int sb256 = dp_lmatmul_sb256(ops, &job, 1, R, K); /* the activations the product takes */
    (sb256 ? dp_lact_quantize256 : dp_lact_quantize)(x, R, K, xq, xd, xs, xm);
    ok &= dp_lmatmul(pool, ops, &job, 1, x, R, K, int8_act) == DP_OK;
    double worst = 0; /* |error| relative to the sum of the terms' magnitudes */
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, mag = 0;
            for (int64_t v = 0; v < K; v++) {
                const double a = int8_act ? (double)xq[r * K + v] * xd[r * K / 32 + v / 32] : (double)x[r * K + v];
                const double t = (double)w[n * K + v] * a;
                acc += t, mag += fabs(t);
            }
            const double e = fabs((double)got[r * ldo + n] - acc) / (mag > 1e-30 ? mag : 1.0);
            if (e > worst) worst = e;
        }
    for (int64_t r = 0; r < R; r++) ok &= got[r * ldo + N] == -7.0f;
    char what[160];
    snprintf(what, sizeof what, "lmatmul %s %s N %lld K %lld R %lld %s%s %s (worst %.1e)", isa, dp_lkinds[kind].name,
             (long long)N, (long long)K, (long long)R, int8_act ? "int8" : "f32", int8_act && sb256 ? " per 256" : "",
             pool ? "pool" : "caller", worst);
    check(ok && worst < 2e-6, what);
    free(src), free(form), free(w), free(x), free(xd), free(xm), free(xq), free(xs), free(got);
}

/* Two jobs of different kinds into adjacent columns of one output, and the argument checks. */
/* Two jobs of kinds k0 and k1 at once equal each alone (where the kinds take the same
 * activations: a Q4_K job alone may take one scale per 256, dp_lmatmul_sb256). */
static int two_jobs_case(const dp_attn_ops *ops, dp_pool *pool, int k0, int k1) {
    const int64_t K = 256, R = 3, N0 = 32, N1 = 16, ldo = N0 + N1;
    int64_t b0, b1;
    uint8_t *s0 = random_ggml(k0, N0, K, 11, &b0), *s1 = random_ggml(k1, N1, K, 12, &b1);
    const int64_t f0 = dp_lform_bytes(k0, N0, K), f1 = dp_lform_bytes(k1, N1, K);
    uint8_t *w0 = malloc((size_t)f0), *w1 = malloc((size_t)f1);
    dp_lform_from_ggml(k0, s0, b0, N0, K, w0, f0);
    dp_lform_from_ggml(k1, s1, b1, N1, K, w1, f1);
    float x[3 * 256], both[3 * 48], one[3 * 48];
    for (int i = 0; i < R * K; i++) x[i] = frand();
    dp_ljob jobs[2] = {{k0, w0, f0, N0, both, R * ldo, ldo}, {k1, w1, f1, N1, both + N0, R * ldo - N0, ldo}};
    int ok = dp_lmatmul(pool, ops, jobs, 2, x, R, K, 1) == DP_OK;
    dp_ljob a = {k0, w0, f0, N0, one, R * ldo, ldo}, b = {k1, w1, f1, N1, one + N0, R * ldo - N0, ldo};
    ok &= dp_lmatmul(pool, ops, &a, 1, x, R, K, 1) == DP_OK && dp_lmatmul(pool, ops, &b, 1, x, R, K, 1) == DP_OK;
    ok &= !memcmp(both, one, sizeof both);
    free(s0), free(s1), free(w0), free(w1);
    return ok;
}

static void lmatmul_job_cases(const dp_attn_ops *ops, dp_pool *pool, const char *isa) {
    const int64_t K = 256, R = 3, N0 = 32, N1 = 16, ldo = N0 + N1;
    int64_t b0, b1;
    uint8_t *s0 = random_ggml(DP_L_Q4_K, N0, K, 11, &b0), *s1 = random_ggml(DP_L_Q8_0, N1, K, 12, &b1);
    const int64_t f0 = dp_lform_bytes(DP_L_Q4_K, N0, K), f1 = dp_lform_bytes(DP_L_Q8_0, N1, K);
    uint8_t *w0 = malloc((size_t)f0), *w1 = malloc((size_t)f1);
    dp_lform_from_ggml(DP_L_Q4_K, s0, b0, N0, K, w0, f0);
    dp_lform_from_ggml(DP_L_Q8_0, s1, b1, N1, K, w1, f1);
    float x[3 * 256], one[3 * 48];
    for (int i = 0; i < R * K; i++) x[i] = frand();
    int ok = two_jobs_case(ops, pool, DP_L_Q6_K, DP_L_Q8_0) && two_jobs_case(ops, pool, DP_L_Q4_K, DP_L_Q4_K);
    const dp_ljob a = {DP_L_Q4_K, w0, f0, N0, one, R * ldo, ldo};
    const dp_ljob q4 = a, mixed[2] = {a, {DP_L_Q8_0, w1, f1, N1, one + N0, R * ldo - N0, ldo}};
    ok &= dp_lmatmul_sb256(ops, mixed, 2, R, K) == 0 && dp_lmatmul_sb256(ops, &q4, 1, 1, K) == 0; /* decode: 32s */
    ok &= dp_lmatmul_sb256(ops, &q4, 1, R, K) == (ops->lquant256 != NULL);
    char what[120];
    snprintf(what, sizeof what, "lmatmul %s: two jobs at once equal each alone; per 256 for prefills of Q4_K only", isa);
    check(ok, what);
    dp_ljob bad = a;
    int refused = 1;
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, 48, 1) == DP_ERR_ARG;       /* K not whole superblocks */
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, 40, 1) == DP_ERR_ARG;       /* K not whole 32s */
    refused &= dp_lmatmul(pool, ops, &bad, 0, x, R, K, 1) == DP_ERR_ARG;
    bad.w_len = f0 - 1;
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, K, 1) == DP_ERR_BOUNDS;
    bad = a, bad.out_len = (R - 1) * ldo + N0 - 1;
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, K, 1) == DP_ERR_BOUNDS;
    bad = a, bad.N = 24;                                                      /* not whole groups */
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, K, 1) == DP_ERR_ARG;
    bad = a, bad.ldo = N0 - 1;
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, K, 1) == DP_ERR_ARG;
    bad = a, bad.kind = DP_L_NUM_KINDS;
    refused &= dp_lmatmul(pool, ops, &bad, 1, x, R, K, 1) == DP_ERR_ARG;
    refused &= dp_lform_from_ggml(DP_L_Q4_K, s0, b0 - 1, N0, K, w0, f0) == DP_ERR_BOUNDS;
    refused &= dp_lform_from_ggml(DP_L_Q4_K, s0, b0, N0, K, w0, f0 - 1) == DP_ERR_BOUNDS;
    refused &= dp_lform_bytes(DP_L_Q6_K, 16, 32) == 0 && dp_lform_bytes(-1, 16, 256) == 0;
    dp_test_fail_alloc_after(0);
    refused &= dp_lmatmul(pool, ops, &a, 1, x, R, K, 1) == DP_ERR_NOMEM;
    dp_test_fail_alloc_after(-1);
    snprintf(what, sizeof what, "lmatmul %s: bad kinds, sizes, short buffers and a failed allocation are refused", isa);
    check(refused, what);
    free(s0), free(s1), free(w0), free(w1);
}

/* A tied table's rows read back from the form (ISA-free): the file's values; bad ids refused. */
static void lform_rows_cases(void) {
    const int64_t K = 256, N = 32;
    int64_t nb;
    uint8_t *src = random_ggml(DP_L_Q4_K, N, K, 11, &nb);
    const int64_t fb = dp_lform_bytes(DP_L_Q4_K, N, K);
    uint8_t *form = malloc((size_t)fb);
    dp_lform_from_ggml(DP_L_Q4_K, src, nb, N, K, form, fb);
    float rows[2 * 256], *w = dequantized_ggml(DP_L_Q4_K, src, nb, N, K);
    const int64_t ids[2] = {31, 0}, bad[2] = {0, 32}, neg[1] = {-1};
    int same = dp_lform_rows(DP_L_Q4_K, form, fb, N, K, ids, 2, rows, 2 * K) == DP_OK;
    for (int64_t v = 0; v < K; v++)
        same &= fabsf(rows[v] - w[31 * K + v]) <= 1e-6f * fabsf(w[31 * K + v]) + 1e-30f &&
                fabsf(rows[K + v] - w[v]) <= 1e-6f * fabsf(w[v]) + 1e-30f;
    check(same, "lform_rows: a table's rows read from the form are its values");
    int refused = dp_lform_rows(DP_L_Q4_K, form, fb, N, K, bad, 2, rows, 2 * K) == DP_ERR_BOUNDS;
    refused &= dp_lform_rows(DP_L_Q4_K, form, fb, N, K, neg, 1, rows, 2 * K) == DP_ERR_BOUNDS;
    refused &= dp_lform_rows(DP_L_Q4_K, form, fb, N, K, ids, 2, rows, 2 * K - 1) == DP_ERR_BOUNDS;
    refused &= dp_lform_rows(DP_L_Q4_K, form, fb - 1, N, K, ids, 2, rows, 2 * K) == DP_ERR_BOUNDS;
    check(refused, "lform_rows: an id outside the table, a short output or form are refused");
    free(src), free(form), free(w);
}

/* Block b of 32 values that probe the quantizer (kind b % 12): random at random scales,
 * exact ties (d a power of two: v * inv = k + 0.5 exactly), zeros, negative zeros, the
 * largest floats, blocks so tiny that d is subnormal or 1 / d overflows, subnormals, and
 * (awkward = 2) infinities and NaN. */
static void awkward_block(float *v, int64_t b, int awkward) {
    const int kind = (int)(b % (awkward > 1 ? 12 : 10));
    const int e = (int)((frand() + 1.0f) * 100.0f) - 100; /* a power of two in [2^-100, 2^100) */
    for (int i = 0; i < 32; i++) {
        const float r = frand();
        switch (kind) {
        case 0: v[i] = ldexpf(r, e); break;
        case 1: v[i] = ldexpf(r, (int)((frand() + 1.0f) * 130.0f) - 140); break; /* 2^-140 .. 2^120 */
        case 2: v[i] = ldexpf(i ? rintf(r * 126.0f) + (r > 0 ? 0.5f : -0.5f) : 127.0f, e); break;
        case 3: v[i] = ldexpf(i ? 2.0f * rintf(r * 126.0f) + 1.0f : -254.0f, e); break; /* d = 2: odd / 2 */
        case 4: v[i] = i % 3 ? 0.0f : -0.0f; break;
        case 5: v[i] = r > 0 ? 3.4028235e38f : r * 3.4028235e38f; break;
        case 6: v[i] = r * 1e-37f; break;  /* 1 / d overflows */
        case 7: v[i] = r * 1e-36f; break;  /* d subnormal, 1 / d finite */
        case 8: v[i] = r * 1e-41f; break;  /* subnormal values */
        case 9: v[i] = i == 5 ? -1.4e-45f : i % 2 ? 0.0f : -0.0f; break;
        case 10: v[i] = i == 7 ? (r > 0 ? INFINITY : -INFINITY) : r; break;
        default: v[i] = i == 30 ? NAN : i == 3 ? INFINITY : r * 5.0f; break;
        }
    }
}

/* Whether quantizer `mine` gives `ref`'s bytes on R x K activations of awkward blocks (every
 * block; per256: one in four, beside plain ones, so that a 256 with an odd block falls back to
 * the reference whole and one without stays on the vector path, and one d a 256). */
static int lquant_same(dp_lquant_fn mine, dp_lquant_fn ref, int64_t R, int64_t K, int rep, int per256) {
    const int64_t nb = R * K / 32;
    float *x = malloc((size_t)(R * K) * sizeof(float)), *fd[2], *fm[2];
    int8_t *q[2];
    int32_t *xs[2];
    for (int64_t b = 0; b < nb; b++) awkward_block(x + 32 * b, per256 && (b + rep) % 4 ? 0 : b + rep, 2);
    for (int k = 0; k < 2; k++) {
        fd[k] = malloc((size_t)nb * sizeof(float)), fm[k] = malloc((size_t)nb * sizeof(float));
        q[k] = malloc((size_t)(R * K)), xs[k] = malloc((size_t)(2 * nb) * sizeof(int32_t));
        (k ? mine : ref)(x, R, K, q[k], fd[k], xs[k], fm[k]);
    }
    int same = !memcmp(q[0], q[1], (size_t)(R * K)) && !memcmp(fd[0], fd[1], (size_t)nb * sizeof(float)) &&
               !memcmp(xs[0], xs[1], (size_t)(2 * nb) * sizeof(int32_t)) &&
               !memcmp(fm[0], fm[1], (size_t)nb * sizeof(float));
    for (int64_t b = 0; per256 && b < nb; b++) same &= fd[0][b] == fd[0][b / 8 * 8];
    for (int k = 0; k < 2; k++) free(fd[k]), free(fm[k]), free(q[k]), free(xs[k]);
    free(x);
    return same;
}

/* Every ISA's quantizer (dp_attn_ops.lquant) gives dp_lact_quantize's bytes, block by block;
 * one with a per-256 quantizer (lquant256), dp_lact_quantize256's. */
static void lquant_cases(void) {
    const int64_t shapes[][2] = {{1, 32}, {3, 96}, {40, 384}, {5, 2048}, {2, 4096}};
    for (int i = 0; i < dp_num_isas; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(dp_isas[i].name);
        if (!ops) continue;
        check(ops->lquant != NULL, "every ISA has an activations' quantizer");
        int same = 1;
        for (int s = 0; s < 5; s++)
            for (int rep = 0; rep < 4; rep++)
                same &= lquant_same(ops->lquant, dp_lact_quantize, shapes[s][0], shapes[s][1], rep, 0);
        char what[160];
        snprintf(what, sizeof what, "lquant %s: the reference's bytes on ties, zeros, -0, huge, tiny, subnormals, "
                 "inf, NaN", dp_isas[i].name);
        check(same, what);
        if (!ops->lquant256) continue;
        same = 1;
        for (int s = 3; s < 5; s++) /* (whole 256s) */
            for (int rep = 0; rep < 8; rep++)
                same &= lquant_same(ops->lquant256, dp_lact_quantize256, shapes[s][0], shapes[s][1], rep, 1);
        snprintf(what, sizeof what, "lquant256 %s: the reference's bytes, one scale per 256", dp_isas[i].name);
        check(same, what);
    }
}

/* A prefill's product with its quantization (and pairs) on the pool in tasks of rows (an
 * odd R: a last task of one row), and its groups in blocks of rows (the last one R % block
 * rows longer, 1 for the first R below), equals the ISA's rows over all R rows at once with
 * the scalar quantizer's activations, byte for byte. */
static void lquant_pool_case(const dp_attn_ops *ops, dp_pool *pool, int kind, int64_t N, int64_t K, int64_t R,
                             const char *isa) {
    int64_t src_bytes;
    uint8_t *src = random_ggml(kind, N, K, 77 + (uint64_t)R, &src_bytes);
    const int64_t fb = dp_lform_bytes(kind, N, K), nb = R * K / 32;
    uint8_t *form = malloc((size_t)fb), *pairs = malloc((size_t)(R / 2 * (K / 32)) * DP_LPAIR_BYTES + 1);
    dp_lform_from_ggml(kind, src, src_bytes, N, K, form, fb);
    float *x = malloc((size_t)(R * K) * sizeof(float)), *xd = malloc((size_t)nb * sizeof(float));
    float *xm = malloc((size_t)nb * sizeof(float));
    int8_t *xq = malloc((size_t)(R * K));
    int32_t *xs = malloc((size_t)(2 * nb) * sizeof(int32_t));
    float *got = malloc((size_t)(R * N) * sizeof(float)), *want = malloc((size_t)(R * N) * sizeof(float));
    for (int64_t b = 0; b < nb; b++) awkward_block(x + 32 * b, b, 1);
    const dp_ljob job = {kind, form, fb, N, got, R * N, N};
    const int sb256 = dp_lmatmul_sb256(ops, &job, 1, R, K);
    (sb256 ? dp_lact_quantize256 : dp_lact_quantize)(x, R, K, xq, xd, xs, xm);
    dp_lact act = {.xq = xq, .xd = xd, .xs = xs, .R = R, .K = K, .xm = xm, .sb256 = sb256};
    if (ops->lact_pairs) {
        dp_lact_pairs(&act, pairs);
        act.pairs = pairs;
    }
    ops->lrows(kind, form, 0, N / 16, &act, want, N);
    int ok = dp_lmatmul(pool, ops, &job, 1, x, R, K, 1) == DP_OK;
    ok &= !memcmp(got, want, (size_t)(R * N) * sizeof(float));
    char what[160];
    snprintf(what, sizeof what, "lmatmul %s %s K %lld R %lld: quantized on the pool, in blocks of rows = one pass",
             isa, dp_lkinds[kind].name, (long long)K, (long long)R);
    check(ok, what);
    free(src), free(form), free(pairs), free(x), free(xd), free(xm), free(xq), free(xs), free(got), free(want);
}

static void lmatmul_cases(dp_pool *pool) {
    for (int i = 0; i < dp_num_isas; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(dp_isas[i].name);
        if (!ops) continue;
        check(ops->lrows != NULL, "every ISA has layer products");
        for (int kind = 0; kind < DP_L_NUM_KINDS; kind++) {
            const int64_t sb = dp_lkinds[kind].sb;
            const int64_t Rs[] = {1, 2, 3, 4, 5, 9, 7, 8, 13};
            for (int r = 0; r < 9; r++)
                lmatmul_case(ops, r % 2 ? pool : NULL, kind, r % 3 ? 48 : 16, sb * (r % 2 ? 3 : 1), Rs[r], 1,
                             dp_isas[i].name);
            lmatmul_case(ops, pool, kind, 256, sb == 32 ? 640 : 2048, 2, 1, dp_isas[i].name); /* the pool's tasks */
            /* decode: tasks of 4 groups or more, read as side-by-side streams, and the rest */
            lmatmul_case(ops, pool, kind, 1024, sb * 2, 1, 1, dp_isas[i].name);
            lmatmul_case(ops, NULL, kind, 304, sb, 1, 1, dp_isas[i].name);
            lmatmul_case(ops, pool, kind, 48, sb * 2, 3, 0, dp_isas[i].name);                  /* f32 activations */
        }
        lmatmul_job_cases(ops, pool, dp_isas[i].name);
        lquant_pool_case(ops, pool, DP_L_Q4_K, 64, 2048, 41, dp_isas[i].name);  /* one block of rows */
        lquant_pool_case(ops, pool, DP_L_Q4_K, 64, 2048, 97, dp_isas[i].name);  /* 48 + 49 rows */
        lquant_pool_case(ops, pool, DP_L_Q8_0, 48, 384, 605, dp_isas[i].name);  /* 256 + 349 */
        lquant_pool_case(ops, NULL, DP_L_Q5_0, 32, 384, 517, dp_isas[i].name);
        lquant_pool_case(ops, pool, DP_L_Q6_K, 16, 4096, 70, dp_isas[i].name);  /* 32 + 38 */
    }
}

/* An encoder's attention (enc_attn.h) against a double-precision reference: texts of
 * every length class (empty, one token, under and over a block of 16, across the scores
 * tiles, many query passes), packed with a row stride wider than the heads (q, k, v as
 * views of a wider tensor), head_dims of the ISAs' paths and of the generic fallback. */
static void enc_attn_case(const dp_attn_ops *ops, dp_pool *pool, const int64_t *lens, int64_t B, int64_t nh,
                          int64_t hd, const char *isa) {
    int64_t starts[16], rows = 0;
    starts[0] = 0;
    for (int64_t b = 0; b < B; b++) starts[b + 1] = rows += lens[b];
    const int64_t ld = nh * hd + 8, ldo = nh * hd + 4;
    float *q = malloc(sizeof(float) * rows * ld), *k = malloc(sizeof(float) * rows * ld);
    float *v = malloc(sizeof(float) * rows * ld), *out = malloc(sizeof(float) * rows * ldo);
    float *ref = malloc(sizeof(float) * rows * ldo), *got = malloc(sizeof(float) * rows * nh * hd);
    float *want = malloc(sizeof(float) * rows * nh * hd);
    double *sc = malloc(sizeof(double) * rows);
    for (int64_t i = 0; i < rows * ld; i++) q[i] = 2.0f * frand(), k[i] = 2.0f * frand(), v[i] = frand();
    for (int64_t i = 0; i < rows * ldo; i++) out[i] = ref[i] = 7.0f; /* the gaps between heads stay 7 */
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = starts[b]; i < starts[b + 1]; i++) {
                double mx = -1e300, sum = 0;
                for (int64_t j = starts[b]; j < starts[b + 1]; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < hd; e++) d += (double)q[i * ld + h * hd + e] * k[j * ld + h * hd + e];
                    sc[j] = d * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int64_t j = starts[b]; j < starts[b + 1]; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int64_t e = 0; e < hd; e++) {
                    double a = 0;
                    for (int64_t j = starts[b]; j < starts[b + 1]; j++) a += sc[j] * v[j * ld + h * hd + e];
                    ref[i * ldo + h * hd + e] = (float)(a / sum);
                }
            }
    const int st = dp_enc_attention(pool, ops, q, k, v, ld, rows, starts, B, nh, hd, scale, out, ldo);
    int gaps = 1;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t c = 0; c < nh * hd; c++) got[i * nh * hd + c] = out[i * ldo + c], want[i * nh * hd + c] = ref[i * ldo + c];
        for (int64_t c = nh * hd; c < ldo; c++) gaps &= out[i * ldo + c] == 7.0f;
    }
    const double err = worst_rel_err(want, got, rows * nh * hd);
    char what[200];
    snprintf(what, sizeof what, "%s enc attention B=%ld nh=%ld hd=%ld rows=%ld %s: status %d, rel err %.2e", isa,
             (long)B, (long)nh, (long)hd, (long)rows, pool ? "pool" : "caller", st, err);
    check(st == DP_OK && err < 2e-6 && gaps, what);
    free(q), free(k), free(v), free(out), free(ref), free(got), free(want), free(sc);
}

static void enc_attn_cases(dp_pool *pool) {
    const int64_t mixed[] = {5, 0, 1, 16, 17, 33, 47, 130}, one[] = {300}, shorts[] = {3, 9, 12, 15, 7, 2};
    const int64_t hds[] = {16, 32, 48, 64, 8, 50, 24, 72};
    for (int i = 0; i < dp_num_isas; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(dp_isas[i].name);
        if (!ops) continue;
        check(ops->enc_rows != NULL, dp_isas[i].name);
        for (int a = 0; a < 8; a++) {
            enc_attn_case(ops, a % 2 ? pool : NULL, mixed, 8, 3, hds[a], dp_isas[i].name);
            enc_attn_case(ops, a % 2 ? NULL : pool, one, 1, 2, hds[a], dp_isas[i].name); /* split into query pieces */
            enc_attn_case(ops, pool, shorts, 6, 12, hds[a], dp_isas[i].name);
        }
    }
    /* Bad arguments are refused before anything is written; a failed allocation says so. */
    const dp_attn_ops *ops = dp_ops_by_name("generic");
    float x[64 * 4] = {0}, o[64 * 4];
    for (int i = 0; i < 64 * 4; i++) o[i] = 3.0f;
    const int64_t good[] = {0, 2, 4}, gap[] = {0, 3, 4}, down[] = {0, 3, 2}, late[] = {1, 2, 4};
    check(dp_enc_attention(pool, ops, x, x, x, 64, 4, good, 2, 2, 32, 1.0f, o, 64) == DP_OK, "enc attention ok");
    for (int i = 0; i < 64 * 4; i++) o[i] = 3.0f;
    check(dp_enc_attention(pool, ops, x, x, x, 64, 4, gap, 2, 2, 32, 1.0f, o, 64) == DP_OK, "enc attention uneven");
    for (int i = 0; i < 64 * 4; i++) o[i] = 3.0f;
    int st[8];
    st[0] = dp_enc_attention(pool, ops, x, x, x, 64, 4, down, 2, 2, 32, 1.0f, o, 64);
    st[1] = dp_enc_attention(pool, ops, x, x, x, 64, 4, late, 2, 2, 32, 1.0f, o, 64);
    st[2] = dp_enc_attention(pool, ops, x, x, x, 64, 5, good, 2, 2, 32, 1.0f, o, 64);  /* starts[B] != rows */
    st[3] = dp_enc_attention(pool, ops, x, x, x, 63, 4, good, 2, 2, 32, 1.0f, o, 64);  /* ld < nh * hd */
    st[4] = dp_enc_attention(pool, ops, x, x, x, 64, 4, good, 2, 2, 32, 1.0f, o, 32);  /* ldo < nh * hd */
    st[5] = dp_enc_attention(pool, ops, x, x, x, 2048, 4, good, 2, 2, DP_MAX_HEAD_DIM + 1, 1.0f, o, 2048);
    st[6] = dp_enc_attention(pool, NULL, x, x, x, 64, 4, good, 2, 2, 32, 1.0f, o, 64);
    dp_test_fail_alloc_after(0);
    st[7] = dp_enc_attention(pool, ops, x, x, x, 64, 4, good, 2, 2, 32, 1.0f, o, 64);
    dp_test_fail_alloc_after(-1);
    int untouched = 1;
    for (int i = 0; i < 64 * 4; i++) untouched &= o[i] == 3.0f;
    check(st[0] == DP_ERR_BOUNDS && st[1] == DP_ERR_BOUNDS && st[2] == DP_ERR_BOUNDS && st[3] == DP_ERR_ARG &&
              st[4] == DP_ERR_ARG && st[5] == DP_ERR_ARG && st[6] == DP_ERR_ARG && st[7] == DP_ERR_NOMEM && untouched,
          "enc attention refuses bad starts, strides, head_dim, ops; NOMEM writes nothing");
}

int main(void) {
    verbose = getenv("DP_TEST_VERBOSE") != NULL;
    unsigned disabled = 0;
    const char *bad = NULL;
    size_t bad_len = 0;
    if (dp_parse_features(getenv("DUALPATH_DISABLE_CPU_FEATURES"), &disabled, &bad, &bad_len) != DP_OK) {
        printf("DUALPATH_DISABLE_CPU_FEATURES: unknown feature %.*s\n", (int)bad_len, bad);
        return 2;
    }
    const dp_attn_ops *best = dp_select_ops(disabled);
    printf("cpu features 0x%x, dispatch picks %s\n", dp_cpu_features(), dp_ops_name(best));
    dp_pool *pool = NULL;
    check(dp_pool_create(2, &pool) == DP_OK && pool, "pool of 2 threads");
    parse_features_cases();
    for (int i = 0; i < dp_num_isas; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(dp_isas[i].name);
        if (!ops) { printf("skip %s (not on this CPU/build)\n", dp_isas[i].name); continue; }
        for (int d = 0; d < DP_KV_NUM_DTYPES; d++) {
            const dp_kv_kernels *kk = &ops->kv[d];
            char what[120];
            snprintf(what, sizeof what, "%s has scores and accum for %s, run ops in pairs", dp_isas[i].name,
                     dp_kv_types[d].name);
            check(kk->scores && kk->accum && !kk->scores_run == !kk->accum_run, what);
        }
        const int64_t hds[] = {8, 48, 64, 80, 120, 128}, groups[] = {1, 2, 8}, ctxs[] = {1, 17, 300, 2048};
        for (int d = 0; d < DP_KV_NUM_DTYPES; d++)
            for (int a = 0; a < 6; a++)
                for (int b = 0; b < 3; b++)
                    for (int c = 0; c < 4; c++)
                        for (int sc = 0; sc < 2; sc++) {
                            const int64_t T = ctxs[c] >= 3 && (a + b + c) % 2 ? 3 : 1;
                            run_case(ops, (a + c) % 2 ? pool : NULL, d, hds[a], groups[b], ctxs[c], T, sc);
                        }
        /* f32 -> f16 conversion equals the portable reference, bit for bit. */
        float src[1000];
        uint16_t got[1000];
        int same = 1;
        for (int j = 0; j < 1000; j++) src[j] = frand() * 70000.0f;
        ops->f32_to_f16(src, got, 1000);
        for (int j = 0; j < 1000; j++) same &= got[j] == dp_float_to_half(src[j]);
        check(same, dp_isas[i].name);
        if (ops->kv[DP_KV_F16].scores_run) {
            const int64_t hds[] = {8, 48, 64, 120, 128}, groups[] = {1, 3, 8, 16, 20};
            for (int a = 0; a < 5; a++)
                for (int b = 0; b < 5; b++) run_ops_case(ops, groups[b], hds[a]);
        }
        if (ops->kv[DP_KV_Q8].scores_run) {
            const int64_t hds[] = {8, 48, 64, 80, 128}, groups[] = {1, 3, 8, 16, 20};
            for (int a = 0; a < 5; a++)
                for (int b = 0; b < 5; b++) run_ops_case_q8(ops, groups[b], hds[a]);
        }
        check(!ops->kv[DP_KV_F32].scores_run, "f32 run ops: none yet, so none untested");
        /* The FMA peak probe counts its flops exactly: linear in rounds, per thread. */
        float sink = 0.0f;
        const int64_t one = ops->fma_probe(1000, &sink);
        check(one > 0 && one % 1000 == 0 && ops->fma_probe(0, &sink) == 0, "fma_probe counts flops");
        int64_t flops = -1;
        check(dp_run_fma_probe(pool, ops->fma_probe, 1000, &flops) == DP_OK && flops == 2 * one, "fma_probe on the pool");
        check(dp_run_fma_probe(NULL, ops->fma_probe, 1000, &flops) == DP_OK && flops == one, "fma_probe on the caller");
        /* The largest head_dim: the generic accumulation's row buffer is sized by it. */
        for (int d = 0; d < DP_KV_NUM_DTYPES; d++) run_case(ops, NULL, d, DP_MAX_HEAD_DIM, 1, 17, 1, 0);
        run_case(ops, pool, DP_KV_Q8, 50, 3, 300, 3, 1); /* head_dim not a multiple of 8: every scalar rest */
    }
    check_head_dim_limit();
    q8_storage_cases();
    tile_io_cases();
    for (int i = 0; i < dp_num_isas; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(dp_isas[i].name);
        if (!ops) continue;
        alloc_failure_case(ops, pool, 2048, 1); /* decode on the pool: chunked, merged */
        alloc_failure_case(ops, NULL, 300, 37); /* prefill on the caller: query blocks */
    }
    step_alloc_failure_case(pool);
    pool_failure_cases();
    pool_protocol_cases();
    pool_yielder_cases();
    pool_active_cases();
    pool_warm_cases();
    bad_slot_cases(best);
    ggml_repack_cases();
    qmatmul_cases(pool);
    lquant_cases();
    lmatmul_cases(pool);
    lform_rows_cases();
    enc_attn_cases(pool);
    dp_pool_destroy(pool);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
