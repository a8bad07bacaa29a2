/* The NEON layer-product loops (lmatmul.h), included once per ARM ISA: lmatmul_neon.c
 * (baseline ARMv8), lmatmul_neon_dotprod.c (SDOT), lmatmul_neon_i8mm.c (USDOT, SMMLA).
 * Before including, define:
 *   LN_SUFFIX(n)             n with the ISA's suffix
 *   LN_ACC                   the type of an integer accumulator of 4 rows
 *   LN_ACC_SET(acc, v)       acc = the int32x4 v
 *   LN_DOT(acc, w, x, lane)  acc += for each of 4 rows i: the dot product of the 4 values
 *                            of w (uint8x16: row i's four in bytes 4i..4i+3) with the
 *                            int8 values 4 lane .. 4 lane + 3 of x (int8x16); lane a constant
 *   LN_ACC_GET(acc)          the int32x4 of the 4 rows' sums
 *   LN_UNSIGNED_DOT          1 if LN_DOT takes any uint8 w (USDOT), 0 if w must be below
 *                            128 (SDOT, SMULL): then Q8_0's values go as v ^ 0x80 = q
 *   LN_MMLA                  1 to take activation rows in pairs through USMMLA (i8mm)
 *
 * A unit's step j (a 64-byte vector) is four 16-byte quarters, quarter qd holding rows
 * 4 qd .. 4 qd + 3: one dot per quarter and step, 32 a unit, into 4 accumulators (Q6_K: 8,
 * its two halves of 16 values have scales of their own). A pass takes one activation row
 * against one group of 16 rows, step by step, so that one load of 64 bytes serves all
 * four quarters. */

/* Q8_0's stored values v = q + 128: multiplied as q (z = 0) by a signed dot, as v less
 * 128 x the activations' sum by an unsigned one. */
#define LN_Z(kind) ((kind) == DP_L_Q8_0 ? (LN_UNSIGNED_DOT ? 128 : 0) : dp_lkind_zero_point(kind))

#define LN_QDOT(kind, acc, w, x, lane) \
    LN_DOT(acc, (kind) == DP_L_Q8_0 && !LN_UNSIGNED_DOT ? veorq_u8(w, vdupq_n_u8(0x80)) : (w), x, lane)

/* 16 uint8 / int8 (one per row) as four int32x4, rows 4q .. 4q + 3 in [q]. */
static inline __attribute__((always_inline)) void LN_SUFFIX(u8x16_s32)(const uint8_t *p, int32x4_t o[4]) {
    const uint8x16_t v = vld1q_u8(p);
    const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    o[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo)));
    o[1] = vreinterpretq_s32_u32(vmovl_high_u16(lo));
    o[2] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi)));
    o[3] = vreinterpretq_s32_u32(vmovl_high_u16(hi));
}
static inline __attribute__((always_inline)) void LN_SUFFIX(i8x16_s32)(const uint8_t *p, int32x4_t o[4]) {
    const int8x16_t v = vreinterpretq_s8_u8(vld1q_u8(p));
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    o[0] = vmovl_s16(vget_low_s16(lo));
    o[1] = vmovl_high_s16(lo);
    o[2] = vmovl_s16(vget_low_s16(hi));
    o[3] = vmovl_high_s16(hi);
}
/* 16 fp16 (one per row, FCVTL: baseline AArch64) as four f32x4. */
static inline __attribute__((always_inline)) void LN_SUFFIX(f16x16)(const uint8_t *p, float32x4_t o[4]) {
    const uint16x8_t h0 = vld1q_u16((const uint16_t *)p), h1 = vld1q_u16((const uint16_t *)p + 8);
    o[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h0)));
    o[1] = vcvt_high_f32_f16(vreinterpretq_f16_u16(h0));
    o[2] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h1)));
    o[3] = vcvt_high_f32_f16(vreinterpretq_f16_u16(h1));
}

/* The 32 dots of one unit against x (its 32 int8 values in x0, x1), all four quarters of
 * a step from one 64-byte load: rows 4q .. 4q + 3 into A[q], Q6_K's second half (steps
 * 4-7) into B[q]. Written out step by step: the lane of a dot is an immediate, and the
 * accumulators must stay in registers. */
