"""The classifier in our kernels (``kernels.QMatmul``, csrc/qmatmul.h): the product over
the cached 8-bit form of a GGUF table equals NumPy's over gguf-py's dequantization of the
same blocks, on every kernel this CPU runs; bad arguments are refused; and a model whose
classifier is 8-bit runs it there (no logits in its last graph part) with the logits the
graph would have given."""

import gguf
import numpy as np
import pytest

import dualpath
from dualpath.kernels import QMatmul, ThreadPool, available_kernels
from dualpath.models import quants
from dualpath.models.synth import synth_gguf
from lform_reference import dequantize

rng = np.random.default_rng(7)


def _table(type_name: str, rows: int, cols: int):
    """(the GGUF blocks' NBits form, their f32 values by gguf-py) of a random table."""
    qt = getattr(gguf.GGMLQuantizationType, type_name)
    if type_name == "Q8_0":
        raw = gguf.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qt)
    else:  # Q6_K: random blocks, each with a small positive fp16 d (its last two bytes)
        block, size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        raw[:, :, -2:] = (rng.random((rows, cols // block)) * 0.01 + 0.001).astype(np.float16)[..., None].view(np.uint8)
        raw = raw.reshape(rows, -1)
    nb = quants.repack(np.ascontiguousarray(raw).reshape(-1), type_name, (rows, cols))
    return nb, gguf.dequantize(raw, qt).reshape(rows, cols).astype(np.float64)


def _quantized(x: np.ndarray, bs: int) -> np.ndarray:
    """x as int8 per block of bs (amax / 127, round half to even), back in f64."""
    b = x.reshape(x.shape[0], -1, bs).astype(np.float64)
    d = (np.abs(x.reshape(b.shape)).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.rint(x.reshape(b.shape) * np.where(d > 0, np.float32(1) / d, 0).astype(np.float32))
    return (q * d).reshape(x.shape)


@pytest.mark.parametrize("kernel", available_kernels())
@pytest.mark.parametrize("type_name, cols", [("Q8_0", 640), ("Q8_0", 96), ("Q6_K", 512)])
@pytest.mark.parametrize("int8", [True, False])
def test_the_product_equals_numpy_over_gguf_dequantization(kernel, type_name, cols, int8):
    nb, w = _table(type_name, 300, cols)
    assert nb.bits == 8 and nb.zero_points is None and nb.block_size in (16, 32)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    want = (_quantized(x, nb.block_size) if int8 else x.astype(np.float64)) @ w.T
    for rows, pool in ((3, ThreadPool(2)), (1, None)):
        out = np.full((3, 300), np.nan, np.float32)
        QMatmul(nb.blob, nb.scales, x, out, kernel, int8).run(rows, pool)
        np.testing.assert_allclose(out[:rows], want[:rows], rtol=0, atol=2e-5 * np.abs(want).max())
        assert np.isnan(out[rows:]).all()  # rows past R untouched


def test_bad_arguments_are_refused():
    nb, _ = _table("Q8_0", 8, 64)
    x, out = np.zeros((2, 64), np.float32), np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="blocks of 16 or 32"):
        QMatmul(nb.blob.reshape(8, 1, 64), np.zeros(8, np.float32), x, out)
    with pytest.raises(ValueError, match="scales"):
        QMatmul(nb.blob, nb.scales[:-1], x, out)
    with pytest.raises(ValueError, match="does not match"):
        QMatmul(nb.blob, nb.scales, x, np.zeros((2, 7), np.float32))
    with pytest.raises(TypeError, match="float32"):
        QMatmul(nb.blob, nb.scales, x.astype(np.float64), out)
    with pytest.raises(ValueError, match="kernel"):
        QMatmul(nb.blob, nb.scales, x, out, "no-such-isa")
    qm = QMatmul(nb.blob, nb.scales, x, out)
    for rows in (0, 3):
        with pytest.raises(ValueError, match="outside 1..2"):
            qm.run(rows)


@pytest.mark.parametrize("preset", ["llama3-tiny", "gemma2-tiny"])  # gemma2: the final soft-cap
def test_an_8_bit_classifier_runs_in_our_kernels_with_the_graphs_logits(tmp_path, preset):
    path = synth_gguf(tmp_path / "m.gguf", preset, "Q8_0", seed=3)
    llm = dualpath.LLM(path, dualpath.load_config(None, {"runtime.max_context_tokens": 64}))
    runner = llm.runner
    assert runner.spec.classifier_in_kernels
    assert [o.name for o in runner.sessions[-1].get_outputs()] == ["hidden"]
    logits = runner.forward([1, 5, 9, 2]).copy()
    # The same rows through NumPy: the final hidden state times the dequantized table (the
    # file's blocks in our kernels' form: rows in whole 16s, as these vocabularies are).
    w = runner.spec.output
    assert w.kernel_form
    table = dequantize(w.data, w.source_type, w.shape).astype(np.float64)
    want = _quantized(runner.hidden[:1], 32) @ table.T
    cap = runner.spec.config.final_softcap
    if cap:
        assert preset == "gemma2-tiny"
        want = cap * np.tanh(want / cap)
    np.testing.assert_allclose(logits, want, rtol=0, atol=2e-5 * np.abs(want).max())
    assert np.isfinite(logits).all() and logits.shape == (1, runner.spec.config.vocab_size)
