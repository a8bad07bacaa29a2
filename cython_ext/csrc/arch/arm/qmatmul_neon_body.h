/* The NEON classifier rows (qmatmul.h) with a 16-byte dot product, included by the ARM
 * ISA files that have one. Before including, define:
 *   QN_SUFFIX(n)    n with the ISA's suffix
 *   QN_DOT(a, w, x) a + the dot products of each 4 of w (uint8x16, the stored v = q + 128)
 *                   and x (int8x16) into 4 int32 lanes: of q (QN_BIAS 0) or of v (QN_BIAS 128)
 * Four weight rows share each load of the activations (and, with QN_BIAS, their sums). */

static inline __attribute__((always_inline)) void QN_SUFFIX(qrows_block)(const uint8_t *const row[4], const int nr,
                                                                       const int8_t *x, const int64_t v0,
                                                                       const int64_t bs, int32x4_t s[4]) {
    int32x4_t bias = vdupq_n_s32(0);
    for (int64_t v = v0; v < v0 + bs; v += 16) {
        const int8x16_t xv = vld1q_s8(x + v);
        if (QN_BIAS) bias = vdotq_s32(bias, vdupq_n_s8((int8_t)-QN_BIAS), xv);
        for (int i = 0; i < nr; i++) s[i] = QN_DOT(s[i], vld1q_u8(row[i] + v), xv);
    }
    if (QN_BIAS) /* v = q + 128: take 128 x the activations' sum away */
        for (int i = 0; i < nr; i++) s[i] = vaddq_s32(s[i], bias);
}

static void QN_SUFFIX(qrows)(const uint8_t *w, const float *scales, int64_t bs, int64_t n0, int64_t n1, int64_t K,
                             const int8_t *xq, const float *xd, int64_t R, float *out, int64_t ldo) {
    const int64_t nb = K / bs;
    for (int64_t n = n0; n < n1; n += 4) {
        const int nr = n1 - n < 4 ? (int)(n1 - n) : 4;
        const uint8_t *row[4];
        for (int i = 0; i < 4; i++) row[i] = w + (n + (i < nr ? i : 0)) * K;
        for (int64_t r = 0; r < R; r++) {
            const int8_t *x = xq + r * K;
            float32x4_t acc[4];
            for (int i = 0; i < 4; i++) acc[i] = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                if (r == 0)
                    for (int i = 0; i < nr; i++) __builtin_prefetch(row[i] + b * bs + DP_QMATMUL_PREFETCH);
                int32x4_t s[4];
                for (int i = 0; i < 4; i++) s[i] = vdupq_n_s32(0);
                QN_SUFFIX(qrows_block)(row, nr, x, b * bs, bs, s);
                for (int i = 0; i < nr; i++)
                    acc[i] = vmlaq_n_f32(acc[i], vcvtq_f32_s32(s[i]), scales[(n + i) * nb + b] * xd[r * nb + b]);
            }
            for (int i = 0; i < nr; i++) out[r * ldo + n + i] = vaddvq_f32(acc[i]);
        }
    }
}