static inline __attribute__((always_inline)) void LN_SUFFIX(unit_dots)(const int kind, const uint8_t *unit,
                                                                       const int8x16_t x0, const int8x16_t x1,
                                                                       LN_ACC A[4], LN_ACC B[4]) {
    LN_ACC a0 = A[0], a1 = A[1], a2 = A[2], a3 = A[3], b0 = B[0], b1 = B[1], b2 = B[2], b3 = B[3];
#define LN_D4(P0, P1, P2, P3, V0, V1, V2, V3, X, L) \
    do {                                            \
        LN_QDOT(kind, P0, V0, X, L);                \
        LN_QDOT(kind, P1, V1, X, L);                \
        LN_QDOT(kind, P2, V2, X, L);                \
        LN_QDOT(kind, P3, V3, X, L);                \
    } while (0)
    if (kind == DP_L_Q8_0) {
#define LN_Q8(j, X, L)                                                                                  \
    do {                                                                                                \
        const uint8_t *p_ = unit + 64 * (j);                                                            \
        LN_D4(a0, a1, a2, a3, vld1q_u8(p_), vld1q_u8(p_ + 16), vld1q_u8(p_ + 32), vld1q_u8(p_ + 48), X, L); \
    } while (0)
        LN_Q8(0, x0, 0); LN_Q8(1, x0, 1); LN_Q8(2, x0, 2); LN_Q8(3, x0, 3);
        LN_Q8(4, x1, 0); LN_Q8(5, x1, 1); LN_Q8(6, x1, 2); LN_Q8(7, x1, 3);
#undef LN_Q8
    } else {
        const uint8x16_t m0f = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30), v16 = vdupq_n_u8(16);
        /* Q5_0: byte 2q (lanes 0-7) and 2q + 1 (lanes 8-15) of step j's 8 bytes of bit 4,
         * spread by TBL, tested against each lane's bit (CMTST: 0xff where set); taking
         * 0xff x 16 = 0xf0 away adds the 16 */
        static const uint8_t spread[64] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                           4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
                                           6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7};
        uint8x16_t t0 = m0f, t1 = m0f, t2 = m0f, t3 = m0f, bits = m0f, p0 = m0f, p1 = m0f, p2 = m0f, p3 = m0f;
        if (kind == DP_L_Q5_0) {
            t0 = vld1q_u8(spread), t1 = vld1q_u8(spread + 16), t2 = vld1q_u8(spread + 32), t3 = vld1q_u8(spread + 48);
            bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
        }
#define LN_Q5(j, V0, V1, V2, V3)                                                   \
    do {                                                                           \
        uint64_t h_;                                                               \
        memcpy(&h_, unit + 256 + 8 * (j), 8);                                      \
        const uint8x16_t m_ = vreinterpretq_u8_u64(vdupq_n_u64(h_));               \
        V0 = vmlsq_u8(V0, vtstq_u8(vqtbl1q_u8(m_, t0), bits), v16);                \
        V1 = vmlsq_u8(V1, vtstq_u8(vqtbl1q_u8(m_, t1), bits), v16);                \
        V2 = vmlsq_u8(V2, vtstq_u8(vqtbl1q_u8(m_, t2), bits), v16);                \
        V3 = vmlsq_u8(V3, vtstq_u8(vqtbl1q_u8(m_, t3), bits), v16);                \
    } while (0)
        /* Q6_K: bits 4-5 of step j = 4 a + t at bits 2 t of the plane's 64 bytes a */
#define LN_Q6(SHIFT, V0, V1, V2, V3)                 \
    do {                                             \
        V0 = vbslq_u8(m30, SHIFT(p0), V0);           \
        V1 = vbslq_u8(m30, SHIFT(p1), V1);           \
        V2 = vbslq_u8(m30, SHIFT(p2), V2);           \
        V3 = vbslq_u8(m30, SHIFT(p3), V3);           \
    } while (0)
#define LN_SH0(p) vshlq_n_u8(p, 4)
#define LN_SH1(p) vshlq_n_u8(p, 2)
#define LN_SH2(p) (p)
#define LN_SH3(p) vshrq_n_u8(p, 2)
        /* Steps 2c (low nibbles) and 2c + 1 (high) of all four quarters. */
