/* GGML quantized blocks -> ONNX Runtime MatMulNBits weights (models/quants.py states the
 * mappings and why; this is their one implementation).
 *
 * Shape contract, for a weight of rows x cols values (cols a multiple of the type's block):
 *   src:         rows * cols / block GGML blocks of type_size bytes, row-major
 *   blob:        uint8 (rows, cols / sub, sub * bits / 8): values u < 2^bits, element 2m in
 *                the low nibble of byte m when bits == 4
 *   scales:      f32 (rows * cols / sub,): one per MatMulNBits block
 *   zero_points: uint8 (rows, ceil(cols / sub * bits / 8)), packed like blob, each row padded
 *                with zero nibbles; only for layouts with zero_points, else unused (may be NULL)
 *   mins:        f32 (rows, cols / sub): dm - z * s, what the graph subtracts; only with
 *                zero_points, else unused (may be NULL)
 * Every size is checked before anything is written (DP_ERR_BOUNDS); an unknown type, a
 * cols that is not whole blocks or a missing buffer is DP_ERR_ARG. */
#ifndef DP_GGML_REPACK_H
#define DP_GGML_REPACK_H

#include "dp_common.h"

typedef struct {
    const char *name;   /* GGML type name, as gguf-py spells it: "Q4_K" */
    int64_t block;      /* values per GGML block */
    int64_t type_size;  /* bytes per GGML block */
    int bits;           /* MatMulNBits bits: 4 or 8 */
    int64_t sub;        /* MatMulNBits block_size: values per scale (16 or 32) */
    int zero_points;    /* 1: uint8 zero points and mins; 0: the implicit offset 2^(bits-1) */
} dp_ggml_layout;

/* Every type dp_repack_ggml converts, indexed by its `type` argument. */
extern const dp_ggml_layout dp_ggml_layouts[];
extern const int dp_num_ggml_layouts;

int dp_repack_ggml(const uint8_t *src, int64_t src_bytes, int type, int64_t rows, int64_t cols,
                   uint8_t *blob, int64_t blob_bytes, float *scales, int64_t num_scales,
                   uint8_t *zero_points, int64_t zero_point_bytes, float *mins, int64_t num_mins);

#endif
