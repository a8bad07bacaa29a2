"""kv_dtype q8 (int8 values, one f32 scale per token and KV head; csrc/kv_arena.h):
storage, copies and attention with every kernel ISA this machine has, against the
NumPy reference (tests/kernels/attention_reference.py).

Two references, two tolerances:

* the reference run on the dequantized K/V the arena returns (``gather``): the kernel's
  own arithmetic only. int8 widens to f32 exactly and the products are f32 FMAs, so the
  tolerance is f32's: rtol = atol = 1e-5, with a wide margin;
* the reference run on the original f32 K/V: the quantization error too. Each element
  is off by at most s / 2 (s = max |row| / 127, about 0.024 for a standard normal row of
  64), so a V row is off by at most s / 2 and a convex combination of rows too; the
  score error (scale * q . dk, of the order of s) moves the softmax weights by about
  as much. We assert max |error| <= 3 * s_mean / 2 and RMS error <= s_mean / 2, s_mean
  being the mean scale of the K and V rows read (the worst case, one context token of
  head_dim 128, stays inside both).
"""

import attention_reference as reference
import numpy as np
import pytest
from test_attention import P, _fill

from dualpath.kernels import KV_DTYPES, KVArena, ThreadPool, available_kernels, kv_tile_bytes

KERNELS = available_kernels()
POOL = ThreadPool(2)
TIGHT = 1e-5


def _q8_fill(arena, rng, n_ctx, layout, kernel=None):
    """n_ctx random tokens in layer 0: spans, the original f32 (k, v) and the dequantized
    (kd, vd), all (kv_heads, n, head_dim), and the mean q8 scale of their rows."""
    spans, k, v = _fill(arena, rng, n_ctx, layout, "f32", kernel)
    kd, vd = arena.gather(0, spans, n_ctx)
    s_mean = float(np.concatenate([np.abs(k).max(-1), np.abs(v).max(-1)]).mean() / 127)
    return spans, k, v, kd, vd, s_mean


def _check_both(got, q, k, v, kd, vd, pos0, s_mean, msg, **kw):
    np.testing.assert_allclose(got, reference.attention(q, kd, vd, pos0, **kw), rtol=TIGHT, atol=TIGHT, err_msg=msg)
    err = np.abs(got - reference.attention(q, k, v, pos0, **kw))
    assert err.max() <= 1.5 * s_mean, (msg, err.max(), s_mean)
    assert np.sqrt((err ** 2).mean()) <= 0.5 * s_mean, (msg, np.sqrt((err ** 2).mean()), s_mean)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["sequential", "random"])
@pytest.mark.parametrize("head_dim", [48, 64, 80, 128])
@pytest.mark.parametrize("group", [1, 4])  # MHA, GQA
def test_q8_decode_attention_matches_reference(kernel, layout, head_dim, group):
    rng = np.random.default_rng(head_dim * 10 + group)
    nkv = 2
    arena = KVArena(1 << 17, 64, 1, nkv, head_dim, "q8")
    for n_ctx in (1, 17, 255, 1000, 4096):
        spans, k, v, kd, vd, s_mean = _q8_fill(arena, rng, n_ctx, layout, kernel)
        for num_q in (1, 3):
            if num_q > n_ctx:
                continue
            q = rng.standard_normal((num_q, nkv * group, head_dim)).astype(np.float32)
            pos0 = n_ctx - num_q
            for pool in (None, POOL):  # the pool splits long contexts (flash-decoding)
                got = arena.attention(0, q, spans, pos0, prefetch_degree=4, kernel=kernel, pool=pool)
                _check_both(got, q, k, v, kd, vd, pos0, s_mean, f"ctx {n_ctx} q {num_q} pool {pool is not None}")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["sequential", "random"])
def test_q8_causal_prefill_window_and_softcap_match_reference(kernel, layout):
    rng = np.random.default_rng(7)
    arena = KVArena(1 << 17, 16, 1, 2, 64, "q8")
    spans, k, v, kd, vd, s_mean = _q8_fill(arena, rng, 600, layout, kernel)
    for pos0, n in ((0, 1), (0, 37), (5, 64), (100, 200), (400, 200)):
        q = rng.standard_normal((n, 8, 64)).astype(np.float32)
        for window, softcap in ((0, 0.0), (100, 0.0), (0, 30.0)):
            for pool in (None, POOL):
                got = arena.attention(0, q, spans, pos0, kernel=kernel, pool=pool, window=window, softcap=softcap)
                _check_both(got, q, k, v, kd, vd, pos0, s_mean, f"pos0 {pos0} n {n} window {window}",
                            window=window, softcap=softcap)


@pytest.mark.parametrize("kernel", KERNELS)
def test_q8_layouts_give_bit_identical_attention(kernel):
    # Same tokens, same order: quantization happens once on write, so the path only
    # changes where the int8 rows and their scales live, never the result.
    a, b = KVArena(1 << 17, 8, 1, 2, 64, "q8"), KVArena(1 << 17, 8, 1, 2, 64, "q8")
    s1, *_ = _fill(a, np.random.default_rng(1), 500, "sequential", "f32", kernel)
    s2, *_ = _fill(b, np.random.default_rng(1), 500, "random", "f32", kernel)
    np.testing.assert_array_equal(a.gather(0, s1, 500)[0], b.gather(0, s2, 500)[0])
    q = np.random.default_rng(3).standard_normal((3, 4, 64)).astype(np.float32)
    np.testing.assert_array_equal(a.attention(0, q, s1, 497, kernel=kernel), b.attention(0, q, s2, 497, kernel=kernel))


