/* AVX2 + FMA + F16C attention building blocks. Compiled with -mavx2 -mfma -mf16c;
 * called only when dp_cpu_features() reports AVX2 (CPU and OS). */
#include <immintrin.h>
#include <math.h>
#include "../../dp_attn_ops.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* 8 int8 values widened to f32 (vpmovsxbd + vcvtdq2ps): exact. */
static inline __m256 load_q8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

#define F32_ID(x) (x)
#define Q8_TAIL(x) ((float)(x))

/* Scores of 8 tokens at a time (one vector of K^T per dimension) for G query heads:
 * G accumulators stay in registers, no horizontal reductions; tails are scalar. q8
 * (ks != NULL): the 8 tokens' scales multiply the finished dot products once. */
#define DEFINE_SCORES(NAME, T, LOAD, TAIL)                                                        \
    static inline __attribute__((always_inline)) void NAME##_blk(                                  \
        const float *q, const int G, int64_t hd, const T *kt, int64_t ldk, const float *ks, int64_t n, \
        float scale, float *scores, int64_t sstride) {                                             \
        int64_t r0 = 0;                                                                            \
        for (; r0 + 8 <= n; r0 += 8) {                                                             \
            __m256 acc[8];                                                                         \
            for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();                              \
            for (int64_t e = 0; e < hd; e++) {                                                     \
                const __m256 k = LOAD(kt + e * ldk + r0);                                          \
                for (int g = 0; g < G; g++)                                                        \
                    acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + g * hd + e), k, acc[g]);      \
            }                                                                                      \
            const __m256 sv = ks ? _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_loadu_ps(ks + r0))  \
                                 : _mm256_set1_ps(scale);                                          \
            for (int g = 0; g < G; g++)                                                            \
                _mm256_storeu_ps(scores + g * sstride + r0, _mm256_mul_ps(acc[g], sv));            \
        }                                                                                          \
        DP_SCORES_SCALAR_TAIL(TAIL)                                                                \
    }

DEFINE_SCORES(scores_f32, float, _mm256_loadu_ps, F32_ID)
DEFINE_SCORES(scores_f16, uint16_t, load_f16, dp_half_to_float)
DEFINE_SCORES(scores_q8, int8_t, load_q8, Q8_TAIL)
DP_DEFINE_SCORES_GROUPS(scores_f32, float)
DP_DEFINE_SCORES_GROUPS(scores_f16, uint16_t)
DP_DEFINE_SCORES_GROUPS_SCALED(scores_q8, int8_t)

/* o[g] += sum_r p[g, r] * V[r] from f32 rows. Blocks of GB query heads x C vectors of
 * head_dim stay in registers (GB * C <= 12 accumulators); each V row is loaded once
 * per block. */
static inline __attribute__((always_inline)) void accum_blk(const float *p, int64_t sstride, const int GB,
                                                            const int C, int64_t hd, const float *rows,
                                                            int64_t n, float *o) {
    __m256 acc[16];
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < C; c++) acc[g * C + c] = _mm256_loadu_ps(o + g * hd + 8 * c);
    for (int64_t r = 0; r < n; r++) {
        for (int c = 0; c < C; c++) {
            const __m256 v = _mm256_loadu_ps(rows + r * hd + 8 * c);
            for (int g = 0; g < GB; g++)
                acc[g * C + c] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * sstride + r), v, acc[g * C + c]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < C; c++) _mm256_storeu_ps(o + g * hd + 8 * c, acc[g * C + c]);
}

#define ACCUM_CASE(CC, GBB)                                                                        \
    case CC:                                                                                       \
        for (; g + GBB <= group; g += GBB)                                                         \
            accum_blk(p + g * sstride, sstride, GBB, CC, hd, rows, n, o + g * hd);                 \
        for (; g < group; g++) accum_blk(p + g * sstride, sstride, 1, CC, hd, rows, n, o + g * hd); \
        return;

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                      const float *vs, int64_t n, float *o) {
    const float *rows = (const float *)rows_;
    (void)vs;
    int64_t g = 0;
    if (hd % 8 == 0) { /* GB * C <= 12 (or C alone) independent FMA chains */
        switch (hd / 8) {
            ACCUM_CASE(1, 8) ACCUM_CASE(2, 6) ACCUM_CASE(3, 4) ACCUM_CASE(4, 3) ACCUM_CASE(5, 2)
            ACCUM_CASE(6, 2) ACCUM_CASE(7, 1) ACCUM_CASE(8, 1) ACCUM_CASE(9, 1) ACCUM_CASE(10, 1)
            ACCUM_CASE(11, 1) ACCUM_CASE(12, 1) ACCUM_CASE(13, 1) ACCUM_CASE(14, 1) ACCUM_CASE(15, 1)
            ACCUM_CASE(16, 1)
            default: break;
        }
    }
    int64_t e = 0;
    for (; e + 8 <= hd; e += 8)
        for (g = 0; g < group; g++) {
            __m256 acc = _mm256_loadu_ps(o + g * hd + e);
            for (int64_t r = 0; r < n; r++)
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * sstride + r), _mm256_loadu_ps(rows + r * hd + e), acc);
            _mm256_storeu_ps(o + g * hd + e, acc);
        }
    for (; e < hd; e++)
        for (g = 0; g < group; g++)
            for (int64_t r = 0; r < n; r++) o[g * hd + e] += p[g * sstride + r] * rows[r * hd + e];
}

