/* The AVX-512 layer-product loop (lmatmul_avx512.c includes it twice: with VNNI and
 * without). Before including, define:
 *   LM_ATTR            the functions' attributes (a target, or nothing)
 *   LM_SUFFIX(n)       n with the variant's suffix
 *   LM_SUMS(kind, u, p)  t0..t7 (int32 lanes, one per weight row) + activation row i's
 *                      sums of products over part p of unit u's steps, x0..x7 the rows'
 *                      activations (lmatmul_avx512.c)
 *   LM_Q8_ZERO         the offset Q8_0's sums still hold (128, or 0 for sums on q itself)
 * One pass takes one group of 16 rows against RR <= 8 activation rows (a constant once
 * inlined): each 64-byte load unpacks two steps for all of them, so with 8 rows the
 * unpacking and the scales cost an eighth of what they cost a row. */

static inline __attribute__((always_inline)) LM_ATTR void LM_SUFFIX(pass)(
    const int kind, const uint8_t *gw, const dp_lact *a, const int64_t r0, const int RR, float *out,
    const int64_t ldo) {
    const int64_t K = a->K, units = dp_lkind_sb(kind) / 32, nsb = K / dp_lkind_sb(kind);
    const int64_t sbb = dp_lkind_header(kind) + units * dp_lkind_unit(kind);
    const int parts = kind == DP_L_Q6_K ? 2 : 1; /* Q6_K: a scale per 16 values, so a sum per half unit */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, acc5 = acc0,
           acc6 = acc0, acc7 = acc0;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        if (r0 == 0) dp_lprefetch(h, dp_lkind_header(kind));
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + dp_lkind_header(kind) + b * dp_lkind_unit(kind);
            if (r0 == 0) dp_lprefetch(unit, dp_lkind_unit(kind));
            const int64_t kb = s * units + b;
            /* rows past RR are never read: they point at row r0's */
            const int32_t *x0 = (const int32_t *)(a->xq + r0 * K + 32 * kb);
#define LM_ROW_X(i) const int32_t *x##i = RR > (i) ? x0 + (i) * (K / 4) : x0;
            LM_ROW_X(1) LM_ROW_X(2) LM_ROW_X(3) LM_ROW_X(4) LM_ROW_X(5) LM_ROW_X(6) LM_ROW_X(7)
#undef LM_ROW_X
#pragma GCC unroll 2
            for (int p = 0; p < parts; p++) {
                __m512i t0 = _mm512_setzero_si512(), t1 = t0, t2 = t0, t3 = t0, t4 = t0, t5 = t0, t6 = t0, t7 = t0;
                LM_SUMS(kind, unit, p);
                __m512 sc = d, o = d;
                if (kind == DP_L_Q4_K) {
                    sc = _mm512_mul_ps(d, u8_ps(h + 64 + 16 * b));
                    o = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32))),
                                      u8_ps(h + 192 + 16 * b));
                } else if (kind == DP_L_Q6_K) {
                    sc = _mm512_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + p)));
                }
                const int z = kind == DP_L_Q8_0 ? LM_Q8_ZERO : dp_lkind_zero_point(kind);
#define LM_SCALE_ROW(i)                                                                                  \
    if ((i) < RR) {                                                                                      \
        const int64_t r = r0 + (i);                                                                      \
        const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;                                               \
        if (z) t##i = _mm512_sub_epi32(t##i, _mm512_set1_epi32(z * (parts == 2 ? xs[p] : xs[0] + xs[1]))); \
        const __m512 dx = _mm512_set1_ps(a->xd[r * (K / 32) + kb]);                                      \
        acc##i = _mm512_fmadd_ps(_mm512_mul_ps(sc, dx), _mm512_cvtepi32_ps(t##i), acc##i);              \
        if (kind == DP_L_Q4_K) acc##i = _mm512_fnmadd_ps(o, _mm512_set1_ps(a->xm[r * (K / 32) + kb]), acc##i); \
    }
                LM_EACH(LM_SCALE_ROW)
#undef LM_SCALE_ROW
            }
        }
    }
#define LM_STORE_ROW(i) \
    if ((i) < RR) _mm512_storeu_ps(out + (r0 + (i)) * ldo, acc##i);
    LM_EACH(LM_STORE_ROW)
#undef LM_STORE_ROW
}

/* Decode (one activation row): NS <= 4 groups, gq bytes apart, walked unit by unit side
 * by side, so that each thread reads NS streams of weights at once instead of one. */
