/* The AVX2 layer-product loop (lmatmul_avx2.c includes it twice: with AVX-VNNI and
 * without). Before including, define:
 *   LM2_ATTR              the functions' attributes (a target, or nothing)
 *   LM2_SUFFIX(n)         n with the variant's suffix
 *   LM2_SUMS(kind, unit, hf, p)  t0..t3 (int32 lanes, one per weight row) + activation
 *                         row i's sums of products over part p of the unit's steps, x0..x3
 *                         the rows' activations (lmatmul_avx2.c)
 *   LM2_Q8_ZERO           the offset Q8_0's sums still hold (128 for stored q + 128, 0 for
 *                         sums taken on q itself)
 *   LM2_FOLD_W(p), LM2_FOLD(t, w)  a Q4_K unit's row scales (u8 at p) as w, and its sums t
 *                         times them, where a superblock's sums are folded (fold below)
 *   LM2_FOLD_IN_SUMS      1: LM2_SUMS multiplies by w itself (its madd takes w16), and adds
 *                         into t: the superblock's sums are then t, carried from unit to unit
 * A pass takes half hf of a group (8 rows) against RR <= 4 activation rows: each 32-byte
 * load of the unit unpacks two steps for all RR rows at once, so with 4 rows the unpacking
 * and the scales cost a quarter of what they cost a row. One accumulator a row: Q4_K's
 * mins are taken off as they come (xm, lmatmul.h), which leaves the registers for 4 rows.
 * fold (Q4_K over activations with a scale per 256, dp_lact.sb256): each unit's sums are
 * multiplied by the rows' block scales in int32 and added up over the superblock, which is
 * then scaled once, instead of a float multiply-add per unit and row. */

/* LM2_XB: how the sums broadcast an activation's 4 bytes (lmatmul_avx2.c's x4 says why
 * the decode streams take another) */
#define LM2_XB(p) _mm256_set1_epi32(*(p))
static inline __attribute__((always_inline)) LM2_ATTR void LM2_SUFFIX(pass)(const int kind, const uint8_t *gw, const int hf,
                                                       const dp_lact *a, const int64_t r0, const int RR, float *out,
                                                       const int64_t ldo, const int fold) {
    const int64_t K = a->K, units = dp_lkind_sb(kind) / 32, nsb = K / dp_lkind_sb(kind);
    const int64_t sbb = dp_lkind_header(kind) + units * dp_lkind_unit(kind);
    const int parts = kind == DP_L_Q6_K ? 2 : 1; /* Q6_K: a scale per 16 values, so a sum per half unit */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        if (hf == 0 && r0 == 0) dp_lprefetch(h, dp_lkind_header(kind));
        const __m256 d = f16_ps(h + 16 * hf);
        __m256i f0 = _mm256_setzero_si256(), f1 = f0, f2 = f0, f3 = f0; /* fold: the superblock's sums */
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + dp_lkind_header(kind) + b * dp_lkind_unit(kind);
            if (hf == 0 && r0 == 0) dp_lprefetch(unit, dp_lkind_unit(kind));
            const int64_t kb = s * units + b;
            /* rows past RR are never read: they point at row r0's */
            const int32_t *x0 = (const int32_t *)(a->xq + r0 * K + 32 * kb);
            const int32_t *x1 = RR > 1 ? x0 + K / 4 : x0, *x2 = RR > 2 ? x0 + K / 2 : x0;
            const int32_t *x3 = RR > 3 ? x0 + 3 * K / 4 : x0;
#pragma GCC unroll 2
            for (int p = 0; p < parts; p++) {
                /* folded sums that the sums' own madd scales go on in the superblock's */
                const int in_sums = fold && LM2_FOLD_IN_SUMS;
                __m256i t0 = in_sums ? f0 : _mm256_setzero_si256(), t1 = in_sums ? f1 : t0;
                __m256i t2 = in_sums ? f2 : t0, t3 = in_sums ? f3 : t0;
                const __m256i w16 = fold ? LM2_FOLD_W(h + 64 + 16 * b + 8 * hf) : _mm256_set1_epi16(1);
                (void)w16; /* (read by the sums without VNNI only) */
                LM2_SUMS(kind, unit, hf, p);
                if (fold) {
                    const __m256 o = _mm256_mul_ps(f16_ps(h + 32 + 16 * hf), u8_ps(h + 192 + 16 * b + 8 * hf));
#define LM2_FOLD_ROW(i)                                                                                  \
    if ((i) < RR) {                                                                                      \
        f##i = in_sums ? t##i : _mm256_add_epi32(f##i, LM2_FOLD(t##i, w16));                             \
        acc##i = _mm256_fnmadd_ps(o, _mm256_broadcast_ss(a->xm + (r0 + (i)) * (K / 32) + kb), acc##i);   \
    }
                    LM2_EACH(LM2_FOLD_ROW)
#undef LM2_FOLD_ROW
                    continue;
                }
                __m256 sc = d, o = d;
                if (kind == DP_L_Q4_K) {
                    sc = _mm256_mul_ps(d, u8_ps(h + 64 + 16 * b + 8 * hf));
                    o = _mm256_mul_ps(f16_ps(h + 32 + 16 * hf), u8_ps(h + 192 + 16 * b + 8 * hf));
                } else if (kind == DP_L_Q6_K) {
                    sc = _mm256_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + p) + 8 * hf));
                }
                const int z = kind == DP_L_Q8_0 ? LM2_Q8_ZERO : dp_lkind_zero_point(kind);
