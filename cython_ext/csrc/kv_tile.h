/* Inside kv_arena.c and kv_attn.c only: where a tile's rows and scales sit (the layout
 * kv_arena.h describes), and the arena's checks and writes that a layer step
 * (dp_step_batch, kv_attn.c) runs before its attention. */
#ifndef DP_KV_TILE_H
#define DP_KV_TILE_H

#include "kv_arena.h"

/* tile_bytes(P) of kv_arena.h for this arena. */
static inline int64_t tile_bytes(const dp_arena *a, int64_t P) {
    return 2 * a->num_kv_heads * P * (a->head_dim * a->elem_bytes + a->scale_bytes);
}

/* Byte offset of V row `row` of kv head `h` inside a tile of P tokens. */
static inline int64_t v_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h) {
    return (a->num_kv_heads * P * a->head_dim + (h * P + row) * a->head_dim) * a->elem_bytes;
}

/* Byte offset of K element (token `row`, dim 0) of kv head `h`; dim e is e * P further. */
static inline int64_t k_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h) {
    return (h * a->head_dim * P + row) * a->elem_bytes;
}

/* q8: byte offsets of the f32 scales of K row (token `row`, kv head `h`) and of its V row,
 * behind the tile's values: K scales (num_kv_heads, P), then V scales (num_kv_heads, P). */
static inline int64_t ks_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h) {
    return 2 * a->num_kv_heads * P * a->head_dim + (h * P + row) * (int64_t)sizeof(float);
}
static inline int64_t vs_offset(const dp_arena *a, int64_t P, int64_t row, int64_t h) {
    return 2 * a->num_kv_heads * P * a->head_dim + ((a->num_kv_heads + h) * P + row) * (int64_t)sizeof(float);
}

/* Slots (num_tokens, 3), layer, k, v and their row stride checked for a write:
 * DP_OK or the status dp_kv_write_slots returns. */
int dp_kv_check_write(const dp_arena *a, int64_t layer, const float *k, const float *v, int64_t stride,
                      const int64_t *slots, int64_t num_tokens);
/* The writes of dp_kv_write_slots, every slot already checked (dp_kv_check_write). */
void dp_kv_write_rows(const dp_arena *a, const dp_attn_ops *ops, int64_t layer, const float *k, const float *v,
                      int64_t stride, const int64_t *slots, int64_t num_tokens);
/* Spans (num_spans, 3) inside the layer region, in whole tiles, holding at least
 * `need` tokens: DP_OK, DP_ERR_BOUNDS or DP_ERR_ALIGN. */
int dp_kv_check_spans(const dp_arena *a, const int64_t *spans, int64_t num_spans, int64_t need);

#endif
