"""Every kernel ISA this machine has, against the NumPy reference (tests/kernels/attention_reference.py).

Attention reads the arena through spans; the same tokens are laid out as one
contiguous run of pages (sequential path) and as scattered single pages (random
path), on one thread and on a pool (which splits long contexts and merges).
"""

import attention_reference as reference
import numpy as np
import pytest

from dualpath import kernels as _kernels
from dualpath.kernels import KVArena, ThreadPool, available_kernels

KERNELS = available_kernels()
POOL = ThreadPool(2)

P = 16  # tokens per page


def _fill(arena, rng, n_ctx, layout, kv_dtype, kernel=None):
    """Write n_ctx random tokens to layer 0; return spans and dense (k, v) (kv_heads, n, hd)."""
    nkv, hd = arena.num_kv_heads, arena.head_dim
    pages_total = arena.num_blocks * (arena.block_size // arena.tile_bytes(P))
    n_pages = -(-n_ctx // P)
    if layout == "sequential":
        pages = np.arange(n_pages)
    else:  # random: distinct pages in shuffled order
        pages = np.random.default_rng(n_ctx).permutation(pages_total)[:n_pages]
    page_bytes = arena.tile_bytes(P)
    ppb = arena.block_size // page_bytes
    offs = np.array([(p // ppb) * arena.block_size + (p % ppb) * page_bytes for p in pages], np.int64)
    pos = np.arange(n_ctx)
    slots = np.stack([offs[pos // P], pos % P, np.full(n_ctx, P)], 1).astype(np.int64)
    k = rng.standard_normal((n_ctx, nkv * hd)).astype(np.float32)
    v = rng.standard_normal((n_ctx, nkv * hd)).astype(np.float32)
    arena.write(0, k, v, slots, kernel=kernel)
    spans = np.stack([offs, np.minimum(P, n_ctx - np.arange(n_pages) * P), np.full(n_pages, P)], 1).astype(np.int64)
    dt = np.float16 if kv_dtype == "f16" else np.float32
    dense = lambda a: a.reshape(n_ctx, nkv, hd).transpose(1, 0, 2).astype(dt)  # noqa: E731
    return spans, dense(k), dense(v)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["sequential", "random"])
@pytest.mark.parametrize("head_dim", [8, 48, 64, 80, 120, 128])
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("kv_dtype,tol", [("f32", 1e-5), ("f16", 2e-3)])
def test_decode_attention_matches_reference(kernel, layout, head_dim, group, kv_dtype, tol):
    rng = np.random.default_rng(head_dim * 10 + group)
    nkv = 2
    arena = KVArena(1 << 17, 64, 1, nkv, head_dim, kv_dtype)
    for n_ctx in (1, 2, 17, 255, 1000, 4096):
        spans, k, v = _fill(arena, rng, n_ctx, layout, kv_dtype, kernel)
        for num_q in (1, 3):  # one token, and a multi-token decode step
            q = rng.standard_normal((num_q, nkv * group, head_dim)).astype(np.float32)
            pos0 = n_ctx - num_q if n_ctx >= num_q else 0
            if pos0 + num_q > n_ctx:
                continue
            want = reference.attention(q, k, v, pos0)
            for pool in (None, POOL):  # the pool splits long contexts (flash-decoding)
                got = arena.attention(0, q, spans, pos0, prefetch_degree=4, kernel=kernel, pool=pool)
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
            # the model runner's setting: a decode on the calling thread, never split
            on_caller = arena.attention(0, q, spans, pos0, prefetch_degree=4, kernel=kernel, pool=POOL,
                                        decode_on_caller=True)
            np.testing.assert_allclose(on_caller, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["sequential", "random"])
@pytest.mark.parametrize("kv_dtype,tol", [("f32", 1e-5), ("f16", 2e-3)])
def test_causal_prefill_attention_matches_reference(kernel, layout, kv_dtype, tol):
    rng = np.random.default_rng(7)
    arena = KVArena(1 << 17, 8, 1, 4, 64, kv_dtype)
    spans, k, v = _fill(arena, rng, 300, layout, kv_dtype, kernel)
    for pos0, n in ((0, 1), (0, 37), (5, 64), (100, 200)):
        q = rng.standard_normal((n, 8, 64)).astype(np.float32)
        want = reference.attention(q, k, v, pos0)
        for pool in (None, POOL):
            got = arena.attention(0, q, spans, pos0, kernel=kernel, pool=pool)
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kernel", KERNELS)
def test_f16_writes_round_like_the_generic_kernel(kernel):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((50, 2 * 64)) * 100).astype(np.float32)
    spans = np.array([[0, 50, 64]], np.int64)
    slots = np.stack([np.zeros(50), np.arange(50), np.full(50, 64)], 1).astype(np.int64)
    a, b = KVArena(1 << 17, 1, 1, 2, 64, "f16"), KVArena(1 << 17, 1, 1, 2, 64, "f16")
    a.write(0, x, x, slots, kernel="generic")
    b.write(0, x, x, slots, kernel=kernel)
    np.testing.assert_array_equal(a.gather(0, spans, 50)[0], b.gather(0, spans, 50)[0])


def test_unavailable_kernel_is_an_error_not_a_silent_fallback():
    arena = KVArena(1 << 12, 1, 1, 1, 8, "f32")
    with pytest.raises(ValueError, match="not available"):
        arena.attention(0, np.zeros((1, 1, 8), np.float32), np.array([[0, 1, 16]], np.int64), 0,
                        kernel="neon" if "avx2" in KERNELS else "avx2")


def test_layouts_give_bit_identical_f32_attention():
    # Same tokens, same order: the path only changes where they live, never the result.
    rng = np.random.default_rng(3)
    a = KVArena(1 << 17, 8, 1, 2, 64, "f32")
    b = KVArena(1 << 17, 8, 1, 2, 64, "f32")
    s1, k1, _ = _fill(a, np.random.default_rng(1), 500, "sequential", "f32")
    s2, k2, _ = _fill(b, np.random.default_rng(1), 500, "random", "f32")
    np.testing.assert_array_equal(k1, k2)
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    np.testing.assert_array_equal(a.attention(0, q, s1, 497), b.attention(0, q, s2, 497))


def test_arena_rejects_out_of_bounds_slots_spans_and_positions():
    arena = KVArena(1 << 12, 4, 2, 1, 8, "f32")
    k = np.zeros((1, 8), np.float32)
    with pytest.raises(IndexError, match="outside the arena"):
        arena.write(0, k, k, np.array([[4 * 4096, 0, 16]], np.int64))  # past the last block
    with pytest.raises(IndexError):
        arena.write(2, k, k, np.array([[0, 0, 16]], np.int64))  # no layer 2
    with pytest.raises(IndexError):
        arena.write(0, k, k, np.array([[0, 16, 16]], np.int64))  # row outside its page
    spans = np.array([[0, 10, 16]], np.int64)
    q = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(IndexError):
        arena.attention(0, q, spans, 9)  # positions 9..10 but the spans hold 10 tokens
    with pytest.raises(ValueError, match="head_dim"):
        arena.attention(0, np.zeros((1, 1, 4), np.float32), spans, 0)
    with pytest.raises(ValueError, match="power of two"):
        KVArena(1000, 4, 1, 1, 8, "f32")


def test_f16_storage_rounds_like_numpy():
    # Every finite half value and the halfway points between them round-trip like numpy.
    halves = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    vals = np.concatenate([finite, mids, np.float32([1e-8, 7e4, -7e4, 65519.0, 65520.0])])
    n = vals.size
    pad = -n % 8
    vals = np.concatenate([vals, np.zeros(pad, np.float32)])
    rows = vals.reshape(-1, 8)  # one kv head of head_dim 8
    arena = KVArena(1 << 20, 8, 1, 1, 8, "f16")
    P_ = 1024
    tile = arena.tile_bytes(P_)
    t = np.arange(len(rows))
    slots = np.stack([(t // P_) * tile, t % P_, np.full(len(rows), P_)], 1).astype(np.int64)
    arena.write(0, rows, rows, slots)
    num_pages = -(-len(rows) // P_)
    spans = np.stack([np.arange(num_pages) * tile, np.minimum(P_, len(rows) - np.arange(num_pages) * P_),
                      np.full(num_pages, P_)], 1).astype(np.int64)
    k, _ = arena.gather(0, spans, len(rows))
    with np.errstate(over="ignore"):  # 7e4 overflows to inf in both implementations
        want = rows.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(k[0], want)


def test_copy_moves_every_layer_of_a_token():
    rng = np.random.default_rng(4)
    arena = KVArena(1 << 12, 4, 3, 2, 8, "f32")  # 4 tokens per page of 256 bytes... one page = 4 tokens
    k = rng.standard_normal((2, 16)).astype(np.float32)
    src = np.array([[0, 0, 4], [0, 1, 4]], np.int64)
    dst = np.array([[4096 * 2, 3, 4], [4096 * 3, 0, 4]], np.int64)
    for layer in range(3):
        arena.write(layer, k + layer, -k - layer, src)
    arena.copy(src, dst)
    for layer in range(3):
        for i in range(2):
            page = np.array([[dst[i, 0], 4, 4]], np.int64)
            kk, vv = arena.gather(layer, page, 4)  # (kv_heads, 4, head_dim)
            row = dst[i, 1]
            np.testing.assert_array_equal(kk[:, row].reshape(-1), k[i] + layer)
            np.testing.assert_array_equal(vv[:, row].reshape(-1), -k[i] - layer)


def test_embed_dequantizes_rows_of_every_layout():
    rng = np.random.default_rng(2)
    vocab, dim = 10, 64
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    ids = np.array([3, 0, 9, 3], np.int64)
    np.testing.assert_array_equal(_kernels.embed(ids, table), table[ids])
    scales = rng.random(vocab * dim // 32).astype(np.float32)
    q8 = rng.integers(0, 256, (vocab, dim // 32, 32), dtype=np.uint8)
    want8 = ((q8.astype(np.float32) - 128) * scales.reshape(vocab, -1, 1)).reshape(vocab, dim)
    np.testing.assert_allclose(_kernels.embed(ids, q8, scales, "q8_0"), want8[ids], rtol=1e-6)
    q4 = rng.integers(0, 256, (vocab, dim // 32, 16), dtype=np.uint8)
    nib = np.stack([q4 & 15, q4 >> 4], axis=-1).reshape(vocab, dim // 32, 32).astype(np.float32) - 8
    want4 = (nib * scales.reshape(vocab, -1, 1)).reshape(vocab, dim)
    np.testing.assert_allclose(_kernels.embed(ids, q4, scales, "q4_0"), want4[ids], rtol=1e-6)
    with pytest.raises(IndexError):
        _kernels.embed(np.array([vocab], np.int64), table)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["sequential", "random"])
@pytest.mark.parametrize("kv_dtype,tol", [("f32", 1e-5), ("f16", 2e-3)])
def test_sliding_window_and_softcap_match_reference(kernel, layout, kv_dtype, tol):
    """Gemma's sliding window (a query sees its last `window` positions) and score
    soft-capping, in decode (split over the context on the pool) and in prefill
    blocks whose queries see different windows."""
    rng = np.random.default_rng(11)
    arena = KVArena(1 << 17, 64, 1, 2, 64, kv_dtype)
    spans, k, v = _fill(arena, rng, 3000, layout, kv_dtype, kernel)
    cases = [(2999, 1), (2997, 3), (0, 40), (100, 200), (1500, 64)]
    for window in (1, 5, 16, 100, 129, 1024, 5000):
        for softcap in (0.0, 0.7, 50.0):
            for pos0, n in cases:
                q = 3 * rng.standard_normal((n, 4, 64)).astype(np.float32)
                want = reference.attention(q, k, v, pos0, softcap=softcap, window=window)
                for pool in (None, POOL):
                    got = arena.attention(0, q, spans, pos0, kernel=kernel, pool=pool, softcap=softcap,
                                          window=window)
                    np.testing.assert_allclose(got, want, rtol=tol, atol=tol,
                                               err_msg=f"window {window} softcap {softcap} pos0 {pos0} n {n}")


def test_window_and_softcap_refuse_negative_values():
    arena = KVArena(1 << 17, 4, 1, 2, 64, "f32")
    q = np.zeros((1, 2, 64), np.float32)
    spans = np.array([[0, 1, 16]], np.int64)
    with pytest.raises(ValueError, match="softcap"):
        arena.attention(0, q, spans, 0, softcap=-1.0)
    with pytest.raises(ValueError, match="window"):
        arena.attention(0, q, spans, 0, window=-2)
