"""The compiled generic kernels against the NumPy reference (kernels/reference.py)."""

import numpy as np
import pytest

from dualpath import _kernels
from dualpath.kernels import reference


def _case(rng, num_heads, num_kv_heads, head_dim, capacity, dtype):
    k = rng.standard_normal((num_kv_heads, capacity, head_dim)).astype(dtype)
    v = rng.standard_normal((num_kv_heads, capacity, head_dim)).astype(dtype)
    return k, v


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("kv_dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_decode_attention_matches_reference(head_dim, group, kv_dtype, tol):
    rng = np.random.default_rng(head_dim * 10 + group)
    num_kv_heads = 2
    num_heads = num_kv_heads * group
    for n_ctx in (1, 2, 17, 255, 1000):
        k, v = _case(rng, num_heads, num_kv_heads, head_dim, 1024, kv_dtype)
        q = rng.standard_normal((1, num_heads, head_dim)).astype(np.float32)
        got = _kernels.attention(q, k, v, n_ctx - 1)
        want = reference.attention(q, k, v, n_ctx - 1)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kv_dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_causal_prefill_attention_matches_reference(kv_dtype, tol):
    rng = np.random.default_rng(7)
    k, v = _case(rng, 8, 4, 64, 300, kv_dtype)
    for pos0, n in ((0, 1), (0, 37), (5, 64), (100, 199)):
        q = rng.standard_normal((n, 8, 64)).astype(np.float32)
        np.testing.assert_allclose(_kernels.attention(q, k, v, pos0), reference.attention(q, k, v, pos0),
                                   rtol=tol, atol=tol)


def test_attention_rejects_positions_past_the_cache():
    k = np.zeros((1, 16, 8), np.float32)
    q = np.zeros((4, 1, 8), np.float32)
    with pytest.raises(IndexError, match="out of bounds"):
        _kernels.attention(q, k, k, 13)  # positions 13..16 but capacity 16
    with pytest.raises(ValueError, match="head_dim"):
        _kernels.attention(np.zeros((1, 1, 4), np.float32), k, k, 0)


def test_kv_write_converts_to_f16_and_checks_bounds():
    rng = np.random.default_rng(1)
    src = rng.standard_normal((3, 2, 8)).astype(np.float32)
    cache = np.zeros((2, 10, 8), np.float16)
    _kernels.kv_write(src, cache, 4)
    np.testing.assert_array_equal(cache[:, 4:7], src.transpose(1, 0, 2).astype(np.float16))
    assert not cache[:, :4].any() and not cache[:, 7:].any()
    with pytest.raises(IndexError):
        _kernels.kv_write(src, cache, 8)


def test_f16_conversion_rounds_like_numpy():
    # Every finite half value and the halfway points between them round-trip like numpy.
    halves = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    vals = np.concatenate([finite, mids, np.float32([1e-8, 7e4, -7e4, 65519.0, 65520.0])])
    cache = np.zeros((1, vals.size, 1), np.float16)
    _kernels.kv_write(vals.reshape(-1, 1, 1), cache, 0)
    with np.errstate(over="ignore"):  # 7e4 overflows to inf in both implementations
        want = vals.astype(np.float16)
    np.testing.assert_array_equal(cache.ravel().view(np.uint16), want.view(np.uint16))


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
