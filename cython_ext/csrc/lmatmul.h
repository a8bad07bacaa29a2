/* A layer's matrix products in our kernels, over GGML's quantized blocks rearranged so
 * that one vector load serves 16 rows of the weight (the "form" below), read in place
 * from the model cache entry's mapping.
 *
 * ONNX Runtime's MatMulNBits packs its own copy of each weight, and the GGML types that
 * phones' files use most map onto it at 7-13.5 bits a value (Q4_K at 7, plus 1 for its
 * mins; Q5_0 and Q8_0 at 10.7; Q6_K at 13.5) against the file's 4.5-8.5
 * (docs/performance.md, memory). Decode streams every weight once per token, so those
 * bits are its time, and the packed copy is most of the resident memory. This form keeps
 * the file's bits: 4.625 (Q4_K), 6.56 (Q6_K), 5.5 (Q5_0), 8.5 (Q8_0), 4.5 (Q4_0), and is
 * exact (the same values, scales and mins as the file; only the order changes).
 *
 * Form of a weight of N rows (a multiple of 16) and K columns (a multiple of the kind's
 * superblock SB: 256 for the K-quants, 32 for the others): N / 16 groups of 16 rows, one
 * after the other; a group is K / SB superblocks, each a header and SB / 32 units of 16
 * rows x 32 values. In a unit, step j (0..7) is the values 4j..4j+3 of each row, row l's
 * four in bytes 4l..4l+3 of a 64-byte vector:
 *
 *   nibble plane (256 B): step j's low 4 bits in byte 64 (j / 2) + 4l + i, low nibble for
 *                         even j, high nibble for odd j
 *   Q5_0 bit 4 (64 B):    step j's in the 64-bit word j, bit 4l + i
 *   Q6_K bits 4-5 (128 B): step j's in byte 64 (j / 4) + 4l + i, bits 2 (j % 4) and up
 *   Q8_0 (512 B):         step j's 64 bytes at 64 j, value q + 128
 *
 *   kind   SB   header (f16 d and dmin: one per row; sc, m: [block][row])      unit bytes
 *   Q4_K   256  d[16] dmin[16] sc[8][16] u8 m[8][16] u8  (320 B)               256
 *   Q6_K   256  d[16] sc[16][16] int8, per 16 values (288 B)                   256 + 128
 *   Q5_0   32   d[16] (32 B)                                                   256 + 64
 *   Q8_0   32   d[16]                                                          512
 *   Q4_0   32   d[16]                                                          256
 *
 * A row's value is s * (u - z) (Q4_K: s * u - dmin * m), u the stored unsigned value:
 *   Q4_K  s = d * sc                    Q6_K  s = d * sc, z = 32 (per 16 values)
 *   Q5_0  s = d, z = 16                 Q8_0  s = d, z = 128        Q4_0  s = d, z = 8
 *
 * Activations are quantized per block of 32 to int8, d = max|x| / 127 (as llama.cpp's
 * Q8_0 and MatMulNBits at accuracy level 4 do), or per 256 for a prefill of Q4_K weights on
 * an ISA that folds their scales (dp_lact.sb256; llama.cpp's Q8_K); the offsets z and the
 * mins take the activations' sums per 16, so that the inner products run on the unsigned
 * values. */
#ifndef DP_LMATMUL_H
#define DP_LMATMUL_H

#include "dp_common.h"

enum dp_lkind { DP_L_Q4_K = 0, DP_L_Q6_K = 1, DP_L_Q5_0 = 2, DP_L_Q8_0 = 3, DP_L_Q4_0 = 4, DP_L_NUM_KINDS };

typedef struct {
    const char *name;     /* the GGML type it holds, as gguf-py spells it */
    int64_t sb;           /* values per superblock (and per GGML block) */
    int64_t ggml_bytes;   /* bytes per GGML block */
    int64_t header;       /* bytes of a superblock's header (16 rows) */
    int64_t unit;         /* bytes of a unit (16 rows x 32 values) */
} dp_lkind_info;

extern const dp_lkind_info dp_lkinds[DP_L_NUM_KINDS];

/* The offset z of a kind's stored values (Q4_K has mins instead: 0). Inline, so that a
 * kernel instantiated per kind folds it to a constant. */
static inline int dp_lkind_zero_point(int kind) {
    return kind == DP_L_Q6_K ? 32 : kind == DP_L_Q5_0 ? 16 : kind == DP_L_Q8_0 ? 128 : kind == DP_L_Q4_0 ? 8 : 0;
}