#define LN_NIB(c, X, L0, L1, SHL, SHH, P0, P1, P2, P3)                                                     \
    do {                                                                                                    \
        const uint8_t *p_ = unit + 64 * (c);                                                                \
        const uint8x16_t r0 = vld1q_u8(p_), r1 = vld1q_u8(p_ + 16), r2 = vld1q_u8(p_ + 32),               \
                         r3 = vld1q_u8(p_ + 48);                                                           \
        uint8x16_t l0 = vandq_u8(r0, m0f), l1 = vandq_u8(r1, m0f), l2 = vandq_u8(r2, m0f),                \
                   l3 = vandq_u8(r3, m0f);                                                                 \
        uint8x16_t h0 = vshrq_n_u8(r0, 4), h1 = vshrq_n_u8(r1, 4), h2 = vshrq_n_u8(r2, 4),                \
                   h3 = vshrq_n_u8(r3, 4);                                                                 \
        if (kind == DP_L_Q5_0) {                                                                            \
            LN_Q5(2 * (c), l0, l1, l2, l3);                                                                 \
            LN_Q5(2 * (c) + 1, h0, h1, h2, h3);                                                             \
        } else if (kind == DP_L_Q6_K) {                                                                     \
            LN_Q6(SHL, l0, l1, l2, l3);                                                                     \
            LN_Q6(SHH, h0, h1, h2, h3);                                                                     \
        }                                                                                                   \
        LN_D4(P0, P1, P2, P3, l0, l1, l2, l3, X, L0);                                                       \
        LN_D4(P0, P1, P2, P3, h0, h1, h2, h3, X, L1);                                                       \
    } while (0)
        if (kind == DP_L_Q6_K)
            p0 = vld1q_u8(unit + 256), p1 = vld1q_u8(unit + 272), p2 = vld1q_u8(unit + 288), p3 = vld1q_u8(unit + 304);
        LN_NIB(0, x0, 0, 1, LN_SH0, LN_SH1, a0, a1, a2, a3);
        LN_NIB(1, x0, 2, 3, LN_SH2, LN_SH3, a0, a1, a2, a3);
        if (kind == DP_L_Q6_K) {
            p0 = vld1q_u8(unit + 320), p1 = vld1q_u8(unit + 336), p2 = vld1q_u8(unit + 352), p3 = vld1q_u8(unit + 368);
            LN_NIB(2, x1, 0, 1, LN_SH0, LN_SH1, b0, b1, b2, b3);
            LN_NIB(3, x1, 2, 3, LN_SH2, LN_SH3, b0, b1, b2, b3);
        } else {
            LN_NIB(2, x1, 0, 1, LN_SH0, LN_SH1, a0, a1, a2, a3);
            LN_NIB(3, x1, 2, 3, LN_SH2, LN_SH3, a0, a1, a2, a3);
        }
#undef LN_NIB
#undef LN_Q5
#undef LN_Q6
#undef LN_SH0
#undef LN_SH1
#undef LN_SH2
#undef LN_SH3
    }
#undef LN_D4
    A[0] = a0, A[1] = a1, A[2] = a2, A[3] = a3, B[0] = b0, B[1] = b1, B[2] = b2, B[3] = b3;
}

/* Decode: the one activation row against one group of 16 rows (gw: the group's first
 * superblock): out[0..16). Per unit, the integer sums of each row are scaled in f32 by the unit's
 * scales and the activations' dx; Q4_K's d and the mins' dmin multiply once a superblock. */
