"""``dualpath bench layers``: ours and ONNX Runtime's products of a layer's matrix agree,
the figures are consistent (the streamed decode row too), and a missing layer is refused."""

import numpy as np
import pytest

from dualpath.bench.layers import layer_matrices, measure
from dualpath.models.synth import synth_gguf


def q8_0_blocks(n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGML Q8_0 blocks of an n x k matrix: an f16 scale and 32 int8 values each."""
    rng = np.random.default_rng(seed)
    blocks = np.zeros((n * k // 32, 34), np.uint8)
    blocks[:, :2] = rng.uniform(0.001, 0.01, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    blocks[:, 2:] = rng.integers(-127, 128, (len(blocks), 32), dtype=np.int8).view(np.uint8)
    return blocks.reshape(-1)


@pytest.mark.parametrize("rows", [1, 8])
def test_ours_and_onnx_runtimes_products_agree(rows):
    r = measure("m", "Q8_0", (64, 256), q8_0_blocks(64, 256), rows, threads=2, repeats=2, stream_bytes=1 << 20)
    assert r["max_abs_diff_rel"] < 2e-2  # both int8 activations per block of 32
    assert r["ours_mib"] == pytest.approx(64 * 256 * 34 / 32 / (1 << 20))  # the file's bits
    assert r["ours_gb_per_s"] == pytest.approx(r["ours_mib"] * (1 << 20) / r["ours_ms"] / 1e6)
    if rows == 1:  # the decode row, streamed over copies too
        assert r["streamed_ms"] > 0
        assert r["streamed_gb_per_s"] == pytest.approx(r["ours_mib"] * (1 << 20) / r["streamed_ms"] / 1e6)
    else:
        assert r["streamed_ms"] is None and r["streamed_gb_per_s"] is None


def test_a_layers_matrices_are_found_and_a_missing_layer_refused(tmp_path):
    path = synth_gguf(tmp_path / "tiny-q8.gguf", "kquant-tiny", "Q8_0", seed=2)
    layer, mats = layer_matrices(path, None)
    names = {name.split(".", 2)[2] for name, *_ in mats}
    assert {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"} <= names
    assert all(t == "Q8_0" and raw.nbytes == shape[0] * shape[1] * 34 // 32 for _, t, shape, raw in mats)
    assert layer_matrices(path, 0)[0] == 0
    with pytest.raises(ValueError, match="layer 99 is not in"):
        layer_matrices(path, 99)
