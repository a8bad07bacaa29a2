/* GGML quantized blocks -> MatMulNBits (the contract is in ggml_repack.h, the mappings in
 * sdk/dualpath/models/quants.py). Scalar C99: it runs once per weight, at first load.
 *
 * Arithmetic follows gguf-py's numpy dequantization, which tests/models/ uses as the
 * oracle: fp16 fields widen exactly to fp32, every product and quotient is one fp32
 * operation written as its own statement (so that no compiler contracts two into an fma),
 * and the zero point rounds half to even (rintf in the default rounding mode, as np.rint). */
#include <math.h>
#include <string.h>
#include "ggml_repack.h"

enum { Q8_0, Q4_0, Q5_0, IQ4_NL, Q6_K, Q3_K, Q4_K, Q4_1, Q2_K, Q5_K, Q5_1, NUM_TYPES };

const dp_ggml_layout dp_ggml_layouts[] = {
    /*           name      block size bits sub zero_points */
    [Q8_0]   = {"Q8_0",    32,  34,  8, 32, 0},
    [Q4_0]   = {"Q4_0",    32,  18,  4, 32, 0},
    [Q5_0]   = {"Q5_0",    32,  22,  8, 32, 0},
    [IQ4_NL] = {"IQ4_NL",  32,  18,  8, 32, 0},
    [Q6_K]   = {"Q6_K",   256, 210,  8, 16, 0},
    [Q3_K]   = {"Q3_K",   256, 110,  4, 16, 0},
    [Q4_K]   = {"Q4_K",   256, 144,  4, 32, 1},
    [Q4_1]   = {"Q4_1",    32,  20,  4, 32, 1},
    [Q2_K]   = {"Q2_K",   256,  84,  4, 16, 1},
    [Q5_K]   = {"Q5_K",   256, 176,  8, 32, 1},
    [Q5_1]   = {"Q5_1",    32,  24,  8, 32, 1},
};
const int dp_num_ggml_layouts = NUM_TYPES;

/* IQ4_NL's non-linear 4-bit code book (GGML's kvalues_iq4nl). */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1, 13, 25, 38, 53, 69, 89, 113};

typedef struct {
    uint8_t u[256];  /* (block,) MatMulNBits values */
    float s[16];     /* (block / sub,) scales */
    float dm[16];    /* (block / sub,) mins: x = s * u - dm (zero-point layouts only) */
} decoded;

static float f16_at(const uint8_t *p) { return dp_half_to_float((uint16_t)(p[0] | p[1] << 8)); }

/* Blocks of 32: x[j] in the low nibble of qs[j] and x[j + 16] in the high one (j < 16);
 * with qh (4 bytes, a little-endian uint32) bit j is bit 4 of x[j]. */
static void nibbles32(const uint8_t *qs, const uint8_t *qh, uint8_t *u) {
    const uint32_t h = qh ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24
                          : 0;
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((qs[j] & 0x0f) | ((h >> j) & 1u) << 4);
        u[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1u) << 4);
    }
}

/* Q4_K / Q5_K: 128 bytes in 4 chunks of 32; x[64c + l] is the low nibble of qs[32c + l]
 * and x[64c + 32 + l] the high one. With qh (32 bytes), bit 4 of x[32i + l] is bit i
 * of qh[l]. */
static void nibbles256(const uint8_t *qs, const uint8_t *qh, uint8_t *u) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            u[64 * c + l] = qs[32 * c + l] & 0x0f;
            u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
    if (qh)
        for (int e = 0; e < 256; e++) u[e] |= (uint8_t)(((qh[e % 32] >> (e / 32)) & 1) << 4);
}

/* 2-bit fields of 64 bytes in 2 halves of 32: x[128h + 32k + l] is bits 2k..2k+1 of
 * q[32h + l] (Q2_K's and Q3_K's low bits, Q6_K's high bits). */
