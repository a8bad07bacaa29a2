"""An encoder's attention over packed texts (``EncAttention``, csrc/enc_attn.h): every kernel
ISA this machine has against NumPy in float64, on views of a wider tensor (as the encoder's
crossing buffers are), on a pool and on the caller; bad arguments raise before anything is
written."""

import numpy as np
import pytest

from dualpath.kernels import EncAttention, ThreadPool, available_kernels

POOL = ThreadPool(2)


def reference(q, k, v, starts, heads, scale):
    out = np.zeros(q.shape, np.float64)
    hd = q.shape[1] // heads
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        for h in range(heads if e > s else 0):
            cols = slice(h * hd, (h + 1) * hd)
            scores = scale * q[s:e, cols].astype(np.float64) @ k[s:e, cols].astype(np.float64).T
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[s:e, cols] = (p / p.sum(axis=1, keepdims=True)) @ v[s:e, cols]
    return out


@pytest.mark.parametrize("kernel", available_kernels())
@pytest.mark.parametrize("head_dim", [32, 64, 24])  # 24: the generic rows whatever the ISA
def test_every_isa_matches_numpy(kernel, head_dim):
    rng = np.random.default_rng(head_dim)
    heads, lengths = 3, [1, 15, 16, 17, 0, 40, 130]
    starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    rows = int(starts[-1])
    wide = rng.standard_normal((3, rows + 5, heads * head_dim + 8)).astype(np.float32)
    q, k, v = (wide[i, :, :heads * head_dim] for i in range(3))  # rows strided, as views of a wider tensor
    scale = float(head_dim) ** -0.5
    want = reference(q[:rows], k[:rows], v[:rows], starts, heads, scale)
    for pool in (POOL, None):
        out = np.full((rows + 5, heads * head_dim), 7.0, np.float32)
        EncAttention(q, k, v, out, heads, scale, kernel).run(starts, pool)
        np.testing.assert_allclose(out[:rows], want, atol=2e-6)
        assert (out[rows:] == 7.0).all()  # rows past the batch untouched


def test_bad_arguments_raise_before_anything_is_written():
    q = np.zeros((8, 64), np.float32)
    out = np.full((8, 64), 3.0, np.float32)
    a = EncAttention(q, q, q, out, 2, 0.1)
    for starts, error in (([0, 5, 3], IndexError),        # decreasing
                          ([1, 4], IndexError),           # not from 0
                          ([0, 9], ValueError),           # more rows than the buffers hold
                          ([0], ValueError)):             # no text
        with pytest.raises(error):
            a.run(np.array(starts, np.int64), POOL)
    with pytest.raises(ValueError, match="starts must be int64"):
        a.run(np.array([0, 4], np.int32), POOL)
    assert (out == 3.0).all()
    with pytest.raises(ValueError, match="heads"):
        EncAttention(q, q, q, out, 3, 0.1)
    with pytest.raises(ValueError, match="share a row stride"):
        EncAttention(q, np.zeros((8, 128), np.float32)[:, :64], q, out, 2, 0.1)
    with pytest.raises(ValueError, match="shaped like q"):
        EncAttention(q, q, q, np.zeros((8, 32), np.float32), 2, 0.1)