static inline __attribute__((always_inline)) void LN_SUFFIX(row)(const int kind, const uint8_t *gw,
                                                                 const dp_lact *a, float *out) {
    const int64_t hb = dp_lkind_header(kind), ub = dp_lkind_unit(kind), sb = dp_lkind_sb(kind);
    const int64_t K = a->K, nsb = K / sb, units = sb / 32, sbb = hb + units * ub;
    const int32_t z = LN_Z(kind);
    const int8_t *xq = a->xq;
    const int32_t *xs = a->xs;
    const float *xd = a->xd;
    float32x4_t acc[4], macc[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) acc[q] = macc[q] = vdupq_n_f32(0.0f);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        dp_lprefetch(h, hb);
        /* Q4_K, Q6_K: sums over the superblock's units of dx sc dot (and of dx sum m), then d (dmin) */
        float32x4_t sacc[4], smin[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) sacc[q] = smin[q] = vdupq_n_f32(0.0f);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + hb + b * ub;
            dp_lprefetch(unit, ub);
            const int64_t kb = s * units + b;
            const int8x16_t x0 = vld1q_s8(xq + 32 * kb), x1 = vld1q_s8(xq + 32 * kb + 16);
            const float dx = xd[kb];
            LN_ACC ia[4], ib[4];
            const int32x4_t init = vdupq_n_s32(kind == DP_L_Q6_K ? -32 * xs[2 * kb] : -z * (xs[2 * kb] + xs[2 * kb + 1]));
            const int32x4_t init_b = vdupq_n_s32(kind == DP_L_Q6_K ? -32 * xs[2 * kb + 1] : 0);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                LN_ACC_SET(ia[q], init);
                LN_ACC_SET(ib[q], init_b);
            }
            LN_SUFFIX(unit_dots)(kind, unit, x0, x1, ia, ib);
            if (kind == DP_L_Q4_K) {
                int32x4_t sc[4], m[4];
                LN_SUFFIX(u8x16_s32)(h + 64 + 16 * b, sc);
                LN_SUFFIX(u8x16_s32)(h + 192 + 16 * b, m);
                const float t = dx * (float)(xs[2 * kb] + xs[2 * kb + 1]);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    sacc[q] = vfmaq_n_f32(sacc[q], vcvtq_f32_s32(vmulq_s32(LN_ACC_GET(ia[q]), sc[q])), dx);
                    smin[q] = vfmaq_n_f32(smin[q], vcvtq_f32_s32(m[q]), t);
                }
            } else if (kind == DP_L_Q6_K) {
                int32x4_t s0[4], s1[4];
                LN_SUFFIX(i8x16_s32)(h + 32 + 16 * (2 * b), s0);
                LN_SUFFIX(i8x16_s32)(h + 32 + 16 * (2 * b + 1), s1);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    const int32x4_t v = vmlaq_s32(vmulq_s32(LN_ACC_GET(ia[q]), s0[q]), LN_ACC_GET(ib[q]), s1[q]);
                    sacc[q] = vfmaq_n_f32(sacc[q], vcvtq_f32_s32(v), dx);
                }
            } else { /* one scale d a unit (the superblock is the unit) */
                float32x4_t d[4];
                LN_SUFFIX(f16x16)(h, d);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    acc[q] = vfmaq_f32(acc[q], vmulq_n_f32(d[q], dx), vcvtq_f32_s32(LN_ACC_GET(ia[q])));
            }
        }
        if (kind == DP_L_Q4_K || kind == DP_L_Q6_K) {
            float32x4_t d[4], dm[4];
            LN_SUFFIX(f16x16)(h, d);
            if (kind == DP_L_Q4_K) LN_SUFFIX(f16x16)(h + 32, dm);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                acc[q] = vfmaq_f32(acc[q], d[q], sacc[q]);
                if (kind == DP_L_Q4_K) macc[q] = vfmaq_f32(macc[q], dm[q], smin[q]);
            }
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) vst1q_f32(out + 4 * q, vsubq_f32(acc[q], macc[q]));
}

/* ---- several activation rows: one quarter (4 rows) of a group at a time ---- */

/* Quarter qd of a unit's 8 steps as the dot takes them (Q8_0's sign flip left to LN_DOT4's
 * caller, LN_QDOT). */
static inline __attribute__((always_inline)) void LN_SUFFIX(quarter)(const int kind, const uint8_t *unit, const int qd,
                                                                     uint8x16_t w[8]) {
    if (kind == DP_L_Q8_0) {
        for (int j = 0; j < 8; j++) w[j] = vld1q_u8(unit + 64 * j + 16 * qd);
        return;
    }
    for (int c = 0; c < 4; c++) {
        const uint8x16_t raw = vld1q_u8(unit + 64 * c + 16 * qd);
        w[2 * c] = vandq_u8(raw, vdupq_n_u8(0x0f));
        w[2 * c + 1] = vshrq_n_u8(raw, 4);
    }
    if (kind == DP_L_Q5_0) { /* as unit_dots, for the quarter's 2 bytes */
        static const uint8_t spread[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
        const uint8x16_t bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull)), idx = vld1q_u8(spread);
        for (int j = 0; j < 8; j++) {
            uint16_t h;
            memcpy(&h, unit + 256 + 8 * j + 2 * qd, 2);
            const uint8x16_t set = vtstq_u8(vqtbl1q_u8(vreinterpretq_u8_u16(vdupq_n_u16(h)), idx), bits);
            w[j] = vmlsq_u8(w[j], set, vdupq_n_u8(16));
        }
    } else if (kind == DP_L_Q6_K) {
        const uint8x16_t mask = vdupq_n_u8(0x30);
        for (int a = 0; a < 2; a++) {
            const uint8x16_t p = vld1q_u8(unit + 256 + 64 * a + 16 * qd);
            w[4 * a + 0] = vbslq_u8(mask, vshlq_n_u8(p, 4), w[4 * a + 0]);
            w[4 * a + 1] = vbslq_u8(mask, vshlq_n_u8(p, 2), w[4 * a + 1]);
            w[4 * a + 2] = vbslq_u8(mask, p, w[4 * a + 2]);
            w[4 * a + 3] = vbslq_u8(mask, vshrq_n_u8(p, 2), w[4 * a + 3]);
        }
    }
}

