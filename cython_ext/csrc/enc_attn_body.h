/* The enc_rows of an ISA (dp_attn_ops.h, enc_attn.h), from its vector operations. An ISA's
 * attention file defines, then includes this after its exp_sum and max_of:
 *
 *   EA_VT, EA_VL      the f32 vector type and its lanes (4, 8 or 16)
 *   EA_LOAD, EA_STORE, EA_SET1, EA_ZERO, EA_MUL, EA_FMA(a, b, c) = a * b + c
 *   EA_ROWS           query rows a pass holds (<= DP_ENC_ROWS)
 *   EA_KB             blocks of 16 tokens a scores tile takes (1 or 2)
 *   EA_DV             vectors of head dims a pass over V takes (head_dim % (EA_DV * EA_VL)
 *                     is done a vector at a time)
 *   EA_LOAD_PART(p, w), EA_STORE_PART(p, x, w)
 *                     the first w lanes only; needed where EA_VL is over 8, since
 *                     enc_rows takes any head_dim in whole 8s (Gemma 3's SigLIP: 72)
 *
 * A pass: EA_ROWS query rows (scaled, copied to qp; rows past m are zero), their scores
 * tile by tile (EA_ROWS x EA_KB * 16 accumulators: each K^T vector is loaded once for
 * all rows, each query value broadcast once for EA_KB blocks), the softmax of each real
 * row over its n keys, then the rows times V (EA_ROWS x EA_DV accumulators while the n
 * rows of V stream by), normalized on the way out. */

#define EA_BV (16 / EA_VL) /* vectors in a block of 16 tokens */

static inline __attribute__((always_inline)) void ea_scores(const float *qp, int64_t hd, const float *kb, const int nb,
                                                            float *s, int64_t ss) {
    EA_VT acc[EA_ROWS * EA_KB * EA_BV];
    for (int i = 0; i < EA_ROWS * nb * EA_BV; i++) acc[i] = EA_ZERO();
    for (int64_t e = 0; e < hd; e++) {
        EA_VT kv[EA_KB * EA_BV];
        for (int b = 0; b < nb; b++)
            for (int j = 0; j < EA_BV; j++) kv[b * EA_BV + j] = EA_LOAD(kb + b * hd * 16 + e * 16 + j * EA_VL);
        for (int i = 0; i < EA_ROWS; i++) {
            const EA_VT x = EA_SET1(qp[i * hd + e]);
            for (int j = 0; j < nb * EA_BV; j++) acc[i * nb * EA_BV + j] = EA_FMA(x, kv[j], acc[i * nb * EA_BV + j]);
        }
    }
    for (int i = 0; i < EA_ROWS; i++)
        for (int j = 0; j < nb * EA_BV; j++) EA_STORE(s + i * ss + j * EA_VL, acc[i * nb * EA_BV + j]);
}

static inline __attribute__((always_inline)) void ea_pv(const float *s, int64_t ss, int64_t n, const float *v,
                                                        int64_t ldv, const int dv, const float *inv, int64_t m,
                                                        float *out, int64_t ldo) {
    EA_VT acc[EA_ROWS * EA_DV];
    for (int i = 0; i < EA_ROWS * dv; i++) acc[i] = EA_ZERO();
    for (int64_t r = 0; r < n; r++) {
        EA_VT x[EA_DV];
        for (int j = 0; j < dv; j++) x[j] = EA_LOAD(v + r * ldv + j * EA_VL);
        for (int i = 0; i < EA_ROWS; i++) {
            const EA_VT p = EA_SET1(s[i * ss + r]);
            for (int j = 0; j < dv; j++) acc[i * dv + j] = EA_FMA(p, x[j], acc[i * dv + j]);
        }
    }
    for (int64_t i = 0; i < m; i++)
        for (int j = 0; j < dv; j++) EA_STORE(out + i * ldo + j * EA_VL, EA_MUL(acc[i * dv + j], EA_SET1(inv[i])));
}

#ifdef EA_LOAD_PART
/* The rows times the last w (< EA_VL) dims of V: never reading or writing past the head. */
static inline __attribute__((always_inline)) void ea_pv_part(const float *s, int64_t ss, int64_t n, const float *v,
                                                             int64_t ldv, int w, const float *inv, int64_t m,
                                                             float *out, int64_t ldo) {
    EA_VT acc[EA_ROWS];
    for (int i = 0; i < EA_ROWS; i++) acc[i] = EA_ZERO();
    for (int64_t r = 0; r < n; r++) {
        const EA_VT x = EA_LOAD_PART(v + r * ldv, w);
        for (int i = 0; i < EA_ROWS; i++) acc[i] = EA_FMA(EA_SET1(s[i * ss + r]), x, acc[i]);
    }
    for (int64_t i = 0; i < m; i++) EA_STORE_PART(out + i * ldo, EA_MUL(acc[i], EA_SET1(inv[i])), w);
}
#endif

static void enc_rows(const float *q, int64_t ldq, int64_t m, int64_t hd, const float *kt, int64_t n, const float *v,
                     int64_t ldv, float scale, float *s, float *out, int64_t ldo) {
    const int64_t nb = (n + 15) / 16, ss = nb * 16 + 16;
    float qp[EA_ROWS * DP_MAX_HEAD_DIM];
    float inv[EA_ROWS];
    for (int64_t i0 = 0; i0 < m; i0 += EA_ROWS) {
        const int64_t rm = m - i0 < EA_ROWS ? m - i0 : EA_ROWS;
        for (int64_t i = 0; i < EA_ROWS; i++)
            for (int64_t e = 0; e < hd; e++) qp[i * hd + e] = i < rm ? q[(i0 + i) * ldq + e] * scale : 0.0f;
        int64_t b = 0;
        for (; b + EA_KB <= nb; b += EA_KB) ea_scores(qp, hd, kt + b * 16 * hd, EA_KB, s + b * 16, ss);
        for (; b < nb; b++) ea_scores(qp, hd, kt + b * 16 * hd, 1, s + b * 16, ss);
        for (int64_t i = 0; i < rm; i++) inv[i] = 1.0f / exp_sum(s + i * ss, n, max_of(s + i * ss, n));
        int64_t c = 0;
        for (; c + EA_DV * EA_VL <= hd; c += EA_DV * EA_VL)
            ea_pv(s, ss, n, v + c, ldv, EA_DV, inv, rm, out + i0 * ldo + c, ldo);
        for (; c + EA_VL <= hd; c += EA_VL) ea_pv(s, ss, n, v + c, ldv, 1, inv, rm, out + i0 * ldo + c, ldo);
#ifdef EA_LOAD_PART
        if (c < hd) ea_pv_part(s, ss, n, v + c, ldv, (int)(hd - c), inv, rm, out + i0 * ldo + c, ldo);
#endif
    }
}
