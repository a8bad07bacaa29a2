"""The compiled kernels fail loudly and cleanly: an allocation or thread-creation
failure is an exception naming it (never stale output or a smaller pool), and a
batch of slots with one bad slot is refused whole, the arena left as it was.

Failures are injected through the C code's test-only hooks
(``KVArena._fail_allocations_after``, ``ThreadPool._fail_thread_creation_after``),
which are process-wide: every test that sets one resets it before it returns.
"""

import contextlib

import numpy as np
import pytest

from dualpath.kernels import ArenaStepper, KVArena, ThreadPool

P = 16           # tokens per page
NKV, HD = 2, 64  # KV heads, head_dim
GROUP = 2        # query heads per KV head
BLOCK = 1 << 16  # bytes per block


@contextlib.contextmanager
def allocations_fail_after(n):
    KVArena._fail_allocations_after(n)
    try:
        yield
    finally:
        KVArena._fail_allocations_after(-1)


@contextlib.contextmanager
def threads_fail_after(n):
    ThreadPool._fail_thread_creation_after(n)
    try:
        yield
    finally:
        ThreadPool._fail_thread_creation_after(-1)


def _filled_arena(n_ctx, num_layers=1, kv_dtype="f16"):
    """An arena with n_ctx random tokens in layer 0, on pages 0..; returns (arena, spans)."""
    arena = KVArena(BLOCK, 32, num_layers, NKV, HD, kv_dtype)
    page = arena.tile_bytes(P)
    ppb = BLOCK // page
    n_pages = -(-n_ctx // P)
    offs = np.array([(p // ppb) * BLOCK + (p % ppb) * page for p in range(n_pages)], np.int64)
    pos = np.arange(n_ctx)
    slots = np.stack([offs[pos // P], pos % P, np.full(n_ctx, P)], 1).astype(np.int64)
    rng = np.random.default_rng(n_ctx)
    for layer in range(num_layers):
        kv = rng.standard_normal((2, n_ctx, NKV * HD)).astype(np.float32)
        arena.write(layer, kv[0], kv[1], slots)
    spans = np.stack([offs, np.minimum(P, n_ctx - np.arange(n_pages) * P), np.full(n_pages, P)], 1).astype(np.int64)
    return arena, spans


def _snapshot(arena):
    """Every page of every layer, read back: (layers, 2, kv_heads, tokens, head_dim)."""
    page = arena.tile_bytes(P)
    n_pages = arena.num_blocks * (arena.block_size // page)
    ppb = arena.block_size // page
    offs = np.array([(p // ppb) * arena.block_size + (p % ppb) * page for p in range(n_pages)], np.int64)
    spans = np.stack([offs, np.full(n_pages, P), np.full(n_pages, P)], 1).astype(np.int64)
    return np.stack([np.stack(arena.gather(layer, spans, n_pages * P)) for layer in range(arena.num_layers)])


# KVArena.attention has no workspace of its own: each call allocates one, once, for its
# span starts, chunk partials and every pool thread's scratch (decode split over two
# threads, prefill in query blocks); the workers allocate nothing.
@pytest.mark.parametrize("num_q,threads", [(1, 2), (1, 1), (37, 1), (37, 2)])
def test_attention_allocation_failure_raises_memory_error_not_stale_output(num_q, threads):
    arena, spans = _filled_arena(2048)
    pool = ThreadPool(threads)
    q = np.random.default_rng(1).standard_normal((num_q, NKV * GROUP, HD)).astype(np.float32)
    want = arena.attention(0, q, spans, 2048 - num_q, pool=pool)
    failures = 0
    for n in range(1000):
        with allocations_fail_after(n):
            try:
                got = arena.attention(0, q, spans, 2048 - num_q, pool=pool)
            except MemoryError as e:
                assert "attention (layer 0" in str(e) and "out of memory" in str(e)
                failures += 1
                continue
        break
    assert failures == 1  # the call's one allocation
    np.testing.assert_array_equal(got, want)


def test_stepper_allocation_failure_raises_memory_error():
    arena, spans = _filled_arena(300)
    n = 4
    rng = np.random.default_rng(2)
    q = rng.standard_normal((n, NKV * GROUP * HD)).astype(np.float32)
    k, v = rng.standard_normal((2, n, NKV * HD)).astype(np.float32)
    page = arena.tile_bytes(P)
    slots = np.stack([np.full(n, page * 30), np.arange(n), np.full(n, P)], 1).astype(np.int64)  # a free page
    seqs = np.array([[0, n, 300 - n, 0, len(spans)]], np.int64)
    stepper = ArenaStepper(arena, q, k, v, np.empty_like(q), slots, spans, 0.125, 0, seqs=seqs)
    before = _snapshot(arena)
    with allocations_fail_after(0), pytest.raises(MemoryError, match="batched attention step.*out of memory"):
        stepper.step_batch(0, n, 1, len(spans))
    np.testing.assert_array_equal(_snapshot(arena), before)  # refused before its first write
    stepper.step_batch(0, n, 1, len(spans))
    assert not np.array_equal(_snapshot(arena), before)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_warm_stepper_allocates_nothing_per_layer_step(threads):
    """The stepper keeps its attention scratch: after the first step, steps of the same
    shape (or smaller) run with every allocation failing; a larger one grows the
    scratch first, and refused (MemoryError) leaves the arena as it was."""
    arena, spans = _filled_arena(2048, num_layers=2)
    pool = ThreadPool(threads)
    rng = np.random.default_rng(3)
    n = 8
    q = rng.standard_normal((n, NKV * GROUP * HD)).astype(np.float32)
    k = rng.standard_normal((n, NKV * HD)).astype(np.float32)
    v = rng.standard_normal((n, NKV * HD)).astype(np.float32)
    pos = np.array([2047] + list(range(2048 - n, 2047)))  # row 0: one sequence's token; rows 1..: another's
    slots = np.stack([spans[pos // P, 0], pos % P, np.full(n, P)], 1).astype(np.int64)
    seqs = np.array([[0, 1, 2047, 0, len(spans)], [1, n - 1, 2040, 0, len(spans)]], np.int64)
    out = np.empty_like(q)
    stepper = ArenaStepper(arena, q, k, v, out, slots, spans, 0.125, 0, pool=pool, seqs=seqs)
    assert stepper.workspace_bytes == 0
    stepper.step_batch(0, 1, 1, len(spans))  # decode of one token: split over the threads when there are 2
    grown = stepper.workspace_bytes
    assert grown > 0
    want = out[:1].copy()
    with allocations_fail_after(0):
        for layer in (0, 1, 0):
            stepper.step_batch(layer, 1, 1, len(spans))
    assert stepper.workspace_bytes == grown
    np.testing.assert_array_equal(out[:1], want)
    before = _snapshot(arena)
    with allocations_fail_after(0), pytest.raises(MemoryError, match="batched attention step"):
        stepper.step_batch(1, n, 2, len(spans))  # more query rows than the scratch holds
    np.testing.assert_array_equal(_snapshot(arena), before)
    stepper.step_batch(1, n, 2, len(spans))
    assert stepper.workspace_bytes > grown


def test_arena_allocation_failure_raises_memory_error():
    with allocations_fail_after(0), pytest.raises(MemoryError, match="arena of 1 x 8 x 65536 bytes: out of memory"):
        KVArena(BLOCK, 8, 1, NKV, HD, "f16")


def test_thread_creation_failure_raises_runtime_error_not_a_smaller_pool():
    with threads_fail_after(1), pytest.raises(RuntimeError, match="thread pool of 3 threads.*thread creation failed"):
        ThreadPool(3)  # the first worker starts, the second does not: no pool of 2
    assert ThreadPool(3).num_threads == 3


def test_thread_pool_allocation_failure_raises_memory_error():
    with allocations_fail_after(0), pytest.raises(MemoryError, match="thread pool of 2 threads"):
        ThreadPool(2)


def test_fma_probe_allocation_failure_raises_memory_error_not_zero_flops():
    pool = ThreadPool(1)
    with allocations_fail_after(0), pytest.raises(MemoryError, match="FMA probe"):
        pool.fma(10)


def test_set_affinity_rejects_a_cpu_outside_the_cpu_set():
    pool = ThreadPool(2)
    with pytest.raises(ValueError, match=r"cpu 4096 must be -1 \(unpinned\) or in \[0, 1024\)"):
        pool.set_affinity([0, 4096])
    with pytest.raises(ValueError, match="cpu -2"):
        pool.set_affinity([-2])
    pool.set_affinity([0, -1])


def test_arena_refuses_head_dim_above_the_one_limit_and_names_it():
    KVArena(BLOCK, 1, 1, 1, 512, "f16")
    with pytest.raises(ValueError, match=r"head_dim=513 in \[1, 512\]"):
        KVArena(BLOCK, 1, 1, 1, 513, "f16")


# (offset, row, tile_tokens) of a bad slot, given the page bytes of P tokens; the
# message the refusal carries.
BAD_SLOTS = {
    "past_the_layer": (lambda page: (32 * BLOCK, 0, P), "outside the arena"),
    "negative_offset": (lambda page: (-page, 0, P), "outside the arena"),
    "row_past_its_page": (lambda page: (0, P, P), "outside the arena"),
    "tile_tokens_zero": (lambda page: (0, 0, 0), "outside the arena"),
    "tile_tokens_overflowing": (lambda page: (0, 2**60, 2**62), "outside the arena"),
    "offset_inside_a_page": (lambda page: (page // 2, 0, P), "does not start a tile"),
    "offset_not_element_aligned": (lambda page: (2, 0, P), "does not start a tile"),
    "page_straddling_two_blocks": (lambda page: (BLOCK // (page * 3 // 2) * (page * 3 // 2), 0, P * 3 // 2),
                                   "does not start a tile"),
}


def _batch_with_one_bad_slot(arena, kind):
    """8 good slots on a free page with the one at index 5 replaced by a bad one."""
    page = arena.tile_bytes(P)
    slots = np.stack([np.full(8, 20 * page), np.arange(8), np.full(8, P)], 1).astype(np.int64)
    slots[5] = BAD_SLOTS[kind][0](page)
    return slots


@pytest.mark.parametrize("kind", sorted(BAD_SLOTS))
def test_write_with_one_bad_slot_raises_value_error_and_writes_nothing(kind):
    arena, _ = _filled_arena(64, num_layers=2)
    slots = _batch_with_one_bad_slot(arena, kind)
    k = np.ones((8, NKV * HD), np.float32)
    before = _snapshot(arena)
    with pytest.raises(ValueError, match=rf"write of 8 tokens to layer 1 \(slots\[5\] = .*\).*{BAD_SLOTS[kind][1]}"):
        arena.write(1, k, k, slots)
    np.testing.assert_array_equal(_snapshot(arena), before)


@pytest.mark.parametrize("kind", sorted(BAD_SLOTS))
@pytest.mark.parametrize("side", ["src", "dst"])
def test_copy_with_one_bad_slot_raises_value_error_and_copies_nothing(kind, side):
    arena, _ = _filled_arena(64, num_layers=2)
    bad = _batch_with_one_bad_slot(arena, kind)
    good = np.stack([np.zeros(8), np.arange(8), np.full(8, P)], 1).astype(np.int64)  # page 0: written tokens
    src, dst = (bad, good) if side == "src" else (good, bad)
    before = _snapshot(arena)
    with pytest.raises(ValueError, match=rf"copy of 8 tokens \({side}_slots\[5\].*{BAD_SLOTS[kind][1]}"):
        arena.copy(src, dst)
    np.testing.assert_array_equal(_snapshot(arena), before)


@pytest.mark.parametrize("kind", sorted(BAD_SLOTS))
def test_stepper_with_one_bad_slot_raises_value_error_and_writes_nothing(kind):
    arena, spans = _filled_arena(64)
    slots = _batch_with_one_bad_slot(arena, kind)
    n = 8
    rng = np.random.default_rng(3)
    q = rng.standard_normal((n, NKV * GROUP * HD)).astype(np.float32)
    k, v = rng.standard_normal((2, n, NKV * HD)).astype(np.float32)
    seqs = np.array([[0, n, 64 - n, 0, len(spans)]], np.int64)
    stepper = ArenaStepper(arena, q, k, v, np.empty_like(q), slots, spans, 0.125, 0, seqs=seqs)
    before = _snapshot(arena)
    with pytest.raises(ValueError, match=rf"batched attention step .* \(slots\[5\].*{BAD_SLOTS[kind][1]}"):
        stepper.step_batch(0, n, 1, len(spans))
    np.testing.assert_array_equal(_snapshot(arena), before)


def test_stepper_with_a_bad_span_writes_none_of_its_good_slots():
    arena, spans = _filled_arena(64)
    page = arena.tile_bytes(P)
    n = 8
    slots = np.stack([np.full(n, 20 * page), np.arange(n), np.full(n, P)], 1).astype(np.int64)
    bad_spans = spans.copy()
    bad_spans[2, 0] += page // 2  # the third page's offset now falls inside it
    rng = np.random.default_rng(4)
    q = rng.standard_normal((n, NKV * GROUP * HD)).astype(np.float32)
    k, v = rng.standard_normal((2, n, NKV * HD)).astype(np.float32)
    seqs = np.array([[0, n, 64 - n, 0, len(spans)]], np.int64)
    stepper = ArenaStepper(arena, q, k, v, np.empty_like(q), slots, bad_spans, 0.125, 0, seqs=seqs)
    before = _snapshot(arena)
    with pytest.raises(ValueError, match=r"\(in seqs or spans\).*does not start a tile"):
        stepper.step_batch(0, n, 1, len(spans))
    np.testing.assert_array_equal(_snapshot(arena), before)


# Whole-tile copies (the prefix cache on disk): a bad offset among good ones copies nothing.
BAD_TILES = {k: v for k, v in BAD_SLOTS.items() if k not in ("row_past_its_page", "tile_tokens_zero",
                                                              "tile_tokens_overflowing")}


@pytest.mark.parametrize("kv_dtype", ["f16", "q8"])
def test_tiles_read_back_what_was_written_on_every_layer(kv_dtype):
    arena, _ = _filled_arena(64, num_layers=3, kv_dtype=kv_dtype)
    page = arena.tile_bytes(P)
    ppb = BLOCK // page
    src = np.array([0, page, 2 * page], np.int64)
    dst = np.array([3 * BLOCK + (ppb - 1) * page, BLOCK, 2 * BLOCK], np.int64)  # free pages, in other blocks
    arena.write_tiles(dst, P, arena.read_tiles(src, P))
    spans = lambda offs: np.stack([offs, np.full(3, P), np.full(3, P)], 1).astype(np.int64)  # noqa: E731
    for layer in range(3):
        for a, b in zip(arena.gather(layer, spans(src), 3 * P), arena.gather(layer, spans(dst), 3 * P)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", sorted(BAD_TILES))
@pytest.mark.parametrize("op", ["read", "write"])
def test_tiles_with_one_bad_offset_raise_and_copy_nothing(kind, op):
    arena, _ = _filled_arena(64, num_layers=2)
    page = arena.tile_bytes(P)
    off, _, tile_tokens = BAD_TILES[kind][0](page)
    offs = np.array([0, page, off], np.int64)
    before = _snapshot(arena)
    with pytest.raises(ValueError, match=BAD_TILES[kind][1]):
        if op == "read":
            arena.read_tiles(offs, tile_tokens)
        else:
            arena.write_tiles(offs, tile_tokens, np.zeros((3, 2, arena.tile_bytes(tile_tokens)), np.uint8))
    np.testing.assert_array_equal(_snapshot(arena), before)


def test_tiles_refuse_a_bad_shape_or_tile_size():
    arena, _ = _filled_arena(16)
    offs = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="tile_tokens must be >= 1"):
        arena.read_tiles(offs, 0)
    with pytest.raises(ValueError, match="data must have shape"):
        arena.write_tiles(offs, P, np.zeros((1, 1, 7), np.uint8))
    with pytest.raises(TypeError, match="must be uint8"):
        arena.write_tiles(offs, P, np.zeros((1, 1, arena.tile_bytes(P)), np.float32))
