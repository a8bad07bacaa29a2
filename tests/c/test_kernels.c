/* C parity test for DualPath's kernels: every ISA this CPU runs, against a double-
 * precision reference, through the same span walker the extension uses.
 * Built and run by .ci/run natively, under -fsanitize=address,undefined, and
 * cross-compiled for aarch64 under qemu (with and without FP16 arithmetic).
 * Prints one line per check and a final "N passed, N failed" line; exit 1 on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../cython_ext/csrc/dp_attn_ops.h"
#include "../../cython_ext/csrc/dp_pool.h"
#include "../../cython_ext/csrc/kv_arena.h"

static int passed = 0, failed = 0;
static uint64_t rng_state = 88172645463325252ull;

static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1u << 23) - 1.0f;
}

static void check(int ok, const char *what) {
    if (ok) passed++;
    else { failed++; printf("FAIL %s\n", what); }
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

static void run_case(const dp_attn_ops *ops, dp_pool *pool, int kv_dtype, int64_t hd, int64_t group,
                     int64_t n_ctx, int64_t T, int scattered) {
    const int64_t nkv = 2, H = nkv * group, P = 16;
    dp_arena a;
    const int64_t block = 1 << 17;
    const int64_t pages_needed = (n_ctx + P - 1) / P;
    const int64_t page_bytes = 2 * nkv * P * hd * (kv_dtype == DP_F32 ? 4 : 2);
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
                           1.0f / sqrtf((float)hd), 4);
    check(st == DP_OK, "attention status");
    reference(q, kd, vd, T, H, nkv, n_ctx, hd, pos0, want);
    const double tol = kv_dtype == DP_F32 ? 1e-5 : 2e-3;
    double worst = 0;
    for (int64_t i = 0; i < T * H * hd; i++) {
        const double err = fabs(out[i] - want[i]) / (tol * (1 + fabs(want[i])));
        if (err > worst) worst = err;
    }
    char what[200];
    snprintf(what, sizeof what, "%s %s hd=%lld group=%lld ctx=%lld T=%lld %s pool=%d worst=%.3g", ops->name,
             kv_dtype == DP_F32 ? "f32" : "f16", (long long)hd, (long long)group, (long long)n_ctx, (long long)T,
             scattered ? "paged" : "contiguous", pool ? dp_pool_num_threads(pool) : 1, worst);
    check(worst <= 1.0, what);
    /* Out-of-bounds requests are refused, never read. */
    check(dp_attn_spans(&a, ops, pool, 0, q, H * hd, out, H * hd, H, spans, pages_needed, pos0 + 1, T,
                        1.0f, 0) == DP_ERR_BOUNDS, "bounds: positions past the spans");
    check(dp_attn_spans(&a, ops, pool, 1, q, H * hd, out, H * hd, H, spans, pages_needed, pos0, T,
                        1.0f, 0) == DP_ERR_BOUNDS, "bounds: layer");
    free(slots); free(spans); free(k); free(v); free(kd); free(vd); free(q); free(out); free(want);
    dp_arena_free(&a);
}

/* An ISA's run ops equal its per-piece ops over the same pieces: scores bit for bit
 * (each 16-token vector is one dot product either way), accumulation to rounding
 * (partial sums are reduced once per run instead of once per piece). Pieces of
 * uneven length, tile pitch and offset, as gather_run hands them over. */
