"""KVCacheManager unit tests on a tiny arena: exact page ids, block ids and orders.

Geometry used throughout (see ``make_cache``):
    block_bytes 4096, page_tokens P = 4, f32, 1 layer, 2 KV heads, head_dim 32
    -> 2 * 2 * 32 * 4 = 512 bytes per token per layer, page_bytes = 2048,
       pages_per_block = 2, so page p lives in block p // 2 and starts at byte p * 2048.
With locality_window = 8 a span counts as "long" from two full pages on.

Block tags at start: | 0 seq | 1 rand | 2 seq | 3 rand | ... |, so random pages come
from blocks 1, 3, 5 ... (pages 2, 3, 6, 7, 10, ...) and extents start on blocks 0, 2,
4 ... (pages 0, 1, 4, 5, 8, ...).

Tests read the manager's bookkeeping (page_ref, lru, free_blocks, ...) directly, as
vLLM's KVCacheManager tests read its BlockPool.
"""

from __future__ import annotations

import numpy as np

from dualpath.cache.manager import KVCacheManager, NoRoom
from dualpath.cache.policy import Path
from dualpath.config import KVCacheConfig

P = 4                          # tokens per page
PAGE_BYTES = 2048              # 2 (K, V) * 2 heads * 4 tokens * 32 dims * 4 bytes
NUM_KV_HEADS, HEAD_DIM = 2, 32
KV_DIM = NUM_KV_HEADS * HEAD_DIM


def make_cache(num_blocks: int = 8, **overrides) -> KVCacheManager:
    cfg = KVCacheConfig(**{"block_bytes": 4096, "page_tokens": P, "kv_dtype": "f32",
                            "locality_window": 8, **overrides})
    cache = KVCacheManager(cfg, num_layers=1, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                           num_blocks=num_blocks)
    assert (cache.page_bytes, cache.pages_per_block) == (PAGE_BYTES, 2)
    return cache


