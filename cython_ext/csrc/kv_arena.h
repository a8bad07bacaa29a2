/* The dual-path KV arena: one aligned allocation, cut into blocks, read through tiles.
 *
 * Memory: num_layers regions of num_blocks * block_size bytes each. Block b of
 * layer l starts at base + l * layer_bytes + b * block_size. Every layer advances
 * through the same block ids, so one block table per sequence serves all layers.
 *
 * A *tile* holds P tokens of one layer in the layout a kernel streams:
 *     K: (num_kv_heads, head_dim, P) -- transposed: one dimension of P tokens is
 *        contiguous, so decode scores P tokens per vector with no reductions --
 *     then V: (num_kv_heads, P, head_dim), kv dtype
 *     then, for a dtype with scales (q8), K scales: (num_kv_heads, P) f32 and V scales: (num_kv_heads, P) f32
 * tile_bytes(P) = 2 * num_kv_heads * P * (head_dim * elem_bytes + scale_bytes).
 *
 * DP_KV_Q8 (kv_dtype q8): element (token t, head h, dim e) = scale[h, t] * int8 value,
 * symmetric, scale = max_e |x[e]| / 127 of that token's row of that head, values
 * round(x / scale) in [-127, 127] (0 and scale 0 for an all-zero row); the error of
 * an element is at most scale / 2. Against llama.cpp's q8_0 cache type (blocks of
 * 32 values along head_dim with an f16 scale, 34 bytes per 32 values):
 *   - one scale per (token, KV head) row instead of per 32 dims: K is stored
 *     transposed, so a scores kernel runs along tokens and reduces over dims; a
 *     scale per row factors out of the dot product (score = scale * (q . k_int8),
 *     one multiply per token), and in the V pass it folds into the softmax weight
 *     (one multiply per token and query head), while a scale per 32 dims would cut
 *     every dot product into blocks. The price: a row with an outlier dim quantizes
 *     its other dims more coarsely than 32-blocks would (quality: README.md).
 *   - the scale in f32, not f16: it is stored exactly as the quantizer used it (no
 *     second rounding, no f16 underflow for rows below 6e-5 * 127), and the kernels
 *     use it without conversion. It costs 2 bytes per row more than an f16 scale:
 *     68 bytes per 64 values (8.5 bits, as q8_0), 132 per 128 (8.25 bits), 53% and
 *     52% of f16's bytes.
 *   - the scales sit in the tile behind the values, so a tile is still the unit the
 *     two paths address (pages and extents work unchanged) and a kernel reads a
 *     run's values and scales from the same few pages. They are 4-byte aligned
 *     because DP_KV_Q8 needs an even head_dim (2 * num_kv_heads * P * head_dim is then a
 *     multiple of 4, and so is tile_bytes).
 *   Values are quantized once, on write (dp_kv_write_slots, the same scalar code for
 *   every ISA, so storage never depends on the kernel); the kernels widen int8 to f32
 *   and use f32 FMAs, exact relative to the dequantized values.
 * The random path uses tiles of page_tokens (pages, several per block); the
 * sequential path uses one tile per block (P = tokens_per_block), so a head's K
 * rows run contiguously for a whole block. One kernel reads both.
 *
 * A *slot* (where one token is written) is int64[3]: (tile byte offset inside a
 * layer region, row inside the tile, P).
 * A *span* (kernel view) is int64[3]: (byte offset of its first tile, num_tokens, P);
 * its tokens fill consecutive tiles of tile_bytes(P) in position order.
 * A tile starts at a multiple of tile_bytes(P) inside its block and, when it fits
 * in a block, ends in the same block; one that does not fit starts a block. A slot
 * or span breaking this is DP_ERR_ALIGN; one outside the layer region (or a row
 * outside its tile) is DP_ERR_BOUNDS.
 *
 * Every call checks all its slots (and spans) before it writes anything: a call
 * that fails leaves the arena as it was.
 */
#ifndef DP_KV_ARENA_H
#define DP_KV_ARENA_H

#include "dp_common.h"
#include "dp_attn_ops.h"

/* A KV dtype's storage traits, the same for every ISA (its kernels are each ISA's
 * dp_attn_ops.kv entry): dp_kv_types[kv_dtype], one entry per enum dp_kv_dtype. */
typedef struct {
    const char *name;           /* as configs and the CLI spell it */
    const char *doc;            /* what an element is, for `dualpath info` and --help */
    int64_t elem_bytes;         /* bytes per value */
    int64_t scale_bytes;        /* per (token, KV head) row of K and of V: sizeof(float) for an f32
                                 * scale behind the tile's values, or 0 */
    int64_t head_dim_multiple;  /* head_dim must be a multiple of it (q8: 2, scales 4-byte aligned) */
    /* Store a row of n f32 values x: element i at dst + i * stride elements. Returns
     * its scale (0 without scales). ops converts f32 -> f16 (the ISA's, bit-exact). */
    float (*store_row)(const dp_attn_ops *ops, const float *x, int64_t n, char *dst, int64_t stride);
    /* f32 values of a stored row: dst[i] = the element at src + i * stride elements,
     * times scale with scales. */
    void (*load_row)(const char *src, int64_t n, int64_t stride, float scale, float *dst);
} dp_kv_type;
extern const dp_kv_type dp_kv_types[DP_KV_NUM_DTYPES];

