/* The per-ISA building blocks of attention, and run-time dispatch between them.
 *
 * The span walker (kv_attn.c) owns the loop structure; an ISA supplies only the
 * inner loops over a run of contiguous K or V rows of one KV head, for a group of
 * query heads that share it (GQA: a row is loaded once for the whole group).
 *
 *   q:      (group, head_dim) f32, the query heads reading this KV head
 *   kt:     K transposed: element (token r, dim e) at kt[e * ldk + r], r < n
 *   rows:   V: (n, head_dim) of the KV dtype (f32, f16 as uint16 bits, int8), contiguous
 *   ks, vs: dtypes with scales (q8) only: (n,) f32, the per-token scales of those K / V rows
 *   scores: (group, sstride) f32; scores[g * sstride + r] for r < n
 *   o:      (group, head_dim) f32 accumulators
 */
#ifndef DP_ATTN_OPS_H
#define DP_ATTN_OPS_H

#include "dp_common.h"
#include "dp_pool.h"
#include "lmatmul.h"
#include "qmatmul.h"

/* One piece of a run: n consecutive positions of one KV head inside one tile.
 * K: ptr = K^T of row 0 of the piece, ld = the tile's P; V: ptr = row 0, ld unused;
 * scales: the (n,) f32 scales of those rows for a dtype with scales (NULL otherwise). */
typedef struct {
    const void *ptr;
    int64_t ld, n;
    const float *scales;
} dp_seg;

/* One KV dtype's kernels in one ISA (the entry of dp_attn_ops.kv for that dtype).
 * kt, rows point at values of the dtype (f32, f16 as uint16 bits, int8); ks, vs
 * are the rows' f32 scales for a dtype with scales (dp_kv_types: q8), NULL otherwise. */
typedef struct {
    /* scores[g, r] = scale * sum_e q[g, e] * kt[e * ldk + r], times ks[r] with scales
     * (the token's scale applied once to its dot product) */
    void (*scores)(const float *q, int64_t group, int64_t head_dim, const void *kt, int64_t ldk,
                   const float *ks, int64_t n, float scale, float *scores, int64_t sstride);
    /* o[g] += sum_r p[g, r] * row r; with scales, (p[g, r] * vs[r]) * row r, the scale
     * folded into the weight once per (query head, token). int8 widens to f32 exactly,
     * so q8 equals f32 on the dequantized values up to f32 rounding. */
    void (*accum)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const void *rows,
                  const float *vs, int64_t n, float *o);
    /* Optional, in pairs (NULL: the span walker calls the ops above once per piece): the
     * same over a whole run of pieces, back to back: scores[g, off_j + r] for piece j
     * at offset off_j = n_0 + ... + n_(j-1), each dp_seg carrying its scales;
     * accumulators stay in registers across the pieces instead of going through o at
     * every tile. */
    void (*scores_run)(const float *q, int64_t group, int64_t head_dim, const dp_seg *segs, int64_t ns,
                       float scale, float *scores, int64_t sstride);
    void (*accum_run)(const float *p, int64_t sstride, int64_t group, int64_t head_dim, const dp_seg *segs,
                      int64_t ns, float *o);
} dp_kv_kernels;

/* The most query rows an enc_rows holds at once (its scratch s has this many rows). */
#define DP_ENC_ROWS 8

/* An encoder's attention (enc_attn.h) of m query rows of one head over the n keys of its
 * text, every row seeing every key: out[i] = softmax(scale * q_i . k_r for r < n) . V.
 * q, v, out: rows at strides ldq, ldv, ldo; kt: K^T in blocks of 16 tokens, zero past n
 * (enc_attn.h); s: scratch of DP_ENC_ROWS rows of (n rounded up to 16) + 16 f32. The ISAs'
 * take a head_dim that is a multiple of 8, the generic one any. */
typedef void (*dp_enc_rows_fn)(const float *q, int64_t ldq, int64_t m, int64_t hd, const float *kt, int64_t n,
                               const float *v, int64_t ldv, float scale, float *s, float *out, int64_t ldo);

/* An ISA's building blocks: a traits table indexed by KV dtype (every entry's scores
 * and accum set), and the dtype-free ops. Its name and CPU feature are in dp_isas. */
typedef struct {
    dp_kv_kernels kv[DP_KV_NUM_DTYPES];
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
    /* The classifier's rows over 8-bit MatMulNBits weights (qmatmul.h). */
    dp_qrows_fn qrows;
    /* A layer's products over the form of lmatmul.h. */
    dp_lrows_fn lrows;
    /* Non-zero: lrows takes activation rows in pairs and reads dp_lact.pairs when R >= 2. */
    int lact_pairs;
    /* The activations' int8 quantization for lrows (lmatmul.h): dp_lact_quantize's bytes. */
    dp_lquant_fn lquant;
    /* Non-NULL: lrows folds Q4_K's scales into its integer sums where the activations have
     * one scale per 256 values (dp_lact.sb256), and this quantizer makes them
     * (dp_lact_quantize256's bytes); dp_lmatmul_sb256 says when a product takes them. */
    dp_lquant_fn lquant256;
    /* An encoder's attention, a few query rows at a time (enc_attn.h). */
    dp_enc_rows_fn enc_rows;
} dp_attn_ops;