/* A kind's sizes (dp_lkind_info's sb, header, unit), as constant expressions of the kind:
 * dp_lkinds is made from them, and a kernel instantiated per kind knows them at compile
 * time (dp_lkinds itself lives in lmatmul.c). */
#define dp_lkind_sb(kind) ((int64_t)((kind) == DP_L_Q4_K || (kind) == DP_L_Q6_K ? 256 : 32))
#define dp_lkind_header(kind) ((int64_t)((kind) == DP_L_Q4_K ? 320 : (kind) == DP_L_Q6_K ? 288 : 32))
#define dp_lkind_unit(kind) \
    ((int64_t)((kind) == DP_L_Q6_K ? 384 : (kind) == DP_L_Q5_0 ? 320 : (kind) == DP_L_Q8_0 ? 512 : 256))

/* Every cache line of [p, p + bytes) prefetched this far ahead, a line at a time: a decode
 * product streams its weight from DRAM once, and the hardware prefetchers alone held it
 * well below the machine's read bandwidth (2 KiB ahead came closest; 1 KiB, 3 KiB and more
 * were slower; docs/performance-log.md). Past the end of the weight it touches nothing:
 * a prefetch does not fault. */
#define DP_LMATMUL_PREFETCH 2048

/* Groups of a task that an x86 decode product (one activation row) reads side by side,
 * a stream each: four for the K-quants, whose superblocks run 8 units of a group on end;
 * one for Q8_0 and Q5_0, a 32-byte header and one unit a superblock, where four streams
 * were slower than one (a tied Q8_0 classifier most of all; docs/performance-log.md). */
#define DP_LSTREAMS(kind) ((kind) == DP_L_Q8_0 || (kind) == DP_L_Q5_0 ? 1 : 4)

/* How far ahead a decode's streams prefetch, each: the one stream's distance shared out, so
 * that a thread has as many bytes on the way with 4 streams as with one (4 streams at 2 KiB
 * each were slower than at 512 bytes, with AVX2 and AVX-512; docs/performance-log.md). */
#define DP_LSTREAM_PREFETCH(kind) (DP_LMATMUL_PREFETCH / DP_LSTREAMS(kind))

static inline __attribute__((always_inline)) void dp_lprefetch_ahead(const uint8_t *p, int64_t bytes, int64_t ahead) {
    /* bytes and ahead are constants where the kernels call it: one prefetch a line, no loop */
#pragma GCC unroll 16
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + ahead + o, 0, 3);
}

static inline __attribute__((always_inline)) void dp_lprefetch(const uint8_t *p, int64_t bytes) {
    dp_lprefetch_ahead(p, bytes, DP_LMATMUL_PREFETCH);
}

/* FN(kind, ...) with kind a constant for each kind: an ISA's loop is inlined once per kind,
 * its branches on the kind folded away. */
#define DP_LKIND_DISPATCH(kind, FN, ...)                          \
    switch (kind) {                                               \
    case DP_L_Q4_K: FN(DP_L_Q4_K, __VA_ARGS__); return;           \
    case DP_L_Q6_K: FN(DP_L_Q6_K, __VA_ARGS__); return;           \
    case DP_L_Q5_0: FN(DP_L_Q5_0, __VA_ARGS__); return;           \
    case DP_L_Q8_0: FN(DP_L_Q8_0, __VA_ARGS__); return;           \
    default: FN(DP_L_Q4_0, __VA_ARGS__); return;                  \
    }

/* Bytes of the form of an N x K weight (0 if N or K is not whole groups or superblocks). */
int64_t dp_lform_bytes(int kind, int64_t N, int64_t K);

/* GGML blocks (N rows of K values, row-major, as in the file) -> the form. */
int dp_lform_from_ggml(int kind, const uint8_t *src, int64_t src_bytes, int64_t N, int64_t K, uint8_t *dst,
                       int64_t dst_bytes);

/* Rows ids[0..n) of the weight as f32 values, out (n, K): a tied embedding's lookup (the
 * values s * (u - z), Q4_K's s * u - dmin * m, each one f32 operation as gguf-py makes
 * them). DP_ERR_BOUNDS for an id outside [0, N) or a short buffer, before anything is
 * written. */
int dp_lform_rows(int kind, const uint8_t *w, int64_t w_len, int64_t N, int64_t K, const int64_t *ids, int64_t n,
                  float *out, int64_t out_len);