def kv_rows(tag: int, pos0: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V for positions [pos0, pos0 + num_tokens), each (num_tokens, KV_DIM) f32.
    Every (tag, position) gets distinct values, so a misplaced row is visible."""
    pos = np.arange(pos0, pos0 + num_tokens, dtype=np.float32)[:, None]
    k = tag * 1000.0 + pos + np.arange(KV_DIM, dtype=np.float32)[None, :] / 128.0
    return np.ascontiguousarray(k, np.float32), np.ascontiguousarray(-k, np.float32)


def put(cache: KVCacheManager, seq_id: int, tokens, path: Path | None, tag: int = 0):
    """Allocate room for ``tokens``, write their K/V (kv_rows(tag, ...)) and commit."""
    pos0 = cache.seqs[seq_id].num_tokens
    alloc = cache.allocate(seq_id, tokens, path)
    assert alloc, alloc
    k, v = kv_rows(tag, pos0, len(tokens))
    cache.arena.write(0, k, v, alloc.slots)
    cache.commit(seq_id)
    return alloc


def begin(cache: KVCacheManager, seq_id: int, prompt, path: Path | None, tag: int = 0) -> int:
    """start() then put() the part of the prompt not found in the cache; returns start()'s answer.
    Reused pages keep the K/V their writer put there, so tests sharing a prefix use one tag."""
    cached = cache.start(seq_id, prompt, path)
    if cached < len(prompt):
        put(cache, seq_id, prompt[cached:], path, tag)
    return cached


def read(cache: KVCacheManager, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The sequence's K and V read back through its kernel view, each (num_tokens, KV_DIM)."""
    n = cache.seqs[seq_id].num_tokens
    k, v = cache.arena.gather(0, cache.spans(seq_id), n)  # (num_kv_heads, n, head_dim)
    return k.transpose(1, 0, 2).reshape(n, KV_DIM), v.transpose(1, 0, 2).reshape(n, KV_DIM)


def snapshot(cache: KVCacheManager) -> dict:
    """Every piece of bookkeeping an allocation may touch, copied."""
    return {
        "page_ref": list(cache.pool.page_ref),
        "page_hash": list(cache.prefix.page_hash),
        "free_blocks": sorted(cache.free_blocks),
        "rand_free": {b: list(s) for b, s in cache.pool.rand_free.items()},
        "block_state": list(cache.pool.block_state),
        "block_live": list(cache.pool.block_live),
        "extent_used": dict(cache.pool.extent_used),
        "lru": list(cache.prefix.lru),
        "table": dict(cache.prefix.table),
        "seqs": {i: (list(s.pages), list(s.tokens), list(s.blocks), list(s.hashes), s.committed, s.path)
                 for i, s in cache.seqs.items()},
        "counters": (cache.evictions, cache.migrations, cache.cow_copies,
                     cache.prefix_queries, cache.prefix_hit_pages),
    }


def spans_of(cache: KVCacheManager, seq_id: int) -> list[list[int]]:
    return cache.spans(seq_id).tolist()


# ---------------------------------------------------------------------------
# Interleaving: random pages on odd blocks, extents on even blocks
# ---------------------------------------------------------------------------

def test_random_pages_are_carved_from_odd_blocks_in_order():
    cache = make_cache()
    begin(cache, 0, list(range(100, 120)), Path.RANDOM)  # 20 tokens -> 5 pages
    assert cache.seqs[0].pages == [2, 3, 6, 7, 10]       # blocks 1, 1, 3, 3, 5
    assert cache.seqs[0].blocks == []
    assert sorted(cache.free_blocks) == [0, 2, 4, 6, 7]
    # Pages 2, 3 and 6, 7 are back to back inside their block: one span each.
    assert spans_of(cache, 0) == [[2 * PAGE_BYTES, 8, P], [6 * PAGE_BYTES, 8, P], [10 * PAGE_BYTES, 4, P]]
    cache.check_invariants()


def test_random_pages_take_even_blocks_once_odd_blocks_run_out():
    cache = make_cache(num_blocks=4)
    begin(cache, 0, list(range(100, 120)), Path.RANDOM)  # 5 pages, only 2 odd blocks
    assert cache.seqs[0].pages == [2, 3, 6, 7, 0]
    assert sorted(cache.free_blocks) == [2]
    cache.check_invariants()


def test_extents_start_on_even_blocks():
    cache = make_cache()
    begin(cache, 0, [1, 2, 3], Path.SEQUENTIAL)
    begin(cache, 1, [4, 5, 6], Path.SEQUENTIAL)
    begin(cache, 2, [7, 8, 9], Path.SEQUENTIAL)
    assert [cache.seqs[i].blocks for i in range(3)] == [[0], [2], [4]]
    assert [cache.seqs[i].pages for i in range(3)] == [[0], [4], [8]]
    assert sorted(cache.free_blocks) == [1, 3, 5, 6, 7]
    cache.check_invariants()


def test_extent_grows_in_place_over_free_odd_neighbour_into_one_span():
    cache = make_cache()
    begin(cache, 0, list(range(100, 116)), Path.SEQUENTIAL)  # 16 tokens -> 4 pages
    seq = cache.seqs[0]
    assert seq.pages == [0, 1, 2, 3]
    assert seq.blocks == [0, 1]
    assert spans_of(cache, 0) == [[0, 16, P]]
    put(cache, 0, [1, 2], Path.SEQUENTIAL)  # block 2 is free too: still one span, partial tail
    assert seq.pages == [0, 1, 2, 3, 4]
    assert seq.blocks == [0, 1, 2]
    assert spans_of(cache, 0) == [[0, 18, P]]


def test_extent_chains_a_new_extent_when_its_neighbour_is_taken():
    cache = make_cache()
    begin(cache, 0, list(range(100, 108)), Path.SEQUENTIAL)  # block 0: pages 0, 1
    begin(cache, 1, [7, 7, 7], Path.RANDOM)                   # block 1: page 2
    put(cache, 0, [1, 2, 3, 4, 5], Path.SEQUENTIAL)          # block 1 taken -> new extent on block 2
    seq = cache.seqs[0]
    assert seq.pages == [0, 1, 4, 5]
    assert seq.blocks == [0, 2]
    assert spans_of(cache, 0) == [[0, 8, P], [4 * PAGE_BYTES, 5, P]]
    cache.check_invariants()


def test_pages_of_one_extent_merge_into_one_span_including_a_partial_tail():
    cache = make_cache()
    begin(cache, 0, list(range(100, 110)), Path.SEQUENTIAL)  # pages 0, 1, 2 (2 tokens in 2)
    assert cache.seqs[0].pages == [0, 1, 2]
    assert spans_of(cache, 0) == [[0, 10, P]]


def test_spans_fills_a_caller_buffer():
    cache = make_cache()
    begin(cache, 0, list(range(100, 110)), Path.RANDOM)  # pages 2, 3, 6
    buf = np.full((8, 3), -1, np.int64)  # (max_spans, 3)
    out = cache.spans(0, out=buf)
    assert out.tolist() == [[2 * PAGE_BYTES, 8, P], [6 * PAGE_BYTES, 2, P]]
    assert np.shares_memory(out, buf)
    assert buf[2].tolist() == [-1, -1, -1]


# ---------------------------------------------------------------------------
# Prefix reuse
# ---------------------------------------------------------------------------

def test_prefix_hit_reuses_pages_and_bumps_refcount():
    cache = make_cache()
    prompt = list(range(1, 11))                             # 10 tokens
    assert begin(cache, 0, prompt, Path.HYBRID, tag=1) == 0
    assert cache.seqs[0].pages == [0, 1, 2]                 # extent on blocks 0, 1
    assert cache.prefix.table == {cache.seqs[0].hashes[0]: 0, cache.seqs[0].hashes[1]: 1}
    assert cache.start(1, prompt[:8] + [50, 51, 52], Path.HYBRID) == 8
    assert cache.seqs[1].pages == [0, 1]
    assert cache.pool.page_ref[:4] == [2, 2, 1, 0]
    assert (cache.prefix_queries, cache.prefix_hit_pages) == (1 + 2, 2)
    put(cache, 1, [50, 51, 52], Path.HYBRID, tag=2)
    assert cache.seqs[1].pages == [0, 1, 4]                 # block 1 is seq 0's: new extent on block 2
    k0, _ = read(cache, 0)
    k1, _ = read(cache, 1)
    np.testing.assert_array_equal(k1[:8], k0[:8])
    np.testing.assert_array_equal(k1[8:], kv_rows(2, 8, 3)[0])
    cache.check_invariants()


def test_prefix_hit_never_reuses_the_page_of_the_last_prompt_token():
    cache = make_cache()
    prompt = list(range(1, 9))                              # 8 tokens: exactly 2 pages
    begin(cache, 0, prompt, Path.RANDOM)
    assert cache.seqs[0].pages == [2, 3]
    assert len(cache.prefix.table) == 2
    # Both pages are cached, but the last token must run through the model for logits.
    assert cache.start(1, prompt, Path.RANDOM) == 4
    assert cache.seqs[1].pages == [2]
    assert cache.pool.page_ref[2:4] == [2, 1]
    # One more token and the second page can be reused.
    assert cache.start(2, prompt + [9], Path.RANDOM) == 8
    assert cache.seqs[2].pages == [2, 3]
    assert cache.pool.page_ref[2:4] == [3, 2]
    # A prompt of exactly one page never queries the table.
    queries = cache.prefix_queries
    assert cache.start(3, prompt[:4], Path.RANDOM) == 0
    assert cache.prefix_queries == queries
    cache.check_invariants()


def test_prefix_lookup_stops_at_the_first_missing_page():
    cache = make_cache()
    prompt = list(range(1, 14))                             # 13 tokens: 3 full pages + 1
    begin(cache, 0, prompt, Path.RANDOM)
    assert cache.seqs[0].pages == [2, 3, 6, 7]
    # Second page differs: the third (same tokens, other parent hash) must not match either.
    other = prompt[:4] + [0, 0, 0, 0] + prompt[8:]
    queries = cache.prefix_queries
    assert cache.start(1, other, Path.RANDOM) == 4
    assert cache.seqs[1].pages == [2]
    assert cache.prefix_queries == queries + 2              # hit, then miss, then stop
    cache.check_invariants()


def test_forced_sequential_mode_neither_looks_up_nor_registers_pages():
    cache = make_cache(path_mode="sequential")
    prompt = list(range(1, 10))                             # 9 tokens
    assert begin(cache, 0, prompt, None) == 0
    seq = cache.seqs[0]
    assert seq.path is Path.SEQUENTIAL
    assert seq.pages == [0, 1, 2]                           # extent on blocks 0, 1
    assert len(seq.hashes) == 2                             # hashed, but not registered
    assert cache.prefix.table == {}
    assert cache.prefix.page_hash == [None] * 16
    assert cache.start(1, prompt, None) == 0                # same prompt: no lookup
    assert (cache.prefix_queries, cache.prefix_hit_pages) == (0, 0)
    assert cache.pool.page_ref[:3] == [1, 1, 1]
    cache.free(1)
    cache.free(0)                                           # nothing registered: nothing cached
    assert list(cache.prefix.lru) == []
    assert sorted(cache.free_blocks) == list(range(8))
    cache.check_invariants()


def test_sequential_route_still_reuses_and_registers_prefix_pages_in_dual_mode():
    cache = make_cache()
    prompt = list(range(1, 10))                             # 9 tokens
    begin(cache, 0, prompt, Path.SEQUENTIAL)
    assert cache.seqs[0].pages == [0, 1, 2]
    assert sorted(cache.prefix.table.values()) == [0, 1]           # a long document asked twice is reused
    assert cache.start(1, prompt, Path.SEQUENTIAL) == 8
    assert cache.seqs[1].pages == [0, 1]
    assert cache.pool.page_ref[:3] == [2, 2, 1]
    cache.free(0)
    assert list(cache.prefix.lru) == []                            # seq 1 still holds pages 0, 1
    assert cache.pool.block_state[:2] == [2, 0]                  # block 0 RAND (shared pages), block 1 FREE
    cache.free(1)
    assert list(cache.prefix.lru) == [1, 0]                        # free() releases the last page first
    cache.check_invariants()


def test_prompt_routes_by_length_when_start_is_given_no_path():
    cache = make_cache(seq_path_threshold=8)
    begin(cache, 0, list(range(1, 10)), Path.RANDOM)        # registers pages 2, 3
    assert cache.start(1, list(range(1, 10)), None) == 8    # 9 > 8 tokens: SEQUENTIAL (still reuses)
    assert cache.seqs[1].path is Path.SEQUENTIAL
    assert cache.start(2, list(range(1, 9)), None) == 4     # 8 tokens: HYBRID, reuses a page
    assert cache.seqs[2].path is Path.HYBRID


# ---------------------------------------------------------------------------
# Default path of allocate()
# ---------------------------------------------------------------------------

def test_allocate_without_path_uses_the_prompt_path_then_routes_decode_by_locality():
    cache = make_cache()
    cache.start(0, list(range(1, 9)), Path.HYBRID)
    alloc = put(cache, 0, list(range(1, 9)), None)          # nothing written yet: the prompt path
    assert alloc.path is Path.HYBRID
    assert cache.seqs[0].pages == [0, 1]
    assert cache.locality_score(0) == 1.0
    alloc = put(cache, 0, [9], None)                        # decode, locality 1.0 >= 0.5
    assert alloc.path is Path.SEQUENTIAL
    assert cache.seqs[0].pages == [0, 1, 2]                 # the extent grows in place

    cache.start(1, [5, 6, 7], Path.RANDOM)
    put(cache, 1, [5, 6, 7], None)
    assert cache.seqs[1].pages == [6]
    assert cache.locality_score(1) == 0.0
    alloc = put(cache, 1, [8, 9], None)                     # decode, locality 0.0 < 0.5
    assert alloc.path is Path.RANDOM
    assert cache.seqs[1].pages == [6, 7]


def test_rest_of_prompt_after_prefix_hit_continues_in_an_extent_by_default():
    cache = make_cache()
    begin(cache, 0, [1, 2, 3, 4, 5, 6], Path.RANDOM)        # pages 2 (registered), 3
    prompt = [1, 2, 3, 4, 7, 8, 9, 10, 11, 12]
    assert cache.start(1, prompt, None) == 4                # 10 <= 8192 tokens: HYBRID
    assert cache.seqs[1].path is Path.HYBRID
    alloc = cache.allocate(1, prompt[4:])                   # still the prompt: its prefill path
    # Router docstring: HYBRID = "its cached prefix from pages, the rest continuing in an extent".
    assert alloc.path is Path.HYBRID
    assert cache.seqs[1].pages == [2, 0, 1]


def test_prompt_written_in_chunks_keeps_its_prefill_path_by_default():
    cache = make_cache()
    prompt = list(range(1, 13))
    cache.start(0, prompt, Path.HYBRID)
    assert put(cache, 0, prompt[:4], None).path is Path.HYBRID
    assert cache.locality_score(0) == 0.0                   # as decode this would route RANDOM
    assert put(cache, 0, prompt[4:], None).path is Path.HYBRID
    assert cache.seqs[0].pages == [0, 1, 2]
    assert put(cache, 0, [13], None).path is Path.SEQUENTIAL  # past the prompt: decode, locality 1.0


def test_fork_mid_prompt_keeps_the_prefill_path_for_the_child():
    cache = make_cache()
    prompt = list(range(1, 13))
    cache.start(0, prompt, Path.HYBRID)
    put(cache, 0, prompt[:4], None)                         # extent block 0: page 0
    cache.fork(0, 1)
    alloc = cache.allocate(1, prompt[4:])                   # child: still the prompt
    assert alloc.path is Path.HYBRID
    assert cache.seqs[1].pages == [0, 4, 5]                 # its own extent on block 2


# ---------------------------------------------------------------------------
# free(), the LRU and eviction
# ---------------------------------------------------------------------------

def test_free_caches_registered_full_pages_and_releases_the_rest():
    cache = make_cache()
    begin(cache, 0, list(range(1, 11)), Path.RANDOM)        # pages 2, 3 full, 6 partial
    assert cache.seqs[0].pages == [2, 3, 6]
    cache.free(0)
    # Last page first: 6 (partial, unregistered) is released, then 3, then 2 are cached,
    # so the LRU holds the prefix in reverse position order (its tail goes first).
    assert list(cache.prefix.lru) == [3, 2]
    assert sorted(cache.prefix.table.values()) == [2, 3]
    assert sorted(cache.free_blocks) == [0, 2, 3, 4, 5, 6, 7]  # block 3 held only page 6
    assert cache.pool.rand_free == {}                            # block 1 is full of cached pages
    assert not any(cache.pool.page_ref)
    # Written but never committed: unregistered, released at once.
    cache.start(1, [], Path.RANDOM)
    assert cache.allocate(1, list(range(50, 58)), Path.RANDOM)
    assert cache.seqs[1].pages == [6, 7]
    cache.free(1)
    assert list(cache.prefix.lru) == [3, 2]                        # unchanged: seq 1 cached nothing
    assert sorted(cache.free_blocks) == [0, 2, 3, 4, 5, 6, 7]
    cache.check_invariants()


def test_free_of_an_extent_keeps_its_cached_pages_and_frees_empty_blocks():
    cache = make_cache()
    begin(cache, 0, list(range(1, 11)), Path.HYBRID)        # extent blocks 0, 1: pages 0, 1, 2
    cache.free(0)
    assert list(cache.prefix.lru) == [1, 0]                        # page 2 (partial) released, then 1, 0 cached
    assert cache.pool.block_state[:2] == [2, 0]                  # block 0 joins the random pool (RAND), 1 FREE
    assert sorted(cache.free_blocks) == [1, 2, 3, 4, 5, 6, 7]
    assert cache.pool.extent_used == {}
    cache.check_invariants()


def test_evict_all_drops_every_cached_page_and_frees_their_blocks():
    cache = make_cache(num_blocks=4)
    begin(cache, 0, list(range(1, 9)), Path.RANDOM)         # pages 2, 3
    begin(cache, 1, list(range(11, 19)), Path.RANDOM)       # pages 6, 7
    cache.free(0)
    cache.free(1)
    assert list(cache.prefix.lru) == [3, 2, 7, 6]                  # by sequence freed, each last page first
    assert cache.evict_all() == 4
    assert cache.evictions == 4
    assert list(cache.prefix.lru) == [] and cache.prefix.table == {}
    assert cache.prefix.page_hash == [None] * 8
    assert sorted(cache.free_blocks) == [0, 1, 2, 3]
    assert cache.evict_all() == 0
    cache.check_invariants()


def test_pressure_evicts_the_least_recently_freed_sequence_first_from_its_tail():
    cache = make_cache(num_blocks=4)
    a, b = list(range(1, 9)), list(range(11, 19))
    begin(cache, 0, a, Path.RANDOM)                         # pages 2, 3
    begin(cache, 1, b, Path.RANDOM)                         # pages 6, 7
    cache.free(1)                                           # b's pages enter the LRU 7, then 6
    cache.free(0)                                           # then a's: 3, then 2
    assert list(cache.prefix.lru) == [7, 6, 3, 2]
    cache.start(2, [], Path.RANDOM)
    assert cache.allocate(2, [0] * 16, Path.RANDOM)          # free blocks 0, 2 first: no eviction
    assert cache.seqs[2].pages == [0, 1, 4, 5]
    assert cache.evictions == 0
    # Each evicted page's slot is the only free one, so it is the page handed out next.
    # b (freed first) goes first, tail page 7 before its head 6; then a, 3 before 2.
    # After each eviction the pages still registered are heads of their prompts.
    expected_lru = [[6, 3, 2], [3, 2], [2], []]
    for i, page in enumerate([7, 6, 3, 2]):
        assert cache.allocate(2, [0] * 4, Path.RANDOM)
        assert cache.seqs[2].pages[-1] == page
        assert list(cache.prefix.lru) == expected_lru[i]
        assert sorted(cache.prefix.table.values()) == sorted(expected_lru[i])
        assert cache.evictions == i + 1
    assert cache.prefix.table == {}
    assert not cache.allocate(2, [0], Path.RANDOM)
    assert cache.start(3, b + [0], Path.RANDOM) == 0         # b's pages are gone
    cache.check_invariants()


def test_prefix_hit_takes_cached_pages_out_of_lru_and_refree_moves_them_to_the_back():
    cache = make_cache()
    prompt = list(range(1, 13))                             # 3 full pages
    begin(cache, 0, prompt + [99], Path.RANDOM)             # pages 2, 3, 6, 7
    cache.free(0)                                           # 7 (partial) released; 6, 3, 2 cached
    assert list(cache.prefix.lru) == [6, 3, 2]
    begin(cache, 2, list(range(50, 55)), Path.RANDOM)       # page 7 (block 3's free slot), then 10
    assert cache.seqs[2].pages == [7, 10]
    cache.free(2)                                           # 10 (partial) released; 7 cached behind 2
    assert list(cache.prefix.lru) == [6, 3, 2, 7]
    assert cache.start(1, prompt[:8] + [42], Path.RANDOM) == 8
    assert cache.seqs[1].pages == [2, 3]
    assert list(cache.prefix.lru) == [6, 7]
    assert cache.pool.page_ref[2:4] == [1, 1]
    cache.free(1)
    assert list(cache.prefix.lru) == [6, 7, 3, 2]                  # behind page 7 now, last page first
    cache.check_invariants()


def test_a_prefix_partly_evicted_under_pressure_still_hits_its_head_pages():
    cache = make_cache(num_blocks=2)                        # pages 0..3
    prompt = list(range(1, 13)) + [99]                      # 3 full pages + 1 token
    begin(cache, 0, prompt, Path.RANDOM)                    # block 1: pages 2, 3; block 0: pages 0, 1
    assert cache.seqs[0].pages == [2, 3, 0, 1]
    cache.free(0)                                           # 1 (partial) released; 0, 3, 2 cached
    assert list(cache.prefix.lru) == [0, 3, 2]
    cache.start(1, [], Path.RANDOM)
    put(cache, 1, list(range(50, 58)), Path.RANDOM)         # page 1 (free), then page 0 by evicting
    assert cache.seqs[1].pages == [1, 0]                    # the prompt's tail page, not its head
    assert cache.evictions == 1
    assert list(cache.prefix.lru) == [3, 2]
    assert cache.start(2, prompt, Path.RANDOM) == 8         # pages 2, 3 still reachable
    assert cache.seqs[2].pages == [2, 3]
    cache.check_invariants()


# ---------------------------------------------------------------------------
# fork and copy-on-write
# ---------------------------------------------------------------------------

def test_child_append_to_shared_partial_page_copies_it_and_leaves_parent_intact():
    cache = make_cache()
    begin(cache, 0, [1, 2, 3, 4, 5, 6], Path.RANDOM, tag=1)  # page 2 full, page 3 holds 2 tokens
    parent_k, parent_v = read(cache, 0)
    cache.fork(0, 1)
    assert cache.seqs[1].pages == [2, 3]
    assert cache.pool.page_ref[2:4] == [2, 2]
    assert spans_of(cache, 1) == [[2 * PAGE_BYTES, 6, P]]   # kernel view before the copy
    alloc = put(cache, 1, [7], Path.RANDOM, tag=2)
    assert cache.cow_copies == 1
    assert cache.seqs[1].pages == [2, 6]                    # the copy: block 3, page 6
    assert cache.seqs[0].pages == [2, 3]
    assert (cache.pool.page_ref[2], cache.pool.page_ref[3], cache.pool.page_ref[6]) == (2, 1, 1)
    assert alloc.slots.tolist() == [[6 * PAGE_BYTES, 2, P]]
    assert spans_of(cache, 0) == [[2 * PAGE_BYTES, 6, P]]
    assert spans_of(cache, 1) == [[2 * PAGE_BYTES, 4, P], [6 * PAGE_BYTES, 3, P]]
    k, v = read(cache, 0)
    np.testing.assert_array_equal(k, parent_k)
    np.testing.assert_array_equal(v, parent_v)
    k, v = read(cache, 1)
    np.testing.assert_array_equal(k[:6], parent_k)          # copied rows
    np.testing.assert_array_equal(v[:6], parent_v)
    np.testing.assert_array_equal(k[6:], kv_rows(2, 6, 1)[0])
    # The parent's page is no longer shared: it appends in place, no copy.
    alloc = put(cache, 0, [8], Path.RANDOM, tag=3)
    assert cache.cow_copies == 1
    assert alloc.slots.tolist() == [[3 * PAGE_BYTES, 2, P]]
    np.testing.assert_array_equal(read(cache, 0)[0][6:], kv_rows(3, 6, 1)[0])
    np.testing.assert_array_equal(read(cache, 1)[0][6:], kv_rows(2, 6, 1)[0])
    cache.check_invariants()


def test_copy_on_write_of_a_q8_page_copies_its_int8_rows_and_their_scales():
    cfg = KVCacheConfig(block_bytes=4096, page_tokens=P, kv_dtype="q8", locality_window=8)
    cache = KVCacheManager(cfg, num_layers=1, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, num_blocks=8)
    assert cache.page_bytes == 2 * NUM_KV_HEADS * P * (HEAD_DIM + 4)  # int8 + an f32 scale per token and head
    assert cache.pages_per_block == 4096 // cache.page_bytes == 7
    begin(cache, 0, [1, 2, 3, 4, 5, 6], Path.RANDOM, tag=1)
    parent_k, parent_v = read(cache, 0)
    # What was stored is within half a q8 step of what was written (the step: max |row| / 127).
    want_k = kv_rows(1, 0, 6)[0].reshape(6, NUM_KV_HEADS, HEAD_DIM)
    step = np.abs(want_k).max(-1, keepdims=True) / 127
    assert (np.abs(parent_k.reshape(want_k.shape) - want_k) <= step / 2 * (1 + 1e-5)).all()
    cache.fork(0, 1)
    put(cache, 1, [7], Path.RANDOM, tag=2)
    assert cache.cow_copies == 1
    assert cache.seqs[1].pages[1] != cache.seqs[0].pages[1]
    k, v = read(cache, 1)
    np.testing.assert_array_equal(k[:6], parent_k)  # the copy is bit for bit: values and scales
    np.testing.assert_array_equal(v[:6], parent_v)
    np.testing.assert_array_equal(read(cache, 0)[0], parent_k)
    np.testing.assert_allclose(k[6:], kv_rows(2, 6, 1)[0], rtol=1 / 254)
    cache.check_invariants()


def test_parent_append_to_shared_partial_page_copies_it_into_its_extent():
    cache = make_cache()
    begin(cache, 0, [1, 2, 3, 4, 5, 6], Path.SEQUENTIAL, tag=1)  # extent block 0: pages 0, 1
    cache.fork(0, 1)
    put(cache, 0, [7], Path.SEQUENTIAL, tag=2)
    assert cache.cow_copies == 1
    assert cache.seqs[0].pages == [0, 2]                    # grew in place into block 1
    assert cache.seqs[0].blocks == [0, 1]
    assert cache.seqs[1].pages == [0, 1]
    assert cache.pool.page_ref[:3] == [2, 1, 1]
    np.testing.assert_array_equal(read(cache, 1)[0], kv_rows(1, 0, 6)[0])
    np.testing.assert_array_equal(read(cache, 0)[0][:6], kv_rows(1, 0, 6)[0])
    cache.check_invariants()


def test_append_after_shared_full_page_needs_no_copy():
    cache = make_cache()
    begin(cache, 0, list(range(1, 9)), Path.RANDOM)         # pages 2, 3, both full
    cache.fork(0, 1)
    put(cache, 1, [9], Path.RANDOM)
    assert cache.cow_copies == 0
    assert cache.seqs[1].pages == [2, 3, 6]
    assert cache.pool.page_ref[2:4] == [2, 2]
    cache.check_invariants()


# ---------------------------------------------------------------------------
# NoRoom: a value, and all or nothing
# ---------------------------------------------------------------------------

def test_no_room_is_falsy_and_changes_nothing():
    cache = make_cache(num_blocks=2)
    begin(cache, 0, list(range(1, 9)), Path.SEQUENTIAL)     # block 0: pages 0, 1
    begin(cache, 1, [9, 9, 9], Path.RANDOM)                 # block 1: page 2; page 3 free
    before = snapshot(cache)
    result = cache.allocate(0, list(range(20, 29)), Path.SEQUENTIAL)  # 9 tokens: 3 pages
    assert isinstance(result, NoRoom) and not result
    assert result == NoRoom(needed_pages=3, free_pages=1)
    assert snapshot(cache) == before
    # The one free page is still usable: an extent falls back to the random pool.
    alloc = put(cache, 0, [20, 21, 22, 23], Path.SEQUENTIAL)
    assert alloc.path is Path.SEQUENTIAL
    assert cache.seqs[0].pages == [0, 1, 3]
    assert spans_of(cache, 0) == [[0, 8, P], [3 * PAGE_BYTES, 4, P]]
    cache.check_invariants()


def test_no_room_leaves_the_free_neighbour_block_free():
    cache = make_cache(num_blocks=2)
    begin(cache, 0, list(range(1, 9)), Path.SEQUENTIAL)     # block 0: pages 0, 1
    before = snapshot(cache)
    result = cache.allocate(0, list(range(20, 40)), Path.SEQUENTIAL)  # 5 pages, 2 free
    assert result == NoRoom(needed_pages=5, free_pages=2)
    assert snapshot(cache) == before
    assert sorted(cache.free_blocks) == [1]
    assert cache.seqs[0].blocks == [0]
    cache.check_invariants()


def test_no_room_counts_free_pages_plus_the_extent_spare_only_on_extent_paths():
    cache = make_cache(num_blocks=2)
    begin(cache, 0, [1, 2, 3, 4], Path.SEQUENTIAL)          # block 0: page 0; page 1 reserved
    begin(cache, 1, list(range(10, 18)), Path.RANDOM)       # block 1: pages 2, 3
    assert cache.free_page_count() == 0
    before = snapshot(cache)
    assert cache.allocate(0, [5, 6, 7, 8], Path.RANDOM) == NoRoom(needed_pages=1, free_pages=0)
    assert cache.allocate(0, list(range(5, 14)), Path.SEQUENTIAL) == NoRoom(needed_pages=3, free_pages=1)
    assert snapshot(cache) == before
    put(cache, 0, [5, 6, 7, 8], Path.SEQUENTIAL)
    assert cache.seqs[0].pages == [0, 1]
    cache.check_invariants()


def test_no_room_for_the_copy_on_write_page_changes_nothing():
    cache = make_cache(num_blocks=1)
    begin(cache, 0, [1, 2, 3, 4, 5, 6], Path.RANDOM)        # pages 0, 1: the only block, full
    cache.fork(0, 1)
    before = snapshot(cache)
    result = cache.allocate(1, [7], Path.RANDOM)
    assert result == NoRoom(needed_pages=1, free_pages=0)
    assert snapshot(cache) == before
    cache.check_invariants()


def test_no_room_keeps_cached_pages():
    cache = make_cache(num_blocks=2)
    begin(cache, 0, list(range(1, 9)), Path.RANDOM)         # pages 2, 3
    cache.free(0)                                           # both cached
    cache.start(1, [], Path.RANDOM)
    before = snapshot(cache)
    assert before["lru"] == [3, 2] and before["free_blocks"] == [0]  # freed last page first
    result = cache.allocate(1, list(range(20, 40)), Path.RANDOM)  # 5 pages, 4 free or evictable
    assert result == NoRoom(needed_pages=5, free_pages=4)
    assert snapshot(cache) == before


def test_no_room_counting_the_copy_on_write_page_leaves_the_page_shared():
    cache = make_cache(num_blocks=1)
    begin(cache, 0, [1, 2], Path.RANDOM)                    # page 0 holds 2 tokens; page 1 free
    cache.fork(0, 1)
    before = snapshot(cache)
    result = cache.allocate(1, [3, 4, 5, 6, 7], Path.RANDOM)  # copy of page 0 + 1 more page
    assert not result
    assert snapshot(cache) == before
    assert result == NoRoom(needed_pages=2, free_pages=1)


# ---------------------------------------------------------------------------
# migrate()
# ---------------------------------------------------------------------------

def test_migrate_gathers_scattered_pages_into_one_extent_and_back_bit_exact():
    cache = make_cache()
    cache.start(0, [], Path.RANDOM)
    cache.start(1, [], Path.RANDOM)
    put(cache, 0, [1, 2, 3, 4], Path.RANDOM, tag=1)         # page 2
    put(cache, 1, [5, 6, 7, 8], Path.RANDOM, tag=2)         # page 3
    put(cache, 0, [9, 10, 11, 12], Path.RANDOM, tag=1)      # page 6
    put(cache, 0, [13], Path.RANDOM, tag=1)                 # page 7, 1 token
    assert cache.seqs[0].pages == [2, 6, 7]
    assert spans_of(cache, 0) == [[2 * PAGE_BYTES, 4, P], [6 * PAGE_BYTES, 5, P]]
    k, v = read(cache, 0)

    assert cache.migrate(0, Path.SEQUENTIAL) is True
    seq = cache.seqs[0]
    assert seq.path is Path.SEQUENTIAL
    assert seq.pages == [0, 1, 4]                           # block 1 is random: chained onto block 2
    assert seq.blocks == [0, 2]
    assert spans_of(cache, 0) == [[0, 8, P], [4 * PAGE_BYTES, 1, P]]
    assert cache.migrations == 1
    assert list(cache.prefix.lru) == [2, 6]                        # the old registered pages stay cached
    assert cache.pool.page_ref[7] == 0 and 7 not in cache.prefix.lru    # the partial one is released
    np.testing.assert_array_equal(read(cache, 0)[0], k)
    np.testing.assert_array_equal(read(cache, 0)[1], v)

    assert cache.migrate(0, Path.RANDOM) is True
    assert seq.path is Path.RANDOM
    assert seq.pages == [7, 10, 11]                         # block 3's free slot, then block 5
    assert seq.blocks == []
    assert sorted(cache.free_blocks) == [0, 2, 4, 6, 7]     # the extent blocks are free again
    assert cache.migrations == 2
    np.testing.assert_array_equal(read(cache, 0)[0], k)
    np.testing.assert_array_equal(read(cache, 0)[1], v)
    cache.check_invariants()


def test_migrate_into_free_neighbouring_blocks_gives_one_span():
    cache = make_cache()
    begin(cache, 9, list(range(50, 66)), Path.SEQUENTIAL)   # blocks 0, 1 taken for now
    cache.start(0, [], Path.RANDOM)
    cache.start(1, [], Path.RANDOM)
    put(cache, 0, [1, 2, 3, 4], Path.RANDOM, tag=6)         # page 6
    put(cache, 1, [5, 6, 7, 8], Path.RANDOM, tag=7)         # page 7
    put(cache, 0, [9, 10, 11, 12, 13, 14], Path.RANDOM, tag=6)  # pages 10, 11
    assert cache.seqs[0].pages == [6, 10, 11]
    assert cache.locality_score(0) == 0.0                   # runs of 4 and 6 tokens < 8
    k, v = read(cache, 0)
    cache.free(9)
    assert list(cache.prefix.lru) == [3, 2, 1, 0]                  # its pages are cached, last first ...
    assert cache.evict_all() == 4                           # ... until evicted
    assert sorted(cache.free_blocks) == [0, 1, 2, 4, 6, 7]
    assert cache.migrate(0, Path.SEQUENTIAL) is True
    assert cache.seqs[0].pages == [0, 1, 2]                 # block 0, grown in place over block 1
    assert cache.seqs[0].blocks == [0, 1]
    assert spans_of(cache, 0) == [[0, 10, P]]
    assert cache.locality_score(0) == 1.0
    np.testing.assert_array_equal(read(cache, 0)[0], k)
    np.testing.assert_array_equal(read(cache, 0)[1], v)
    cache.check_invariants()


def test_migrate_without_room_returns_no_room_and_changes_nothing():
    cache = make_cache(num_blocks=2)
    begin(cache, 0, list(range(1, 13)), Path.RANDOM, tag=5)  # pages 2, 3, then block 0: page 0
    assert cache.seqs[0].pages == [2, 3, 0]
    k, v = read(cache, 0)
    before = snapshot(cache)
    result = cache.migrate(0, Path.SEQUENTIAL)
    assert isinstance(result, NoRoom) and not result
    assert result == NoRoom(needed_pages=3, free_pages=1)
    assert snapshot(cache) == before
    assert cache.migrations == 0
    np.testing.assert_array_equal(read(cache, 0)[0], k)
    np.testing.assert_array_equal(read(cache, 0)[1], v)
    cache.check_invariants()


def test_migrate_without_room_keeps_cached_pages():
    cache = make_cache(num_blocks=2)
    begin(cache, 9, [7, 7, 7, 7], Path.RANDOM)              # page 2
    cache.free(9)                                           # cached
    begin(cache, 0, list(range(1, 13)), Path.RANDOM)        # pages 3, 0, 1: no free slot left
    assert cache.seqs[0].pages == [3, 0, 1]
    before = snapshot(cache)
    assert before["lru"] == [2]
    result = cache.migrate(0, Path.SEQUENTIAL)              # 3 pages, 1 evictable
    assert result == NoRoom(needed_pages=3, free_pages=1)
    assert snapshot(cache) == before


def test_migrate_of_an_empty_sequence_is_a_no_op():
    cache = make_cache()
    cache.start(0, [], Path.RANDOM)
    before = snapshot(cache)
    assert cache.migrate(0, Path.SEQUENTIAL) is True
    assert snapshot(cache) == before


# ---------------------------------------------------------------------------
# stats() and locality_score()
# ---------------------------------------------------------------------------

def test_stats_of_a_known_layout():
    cache = make_cache()
    begin(cache, 0, list(range(100, 107)), Path.HYBRID)     # 7 tokens: extent block 0, pages 0, 1
    begin(cache, 1, list(range(200, 206)), Path.RANDOM)     # 6 tokens: block 1, pages 2, 3
    begin(cache, 2, list(range(300, 304)), Path.RANDOM)     # 4 tokens: block 3, page 6
    cache.free(2)                                           # page 6 cached
    assert (cache.seqs[0].pages, cache.seqs[1].pages, list(cache.prefix.lru)) == ([0, 1], [2, 3], [6])
    s = cache.stats()
    assert s.bytes_total == 8 * 4096
    assert s.bytes_used_sequential == 2 * PAGE_BYTES
    assert s.bytes_used_random == 2 * PAGE_BYTES
    assert s.bytes_cached == 1 * PAGE_BYTES
    # Free: page 7 (block 3's other slot) and blocks 2, 4, 5, 6, 7.
    assert s.bytes_free == (1 + 5 * 2) * PAGE_BYTES
    assert s.bytes_used_sequential + s.bytes_used_random + s.bytes_cached + s.bytes_free == s.bytes_total
    assert s.token_bytes_needed == (7 + 6) * 512
    # Held: 4 pages = 16 token rows; filled: 7 + 6 = 13.
    assert s.fragmentation == 1.0 - 13 / 16
    # Two prompts of more than one page each queried once (a miss); the 4-token one never.
    assert (s.prefix_queries, s.prefix_hit_pages, s.prefix_hit_rate) == (2, 0, 0.0)
    assert (s.evictions, s.migrations, s.cow_copies) == (0, 0, 0)


def test_stats_count_a_shared_page_once():
    cache = make_cache()
    begin(cache, 0, list(range(1, 9)), Path.RANDOM)         # pages 2, 3
    cache.fork(0, 1)
    cache.start(2, list(range(1, 9)) + [9], Path.RANDOM)     # reuses pages 2, 3 (ref 3 each)
    s = cache.stats()
    assert s.bytes_used_random == 2 * PAGE_BYTES
    assert s.token_bytes_needed == 8 * 512                  # 24 logical tokens, 8 stored
    assert s.fragmentation == 0.0


def test_stats_scale_bytes_by_layers():
    cfg = KVCacheConfig(block_bytes=4096, page_tokens=P, kv_dtype="f32")
    cache = KVCacheManager(cfg, num_layers=3, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, num_blocks=4)
    cache.start(0, [], Path.RANDOM)
    assert cache.allocate(0, [1, 2, 3, 4, 5, 6], Path.RANDOM)  # pages 2, 3
    s = cache.stats()
    assert s.bytes_total == 3 * 4 * 4096
    assert s.bytes_used_random == 3 * 2 * PAGE_BYTES
    assert s.bytes_free == 3 * 6 * PAGE_BYTES
    assert s.token_bytes_needed == 3 * 6 * 512
    assert s.fragmentation == 1.0 - 6 / 8


def test_stats_count_unused_extent_pages_as_fragmentation():
    cache = make_cache()
    begin(cache, 0, list(range(100, 110)), Path.HYBRID)     # 10 tokens: pages 0, 1, 2; page 3 reserved
    assert cache.seqs[0].blocks == [0, 1]
    s = cache.stats()
    # Blocks 0 and 1 are the sequence's: 4 pages = 16 token rows held, 10 filled.
    assert s.fragmentation == 1.0 - 10 / 16
    assert s.bytes_used_sequential == 3 * PAGE_BYTES        # pages handed out
    assert s.bytes_free == 6 * 2 * PAGE_BYTES               # blocks 2..7; the reserved page is not free
    assert s.token_bytes_needed == 10 * 512


def test_stats_equal_a_recount_after_every_operation_of_a_mixed_run():
    """stats() reads running counts; recount_stats() walks the tables as stats() once did."""
    cache = make_cache(num_blocks=12)
    prompt = list(range(100, 110))

    def agree():
        assert cache.stats() == cache.recount_stats()

    begin(cache, 0, prompt, Path.HYBRID)                    # 10 tokens in an extent
    agree()
    assert begin(cache, 1, prompt[:8] + [7, 7, 7], Path.RANDOM) == 8  # two shared pages
    agree()
    cache.fork(0, 2)                                        # shares all three pages of 0
    agree()
    cache.truncate(2, 6)                                    # 2 ends in 0's full page 1, half filled
    agree()
    # Pages of 0 and 1 (2 shared), and 1's own: 10 + 3 tokens stored; 2 adds none.
    assert cache.stats().token_bytes_needed == (10 + 3) * 512
    put(cache, 2, [5, 5, 5], Path.RANDOM)                   # copy-on-write of the shared page
    agree()
    assert cache.cow_copies == 1 and cache.stats().token_bytes_needed == (10 + 3 + 5) * 512
    cache.fork(1, 3)
    cache.truncate(1, 9)                                    # 1 and 3 share a last page, 1 and 2 tokens
    agree()
    cache.free(3)                                           # 1's shorter fill is what stays
    agree()
    assert cache.migrate(0, Path.RANDOM) is True and cache.migrate(1, Path.SEQUENTIAL) is True
    agree()
    cache.start(4, list(range(200, 230)), Path.HYBRID)      # a long prompt, preempted mid-way:
    assert cache.allocate(4, list(range(200, 212)))         # its first chunk allocated, never committed
    agree()
    cache.free(4)
    agree()
    for sid in (0, 2):
        cache.free(sid)
        agree()
    assert cache.evict_all() > 0
    agree()
    cache.free(1)
    cache.evict_all()
    agree()
    assert cache.stats().bytes_free == cache.stats().bytes_total
    cache.check_invariants()


def test_prefix_hit_rate_counts_pages_queried_and_hit():
    cache = make_cache()
    assert cache.stats().prefix_hit_rate == 0.0             # no query yet
    prompt = list(range(1, 13))
    begin(cache, 0, prompt, Path.RANDOM)                    # 1 query: miss
    assert cache.start(1, prompt[:8] + [50, 51, 52, 53], Path.RANDOM) == 8   # 2 queries, 2 hits
    assert cache.start(2, prompt[:4] + list(range(60, 68)), Path.RANDOM) == 4  # 2 queries, 1 hit
    s = cache.stats()
    assert (s.prefix_queries, s.prefix_hit_pages) == (5, 3)
    assert s.prefix_hit_rate == 3 / 5


def test_locality_of_contiguous_extent_is_one_from_locality_window_tokens():
    cache = make_cache()
    begin(cache, 0, list(range(1, 8)), Path.SEQUENTIAL)     # 7 tokens in one span < window 8
    assert spans_of(cache, 0) == [[0, 7, P]]
    assert cache.locality_score(0) == 0.0
    put(cache, 0, [8], Path.SEQUENTIAL)                     # 8 tokens: exactly the window
    assert cache.locality_score(0) == 1.0
    put(cache, 0, [9, 10, 11], Path.SEQUENTIAL)
    assert spans_of(cache, 0) == [[0, 11, P]]
    assert cache.locality_score(0) == 1.0


def test_locality_of_scattered_pages_is_zero():
    cache = make_cache()
    cache.start(0, [], Path.RANDOM)
    cache.start(1, [], Path.RANDOM)
    for i in range(3):                                      # the two sequences take turns
        put(cache, 0, [i] * 4, Path.RANDOM)
        put(cache, 1, [i + 10] * 4, Path.RANDOM)
    assert cache.seqs[0].pages == [2, 6, 10]
    assert cache.seqs[1].pages == [3, 7, 11]
    assert spans_of(cache, 0) == [[2 * PAGE_BYTES, 4, P], [6 * PAGE_BYTES, 4, P], [10 * PAGE_BYTES, 4, P]]
    assert cache.locality_score(0) == 0.0
    assert cache.locality_score(1) == 0.0


def test_kernel_view_stays_exact_step_by_step_past_many_spans():
    cache = make_cache(num_blocks=24)
    cache.start(0, [], Path.RANDOM)
    cache.start(1, [], Path.RANDOM)
    want = []
    for i in range(10):                                     # 10 scattered pages, 1 span each
        put(cache, 0, [i] * 3, Path.RANDOM, tag=1)
        assert spans_of(cache, 0) == want + [[(4 * i + 2) * PAGE_BYTES, 3, P]]
        put(cache, 0, [i], Path.RANDOM, tag=1)              # fills the page in place
        want.append([(4 * i + 2) * PAGE_BYTES, 4, P])
        assert spans_of(cache, 0) == want
        put(cache, 1, [i] * 4, Path.RANDOM, tag=2)          # takes the page next to it
    assert cache.seqs[0].pages == [4 * i + 2 for i in range(10)]
    np.testing.assert_array_equal(read(cache, 0)[0], kv_rows(1, 0, 40)[0])
    np.testing.assert_array_equal(read(cache, 1)[0], kv_rows(2, 0, 40)[0])


def test_locality_of_extent_plus_scattered_page_is_the_share_in_long_runs():
    cache = make_cache()
    begin(cache, 0, list(range(1, 9)), Path.SEQUENTIAL)     # block 0: pages 0, 1
    begin(cache, 1, [5, 5, 5], Path.RANDOM)                 # block 1: page 2
    put(cache, 0, [9, 10, 11, 12], Path.RANDOM)             # page 3: not adjacent to page 1
    assert cache.seqs[0].pages == [0, 1, 3]
    assert spans_of(cache, 0) == [[0, 8, P], [3 * PAGE_BYTES, 4, P]]
    assert cache.locality_score(0) == 8 / 12


def test_random_page_next_to_an_extent_merges_into_its_span():
    cache = make_cache()
    begin(cache, 0, list(range(1, 9)), Path.SEQUENTIAL)     # block 0: pages 0, 1
    put(cache, 0, [9, 10], Path.RANDOM)                     # block 1 (odd, free): page 2
    assert cache.seqs[0].pages == [0, 1, 2]
    assert cache.seqs[0].blocks == [0]
    assert spans_of(cache, 0) == [[0, 10, P]]
    assert cache.locality_score(0) == 1.0


def test_locality_of_empty_sequence_is_zero():
    cache = make_cache()
    cache.start(0, [], Path.RANDOM)
    assert cache.locality_score(0) == 0.0


# ---------------------------------------------------------------------------
# Paired lifecycle: everything back
# ---------------------------------------------------------------------------

def test_freeing_everything_and_evicting_returns_every_block():
    cache = make_cache(num_blocks=16)
    prompt = list(range(1, 14))
    begin(cache, 0, prompt, Path.HYBRID, tag=1)             # extent
    begin(cache, 1, prompt[:8] + [40, 41], Path.HYBRID, tag=1)  # prefix hit on seq 0's pages
    begin(cache, 2, list(range(50, 61)), Path.RANDOM)       # random pages
    begin(cache, 3, list(range(70, 90)), Path.SEQUENTIAL)   # long private document
    cache.fork(2, 4)
    put(cache, 4, [1, 2], Path.RANDOM)                      # copy-on-write
    assert cache.cow_copies == 1
    assert cache.migrate(2, Path.SEQUENTIAL)
    assert cache.migrate(3, Path.RANDOM)
    cache.check_invariants()
    for seq_id in [3, 0, 4, 2, 1]:
        cache.free(seq_id)
        cache.check_invariants()
    assert cache.prefix.lru                                        # registered pages stay cached
    cache.evict_all()
    cache.check_invariants()
    assert sorted(cache.free_blocks) == list(range(16))
    assert cache.pool.block_state == [0] * 16 and cache.pool.block_live == [0] * 16
    assert not any(cache.pool.page_ref)
    assert cache.prefix.page_hash == [None] * 32
    assert (cache.prefix.lru, cache.prefix.table, cache.pool.rand_free, cache.pool.extent_used, cache.seqs) \
        == ({}, {}, {}, {}, {})
    assert cache.free_page_count() == 32