static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                      const float *vs, int64_t n, float *o) {
    const uint16_t *rows = (const uint16_t *)rows_;
    (void)vs;
    /* Widen each V row once (not once per query head), then accumulate from L1. */
    float buf[16 * DP_MAX_HEAD_DIM]; /* at least 16 rows (hd <= DP_MAX_HEAD_DIM) */
    const int64_t step = (int64_t)(sizeof buf / sizeof buf[0]) / hd;
    for (int64_t r0 = 0; r0 < n; r0 += step) {
        const int64_t m = n - r0 < step ? n - r0 : step;
        const int64_t total = m * hd;
        int64_t i = 0;
        for (; i + 8 <= total; i += 8) _mm256_storeu_ps(buf + i, load_f16(rows + r0 * hd + i));
        for (; i < total; i++) buf[i] = dp_half_to_float(rows[r0 * hd + i]);
        accum_f32(p + r0, sstride, group, hd, buf, NULL, m, o);
    }
}

/* q8: widen a stretch of V rows to f32 once (not once per query head), fold each
 * row's scale into the weights of up to 16 heads (one multiply per head and row),
 * then accumulate from L1 like f32 rows. */
static void accum_q8(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows_,
                     const float *vs, int64_t n, float *o) {
    const int8_t *rows = (const int8_t *)rows_;
    enum { HEADS = 16, MAX_ROWS = 128 };
    float buf[16 * DP_MAX_HEAD_DIM]; /* (step, hd): at least 16 rows (hd <= DP_MAX_HEAD_DIM) */
    float w[HEADS * MAX_ROWS];       /* (heads, step) */
    int64_t step = (int64_t)(sizeof buf / sizeof buf[0]) / hd;
    if (step > MAX_ROWS) step = MAX_ROWS;
    for (int64_t r0 = 0; r0 < n; r0 += step) {
        const int64_t m = n - r0 < step ? n - r0 : step;
        const int64_t total = m * hd;
        int64_t i = 0;
        for (; i + 8 <= total; i += 8) _mm256_storeu_ps(buf + i, load_q8(rows + r0 * hd + i));
        for (; i < total; i++) buf[i] = (float)rows[r0 * hd + i];
        for (int64_t g0 = 0; g0 < group; g0 += HEADS) {
            const int64_t gn = group - g0 < HEADS ? group - g0 : HEADS;
            for (int64_t g = 0; g < gn; g++)
                for (int64_t r = 0; r < m; r++) w[g * m + r] = p[(g0 + g) * sstride + r0 + r] * vs[r0 + r];
            accum_f32(w, m, gn, hd, buf, NULL, m, o + g0 * hd);
        }
    }
}

static float max_of(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float t[8], r = -INFINITY;
    _mm256_storeu_ps(t, m);
    for (int j = 0; j < 8; j++) r = t[j] > r ? t[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = dp_float_to_half(src[i]);
}

static inline __m256 round256(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline __m256 pow2_256(__m256 k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}
DP_DEFINE_EXP(exp256, __m256, _mm256_set1_ps, _mm256_max_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_fmadd_ps,
              _mm256_fnmadd_ps, round256, pow2_256)

DP_DEFINE_EXP_SUM_VECTORS(exp_vectors, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                          _mm256_sub_ps, _mm256_add_ps, exp256)

static float exp_sum(float *x, int64_t n, float max) {
    int64_t i;
    float s = hsum(exp_vectors(x, n, max, &i));
    for (; i < n; i++) {
        float t[8] = {x[i] - max, 0, 0, 0, 0, 0, 0, 0};
        _mm256_storeu_ps(t, exp256(_mm256_loadu_ps(t)));
        x[i] = t[0];
        s += t[0];
    }
    return s;
}

/* 12 independent chains: enough to cover the FMA latency on two FMA units. */
DP_DEFINE_FMA_PROBE(__m256, 12, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, hsum)

/* An encoder's attention: 6 query rows x 16 tokens of scores, 6 rows x 16 dims of V
 * (12 accumulators of the 16 registers). */
#define EA_VT __m256
#define EA_VL 8
#define EA_LOAD _mm256_loadu_ps
#define EA_STORE _mm256_storeu_ps
#define EA_SET1 _mm256_set1_ps
#define EA_ZERO _mm256_setzero_ps
#define EA_MUL _mm256_mul_ps
#define EA_FMA _mm256_fmadd_ps
#define EA_ROWS 6
#define EA_KB 1
#define EA_DV 2
#include "../../enc_attn_body.h"

#define AVX2_KV                                                                          \
    .kv = {[DP_KV_F16] = {scores_f16, accum_f16}, [DP_KV_F32] = {scores_f32, accum_f32}, \
           [DP_KV_Q8] = {scores_q8, accum_q8}}

const dp_attn_ops dp_ops_avx2 = {AVX2_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_avx2, .lrows = dp_lrows_avx2,
                                 .lquant = dp_lquant_avx2, .lquant256 = dp_lquant256_avx2};
/* AVX-VNNI (hybrid laptops: AVX2 and VEX dpbusd, no AVX-512): this attention, its products. */
const dp_attn_ops dp_ops_avx_vnni = {AVX2_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_avx_vnni,
                                     .lrows = dp_lrows_avx_vnni, .lquant = dp_lquant_avx2};
/* (no lquant256 yet: its folded sums are written, lmatmul_avx2.c, but have not run on a CPU
 * with AVX-VNNI; the machines here so far have had none) */
