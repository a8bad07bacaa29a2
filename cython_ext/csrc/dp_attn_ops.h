/* The per-ISA building blocks of attention, and run-time dispatch between them.
 *
 * The span walker (kv_attn.c) owns the loop structure; an ISA supplies only the
 * inner loops over a run of contiguous K or V rows of one KV head, for a group of
 * query heads that share it (GQA: a row is loaded once for the whole group).
 *
 *   q:      (group, head_dim) f32, the query heads reading this KV head
 *   kt:     K transposed: element (token r, dim e) at kt[e * ldk + r], r < n
 *   rows:   V: (n, head_dim) of f32 or f16 (uint16 bits), contiguous
 *   ks, vs: q8 only: (n,) f32, the per-token scales of those K / V rows
 *   scores: (group, sstride) f32; scores[g * sstride + r] for r < n
 *   o:      (group, head_dim) f32 accumulators
 */
#ifndef DP_ATTN_OPS_H
#define DP_ATTN_OPS_H

#include "dp_common.h"

/* One piece of a run: n consecutive positions of one KV head inside one tile.
 * K: ptr = K^T of row 0 of the piece, ld = the tile's P; V: ptr = row 0, ld unused;
 * scales: q8 only, the (n,) f32 scales of those rows (NULL otherwise). */
typedef struct {
    const void *ptr;
    int64_t ld, n;
    const float *scales;
} dp_seg;

typedef struct {
    const char *name;
    /* scores[g, r] = scale * sum_e q[g, e] * kt[e * ldk + r] */
    void (*scores_f32)(const float *q, int64_t group, int64_t head_dim, const float *kt, int64_t ldk,
                       int64_t n, float scale, float *scores, int64_t sstride);
    void (*scores_f16)(const float *q, int64_t group, int64_t head_dim, const uint16_t *kt, int64_t ldk,
                       int64_t n, float scale, float *scores, int64_t sstride);
    /* o[g] += sum_r p[g, r] * row r */
    void (*accum_f32)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const float *rows,
                      int64_t n, float *o);
    void (*accum_f16)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const uint16_t *rows,
                      int64_t n, float *o);
    /* q8 (kv_arena.h): scores[g, r] = scale * ks[r] * sum_e q[g, e] * kt[e * ldk + r], the
     * token's scale applied once to its dot product; o[g] += sum_r (p[g, r] * vs[r]) * row r,
     * the scale folded into the weight once per (query head, token). int8 widens to f32
     * exactly, so both equal the f32 ops on the dequantized values up to f32 rounding. */
    void (*scores_q8)(const float *q, int64_t group, int64_t head_dim, const int8_t *kt, int64_t ldk,
                      const float *ks, int64_t n, float scale, float *scores, int64_t sstride);
    void (*accum_q8)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const int8_t *rows,
                     const float *vs, int64_t n, float *o);
    /* dst[i] = half(src[i]), round to nearest even */
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    /* x[i] = exp(x[i] - max); returns the sum of the new x[i] (x[i] - max <= 0) */
    float (*exp_sum)(float *x, int64_t n, float max);
    /* max(x[0..n)), n >= 1 */
    float (*max_of)(const float *x, int64_t n);
    /* Arithmetic peak probe (dualpath bench kernels): `iters` rounds of independent f32
     * FMA chains at this ISA's widest vectors, enough chains to hide the FMA latency.
     * Returns the flops done (2 per lane per FMA); *sink receives their result. */
    int64_t (*fma_probe)(int64_t iters, float *sink);
    /* Optional (NULL: the span walker calls the ops above once per piece): the same
     * over a whole run of f16 pieces, back to back: scores[g, off_j + r] for piece j
     * at offset off_j = n_0 + ... + n_(j-1); accumulators stay in registers across
     * the pieces instead of going through o at every tile. */
    void (*scores_f16_run)(const float *q, int64_t group, int64_t head_dim, const dp_seg *segs, int64_t ns,
                           float scale, float *scores, int64_t sstride);
    void (*accum_f16_run)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const dp_seg *segs,
                          int64_t ns, float *o);
    /* The same for q8 pieces (each dp_seg carries its scales); optional, in pairs. */
    void (*scores_q8_run)(const float *q, int64_t group, int64_t head_dim, const dp_seg *segs, int64_t ns,
                          float scale, float *scores, int64_t sstride);
    void (*accum_q8_run)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const dp_seg *segs,
                         int64_t ns, float *o);
} dp_attn_ops;

/* The fma_probe of an ISA file, from its vector type and operations: CHAINS
 * independent chains x = x * m + c of LANES-wide vectors, summed into *sink at the
 * end so none is dead code. */
#define DP_DEFINE_FMA_PROBE(VT, CHAINS, LANES, SET, FMA, ADD, REDUCE)                   \
    static int64_t fma_probe(int64_t iters, float *sink) {                               \
        VT x[CHAINS];                                                                    \
        for (int j = 0; j < CHAINS; j++) x[j] = SET(0.001f * (float)j);                  \
        const VT m = SET(0.999999f), c = SET(1e-7f);                                     \
        for (int64_t i = 0; i < iters; i++)                                              \
            for (int j = 0; j < CHAINS; j++) x[j] = FMA(x[j], m, c);                     \
        VT s = x[0];                                                                     \
        for (int j = 1; j < CHAINS; j++) s = ADD(s, x[j]);                               \
        *sink = REDUCE(s);                                                               \
        return iters * CHAINS * LANES * 2;                                               \
    }

