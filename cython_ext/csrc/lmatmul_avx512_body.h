/* The AVX-512 layer-product loop (lmatmul_avx512.c includes it twice: with VNNI and
 * without). Before including, define:
 *   LM_ATTR         the functions' attributes (a target, or nothing)
 *   LM_SUFFIX(n)    n with the variant's suffix
 *   LM_DOT(a, v, x) a + the 16 lanes' sums of 4 products of uint8 v and int8 x (an int32
 *                   broadcast of 4 activations); v below 64, or any uint8 with LM_WIDE_DOT
 *   LM_WIDE_DOT(a, v, x) the same for Q8_0's values (any uint8)
 * One pass takes one group of 16 rows against RR activation rows (a constant once inlined):
 * a unit's 8 steps are unpacked once and multiplied by each row's activations. */

static inline __attribute__((always_inline)) LM_ATTR void LM_SUFFIX(pass)(
    const int kind, const uint8_t *gw, const dp_lact *a, const int64_t r0, const int RR, float *out,
    const int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t K = a->K, nsb = K / k->sb, units = k->sb / 32, sbb = k->header + units * k->unit;
    __m512 acc[4], macc[4];
    for (int i = 0; i < RR; i++) acc[i] = macc[i] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        if (r0 == 0) dp_lprefetch(h, k->header);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
        const __m512 dmin = kind == DP_L_Q4_K ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32)))
                                              : _mm512_setzero_ps();
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + k->header + b * k->unit;
            if (r0 == 0) dp_lprefetch(unit, k->unit);
            __m512i v[8];
            unpack(kind, unit, v);
            const int64_t kb = s * units + b;
            __m512 s0, s1 = d, o = d;
            if (kind == DP_L_Q4_K) {
                s0 = _mm512_mul_ps(d, u8_ps(h + 64 + 16 * b));
                o = _mm512_mul_ps(dmin, u8_ps(h + 192 + 16 * b));
            } else if (kind == DP_L_Q6_K) {
                s0 = _mm512_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b)));
                s1 = _mm512_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + 1)));
            } else {
                s0 = d;
            }
            for (int i = 0; i < RR; i++) {
                const int64_t r = r0 + i;
                const int32_t *x = (const int32_t *)(a->xq + r * K + 32 * kb);
                const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;
                const __m512 dx = _mm512_set1_ps(a->xd[r * (K / 32) + kb]);
                __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
                if (kind == DP_L_Q8_0) {
                    for (int j = 0; j < 8; j += 2) {
                        d0 = LM_WIDE_DOT(d0, v[j], _mm512_set1_epi32(x[j]));
                        d1 = LM_WIDE_DOT(d1, v[j + 1], _mm512_set1_epi32(x[j + 1]));
                    }
                } else if (kind == DP_L_Q6_K) { /* two scales: the halves of 16 apart */
                    for (int j = 0; j < 4; j++) d0 = LM_DOT(d0, v[j], _mm512_set1_epi32(x[j]));
                    for (int j = 4; j < 8; j++) d1 = LM_DOT(d1, v[j], _mm512_set1_epi32(x[j]));
                    d0 = _mm512_sub_epi32(d0, _mm512_set1_epi32(32 * xs[0]));
                    d1 = _mm512_sub_epi32(d1, _mm512_set1_epi32(32 * xs[1]));
                    acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(s0, dx), _mm512_cvtepi32_ps(d0), acc[i]);
                    acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(s1, dx), _mm512_cvtepi32_ps(d1), acc[i]);
                    continue;
                } else {
                    for (int j = 0; j < 8; j += 2) {
                        d0 = LM_DOT(d0, v[j], _mm512_set1_epi32(x[j]));
                        d1 = LM_DOT(d1, v[j + 1], _mm512_set1_epi32(x[j + 1]));
                    }
                }
                __m512i dot = _mm512_add_epi32(d0, d1);
                const int32_t sum = xs[0] + xs[1];
                if (kind == DP_L_Q4_K) {
                    macc[i] = _mm512_fmadd_ps(o, _mm512_mul_ps(dx, _mm512_set1_ps((float)sum)), macc[i]);
                } else {
                    const int32_t z = dp_lkind_zero_point(kind);
                    dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(z * sum));
                }
                acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(s0, dx), _mm512_cvtepi32_ps(dot), acc[i]);
            }
        }
    }
    for (int i = 0; i < RR; i++) _mm512_storeu_ps(out + (r0 + i) * ldo, _mm512_sub_ps(acc[i], macc[i]));
}

static inline __attribute__((always_inline)) LM_ATTR void LM_SUFFIX(groups)(
    const int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out, int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t gstride = a->K / k->sb * (k->header + k->sb / 32 * k->unit);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *gw = w + g * gstride;
        float *o = out + 16 * g;
        int64_t r = 0;
        for (; r + 4 <= a->R; r += 4) LM_SUFFIX(pass)(kind, gw, a, r, 4, o, ldo);
        switch (a->R - r) {
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