static uint8_t crumb(const uint8_t *q, int e) {
    return (uint8_t)((q[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
}

/* Q4_K / Q5_K: d, dmin (fp16), 12 bytes of eight 6-bit scales and mins. */
static void scales_k4(const uint8_t *in, decoded *o) {
    const float d = f16_at(in), dmin = f16_at(in + 2);
    const uint8_t *q = in + 4;
    for (int j = 0; j < 8; j++) {
        const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        const int m = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | (q[j] >> 6) << 4;
        o->s[j] = d * (float)sc;
        o->dm[j] = dmin * (float)m;
    }
}

/* Q6_K (210 bytes): ql[128] low nibbles, qh[64] high 2 bits, 16 int8 scales, d (fp16).
 * x[128h + 64s + i] takes nibble s of ql[64h + i]; x = d * sc * (q - 32), u = q + 96. */
static void decode_q6_k(const uint8_t *in, decoded *o) {
    const float d = f16_at(in + 208);
    for (int e = 0; e < 256; e++) {
        const uint8_t lo = (uint8_t)((in[64 * (e / 128) + e % 64] >> (4 * ((e % 128) / 64))) & 0x0f);
        o->u[e] = (uint8_t)((lo | crumb(in + 128, e) << 4) + 96);
    }
    for (int j = 0; j < 16; j++) o->s[j] = d * (float)(int8_t)in[192 + j];
}

/* Q3_K (110 bytes): hmask[32], qs[64] low 2 bits, 12 bytes of sixteen 6-bit scales, d.
 * q = low - (hmask bit ? 0 : 4), the hmask bit of x[32i + l] being bit i of hmask[l];
 * scale j = low nibble of byte j (j < 8) or high nibble of byte j - 8, with bits 4..5
 * from bits 2(j / 4) of byte 8 + j % 4; x = d * (sc - 32) * q, u = q + 8. */
static void decode_q3_k(const uint8_t *in, decoded *o) {
    const float d = f16_at(in + 108);
    const uint8_t *sc = in + 96;
    for (int e = 0; e < 256; e++)
        o->u[e] = (uint8_t)(crumb(in + 32, e) + (((in[e % 32] >> (e / 32)) & 1) ? 8 : 4));
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? sc[j] & 0x0f : sc[j - 8] >> 4;
        const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        o->s[j] = d * (float)((lo | hi << 4) - 32);
    }
}

/* Q2_K (84 bytes): 16 scale bytes (scale low nibble, min high nibble), qs[64], d, dmin. */
static void decode_q2_k(const uint8_t *in, decoded *o) {
    const float d = f16_at(in + 80), dmin = f16_at(in + 82);
    for (int e = 0; e < 256; e++) o->u[e] = crumb(in + 16, e);
    for (int j = 0; j < 16; j++) {
        o->s[j] = d * (float)(in[j] & 0x0f);
        o->dm[j] = dmin * (float)(in[j] >> 4);
    }
}

/* Blocks of 32 with one fp16 scale d first: Q8_0 (x = d * q, int8 q), Q4_0 (x = d * (n - 8)),
 * Q5_0 (qh[4] then qs: x = d * (q - 16)), IQ4_NL (x = d * kvalues[n]), and with the fp16
 * min m second Q4_1 (x = d * n + m) and Q5_1 (qh[4] then qs). */
static void decode_32(int type, const uint8_t *in, decoded *o) {
    o->s[0] = f16_at(in);
    switch (type) {
    case Q8_0:
        for (int i = 0; i < 32; i++) o->u[i] = in[2 + i] ^ 0x80;   /* int8 q -> q + 128 */
        return;
    case Q4_0: nibbles32(in + 2, NULL, o->u); return;
    case Q5_0:
        nibbles32(in + 6, in + 2, o->u);
        for (int i = 0; i < 32; i++) o->u[i] += 112;              /* q - 16 + 128 */
        return;
    case IQ4_NL:
        nibbles32(in + 2, NULL, o->u);
        for (int i = 0; i < 32; i++) o->u[i] = (uint8_t)(iq4nl_values[o->u[i]] + 128);
        return;
    case Q4_1: nibbles32(in + 4, NULL, o->u); break;
    default: nibbles32(in + 8, in + 4, o->u); break;             /* Q5_1 */
    }
    o->dm[0] = -f16_at(in + 2);
}

static void decode(int type, const uint8_t *in, decoded *o) {
    switch (type) {
    case Q6_K: decode_q6_k(in, o); return;
    case Q3_K: decode_q3_k(in, o); return;
    case Q2_K: decode_q2_k(in, o); return;
    case Q4_K: case Q5_K:
        scales_k4(in, o);
        if (type == Q4_K) nibbles256(in + 16, NULL, o->u);
        else nibbles256(in + 48, in + 16, o->u);
        return;
    default: decode_32(type, in, o); return;
    }
}

/* z = round(dm / s) clamped to [0, 2^bits - 1] (0 when s == 0), and mins = dm - z * s. */
static uint8_t zero_point(float s, float dm, int bits, float *min_out) {
    uint8_t z = 0;
    if (s != 0.0f) {
        const float q = dm / s;
        const float r = rintf(q);
        const float zmax = (float)((1 << bits) - 1);
        z = (uint8_t)(r >= 0.0f ? (r <= zmax ? r : zmax) : 0.0f);
    }
    const float zs = (float)z * s;
    *min_out = dm - zs;
    return z;
}

int dp_repack_ggml(const uint8_t *src, int64_t src_bytes, int type, int64_t rows, int64_t cols,
                   uint8_t *blob, int64_t blob_bytes, float *scales, int64_t num_scales,
                   uint8_t *zero_points, int64_t zero_point_bytes, float *mins, int64_t num_mins) {
    if (type < 0 || type >= NUM_TYPES || !src || !blob || !scales || rows < 0 || cols <= 0) return DP_ERR_ARG;
    const dp_ggml_layout *L = &dp_ggml_layouts[type];
    if (cols % L->block || rows > INT64_MAX / 4 / cols || (L->zero_points && (!zero_points || !mins)))
        return DP_ERR_ARG;
    const int64_t row_blocks = cols / L->block, subs = L->block / L->sub, nb = cols / L->sub;
    const int64_t out_block = L->block * L->bits / 8, zp_row = (nb * L->bits + 7) / 8;
    if (src_bytes < rows * row_blocks * L->type_size || blob_bytes < rows * row_blocks * out_block ||
        num_scales < rows * nb)
        return DP_ERR_BOUNDS;
    if (L->zero_points && (zero_point_bytes < rows * zp_row || num_mins < rows * nb)) return DP_ERR_BOUNDS;
    decoded d;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *zp = L->zero_points ? zero_points + r * zp_row : NULL;
        if (zp) memset(zp, 0, (size_t)zp_row);
        for (int64_t b = 0; b < row_blocks; b++) {
            const int64_t k = r * row_blocks + b;   /* block index; its first scale is k * subs */
            decode(type, src + k * L->type_size, &d);
            uint8_t *out = blob + k * out_block;
            if (L->bits == 8)
                memcpy(out, d.u, (size_t)L->block);
            else
                for (int64_t m = 0; m < L->block / 2; m++) out[m] = (uint8_t)(d.u[2 * m] | d.u[2 * m + 1] << 4);
            for (int64_t j = 0; j < subs; j++) {
                scales[k * subs + j] = d.s[j];
                if (!zp) continue;
                const uint8_t z = zero_point(d.s[j], d.dm[j], L->bits, &mins[k * subs + j]);
                const int64_t i = b * subs + j;     /* the zero point's index in its row */
                if (L->bits == 8) zp[i] = z;
                else zp[i / 2] |= (uint8_t)(z << (4 * (i % 2)));
            }
        }
    }
    return DP_OK;
}