/* 4 bytes (one per row) as an int32x4. */
static inline int32x4_t LN_SUFFIX(u8x4_s32)(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(v))))));
}
static inline int32x4_t LN_SUFFIX(i8x4_s32)(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(v)))));
}

/* Activation rows r0 .. r0 + RR - 1 against quarter qd of one group: out[r * ldo + 4 qd ..]. */
static inline __attribute__((always_inline)) void LN_SUFFIX(quarter_pass)(const int kind, const uint8_t *gw,
                                                                          const int qd, const dp_lact *a,
                                                                          const int64_t r0, const int RR, float *out,
                                                                          const int64_t ldo) {
    const int64_t hb = dp_lkind_header(kind), ub = dp_lkind_unit(kind), sb = dp_lkind_sb(kind);
    const int64_t K = a->K, nsb = K / sb, units = sb / 32, sbb = hb + units * ub;
    const int32_t z = LN_Z(kind);
    float32x4_t acc[4], macc[4], sacc[4], smin[4];
    for (int i = 0; i < RR; i++) acc[i] = macc[i] = vdupq_n_f32(0.0f);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        if (r0 == 0 && qd == 0) dp_lprefetch(h, hb);
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(h + 8 * qd)));
        for (int i = 0; i < RR; i++) sacc[i] = smin[i] = vdupq_n_f32(0.0f);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + hb + b * ub;
            if (r0 == 0 && qd == 0) dp_lprefetch(unit, ub);
            uint8x16_t w[8];
            LN_SUFFIX(quarter)(kind, unit, qd, w);
            const int64_t kb = s * units + b;
            int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
            float32x4_t mf = vdupq_n_f32(0.0f);
            if (kind == DP_L_Q4_K) {
                s0 = LN_SUFFIX(u8x4_s32)(h + 64 + 16 * b + 4 * qd);
                mf = vcvtq_f32_s32(LN_SUFFIX(u8x4_s32)(h + 192 + 16 * b + 4 * qd));
            } else if (kind == DP_L_Q6_K) {
                s0 = LN_SUFFIX(i8x4_s32)(h + 32 + 16 * (2 * b) + 4 * qd);
                s1 = LN_SUFFIX(i8x4_s32)(h + 32 + 16 * (2 * b + 1) + 4 * qd);
            }
            for (int i = 0; i < RR; i++) {
                const int64_t r = r0 + i;
                const int8x16_t x0 = vld1q_s8(a->xq + r * K + 32 * kb), x1 = vld1q_s8(a->xq + r * K + 32 * kb + 16);
                const int32_t *xs = a->xs + r * (K / 16) + 2 * kb;
                const float dx = a->xd[r * (K / 32) + kb];
                LN_ACC ia, ib;
                LN_ACC_SET(ia, vdupq_n_s32(kind == DP_L_Q6_K ? -32 * xs[0] : -z * (xs[0] + xs[1])));
                LN_ACC_SET(ib, vdupq_n_s32(-32 * xs[1]));
                LN_QDOT(kind, ia, w[0], x0, 0);
                LN_QDOT(kind, ia, w[1], x0, 1);
                LN_QDOT(kind, ia, w[2], x0, 2);
                LN_QDOT(kind, ia, w[3], x0, 3);
                if (kind == DP_L_Q6_K) {
                    LN_QDOT(kind, ib, w[4], x1, 0);
                    LN_QDOT(kind, ib, w[5], x1, 1);
                    LN_QDOT(kind, ib, w[6], x1, 2);
                    LN_QDOT(kind, ib, w[7], x1, 3);
                    const int32x4_t v = vmlaq_s32(vmulq_s32(LN_ACC_GET(ia), s0), LN_ACC_GET(ib), s1);
                    sacc[i] = vfmaq_n_f32(sacc[i], vcvtq_f32_s32(v), dx);
                    continue;
                }
                LN_QDOT(kind, ia, w[4], x1, 0);
                LN_QDOT(kind, ia, w[5], x1, 1);
                LN_QDOT(kind, ia, w[6], x1, 2);
                LN_QDOT(kind, ia, w[7], x1, 3);
                if (kind == DP_L_Q4_K) {
                    sacc[i] = vfmaq_n_f32(sacc[i], vcvtq_f32_s32(vmulq_s32(LN_ACC_GET(ia), s0)), dx);
                    smin[i] = vfmaq_n_f32(smin[i], mf, dx * (float)(xs[0] + xs[1]));
                } else {
                    acc[i] = vfmaq_f32(acc[i], vmulq_n_f32(d, dx), vcvtq_f32_s32(LN_ACC_GET(ia)));
                }
            }
        }
        if (kind == DP_L_Q4_K || kind == DP_L_Q6_K) {
            const float32x4_t dm = kind == DP_L_Q4_K ? vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(h + 32 + 8 * qd)))
                                                     : vdupq_n_f32(0.0f);
            for (int i = 0; i < RR; i++) {
                acc[i] = vfmaq_f32(acc[i], d, sacc[i]);
                macc[i] = vfmaq_f32(macc[i], dm, smin[i]);
            }
        }
    }
    for (int i = 0; i < RR; i++) vst1q_f32(out + (r0 + i) * ldo + 4 * qd, vsubq_f32(acc[i], macc[i]));
}