/* out (R, ldo) = x (R, K) times w transposed: N rows of K values in the 8-bit MatMulNBits
 * form with blocks of bs (16 or 32) values (qmatmul.h), w_len bytes and scales_len
 * scales long. int8_act: activations quantized to int8 per block (ONNX Runtime's accuracy
 * level 4), else f32 as given. On `pool` (NULL: the calling thread alone), split by rows
 * of w. DP_ERR_ARG for a bs other than 16 or 32, a K that is not whole 32s or a size
 * below 1; DP_ERR_BOUNDS when w, scales or out is too small; DP_ERR_NOMEM. */
int dp_qmatmul(dp_pool *pool, const dp_attn_ops *ops, const uint8_t *w, int64_t w_len, const float *scales,
               int64_t scales_len, int64_t bs, int64_t N, int64_t K, const float *x, int64_t R, float *out,
               int64_t out_len, int64_t ldo, int int8_act);

/* A layer's product (lmatmul.h): every job's weight times x (R, K) f32, the activations
 * quantized once for all of them (int8_act, by ops->lquant, on the pool in tasks of rows
 * where the product runs there; else multiplied as f32, in the scalar loop: accuracy
 * levels below 4, an exactness mode); the jobs' groups of rows, times blocks of a prefill's
 * activation rows, are the pool's tasks. At most 8 jobs; every job's form, rows and output
 * are checked (DP_ERR_ARG / DP_ERR_BOUNDS) before anything runs. */
int dp_lmatmul(dp_pool *pool, const dp_attn_ops *ops, const dp_ljob *jobs, int njobs, const float *x, int64_t R,
               int64_t K, int int8_act);

/* Whether dp_lmatmul quantizes the activations of these jobs with one scale per 256 values
 * (ops->lquant256): a prefill's rows (R >= 2) of Q4_K weights only, on an ISA that folds
 * their scales. Decode (one row) keeps a scale per 32: it reads the weights once, and its
 * time is the memory's, not the arithmetic's. */
int dp_lmatmul_sb256(const dp_attn_ops *ops, const dp_ljob *jobs, int njobs, int64_t R, int64_t K);

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

/* exp(x) for x <= 0 (Cephes-style): 2^k * P(r), |rel err| < 2e-7; x < -87 gives 0. An
 * ISA file defines NAME(VT x) from its vector ops: SET broadcasts, MAX, MUL, ADD,
 * FMA(a, b, c) = a * b + c, FNMS(a, b, c) = c - a * b, ROUND to nearest, and
 * POW2(k) = 2^k for a vector of whole k. */
#define DP_DEFINE_EXP(NAME, VT, SET, MAX, MUL, ADD, FMA, FNMS, ROUND, POW2)               \
    static inline VT NAME(VT x) {                                                        \
        x = MAX(x, SET(-87.0f));                                                         \
        const VT k = ROUND(MUL(x, SET(1.44269504088896341f)));                           \
        VT r = FNMS(k, SET(0.693359375f), x);                                            \
        r = FNMS(k, SET(-2.12194440e-4f), r);                                            \
        VT y = SET(1.9875691500e-4f);                                                    \
        y = FMA(y, r, SET(1.3981999507e-3f));                                            \
        y = FMA(y, r, SET(8.3334519073e-3f));                                            \
        y = FMA(y, r, SET(4.1665795894e-2f));                                            \
        y = FMA(y, r, SET(1.6666665459e-1f));                                            \
        y = FMA(y, r, SET(5.0000001201e-1f));                                            \
        y = FMA(y, MUL(r, r), ADD(r, SET(1.0f)));                                        \
        return MUL(y, POW2(k));                                                          \
    }
/* The whole vectors of an exp_sum: x[i] = EXP(x[i] - max) for i below n rounded down
 * to LANES, summed into the vector returned; *end = the first i left to the ISA's tail. */
#define DP_DEFINE_EXP_SUM_VECTORS(NAME, VT, LANES, SET, LOAD, STORE, SUB, ADD, EXP)       \
    static inline VT NAME(float *x, int64_t n, float max, int64_t *end) {                \
        const VT m = SET(max);                                                           \
        VT acc = SET(0.0f);                                                              \
        int64_t i = 0;                                                                   \
        for (; i + LANES <= n; i += LANES) {                                             \
            const VT v = EXP(SUB(LOAD(x + i), m));                                       \
            STORE(x + i, v);                                                             \
            acc = ADD(acc, v);                                                           \
        }                                                                                \
        *end = i;                                                                        \
        return acc;                                                                      \
    }

