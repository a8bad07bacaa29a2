/* AVX-512 (F/BW/VL) attention building blocks. Compiled with -mavx512f -mavx512bw
 * -mavx512vl; called only when dp_cpu_features() reports AVX512 (CPU and OS).
 * Tails use masked loads, so any head_dim works at full width. */
#include <immintrin.h>
#include <math.h>
#include "../../dp_attn_ops.h"

/* Full vectors use plain loads; only a tail uses a masked load (a masked 16-bit load
 * in the scores loop is markedly slower than a plain one). */
static inline __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 ldm_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 ldm_f16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
/* 16 int8 values widened to f32 (vpmovsxbd + vcvtdq2ps): exact. */
static inline __m512 ld_q8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __m512 ldm_q8(const int8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}
static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* Scores of 16 tokens (one vector of K^T per dimension) for G <= 16 query rows: G
 * accumulators stay in registers, each K vector is widened once for all of them;
 * no horizontal reductions anywhere. Small groups (MHA: G = 1) split the dimensions
 * over U partial sums, so that U * G >= 4 FMA chains hide the FMA latency. The tail
 * (n % 16 tokens) is a separate function: merged into one loop, the compiler turns
 * every load into the masked one. SCALED (q8): ks holds the tokens' scales, which
 * multiply the finished dot products once (16 tokens per multiply). */
#define DEFINE_SCORES(NAME, T, LD, LDM, SCALED)                                                   \
    static inline __attribute__((always_inline)) void NAME##_blk(                                  \
        const float *q, const int G, int64_t hd, const T *kt, int64_t ldk, const float *ks, int64_t n, \
        float scale, float *scores, int64_t sstride) {                                             \
        const int U = G >= 8 ? 1 : G >= 4 ? 2 : 4;                                                 \
        const __m512 sv = _mm512_set1_ps(scale);                                                   \
        for (int64_t r0 = 0; r0 + 16 <= n; r0 += 16) {                                             \
            __m512 acc[16];                                                                        \
            for (int i = 0; i < U * G; i++) acc[i] = _mm512_setzero_ps();                          \
            int64_t e = 0;                                                                         \
            for (; e + U <= hd; e += U)                                                            \
                for (int u = 0; u < U; u++) {                                                      \
                    const __m512 k = LD(kt + (e + u) * ldk + r0);                                  \
                    for (int g = 0; g < G; g++)                                                    \
                        acc[u * G + g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + e + u]), k, acc[u * G + g]); \
                }                                                                                  \
            for (; e < hd; e++) {                                                                  \
                const __m512 k = LD(kt + e * ldk + r0);                                            \
                for (int g = 0; g < G; g++) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + e]), k, acc[g]); \
            }                                                                                      \
            for (int u = 1; u < U; u++)                                                            \
                for (int g = 0; g < G; g++) acc[g] = _mm512_add_ps(acc[g], acc[u * G + g]);        \
            const __m512 tv = SCALED ? _mm512_mul_ps(sv, _mm512_loadu_ps(ks + r0)) : sv;           \
            for (int g = 0; g < G; g++) _mm512_storeu_ps(scores + g * sstride + r0, _mm512_mul_ps(acc[g], tv)); \
        }                                                                                          \
    }                                                                                              \
    static __attribute__((noinline)) void NAME##_tail(const float *q, int64_t group, int64_t hd,   \
                                                      const T *kt, int64_t ldk, const float *ks,   \
                                                      int64_t n, float scale, float *scores,       \
                                                      int64_t sstride) {                           \
        const __mmask16 m = tail_mask(n);                                                          \
        const __m512 sv = _mm512_set1_ps(scale);                                                   \
        const __m512 tv = SCALED ? _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, ks)) : sv;           \
        for (int64_t g = 0; g < group; g++) {                                                      \
            __m512 acc = _mm512_setzero_ps();                                                      \
            for (int64_t e = 0; e < hd; e++)                                                       \
                acc = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + e]), LDM(kt + e * ldk, m), acc);   \
            _mm512_mask_storeu_ps(scores + g * sstride, m, _mm512_mul_ps(acc, tv));                \
        }                                                                                          \
    }                                                                                              \
    static inline __attribute__((always_inline)) void NAME##_one(                                  \
        const float *q, int64_t group, int64_t hd, const T *kt, int64_t ldk, const float *ks, int64_t n, \
        float scale, float *scores, int64_t sstride) {                                             \
        if (n >= 16) {                                                                             \
            int64_t g = 0;                                                                         \
            for (; g + 16 <= group; g += 16) NAME##_blk(q + g * hd, 16, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); \
            if (group - g >= 8) { NAME##_blk(q + g * hd, 8, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); g += 8; } \
            if (group - g >= 4) { NAME##_blk(q + g * hd, 4, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); g += 4; } \
            if (group - g >= 2) { NAME##_blk(q + g * hd, 2, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); g += 2; } \
            if (group - g >= 1) NAME##_blk(q + g * hd, 1, hd, kt, ldk, ks, n, scale, scores + g * sstride, sstride); \
        }                                                                                          \
        const int64_t full = n & ~(int64_t)15;                                                     \
        if (full < n)                                                                              \
            NAME##_tail(q, group, hd, kt + full, ldk, SCALED ? ks + full : NULL, n - full, scale,  \
                        scores + full, sstride);                                                   \
    }                                                                                              \
    static __attribute__((unused)) void NAME##_run(const float *q, int64_t group, int64_t hd,      \
                                                   const dp_seg *segs, int64_t ns, float scale,    \
                                                   float *scores, int64_t sstride) {               \
        for (int64_t j = 0, off = 0; j < ns; off += segs[j].n, j++)                                \
            NAME##_one(q, group, hd, (const T *)segs[j].ptr, segs[j].ld, SCALED ? segs[j].scales : NULL, \
                       segs[j].n, scale, scores + off, sstride);                                   \
    }