#if LN_MMLA
/* ---- pairs of activation rows through USMMLA (i8mm) ----
 * USMMLA multiplies a 2 x 8 matrix of uint8 by a 2 x 8 of int8 into a 2 x 2 of int32: 32
 * multiply-adds an instruction, where a dot by lane does 16. A quarter's steps 2p and
 * 2p + 1 zipped (32-bit lanes) give rows 0-1 and rows 2-3 of the quarter, 8 values each;
 * two activation rows' values 8p .. 8p + 7 zipped (64-bit lanes) the other operand. An
 * accumulator's lanes are then (row, activation) = (0, a) (0, b) (1, a) (1, b). */
static inline __attribute__((always_inline)) void LN_SUFFIX(mmla_pass)(const int kind, const uint8_t *gw, const int qd,
                                                                       const dp_lact *a, const int64_t r0, const int NP,
                                                                       float *out, const int64_t ldo) {
    const int64_t hb = dp_lkind_header(kind), ub = dp_lkind_unit(kind), sb = dp_lkind_sb(kind);
    const int64_t K = a->K, nsb = K / sb, units = sb / 32, sbb = hb + units * ub;
    const int32_t z = LN_Z(kind);
    float32x4_t acc[4][2], sacc[2][2]; /* [pair][rows 0-1, rows 2-3]; sacc: Q6_K's (NP <= 2) */
    for (int i = 0; i < NP; i++) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *h = gw + s * sbb;
        if (r0 == 0 && qd == 0) dp_lprefetch(h, hb);
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(h + 8 * qd)));
        const float32x4_t dp[2] = {vzip1q_f32(d, d), vzip2q_f32(d, d)};
        if (kind == DP_L_Q6_K)
            for (int i = 0; i < NP; i++) sacc[i][0] = sacc[i][1] = vdupq_n_f32(0.0f);
        for (int64_t b = 0; b < units; b++) {
            const uint8_t *unit = h + hb + b * ub;
            if (r0 == 0 && qd == 0) dp_lprefetch(unit, ub);
            uint8x16_t w[8], W[2][4];
            LN_SUFFIX(quarter)(kind, unit, qd, w);
            for (int p = 0; p < 4; p++) {
                const uint32x4_t e = vreinterpretq_u32_u8(w[2 * p]), o = vreinterpretq_u32_u8(w[2 * p + 1]);
                W[0][p] = vreinterpretq_u8_u32(vzip1q_u32(e, o));
                W[1][p] = vreinterpretq_u8_u32(vzip2q_u32(e, o));
            }
            const int64_t kb = s * units + b;
            /* Q6_K: its two int8 scales, applied in integers; Q4_K: d x sc and dmin x m in f32,
             * made once for all the pairs (no per-superblock accumulators: 4 pairs fit) */
            int32x4_t s0p[2] = {vdupq_n_s32(0), vdupq_n_s32(0)}, s1p[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
            float32x4_t scp[2] = {dp[0], dp[1]}, mnp[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
            if (kind == DP_L_Q6_K) {
                const int32x4_t s0 = LN_SUFFIX(i8x4_s32)(h + 32 + 16 * (2 * b) + 4 * qd);
                const int32x4_t s1 = LN_SUFFIX(i8x4_s32)(h + 32 + 16 * (2 * b + 1) + 4 * qd);
                s0p[0] = vzip1q_s32(s0, s0), s0p[1] = vzip2q_s32(s0, s0);
                s1p[0] = vzip1q_s32(s1, s1), s1p[1] = vzip2q_s32(s1, s1);
            } else if (kind == DP_L_Q4_K) {
                const float32x4_t sc = vmulq_f32(d, vcvtq_f32_s32(LN_SUFFIX(u8x4_s32)(h + 64 + 16 * b + 4 * qd)));
                const float32x4_t dm = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(h + 32 + 8 * qd)));
                const float32x4_t mn = vmulq_f32(dm, vcvtq_f32_s32(LN_SUFFIX(u8x4_s32)(h + 192 + 16 * b + 4 * qd)));
                scp[0] = vzip1q_f32(sc, sc), scp[1] = vzip2q_f32(sc, sc);
                mnp[0] = vzip1q_f32(mn, mn), mnp[1] = vzip2q_f32(mn, mn);
            }
            for (int i = 0; i < NP; i++) {
                const uint8_t *P = a->pairs + ((r0 / 2 + i) * (K / 32) + kb) * DP_LPAIR_BYTES;
                const int8x16_t X[4] = {vld1q_s8((const int8_t *)P), vld1q_s8((const int8_t *)P + 16),
                                        vld1q_s8((const int8_t *)P + 32), vld1q_s8((const int8_t *)P + 48)};
                const int32x4_t h0 = vld1q_s32((const int32_t *)(P + 64)), h1 = vld1q_s32((const int32_t *)(P + 80));
                const float32x4_t dxp = vld1q_f32((const float *)(P + 96));
                if (kind == DP_L_Q6_K) { /* two halves of 16 values, each with its scale */
                    const int32x4_t ia = vmulq_n_s32(h0, -32), ib = vmulq_n_s32(h1, -32);
                    for (int hf = 0; hf < 2; hf++) {
                        const int32x4_t ca = vusmmlaq_s32(vusmmlaq_s32(ia, W[hf][0], X[0]), W[hf][1], X[1]);
                        const int32x4_t cb = vusmmlaq_s32(vusmmlaq_s32(ib, W[hf][2], X[2]), W[hf][3], X[3]);
                        const int32x4_t v = vmlaq_s32(vmulq_s32(ca, s0p[hf]), cb, s1p[hf]);
                        sacc[i][hf] = vfmaq_f32(sacc[i][hf], vcvtq_f32_s32(v), dxp);
                    }
                    continue;
                }
                const int32x4_t init = z ? vmulq_n_s32(vaddq_s32(h0, h1), -z) : vdupq_n_s32(0);
                for (int hf = 0; hf < 2; hf++) {
                    int32x4_t c = vusmmlaq_s32(init, W[hf][0], X[0]);
                    c = vusmmlaq_s32(c, W[hf][1], X[1]);
                    c = vusmmlaq_s32(c, W[hf][2], X[2]);
                    c = vusmmlaq_s32(c, W[hf][3], X[3]);
                    acc[i][hf] = vfmaq_f32(acc[i][hf], vmulq_f32(scp[hf], dxp), vcvtq_f32_s32(c));
                    if (kind == DP_L_Q4_K) /* less dmin x m x dx x the block's sum */
                        acc[i][hf] = vfmsq_f32(acc[i][hf], mnp[hf], vld1q_f32((const float *)(P + 112)));
                }
            }
        }
        if (kind == DP_L_Q6_K)
            for (int i = 0; i < NP; i++)
                for (int hf = 0; hf < 2; hf++) acc[i][hf] = vfmaq_f32(acc[i][hf], dp[hf], sacc[i][hf]);
    }
    for (int i = 0; i < NP; i++) { /* lanes (row, act): even lanes are act a's, odd b's */
        vst1q_f32(out + (r0 + 2 * i) * ldo + 4 * qd, vuzp1q_f32(acc[i][0], acc[i][1]));
        vst1q_f32(out + (r0 + 2 * i + 1) * ldo + 4 * qd, vuzp2q_f32(acc[i][0], acc[i][1]));
    }
}
#endif