/* The dtype-free entries, which every ISA file names the same way (f32_to_f16, exp_sum,
 * max_of, fma_probe, enc_rows). Inside a designated initializer:
 *   const dp_attn_ops dp_ops_x = {.kv = {[DP_KV_F16] = {scores_f16, accum_f16}, ...}, DP_ATTN_OPS_COMMON}; */
#define DP_ATTN_OPS_COMMON \
    .f32_to_f16 = f32_to_f16, .exp_sum = exp_sum, .max_of = max_of, .fma_probe = fma_probe, .enc_rows = enc_rows

/* The rest of a scores block past its last full vector of rows (r0 < n), in scalar
 * f32 (TAIL widens one K element; ks: the q8 token scales, NULL otherwise), and the
 * dp_kv_kernels.scores entry points that cover a group of query heads with blocks of
 * 8, 4, 2 and 1 heads of NAME##_blk(q, G, hd, kt, ldk, ks, n, scale, scores, sstride),
 * T the element type: DP_DEFINE_SCORES_GROUPS for a dtype without scales (ks = NULL,
 * folded away in the always-inline blocks), DP_DEFINE_SCORES_GROUPS_SCALED with them.
 * For ISA files whose blocks vectorize over rows. */
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
    static void NAME(const float *q, int64_t group, int64_t hd, const void *kt_, int64_t ldk, \
                     const float *ks_, int64_t n, float scale, float *scores, int64_t sstride) { \
        const T *kt = (const T *)kt_;                                                    \
        const float *ks = NULL;                                                          \
        (void)ks_;                                                                       \
        DP_SCORES_GROUPS_BODY(NAME)                                                      \
    }
#define DP_DEFINE_SCORES_GROUPS_SCALED(NAME, T)                                          \
    static void NAME(const float *q, int64_t group, int64_t hd, const void *kt_, int64_t ldk, \
                     const float *ks, int64_t n, float scale, float *scores, int64_t sstride) { \
        const T *kt = (const T *)kt_;                                                    \
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
extern const dp_attn_ops dp_ops_avx_vnni;
extern const dp_attn_ops dp_ops_avx512;
extern const dp_attn_ops dp_ops_avx512_vnni;
#endif
#if defined(__aarch64__)
extern const dp_attn_ops dp_ops_neon;
extern const dp_attn_ops dp_ops_neon_fp16;
extern const dp_attn_ops dp_ops_neon_dotprod;
extern const dp_attn_ops dp_ops_neon_i8mm;
#endif

/* CPU features the kernels care about, checked against the OS (xgetbv / hwcaps). */
enum {
    DP_CPU_AVX2 = 1 << 0,     /* AVX2 + FMA + F16C, YMM state enabled by the OS */
    DP_CPU_AVX512 = 1 << 1,   /* AVX-512 F/BW/VL, ZMM and opmask state enabled */
    DP_CPU_NEON = 1 << 2,     /* AArch64 Advanced SIMD (baseline) */
    DP_CPU_NEON_FP16 = 1 << 3,    /* FP16 arithmetic (asimdhp) */
    DP_CPU_NEON_DOTPROD = 1 << 4, /* SDOT / UDOT (asimddp, ARMv8.2-A) */
    DP_CPU_NEON_I8MM = 1 << 5,    /* USDOT, SMMLA (i8mm, ARMv8.6-A) */
    DP_CPU_AVX_VNNI = 1 << 6,     /* VEX vpdpbusd (AVX-VNNI: Alder Lake on, Zen 5) */
    DP_CPU_AVX512_VNNI = 1 << 7   /* EVEX vpdpbusd (AVX512_VNNI) */
};

/* An ISA DualPath has kernels for, on any architecture: its name (as configs, the CLI
 * and DUALPATH_DISABLE_CPU_FEATURES spell it), the CPU feature that names it, every
 * feature its kernels need, and its ops (NULL where this build has none). */
typedef struct {
    const char *name;
    unsigned feature; /* 0: generic, which needs none and cannot be disabled */
    unsigned needs;
    const dp_attn_ops *ops;
} dp_isa;
/* Every ISA, the one list (cpu_features.c): generic first, then each architecture's
 * from the least to the most capable. Dispatch picks the last one the CPU runs. */
extern const dp_isa dp_isas[];
extern const int dp_num_isas;

unsigned dp_cpu_features(void);
/* Parse a DUALPATH_DISABLE_CPU_FEATURES list ("avx512,avx2": names of dp_isas with a
 * feature, separated by commas or spaces; NULL is empty) into *mask. DP_ERR_ARG for a
 * name that is none of them: *bad then points at it inside list, *bad_len bytes long. */
int dp_parse_features(const char *list, unsigned *mask, const char **bad, size_t *bad_len);
/* The best ops the CPU supports with `disabled` features removed (generic at worst). */
const dp_attn_ops *dp_select_ops(unsigned disabled);
/* The ops named `name` if this CPU and build have them, else NULL. */
const dp_attn_ops *dp_ops_by_name(const char *name);
/* The name of an ISA's ops (dp_isas), "?" for ops that are none of them. */
const char *dp_ops_name(const dp_attn_ops *ops);

#endif