DEFINE_SCORES(scores_f32, float, ld_f32, ldm_f32, 0)
DEFINE_SCORES(scores_f16, uint16_t, ld_f16, ldm_f16, 0)
DEFINE_SCORES(scores_q8, int8_t, ld_q8, ldm_q8, 1)

static void scores_f32(const float *q, int64_t group, int64_t hd, const void *kt, int64_t ldk, const float *ks,
                       int64_t n, float scale, float *scores, int64_t sstride) {
    (void)ks;
    scores_f32_one(q, group, hd, (const float *)kt, ldk, NULL, n, scale, scores, sstride);
}
static void scores_f16(const float *q, int64_t group, int64_t hd, const void *kt, int64_t ldk, const float *ks,
                       int64_t n, float scale, float *scores, int64_t sstride) {
    (void)ks;
    scores_f16_one(q, group, hd, (const uint16_t *)kt, ldk, NULL, n, scale, scores, sstride);
}
static void scores_q8(const float *q, int64_t group, int64_t hd, const void *kt, int64_t ldk, const float *ks,
                      int64_t n, float scale, float *scores, int64_t sstride) {
    scores_q8_one(q, group, hd, (const int8_t *)kt, ldk, ks, n, scale, scores, sstride);
}

/* o[g] += sum_r p[g, r] * V[r]. A block of GB query heads x C vectors of 16 dims
 * (GB * C <= 16 accumulators) stays in registers while every row of V streams by;
 * an f16 row is widened in registers, once per block. Head blocks of 16, 8, 4, 2, 1
 * take C = 16 / GB vectors at a time (at most 8), then the rest of head_dim in one
 * block (its last vector masked when head_dim % 16). Where head_dim is a multiple of
 * 64 the heads go in blocks of 4 x 64 dims instead: each broadcast weight feeds 4
 * FMAs and each widened row vector 4 (a GQA group of 8 at head_dim 64 in blocks of
 * 8 x 32 dims: 2 and 8), which made decode attention of that shape faster, and of
 * head_dim 128 too (80, not a multiple, gained nothing, so it keeps blocks of 8). A
 * block of at most 4 accumulators (MHA) also splits the rows over 2 partial sums,
 * so that enough FMA chains hide the FMA latency. */