#define LM2_SCALE_ROW(i)                                                                                 \
    if ((i) < RR) {                                                                                      \
        const int64_t r = r0 + (i);                                                                      \
        const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;                                               \
        if (z) t##i = _mm256_sub_epi32(t##i, _mm256_set1_epi32(z * (parts == 2 ? xs[p] : xs[0] + xs[1]))); \
        const __m256 dx = _mm256_broadcast_ss(a->xd + r * (K / 32) + kb);                                \
        acc##i = _mm256_fmadd_ps(_mm256_mul_ps(sc, dx), _mm256_cvtepi32_ps(t##i), acc##i);              \
        if (kind == DP_L_Q4_K)                                                                           \
            acc##i = _mm256_fnmadd_ps(o, _mm256_broadcast_ss(a->xm + r * (K / 32) + kb), acc##i);        \
    }
                LM2_EACH(LM2_SCALE_ROW)
#undef LM2_SCALE_ROW
            }
        }
        if (fold) { /* every block's xd is the superblock's d (dp_lact_quantize256) */
#define LM2_FOLD_SCALE(i)                                                                                \
    if ((i) < RR)                                                                                        \
        acc##i = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(a->xd + (r0 + (i)) * (K / 32) + s * units)), \
                                 _mm256_cvtepi32_ps(f##i), acc##i);
            LM2_EACH(LM2_FOLD_SCALE)
#undef LM2_FOLD_SCALE
        }
    }
#define LM2_STORE_ROW(i) \
    if ((i) < RR) _mm256_storeu_ps(out + (r0 + (i)) * ldo + 8 * hf, acc##i);
    LM2_EACH(LM2_STORE_ROW)
#undef LM2_STORE_ROW
}

/* Every activation row of a group's half: passes of 4 rows, then one of the rest. */
static inline __attribute__((always_inline)) LM2_ATTR void LM2_SUFFIX(passes)(const int kind, const uint8_t *gw,
                                                         const int hf, const dp_lact *a, float *o, const int64_t ldo,
                                                         const int fold) {
    int64_t r = 0;
    for (; r + 4 <= a->R; r += 4) LM2_SUFFIX(pass)(kind, gw, hf, a, r, 4, o, ldo, fold);
    switch (a->R - r) {
    case 3: LM2_SUFFIX(pass)(kind, gw, hf, a, r, 3, o, ldo, fold); break;
    case 2: LM2_SUFFIX(pass)(kind, gw, hf, a, r, 2, o, ldo, fold); break;
    case 1: LM2_SUFFIX(pass)(kind, gw, hf, a, r, 1, o, ldo, fold); break;
    default: break;
    }
}

#undef LM2_XB
#define LM2_XB(p) x4(p)

/* Decode (one activation row): NS <= 4 groups, gq bytes apart, walked unit by unit side
 * by side (both halves of each), so that each thread reads NS streams of weights at once
 * instead of one. */