static inline __attribute__((always_inline)) void LN_SUFFIX(groups)(const int kind, const uint8_t *w, int64_t g0,
                                                                    int64_t g1, const dp_lact *a, float *out,
                                                                    int64_t ldo) {
    const int64_t sb = dp_lkind_sb(kind);
    const int64_t gstride = a->K / sb * (dp_lkind_header(kind) + sb / 32 * dp_lkind_unit(kind));
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *gw = w + g * gstride;
        float *o = out + 16 * g;
        if (a->R == 1) { /* decode: one pass, each load of a step serving its four quarters */
            LN_SUFFIX(row)(kind, gw, a, o);
            continue;
        }
        for (int qd = 0; qd < 4; qd++) {
            int64_t r = 0;
#if LN_MMLA /* a->pairs is there: dp_attn_ops.lact_pairs */
            if (kind != DP_L_Q6_K) /* 4 pairs share a quarter's unpacking (Q6_K's registers fit 2) */
                for (; r + 8 <= a->R; r += 8) LN_SUFFIX(mmla_pass)(kind, gw, qd, a, r, 4, o, ldo);
            for (; r + 4 <= a->R; r += 4) LN_SUFFIX(mmla_pass)(kind, gw, qd, a, r, 2, o, ldo);
            if (a->R - r >= 2) {
                LN_SUFFIX(mmla_pass)(kind, gw, qd, a, r, 1, o, ldo);
                r += 2;
            }
#endif
            for (; r + 4 <= a->R; r += 4) LN_SUFFIX(quarter_pass)(kind, gw, qd, a, r, 4, o, ldo);
            switch (a->R - r) {
            case 3: LN_SUFFIX(quarter_pass)(kind, gw, qd, a, r, 3, o, ldo); break;
            case 2: LN_SUFFIX(quarter_pass)(kind, gw, qd, a, r, 2, o, ldo); break;
            case 1: LN_SUFFIX(quarter_pass)(kind, gw, qd, a, r, 1, o, ldo); break;
            default: break;
            }
        }
    }
}