def test_q8_round_trip_error_is_at_most_half_a_scale_step():
    """Every element comes back within s / 2 of what was written, s = max |x| / 127 of its
    (token, KV head) row, at every magnitude; an all-zero row comes back as zeros. The
    bound's only slack is the f32 rounding of x / s and of s * value (2e-7 * max |x|)."""
    rng = np.random.default_rng(5)
    nkv, hd, n = 3, 64, 48
    arena = KVArena(1 << 16, 4, 1, nkv, hd, "q8")
    mags = 10.0 ** rng.integers(-6, 5, (n, nkv, 1))
    mags[7] = 0.0
    k = (rng.standard_normal((n, nkv, hd)) * mags).astype(np.float32)
    v = (rng.standard_normal((n, nkv, hd)) * mags).astype(np.float32)
    v[:, :, ::9] *= 40  # outlier dims: the rest of the row quantizes coarser, still within s / 2
    tb = arena.tile_bytes(P)
    pos = np.arange(n)
    slots = np.stack([(pos // P) * tb, pos % P, np.full(n, P)], 1).astype(np.int64)
    arena.write(0, k.reshape(n, -1), v.reshape(n, -1), slots)
    spans = np.array([[0, n, P]], np.int64)
    kd, vd = arena.gather(0, spans, n)  # (nkv, n, hd)
    for x, xd in ((k, kd), (v, vd)):
        x = x.transpose(1, 0, 2)
        amax = np.abs(x).max(-1, keepdims=True)
        s = (amax / np.float32(127)).astype(np.float64)
        assert (np.abs(x - xd) <= s / 2 + 2e-7 * amax).all()
        assert (xd[:, 7] == 0).all()
        # The values really are int8 steps: xd / s is an integer in [-127, 127].
        steps = np.divide(xd, s, out=np.zeros_like(xd, np.float64), where=s > 0)
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
        assert np.abs(np.round(steps)).max() == 127


def test_q8_storage_is_the_same_whichever_kernel_writes():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((50, 2 * 64)) * 100).astype(np.float32)
    spans = np.array([[0, 50, 64]], np.int64)
    slots = np.stack([np.zeros(50), np.arange(50), np.full(50, 64)], 1).astype(np.int64)
    want = None
    for kernel in KERNELS:
        a = KVArena(1 << 17, 1, 1, 2, 64, "q8")
        a.write(0, x, -x, slots, kernel=kernel)
        got = a.gather(0, spans, 50)
        if want is None:
            want = got
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_q8_copy_moves_values_and_scales_of_every_layer():
    rng = np.random.default_rng(4)
    arena = KVArena(1 << 12, 4, 3, 2, 8, "q8")
    assert arena.tile_bytes(4) == 2 * 2 * 4 * (8 + 4)  # int8 values + an f32 scale per (token, KV head)
    k = rng.standard_normal((2, 16)).astype(np.float32)
    src = np.array([[0, 0, 4], [0, 1, 4]], np.int64)
    dst = np.array([[4096 * 2, 3, 4], [4096 * 3, 0, 4]], np.int64)
    for layer in range(3):
        arena.write(layer, k * (layer + 1), -k * 10 ** layer, src)
    before = [arena.gather(layer, np.array([[0, 2, 4]], np.int64), 2) for layer in range(3)]
    arena.copy(src, dst)
    for layer in range(3):
        for i in range(2):
            kk, vv = arena.gather(layer, np.array([[dst[i, 0], 4, 4]], np.int64), 4)
            np.testing.assert_array_equal(kk[:, dst[i, 1]], before[layer][0][:, i])
            np.testing.assert_array_equal(vv[:, dst[i, 1]], before[layer][1][:, i])


def test_q8_halves_the_bytes_of_f16():
    for nkv, hd in ((2, 64), (4, 64), (8, 128), (1, 256)):
        f16, q8 = kv_tile_bytes("f16", nkv, hd, 16), kv_tile_bytes("q8", nkv, hd, 16)
        assert q8 == 2 * nkv * 16 * (hd + 4)
        assert q8 / f16 == pytest.approx(0.5 + 2 / hd)  # 53% at head_dim 64, 52% at 128
        assert KVArena(1 << 17, 1, 1, nkv, hd, "q8").tile_bytes(16) == q8


def test_q8_arena_errors_name_the_choices_and_the_head_dim_rule():
    assert KV_DTYPES == ("f16", "f32", "q8")
    with pytest.raises(ValueError, match="'f16', 'f32', 'q8'"):
        KVArena(1 << 17, 1, 1, 2, 64, "q4")
    with pytest.raises(ValueError, match="even head_dim"):
        KVArena(1 << 17, 1, 1, 2, 63, "q8")
    with pytest.raises(ValueError, match=r"holding at least one token \(4352 bytes of q8 K and V\)"):
        KVArena(4096, 1, 1, 32, 64, "q8")  # 2 x 32 x (64 + 4) bytes
    assert KVArena(1 << 17, 1, 1, 2, 64, "q8").kv_dtype == "q8"