static inline __attribute__((always_inline)) LM2_ATTR void LM2_SUFFIX(streams)(
    const int kind, const uint8_t *gw, const int64_t gq, const int NS, const dp_lact *a, float *out,
    const int64_t oq) {
    const int64_t K = a->K, units = dp_lkind_sb(kind) / 32, nsb = K / dp_lkind_sb(kind);
    const int64_t sbb = dp_lkind_header(kind) + units * dp_lkind_unit(kind);
    const int parts = kind == DP_L_Q6_K ? 2 : 1;
    __m256 sacc0 = _mm256_setzero_ps(), sacc1 = sacc0, sacc2 = sacc0, sacc3 = sacc0, sacc4 = sacc0,
           sacc5 = sacc0, sacc6 = sacc0, sacc7 = sacc0; /* stream i's halves: 2 i, 2 i + 1 */
    for (int64_t s = 0; s < nsb; s++)
        for (int64_t b = 0; b < units; b++) {
            const int64_t kb = s * units + b;
            const int32_t *x0 = (const int32_t *)(a->xq + 32 * kb), *x1 = x0, *x2 = x0, *x3 = x0;
            const __m256 dx = _mm256_broadcast_ss(a->xd + kb);
#define LM2_HALF(i, hf)                                                                                   \
    _Pragma("GCC unroll 2") for (int p = 0; p < parts; p++) {                                             \
        const int RR = 1;                                                                                 \
        __m256i t0 = _mm256_setzero_si256(), t1 = t0, t2 = t0, t3 = t0;                                   \
        const __m256i w16 = _mm256_set1_epi16(1);                                                         \
        (void)w16;                                                                                        \
        LM2_SUMS(kind, unit, hf, p);                                                                      \
        (void)t1, (void)t2, (void)t3;                                                                     \
        const __m256 d = f16_ps(h + 16 * (hf));                                                           \
        __m256 sc = d;                                                                                    \
        if (kind == DP_L_Q4_K) sc = _mm256_mul_ps(d, u8_ps(h + 64 + 16 * b + 8 * (hf)));                  \
        else if (kind == DP_L_Q6_K) sc = _mm256_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + p) + 8 * (hf)));   \
        const int z = kind == DP_L_Q8_0 ? LM2_Q8_ZERO : dp_lkind_zero_point(kind);                        \
        if (z) t0 = _mm256_sub_epi32(t0, _mm256_set1_epi32(z * (parts == 2 ? a->xs[2 * kb + p]            \
                                                                            : a->xs[2 * kb] + a->xs[2 * kb + 1]))); \
        sacc##i = _mm256_fmadd_ps(_mm256_mul_ps(sc, dx), _mm256_cvtepi32_ps(t0), sacc##i);                \
        if (kind == DP_L_Q4_K)                                                                            \
            sacc##i = _mm256_fnmadd_ps(_mm256_mul_ps(f16_ps(h + 32 + 16 * (hf)), u8_ps(h + 192 + 16 * b + 8 * (hf))), \
                                       _mm256_broadcast_ss(a->xm + kb), sacc##i);                         \
    }
#define LM2_STREAM(i, i0, i1)                                                                             \
    if ((i) < NS) {                                                                                       \
        const uint8_t *h = gw + (i) * gq + s * sbb;                                                       \
        const uint8_t *unit = h + dp_lkind_header(kind) + b * dp_lkind_unit(kind);                        \
        if (b == 0) dp_lprefetch_ahead(h, dp_lkind_header(kind), DP_LSTREAM_PREFETCH(kind));              \
        dp_lprefetch_ahead(unit, dp_lkind_unit(kind), DP_LSTREAM_PREFETCH(kind));                         \
        LM2_HALF(i0, 0)                                                                                   \
        LM2_HALF(i1, 1)                                                                                   \
    }
            LM2_STREAM(0, 0, 1) LM2_STREAM(1, 2, 3) LM2_STREAM(2, 4, 5) LM2_STREAM(3, 6, 7)
#undef LM2_STREAM
#undef LM2_HALF
            (void)x1, (void)x2, (void)x3;
        }
    _mm256_storeu_ps(out, sacc0), _mm256_storeu_ps(out + 8, sacc1);
    if (NS > 1) _mm256_storeu_ps(out + oq, sacc2), _mm256_storeu_ps(out + oq + 8, sacc3);
    if (NS > 2) _mm256_storeu_ps(out + 2 * oq, sacc4), _mm256_storeu_ps(out + 2 * oq + 8, sacc5);
    if (NS > 3) _mm256_storeu_ps(out + 3 * oq, sacc6), _mm256_storeu_ps(out + 3 * oq + 8, sacc7);
}

#undef LM2_XB

static inline __attribute__((always_inline)) LM2_ATTR void LM2_SUFFIX(groups)(const int kind, const uint8_t *w, int64_t g0, int64_t g1,
                                                         const dp_lact *a, float *out, int64_t ldo) {
    const int64_t gstride = a->K / dp_lkind_sb(kind) * (dp_lkind_header(kind) + dp_lkind_sb(kind) / 32 * dp_lkind_unit(kind));
    const int ns = DP_LSTREAMS(kind);
    if (a->R == 1 && g1 - g0 >= ns) {
        const int64_t q = (g1 - g0) / ns;
        for (int64_t g = g0; g < g0 + q; g++)
            LM2_SUFFIX(streams)(kind, w + g * gstride, q * gstride, ns, a, out + 16 * g, 16 * q);
        g0 += ns * q;
    }
    for (int64_t g = g0; g < g1; g++)
        for (int hf = 0; hf < 2; hf++) {
            const uint8_t *gw = w + g * gstride;
            float *o = out + 16 * g;
            if (kind == DP_L_Q4_K && a->sb256) /* (fold a constant in each call: two loops, no test inside) */
                LM2_SUFFIX(passes)(kind, gw, hf, a, o, ldo, 1);
            else
                LM2_SUFFIX(passes)(kind, gw, hf, a, o, ldo, 0);
        }
}

LM2_ATTR static void LM2_SUFFIX(lrows)(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a,
                                       float *out, int64_t ldo) {
    DP_LKIND_DISPATCH(kind, LM2_SUFFIX(groups), w, g0, g1, a, out, ldo)
}
