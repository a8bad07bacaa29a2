/* The AVX2 layer-product loop (lmatmul_avx2.c includes it twice: with AVX-VNNI and
 * without). Before including, define:
 *   LM2_ATTR              the functions' attributes (a target, or nothing)
 *   LM2_SUFFIX(n)         n with the variant's suffix
 *   LM2_DOT4(kind, a, v, x) a + the 8 lanes' sums of the products of the 4 steps v[0..4)
 *                         (uint8, any byte) and activations x[0..4) (each 4 int8 as an
 *                         int32, broadcast) */

static inline __attribute__((always_inline)) LM2_ATTR void LM2_SUFFIX(pass)(const int kind, const uint8_t *gw, const int hf,
                                                       const dp_lact *a, const int64_t r0, const int RR, float *out,
                                                       const int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t K = a->K, nsb = K / k->sb, units = k->sb / 32, sbb = k->header + units * k->unit;
    __m256 acc[2], macc[2];
    for (int i = 0; i < RR; i++) acc[i] = macc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        const __m256 d = f16_ps(h + 16 * hf);
        if (hf == 0 && r0 == 0) dp_lprefetch(h, k->header);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + k->header + b * k->unit;
            if (hf == 0 && r0 == 0) dp_lprefetch(unit, k->unit);
            __m256i v[8];
            unpack(kind, unit, hf, v);
            const int64_t kb = s * units + b;
            __m256 s0 = d, s1 = d, o = d;
            if (kind == DP_L_Q4_K) {
                s0 = _mm256_mul_ps(d, u8_ps(h + 64 + 16 * b + 8 * hf));
                o = _mm256_mul_ps(f16_ps(h + 32 + 16 * hf), u8_ps(h + 192 + 16 * b + 8 * hf));
            } else if (kind == DP_L_Q6_K) {
                s0 = _mm256_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b) + 8 * hf));
                s1 = _mm256_mul_ps(d, i8_ps(h + 32 + 16 * (2 * b + 1) + 8 * hf));
            }
            for (int i = 0; i < RR; i++) {
                const int64_t r = r0 + i;
                const int32_t *x = (const int32_t *)(a->xq + r * K + 32 * kb);
                const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;
                const __m256 dx = _mm256_set1_ps(a->xd[r * (K / 32) + kb]);
                __m256i d0 = _mm256_setzero_si256(), d1 = _mm256_setzero_si256();
                d0 = LM2_DOT4(kind, d0, v, x);
                d1 = LM2_DOT4(kind, d1, v + 4, x + 4);
                if (kind == DP_L_Q6_K) { /* two scales: the halves of 16 apart */
                    d0 = _mm256_sub_epi32(d0, _mm256_set1_epi32(32 * xs[0]));
                    d1 = _mm256_sub_epi32(d1, _mm256_set1_epi32(32 * xs[1]));
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(d0), acc[i]);
                    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(s1, dx), _mm256_cvtepi32_ps(d1), acc[i]);
                    continue;
                }
                __m256i dt = _mm256_add_epi32(d0, d1);
                const int32_t sum = xs[0] + xs[1];
                if (kind == DP_L_Q4_K) {
                    macc[i] = _mm256_fmadd_ps(o, _mm256_mul_ps(dx, _mm256_set1_ps((float)sum)), macc[i]);
                } else {
                    const int32_t z = dp_lkind_zero_point(kind);
                    dt = _mm256_sub_epi32(dt, _mm256_set1_epi32(z * sum));
                }
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(s0, dx), _mm256_cvtepi32_ps(dt), acc[i]);
            }
        }
    }
    for (int i = 0; i < RR; i++) _mm256_storeu_ps(out + (r0 + i) * ldo + 8 * hf, _mm256_sub_ps(acc[i], macc[i]));
}

static inline __attribute__((always_inline)) LM2_ATTR void LM2_SUFFIX(groups)(const int kind, const uint8_t *w, int64_t g0, int64_t g1,
                                                         const dp_lact *a, float *out, int64_t ldo) {
    const dp_lkind_info *k = &dp_lkinds[kind];
    const int64_t gstride = a->K / k->sb * (k->header + k->sb / 32 * k->unit);
    for (int64_t g = g0; g < g1; g++)
        for (int hf = 0; hf < 2; hf++) {
            int64_t r = 0;
            for (; r + 2 <= a->R; r += 2) LM2_SUFFIX(pass)(kind, w + g * gstride, hf, a, r, 2, out + 16 * g, ldo);
            if (r < a->R) LM2_SUFFIX(pass)(kind, w + g * gstride, hf, a, r, 1, out + 16 * g, ldo);
        }
}

LM2_ATTR static void LM2_SUFFIX(lrows)(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a,
                                       float *out, int64_t ldo) {
    DP_LKIND_DISPATCH(kind, LM2_SUFFIX(groups), w, g0, g1, a, out, ldo)
}