/* The activations of R rows of K values as the kernels take them: xq (R, K) int8,
 * xd (R, K / 32) f32, xs (R, K / 16) int32, the sums of each 16 of xq, and xm (R, K / 32)
 * f32, xd x the block's sum (Q4_K's mins take it: one broadcast a block, no int-to-float
 * conversion in the loop). For an ISA that
 * takes rows in pairs (dp_attn_ops.lact_pairs), also `pairs`: (R / 2, K / 32) records of
 * DP_LPAIR_BYTES, rows 2i and 2i + 1 of block kb (a, b below) as a 2 x 8 matrix multiply
 * wants them, and their per-block terms in its 2 x 2 output's lane order (a, b, a, b):
 *   int8  x[4][16]  x[p] = a's values 8p .. 8p + 7, then b's
 *   int32 s0[4]     the sums of the block's first 16 values: a, b, a, b
 *   int32 s1[4]     of its last 16
 *   f32   dx[4]     the block's scales
 *   f32   t[4]      dx x the block's sum (Q4_K's mins take it)
 * Made once per product, so that a pass over weights reads them instead of rebuilding them
 * for every group and quarter. NULL otherwise.
 * sb256: the activations were quantized with one scale per 256 values (dp_lact_quantize256),
 * repeated in xd over the superblock's 8 blocks, so that every kernel reads them as it reads
 * the others; an ISA with dp_attn_ops.lquant256 then sums a Q4_K superblock's products in
 * int32 with the weights' block scales folded in, and scales once per superblock instead of
 * once per block of 32 (llama.cpp's Q8_K activations do the same). */
typedef struct {
    const int8_t *xq;
    const float *xd;
    const int32_t *xs;
    int64_t R, K;
    const uint8_t *pairs;
    const float *xm;
    int sb256;
} dp_lact;

#define DP_LPAIR_BYTES 128

/* x (R, K) f32 -> xq, xd, xs, xm of dp_lact, one block of 32 at a time (blocks are
 * independent: rows [r0, r1) are the call on x + r0 K, xq + r0 K, xd + r0 K / 32, ...). The
 * scalar reference: d = amax / 127, inv = 1 / d (0 for d = 0), q = rintf(v * inv). */
void dp_lact_quantize(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm);
/* The same with one scale per 256 values (K a multiple of 256): d = amax / 127 over the 256,
 * written to each of their 8 blocks' xd; q, xs and xm per block of 32 as above. */
void dp_lact_quantize256(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm);
/* An ISA's quantizer (dp_attn_ops.lquant): the same bytes as dp_lact_quantize for every
 * input. The vector ones round with the CPU's round-to-nearest-even conversion, rintf's
 * under the default rounding mode, where every |v * inv| < 127.5 (the finite blocks); a
 * block with an infinity or NaN, or so tiny that 1 / d overflows, goes to the reference. */
typedef void (*dp_lquant_fn)(const float *x, int64_t R, int64_t K, int8_t *xq, float *xd, int32_t *xs, float *xm);
void dp_lquant_avx2(const float *, int64_t, int64_t, int8_t *, float *, int32_t *, float *);
void dp_lquant_avx512(const float *, int64_t, int64_t, int8_t *, float *, int32_t *, float *);
void dp_lquant_neon(const float *, int64_t, int64_t, int8_t *, float *, int32_t *, float *);
void dp_lquant256_avx2(const float *, int64_t, int64_t, int8_t *, float *, int32_t *, float *);
/* The pairs records of dp_lact from its xq, xd, xs (R >= 2): out (R / 2, K / 32, 128 B). */
void dp_lact_pairs(const dp_lact *a, uint8_t *out);

/* out[r * ldo + 16 g + l] = row 16 g + l of the weight times activation row r, for the
 * groups [g0, g1) of a weight of kind `kind` in the form. An ISA's entry trusts its
 * arguments (dp_lmatmul checks them). */
typedef void (*dp_lrows_fn)(int kind, const uint8_t *w, int64_t g0, int64_t g1, const dp_lact *a, float *out,
                            int64_t ldo);

void dp_lrows_generic(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_avx2(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_avx_vnni(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_avx512(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_avx512_vnni(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_neon(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_neon_dotprod(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);
void dp_lrows_neon_i8mm(int, const uint8_t *, int64_t, int64_t, const dp_lact *, float *, int64_t);

/* One weight of a product: its form, its rows, and where its output columns go. */
typedef struct {
    int kind;
    const uint8_t *w;
    int64_t w_len, N;
    float *out;        /* (R, ldo): columns [0, N) written */
    int64_t out_len, ldo;
} dp_ljob;

#endif