/* The entries every ops table fills the same way: an ISA file names its building
 * blocks scores_f32, scores_f16, scores_q8, accum_f32, accum_f16, accum_q8,
 * f32_to_f16, exp_sum, max_of and fma_probe. Use inside a designated initializer:
 *   const dp_attn_ops dp_ops_x = { DP_ATTN_OPS_FIELDS("x"), DP_NO_RUN_OPS }; */
#define DP_ATTN_OPS_FIELDS(NAME)                                                        \
    .name = NAME, .scores_f32 = scores_f32, .scores_f16 = scores_f16,                    \
    .accum_f32 = accum_f32, .accum_f16 = accum_f16, .scores_q8 = scores_q8,              \
    .accum_q8 = accum_q8, .f32_to_f16 = f32_to_f16,                                      \
    .exp_sum = exp_sum, .max_of = max_of, .fma_probe = fma_probe
/* No run ops: the span walker calls the per-piece ops once per piece. */
#define DP_NO_RUN_OPS .scores_f16_run = NULL, .accum_f16_run = NULL, .scores_q8_run = NULL, .accum_q8_run = NULL

/* The rest of a scores block past its last full vector of rows (r0 < n), in scalar
 * f32 (TAIL widens one K element; ks: the q8 token scales, NULL otherwise), and the
 * entry points that cover a group of query heads with blocks of 8, 4, 2 and 1 heads
 * of NAME##_blk(q, G, hd, kt, ldk, ks, n, scale, scores, sstride): NAME with the
 * f32/f16 signature (ks = NULL, folded away in the always-inline blocks), or with the
 * q8 one (DP_DEFINE_SCORES_GROUPS_Q8). For ISA files whose blocks vectorize over rows. */
#define DP_SCORES_SCALAR_TAIL(TAIL)                                                      \
    for (; r0 < n; r0++)                                                                 \
        for (int g = 0; g < G; g++) {                                                    \
            float s = 0.0f;                                                              \
            for (int64_t e = 0; e < hd; e++) s += q[g * hd + e] * TAIL(kt[e * ldk + r0]); \
            scores[g * sstride + r0] = s * (ks ? scale * ks[r0] : scale);                \
        }
#define DP_SCORES_GROUPS_BODY(NAME)                                                      \
    int64_t g = 0;                                                                       \
    for (; g + 8 <= group; g += 8)                                                       \
        NAME##_blk(q + g * hd, 8, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); \
    if (group - g >= 4) {                                                                \
        NAME##_blk(q + g * hd, 4, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); \
        g += 4;                                                                          \
    }                                                                                    \
    if (group - g >= 2) {                                                                \
        NAME##_blk(q + g * hd, 2, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); \
        g += 2;                                                                          \
    }                                                                                    \
    if (group - g >= 1) NAME##_blk(q + g * hd, 1, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride);
#define DP_DEFINE_SCORES_GROUPS(NAME, T)                                                 \
    static void NAME(const float *q, int64_t group, int64_t hd, const T *kt, int64_t ldk, int64_t n, \
                     float scale, float *scores, int64_t sstride) {                     \
        const float *ks = NULL;                                                          \
        DP_SCORES_GROUPS_BODY(NAME)                                                      \
    }
#define DP_DEFINE_SCORES_GROUPS_Q8(NAME)                                                 \
    static void NAME(const float *q, int64_t group, int64_t hd, const int8_t *kt, int64_t ldk, \
                     const float *ks, int64_t n, float scale, float *scores, int64_t sstride) { \
        DP_SCORES_GROUPS_BODY(NAME)                                                      \
    }

/* The generic ops read a table that dp_ops_generic_prepare fills (once, thread-
 * safe); dp_select_ops and dp_ops_by_name call it, so ops reached through them are
 * ready. Code that names dp_ops_generic directly calls it first (f32_to_f16 alone
 * needs no table). */
extern const dp_attn_ops dp_ops_generic;
void dp_ops_generic_prepare(void);
#if defined(__x86_64__) || defined(_M_X64)
extern const dp_attn_ops dp_ops_avx2;
extern const dp_attn_ops dp_ops_avx512;
#endif
#if defined(__aarch64__)
extern const dp_attn_ops dp_ops_neon;
extern const dp_attn_ops dp_ops_neon_fp16;
#endif

/* CPU features the kernels care about, checked against the OS (xgetbv / hwcaps). */
enum {
    DP_CPU_AVX2 = 1 << 0,     /* AVX2 + FMA + F16C, YMM state enabled by the OS */
    DP_CPU_AVX512 = 1 << 1,   /* AVX-512 F/BW/VL, ZMM and opmask state enabled */
    DP_CPU_NEON = 1 << 2,     /* AArch64 Advanced SIMD (baseline) */
    DP_CPU_NEON_FP16 = 1 << 3 /* FP16 arithmetic (asimdhp) */
};

unsigned dp_cpu_features(void);
/* Parse "avx512,avx2" style lists (DUALPATH_DISABLE_CPU_FEATURES) into a feature mask. */
unsigned dp_parse_features(const char *list);
/* The best ops the CPU supports with `disabled` features removed (generic at worst). */
const dp_attn_ops *dp_select_ops(unsigned disabled);
/* The ops named `name` if this CPU and build have them, else NULL. */
const dp_attn_ops *dp_ops_by_name(const char *name);

#endif