/* One function a kind, not inlined into the ISA's entry: a profile (and `dualpath bench arm`'s
 * attribution by symbol) then tells the kinds apart. */
#define LN_KIND_FN(KIND, NAME)                                                                          \
    static __attribute__((noinline)) void LN_SUFFIX(NAME)(const uint8_t *w, int64_t g0, int64_t g1,   \
                                                          const dp_lact *a, float *out, int64_t ldo) { \
        LN_SUFFIX(groups)(KIND, w, g0, g1, a, out, ldo);                                              \
    }
LN_KIND_FN(DP_L_Q4_K, lrows_q4_k)
LN_KIND_FN(DP_L_Q6_K, lrows_q6_k)
LN_KIND_FN(DP_L_Q5_0, lrows_q5_0)
LN_KIND_FN(DP_L_Q8_0, lrows_q8_0)
LN_KIND_FN(DP_L_Q4_0, lrows_q4_0)
#undef LN_KIND_FN

static void LN_SUFFIX(lrows)(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                             int64_t ldo) {
    switch (kind) {
    case DP_L_Q4_K: LN_SUFFIX(lrows_q4_k)(w, g0, g1, a, out, ldo); return;
    case DP_L_Q6_K: LN_SUFFIX(lrows_q6_k)(w, g0, g1, a, out, ldo); return;
    case DP_L_Q5_0: LN_SUFFIX(lrows_q5_0)(w, g0, g1, a, out, ldo); return;
    case DP_L_Q8_0: LN_SUFFIX(lrows_q8_0)(w, g0, g1, a, out, ldo); return;
    default: LN_SUFFIX(lrows_q4_0)(w, g0, g1, a, out, ldo); return;
    }
}