typedef struct {
    char *base;            /* (num_layers, num_blocks, block_size) bytes, 2 MiB aligned */
    int64_t block_size;
    int64_t num_blocks;
    int64_t num_layers;
    int64_t num_kv_heads;
    int64_t head_dim;
    int kv_dtype;          /* enum dp_kv_dtype: the index of dp_kv_types */
    int64_t elem_bytes;    /* dp_kv_types[kv_dtype].elem_bytes */
    int64_t scale_bytes;   /* dp_kv_types[kv_dtype].scale_bytes */
    int64_t layer_bytes;   /* num_blocks * block_size */
    int hugepages;         /* 1 when madvise(MADV_HUGEPAGE) was accepted */
    int numa_node;         /* node the arena is bound to, -1 when not bound */
} dp_arena;

int dp_arena_init(dp_arena *a, int64_t block_size, int64_t num_blocks, int64_t num_layers,
                  int64_t num_kv_heads, int64_t head_dim, int kv_dtype, int numa_node);
void dp_arena_free(dp_arena *a);
/* tile_bytes(P) of an arena of this shape and dtype (the one formula, for callers
 * that size pages before they have an arena); -1 for an unknown dtype or a size
 * that overflows. */
int64_t dp_kv_tile_bytes(int kv_dtype, int64_t num_kv_heads, int64_t head_dim, int64_t P);

/* Check slots (num_tokens, 3) against the arena: DP_OK, or the status of the first
 * bad slot and its index in *bad (-1 when every slot is good; bad may be NULL). */
int dp_kv_check_slots(const dp_arena *a, const int64_t *slots, int64_t num_tokens, int64_t *bad);

/* Write num_tokens rows of K and V (each (num_tokens, num_kv_heads * head_dim) f32,
 * row stride `stride` floats) of `layer` at `slots` (num_tokens, 3); f32 -> f16
 * conversion through `ops` (NULL = generic), f32 -> q8 quantization in scalar C (the
 * same bytes whichever ops). Every slot is checked first. */
int dp_kv_write_slots(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *k,
                      const float *v, int64_t stride, const int64_t *slots, int64_t num_tokens);

/* Copy every layer's K and V (and their scales) of num_tokens tokens from src slots to
 * dst slots (every slot of both checked first). */
int dp_kv_copy_slots(const dp_arena *a, const int64_t *src, const int64_t *dst, int64_t num_tokens);

/* Copy whole tiles of P tokens, every layer, between the arena and buf, which is
 * (num_tiles, num_layers, tile_bytes(P)) bytes: to_arena 0 reads the tiles at `offsets`
 * into buf, 1 writes buf over them (the on-disk prefix cache stores pages as they are).
 * Every offset is checked first: a refused call copies nothing. */
int dp_kv_tiles_io(const dp_arena *a, const int64_t *offsets, int64_t num_tiles, int64_t P, void *buf,
                   int to_arena);

/* Give the memory of whole tiles of P tokens back to the OS in the layers with
 * layers[l] != 0 (num_layers flags): the OS pages inside each tile (madvise
 * MADV_DONTNEED; a tile smaller than an OS page gives nothing back). A released
 * row reads as zeros until written again: for sliding-window layers, whose kernels
 * mask every position before the window (kv_attn.c), so zeros there add nothing.
 * Every offset is checked first (as tiles): a refused call releases nothing. */
int dp_kv_release_tiles(const dp_arena *a, const uint8_t *layers, const int64_t *offsets, int64_t num_tiles,
                        int64_t P);

/* No transparent huge pages for the layers with layers[l] != 0 (madvise
 * MADV_NOHUGEPAGE over their regions): khugepaged would otherwise fill released
 * tiles back in, a whole huge page at a time. DP_OK also where the OS has no THP. */
int dp_kv_small_pages(const dp_arena *a, const uint8_t *layers);

/* Gather the first num_tokens tokens of `spans` of `layer` into dense f32 arrays
 * k_out, v_out: (num_kv_heads, num_tokens, head_dim), q8 dequantized (scale * value,
 * one f32 product). For tests and migration checks. */
int dp_kv_gather(const dp_arena *a, int64_t layer, const int64_t *spans, int64_t num_spans,
                 int64_t num_tokens, float *k_out, float *v_out);

#endif