static void run_ops_case(const dp_attn_ops *ops, int64_t group, int64_t hd) {
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
        ks[j] = (dp_seg){kt[j] + row, lds[j], lens[j]};
        vs[j] = (dp_seg){vr[j], hd, lens[j]};
    }
    float *q = (float *)malloc((size_t)(group * hd) * sizeof(float));
    float *s1 = (float *)calloc((size_t)(group * sstride), sizeof(float));
    float *s2 = (float *)calloc((size_t)(group * sstride), sizeof(float));
    float *o1 = (float *)malloc((size_t)(group * hd) * sizeof(float));
    float *o2 = (float *)malloc((size_t)(group * hd) * sizeof(float));
    for (int64_t i = 0; i < group * hd; i++) { q[i] = frand(); o1[i] = o2[i] = frand(); }
    int64_t off = 0;
    for (int j = 0; j < NS; off += lens[j], j++)
        ops->scores_f16(q, group, hd, (const uint16_t *)ks[j].ptr, lds[j], lens[j], 0.3f, s1 + off, sstride);
    ops->scores_f16_run(q, group, hd, ks, NS, 0.3f, s2, sstride);
    check(memcmp(s1, s2, (size_t)(group * sstride) * sizeof(float)) == 0, "run scores == per-piece scores");
    off = 0;
    for (int j = 0; j < NS; off += lens[j], j++)
        ops->accum_f16(s1 + off, sstride, group, hd, vr[j], lens[j], o1);
    ops->accum_f16_run(s1, sstride, group, hd, vs, NS, o2);
    double worst = 0, scale = 0; /* error against the largest output: sums cancel */
    for (int64_t i = 0; i < group * hd; i++) scale = fabs((double)o1[i]) > scale ? fabs((double)o1[i]) : scale;
    for (int64_t i = 0; i < group * hd; i++) {
        const double err = fabs((double)o1[i] - o2[i]) / scale;
        worst = err > worst ? err : worst;
    }
    char what[120];
    snprintf(what, sizeof what, "%s run accumulation == per-piece group=%lld hd=%lld (worst %.2g)", ops->name,
             (long long)group, (long long)hd, worst);
    check(worst < 1e-5, what);
    for (int j = 0; j < NS; j++) { free(kt[j]); free(vr[j]); }
    free(q); free(s1); free(s2); free(o1); free(o2);
}

int main(void) {
    const char *names[] = {"generic", "avx2", "avx512", "neon", "neon_fp16"};
    const dp_attn_ops *best = dp_select_ops(dp_parse_features(getenv("DUALPATH_DISABLE_CPU_FEATURES")));
    printf("cpu features 0x%x, dispatch picks %s\n", dp_cpu_features(), best->name);
    dp_pool *pool = dp_pool_create(2);
    for (int i = 0; i < 5; i++) {
        const dp_attn_ops *ops = dp_ops_by_name(names[i]);
        if (!ops) { printf("skip %s (not on this CPU/build)\n", names[i]); continue; }
        const int64_t hds[] = {8, 48, 64, 80, 120, 128}, groups[] = {1, 2, 8}, ctxs[] = {1, 17, 300, 2048};
        for (int d = 0; d < 2; d++)
            for (int a = 0; a < 6; a++)
                for (int b = 0; b < 3; b++)
                    for (int c = 0; c < 4; c++)
                        for (int sc = 0; sc < 2; sc++) {
                            const int64_t T = ctxs[c] >= 3 && (a + b + c) % 2 ? 3 : 1;
                            run_case(ops, (a + c) % 2 ? pool : NULL, d ? DP_F16 : DP_F32, hds[a], groups[b],
                                     ctxs[c], T, sc);
                        }
        /* f32 -> f16 conversion equals the portable reference, bit for bit. */
        float src[1000];
        uint16_t got[1000];
        int same = 1;
        for (int j = 0; j < 1000; j++) src[j] = frand() * 70000.0f;
        ops->f32_to_f16(src, got, 1000);
        for (int j = 0; j < 1000; j++) same &= got[j] == dp_float_to_half(src[j]);
        check(same, names[i]);
        if (ops->scores_f16_run || ops->accum_f16_run) {
            check(ops->scores_f16_run && ops->accum_f16_run, "run ops come in pairs");
            const int64_t hds[] = {8, 48, 64, 120, 128}, groups[] = {1, 3, 8, 16, 20};
            for (int a = 0; a < 5; a++)
                for (int b = 0; b < 5; b++) run_ops_case(ops, groups[b], hds[a]);
        }
        /* The FMA peak probe counts its flops exactly: linear in rounds, per thread. */
        float sink = 0.0f;
        const int64_t one = ops->fma_probe(1000, &sink);
        check(one > 0 && one % 1000 == 0 && ops->fma_probe(0, &sink) == 0, "fma_probe counts flops");
        check(dp_run_fma_probe(pool, ops->fma_probe, 1000) == 2 * one, "fma_probe on the pool");
        check(dp_run_fma_probe(NULL, ops->fma_probe, 1000) == one, "fma_probe on the caller");
    }
    dp_pool_destroy(pool);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