static inline __attribute__((always_inline)) LM_ATTR void LM_SUFFIX(streams)(
    const int kind, const uint8_t *gw, const int64_t gq, const int NS, const dp_lact *a, float *out,
    const int64_t oq) {
    const int64_t K = a->K, units = dp_lkind_sb(kind) / 32, nsb = K / dp_lkind_sb(kind);
    const int64_t sbb = dp_lkind_header(kind) + units * dp_lkind_unit(kind);
    const int parts = kind == DP_L_Q6_K ? 2 : 1;
    __m512 sacc0 = _mm512_setzero_ps(), sacc1 = sacc0, sacc2 = sacc0, sacc3 = sacc0;
    for (int64_t s = 0; s < nsb; s++)
        for (int64_t b = 0; b < units; b++) {
            const int64_t kb = s * units + b;
            const int32_t *x0 = (const int32_t *)(a->xq + 32 * kb);
            const int32_t *x1 = x0, *x2 = x0, *x3 = x0, *x4 = x0, *x5 = x0, *x6 = x0, *x7 = x0;
            const __m512 dx = _mm512_set1_ps(a->xd[kb]);
#define LM_STREAM(i)                                                                                      \
    if ((i) < NS) {                                                                                       \
        const uint8_t *h = gw + (i) * gq + s * sbb;                                                       \
        const uint8_t *unit = h + dp_lkind_header(kind) + b * dp_lkind_unit(kind);                        \
        if (b == 0) dp_lprefetch_ahead(h, dp_lkind_header(kind), DP_LSTREAM_PREFETCH(kind));              \
        dp_lprefetch_ahead(unit, dp_lkind_unit(kind), DP_LSTREAM_PREFETCH(kind));                         \
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));                         \
        _Pragma("GCC unroll 2") for (int p = 0; p < parts; p++) {                                         \
            const int RR = 1;                                                                             \
            __m512i t0 = _mm512_setzero_si512(), t1 = t0, t2 = t0, t3 = t0, t4 = t0, t5 = t0, t6 = t0, t7 = t0; \
            LM_SUMS(kind, unit, p);                                                                       \
            (void)t1, (void)t2, (void)t3, (void)t4, (void)t5, (void)t6, (void)t7;                         \
            __m512 sc = d;                                                                                \
            if (kind == DP_L_Q4_K) sc = _mm512_mul_ps(d, u8_ps(h + 64 + 16 * b));                         \
            else if (kind == DP_L_Q6_K) sc = _mm512_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + p)));          \
            const int z = kind == DP_L_Q8_0 ? LM_Q8_ZERO : dp_lkind_zero_point(kind);                     \
            if (z) t0 = _mm512_sub_epi32(t0, _mm512_set1_epi32(z * (parts == 2 ? a->xs[2 * kb + p]        \
                                                                                : a->xs[2 * kb] + a->xs[2 * kb + 1]))); \
            sacc##i = _mm512_fmadd_ps(_mm512_mul_ps(sc, dx), _mm512_cvtepi32_ps(t0), sacc##i);            \
            if (kind == DP_L_Q4_K)                                                                        \
                sacc##i = _mm512_fnmadd_ps(                                                               \
                    _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32))),         \
                                  u8_ps(h + 192 + 16 * b)),                                               \
                    _mm512_set1_ps(a->xm[kb]), sacc##i);                                                  \
        }                                                                                                 \
    }
            LM_STREAM(0) LM_STREAM(1) LM_STREAM(2) LM_STREAM(3)
#undef LM_STREAM
            (void)x1, (void)x2, (void)x3, (void)x4, (void)x5, (void)x6, (void)x7;
        }
    _mm512_storeu_ps(out, sacc0);
    if (NS > 1) _mm512_storeu_ps(out + oq, sacc1);
    if (NS > 2) _mm512_storeu_ps(out + 2 * oq, sacc2);
    if (NS > 3) _mm512_storeu_ps(out + 3 * oq, sacc3);
}

static inline __attribute__((always_inline)) LM_ATTR void LM_SUFFIX(groups)(
    const int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    const int64_t gstride = a->K / dp_lkind_sb(kind) * (dp_lkind_header(kind) + dp_lkind_sb(kind) / 32 * dp_lkind_unit(kind));
    const int ns = DP_LSTREAMS(kind);
    if (a->R == 1 && g1 - g0 >= ns) {
        const int64_t q = (g1 - g0) / ns;
        for (int64_t g = g0; g < g0 + q; g++)
            LM_SUFFIX(streams)(kind, w + g * gstride, q * gstride, ns, a, out + 16 * g, 16 * q);
        g0 += ns * q;
    }
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *gw = w + g * gstride;
        float *o = out + 16 * g;
        int64_t r = 0;
        for (; r + 8 <= a->R; r += 8) LM_SUFFIX(pass)(kind, gw, a, r, 8, o, ldo);
        switch (a->R - r) {
        case 7: LM_SUFFIX(pass)(kind, gw, a, r, 7, o, ldo); break;
        case 6: LM_SUFFIX(pass)(kind, gw, a, r, 6, o, ldo); break;
        case 5: LM_SUFFIX(pass)(kind, gw, a, r, 5, o, ldo); break;
        case 4: LM_SUFFIX(pass)(kind, gw, a, r, 4, o, ldo); break;
        case 3: LM_SUFFIX(pass)(kind, gw, a, r, 3, o, ldo); break;
        case 2: LM_SUFFIX(pass)(kind, gw, a, r, 2, o, ldo); break;
        case 1: LM_SUFFIX(pass)(kind, gw, a, r, 1, o, ldo); break;
        default: break;
        }
    }
}

LM_ATTR static void LM_SUFFIX(lrows)(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a,
                                     float *out, int64_t ldo) {
    DP_LKIND_DISPATCH(kind, LM_SUFFIX(groups), w, g0, g1, a, out, ldo)
}