#define DEFINE_ACCUM(NAME, T, LD, LDM)                                                            \
    static inline __attribute__((always_inline)) void NAME##_blk(                                  \
        const float *p0, int64_t sstride, const int GB, const int C, const dp_seg *segs, int64_t ns, \
        int64_t e0, int64_t hd, float *o, const int masked, __mmask16 last) {                      \
        const int U = GB * C <= 4 ? 2 : 1, A = GB * C;                                             \
        __m512 acc[16];                                                                            \
        for (int g = 0; g < GB; g++)                                                               \
            for (int c = 0; c < C; c++)                                                            \
                acc[g * C + c] = masked && c == C - 1 ? ldm_f32(o + g * hd + 16 * c, last)         \
                                                      : ld_f32(o + g * hd + 16 * c);               \
        for (int i = A; i < U * A; i++) acc[i] = _mm512_setzero_ps();                              \
        for (int64_t j = 0, off = 0; j < ns; off += segs[j].n, j++) {                              \
            const T *rows = (const T *)segs[j].ptr + e0;                                           \
            const float *p = p0 + off;                                                             \
            const int64_t n = segs[j].n;                                                           \
            int64_t r = 0;                                                                         \
            for (; r + U <= n; r += U)                                                             \
                for (int u = 0; u < U; u++) {                                                      \
                    __m512 v[8];                                                                   \
                    for (int c = 0; c < C; c++)                                                    \
                        v[c] = masked && c == C - 1 ? LDM(rows + (r + u) * hd + 16 * c, last)      \
                                                    : LD(rows + (r + u) * hd + 16 * c);            \
                    for (int g = 0; g < GB; g++) {                                                 \
                        const __m512 w = _mm512_set1_ps(p[g * sstride + r + u]);                   \
                        for (int c = 0; c < C; c++)                                                \
                            acc[u * A + g * C + c] = _mm512_fmadd_ps(w, v[c], acc[u * A + g * C + c]); \
                    }                                                                              \
                }                                                                                  \
            for (; r < n; r++) {                                                                   \
                __m512 v[8];                                                                       \
                for (int c = 0; c < C; c++)                                                        \
                    v[c] = masked && c == C - 1 ? LDM(rows + r * hd + 16 * c, last) : LD(rows + r * hd + 16 * c); \
                for (int g = 0; g < GB; g++) {                                                     \
                    const __m512 w = _mm512_set1_ps(p[g * sstride + r]);                           \
                    for (int c = 0; c < C; c++) acc[g * C + c] = _mm512_fmadd_ps(w, v[c], acc[g * C + c]); \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int i = A; i < U * A; i++) acc[i - A] = _mm512_add_ps(acc[i - A], acc[i]);            \
        for (int g = 0; g < GB; g++)                                                               \
            for (int c = 0; c < C; c++) {                                                          \
                if (masked && c == C - 1) _mm512_mask_storeu_ps(o + g * hd + 16 * c, last, acc[g * C + c]); \
                else _mm512_storeu_ps(o + g * hd + 16 * c, acc[g * C + c]);                        \
            }                                                                                      \
    }                                                                                              \
    /* GB heads, every dim: chunks of CM = 16 / GB vectors, then the rest in one block. */         \
    static inline __attribute__((always_inline)) void NAME##_heads(                                \
        const float *p, int64_t sstride, const int GB, const dp_seg *segs, int64_t ns, int64_t hd, \
        float *o) {                                                                                \
        const int CM = GB >= 16 ? 1 : GB == 8 ? 2 : GB == 4 ? 4 : 8;                               \
        int64_t e = 0;                                                                             \
        for (; e + 16 * CM <= hd; e += 16 * CM) NAME##_blk(p, sstride, GB, CM, segs, ns, e, hd, o + e, 0, 0xffff); \
        const int64_t rest = hd - e, nv = (rest + 15) / 16;                                        \
        if (rest == 0) return;                                                                     \
        const int mk = rest % 16 != 0;                                                             \
        const __mmask16 last = tail_mask(rest - 16 * (nv - 1));                                    \
        switch (nv) { /* nv <= CM, so GB * nv <= 16 */                                              \
            case 1: NAME##_blk(p, sstride, GB, 1, segs, ns, e, hd, o + e, mk, last); break;        \
            case 2: NAME##_blk(p, sstride, GB, GB <= 8 ? 2 : 1, segs, ns, e, hd, o + e, mk, last); break; \
            case 3: NAME##_blk(p, sstride, GB, GB <= 4 ? 3 : 1, segs, ns, e, hd, o + e, mk, last); break; \
            case 4: NAME##_blk(p, sstride, GB, GB <= 4 ? 4 : 1, segs, ns, e, hd, o + e, mk, last); break; \
            case 5: NAME##_blk(p, sstride, GB, GB <= 2 ? 5 : 1, segs, ns, e, hd, o + e, mk, last); break; \
            case 6: NAME##_blk(p, sstride, GB, GB <= 2 ? 6 : 1, segs, ns, e, hd, o + e, mk, last); break; \
            case 7: NAME##_blk(p, sstride, GB, GB <= 2 ? 7 : 1, segs, ns, e, hd, o + e, mk, last); break; \
            default: NAME##_blk(p, sstride, GB, GB <= 2 ? 8 : 1, segs, ns, e, hd, o + e, mk, last); break; \
        }                                                                                          \
    }                                                                                              \
    static void NAME##_run(const float *p, int64_t sstride, int64_t group, int64_t hd,            \
                           const dp_seg *segs, int64_t ns, float *o) {                             \
        int64_t g = 0;                                                                             \
        if (hd % 64 == 0) /* blocks of 4 heads x 64 dims: a weight feeds 4 FMAs, a widened row 4 */ \
            for (; g + 4 <= group; g += 4) NAME##_heads(p + g * sstride, sstride, 4, segs, ns, hd, o + g * hd); \
        for (; g + 16 <= group; g += 16) NAME##_heads(p + g * sstride, sstride, 16, segs, ns, hd, o + g * hd); \
        if (group - g >= 8) { NAME##_heads(p + g * sstride, sstride, 8, segs, ns, hd, o + g * hd); g += 8; } \
        if (group - g >= 4) { NAME##_heads(p + g * sstride, sstride, 4, segs, ns, hd, o + g * hd); g += 4; } \
        if (group - g >= 2) { NAME##_heads(p + g * sstride, sstride, 2, segs, ns, hd, o + g * hd); g += 2; } \
        if (group - g >= 1) NAME##_heads(p + g * sstride, sstride, 1, segs, ns, hd, o + g * hd);   \
    }                                                                                              \

DEFINE_ACCUM(accum_f32, float, ld_f32, ldm_f32)
DEFINE_ACCUM(accum_f16, uint16_t, ld_f16, ldm_f16)
DEFINE_ACCUM(accum_i8, int8_t, ld_q8, ldm_q8) /* int8 rows, weights already scaled */

/* q8: each row's scale folds into the weights first, 16 rows per multiply, for up to
 * 16 heads and 128 rows at a time (w, in L1); the int8 rows then accumulate like f16
 * ones, the weights broadcast from memory as for f16 (a scalar multiply per head and
 * row inside the FMA loop costs as much as the FMAs it feeds). */
static void accum_q8_run(const float *p, int64_t sstride, int64_t group, int64_t hd, const dp_seg *segs,
                         int64_t ns, float *o) {
    enum { HEADS = 16, ROWS = 128 };
    float w[HEADS * ROWS]; /* (heads, ROWS): p * vs */
    dp_seg part[ROWS];     /* the int8 rows of one batch */
    for (int64_t g0 = 0; g0 < group; g0 += HEADS) {
        const int64_t gn = group - g0 < HEADS ? group - g0 : HEADS;
        int64_t j = 0, r_in = 0, off = 0; /* next row: segs[j] row r_in, p column off */
        while (j < ns) {
            int64_t nb = 0, np = 0;
            while (j < ns && nb < ROWS) {
                const int64_t take = segs[j].n - r_in < ROWS - nb ? segs[j].n - r_in : ROWS - nb;
                const float *vs = segs[j].scales + r_in;
                part[np++] = (dp_seg){(const int8_t *)segs[j].ptr + r_in * hd, hd, take, NULL};
                for (int64_t g = 0; g < gn; g++) {
                    const float *pg = p + (g0 + g) * sstride + off;
                    float *wg = w + g * ROWS + nb;
                    int64_t r = 0;
                    for (; r + 16 <= take; r += 16)
                        _mm512_storeu_ps(wg + r, _mm512_mul_ps(_mm512_loadu_ps(pg + r), _mm512_loadu_ps(vs + r)));
                    if (r < take) {
                        const __mmask16 m = tail_mask(take - r);
                        _mm512_mask_storeu_ps(wg + r, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pg + r),
                                                                       _mm512_maskz_loadu_ps(m, vs + r)));
                    }
                }
                nb += take, off += take, r_in += take;
                if (r_in == segs[j].n) j++, r_in = 0;
            }
            if (nb) accum_i8_run(w, ROWS, gn, hd, part, np, o + g0 * hd);
        }
    }
}

static void accum_f32(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows,
                      const float *vs, int64_t n, float *o) {
    (void)vs;
    const dp_seg one = {rows, hd, n, NULL};
    accum_f32_run(p, sstride, group, hd, &one, 1, o);
}
static void accum_f16(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows,
                      const float *vs, int64_t n, float *o) {
    (void)vs;
    const dp_seg one = {rows, hd, n, NULL};
    accum_f16_run(p, sstride, group, hd, &one, 1, o);
}
static void accum_q8(const float *p, int64_t sstride, int64_t group, int64_t hd, const void *rows,
                     const float *vs, int64_t n, float *o) {
    const dp_seg one = {rows, hd, n, vs};
    accum_q8_run(p, sstride, group, hd, &one, 1, o);
}

static float max_of(const float *x, int64_t n) {
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
    }
    for (; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i);
        m0 = _mm512_mask_max_ps(m0, k, m0, _mm512_maskz_loadu_ps(k, x + i));
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

static void f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

static inline __m512 round512(__m512 x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline __m512 pow2_512(__m512 k) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
}
DP_DEFINE_EXP(exp512, __m512, _mm512_set1_ps, _mm512_max_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_fmadd_ps,
              _mm512_fnmadd_ps, round512, pow2_512)

DP_DEFINE_EXP_SUM_VECTORS(exp_vectors, __m512, 16, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                          _mm512_sub_ps, _mm512_add_ps, exp512)

static float exp_sum(float *x, int64_t n, float max) {
    int64_t i;
    __m512 acc = exp_vectors(x, n, max, &i);
    if (i < n) {
        const __mmask16 k = tail_mask(n - i);
        const __m512 v = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), _mm512_set1_ps(max)));
        _mm512_mask_storeu_ps(x + i, k, v);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, v));
    }
    return _mm512_reduce_add_ps(acc);
}

/* 12 independent chains: enough to cover the FMA latency on two FMA units. */
DP_DEFINE_FMA_PROBE(__m512, 12, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_reduce_add_ps)

/* An encoder's attention: 8 query rows x 32 tokens of scores, 8 rows x 32 dims of V. */
#define EA_VT __m512
#define EA_VL 16
#define EA_LOAD _mm512_loadu_ps
#define EA_STORE _mm512_storeu_ps
#define EA_SET1 _mm512_set1_ps
#define EA_ZERO _mm512_setzero_ps
#define EA_MUL _mm512_mul_ps
#define EA_FMA _mm512_fmadd_ps
#define EA_ROWS 8
#define EA_KB 2
#define EA_DV 2
#define EA_LOAD_PART(p, w) _mm512_maskz_loadu_ps(tail_mask(w), p)
#define EA_STORE_PART(p, x, w) _mm512_mask_storeu_ps(p, tail_mask(w), x)
#include "../../enc_attn_body.h"

/* f32 runs go piece by piece (no run ops), as before run ops existed for f16 and q8. */
#define AVX512_KV                                                                \
    .kv = {[DP_KV_F16] = {scores_f16, accum_f16, scores_f16_run, accum_f16_run}, \
           [DP_KV_F32] = {scores_f32, accum_f32},                               \
           [DP_KV_Q8] = {scores_q8, accum_q8, scores_q8_run, accum_q8_run}}

const dp_attn_ops dp_ops_avx512 = {AVX512_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_avx512, .lrows = dp_lrows_avx512,
                                   .lquant = dp_lquant_avx512};
/* AVX-512 VNNI: this attention, its products with vpdpbusd. */
const dp_attn_ops dp_ops_avx512_vnni = {AVX512_KV, DP_ATTN_OPS_COMMON, .qrows = dp_qrows_avx512_vnni,
                                        .lrows = dp_lrows_avx512_vnni, .lquant = dp_lquant_avx512};
