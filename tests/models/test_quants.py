"""GGML block types -> MatMulNBits (models/quants.py), against gguf-py's own dequantization.

Exact types must give gguf.quants.dequantize's values bit for bit. Types with a float
zero point (Q4_K, Q4_1, Q2_K) are exact where fp32(zp * s) == dm and otherwise off by
one rounding of the block's min: we assert max abs error <= 1 ulp of the largest |x|
(measured: 6e-8 abs / 3e-9 relative for Q4_K with d ~ 0.01).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from dualpath.models import quants

# Byte offsets of each type's fp16 fields (d, and dmin / m where there is one).
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "IQ4_NL": [0], "Q4_1": [0, 2], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [-2], "Q3_K": [-2], "Q2_K": [-4, -2]}


def random_raw(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random blocks (every quant byte possible) with finite fp16 scales; some zero."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // block, type_size), dtype=np.uint8)
    for at in F16_FIELDS[type_name]:
        at %= type_size
        d = (rng.standard_normal(len(raw)) * 0.01).astype(np.float16)
        d[0] = 0  # a zero scale: for the zero-point types, a block of constant -dm
        raw[:, at:at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name))


@pytest.mark.parametrize("type_name", quants.EXACT_TYPES)
def test_exact_types_repack_to_gguf_values_bit_for_bit(type_name):
    raw = random_raw(type_name, 6, 512, seed=1)
    w = quants.repack(raw, type_name, (6, 512))
    ours, ref = quants.dequantize(w, (6, 512)), reference(raw, type_name)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    expected = {"Q8_0": (8, 32), "Q4_0": (4, 32), "Q5_0": (8, 32), "IQ4_NL": (8, 32), "Q6_K": (8, 16),
                "Q3_K": (4, 16)}[type_name]
    assert (w.bits, w.block_size) == expected
    assert w.blob.shape == (6, 512 // w.block_size, w.block_size * w.bits // 8) and w.blob.dtype == np.uint8
    assert w.scales.shape == (6 * 512 // w.block_size,) and w.scales.dtype == np.float32
    assert w.zero_points is None and w.mins is None


@pytest.mark.parametrize("type_name, bits_, block", [("Q4_K", 4, 32), ("Q4_1", 4, 32), ("Q2_K", 4, 16),
                                                     ("Q5_K", 8, 32), ("Q5_1", 8, 32)])
def test_offset_min_types_are_within_one_rounding_of_the_min(type_name, bits_, block):
    """4 bits with uint8 zero points (float zero points and 2-bit blocks of 16 have no
    fast CPU kernel), the min's remainder dm - z s in ``mins``."""
    raw = random_raw(type_name, 6, 512, seed=2)
    w = quants.repack(raw, type_name, (6, 512))
    ours, ref = quants.dequantize(w, (6, 512)), reference(raw, type_name)
    assert (w.bits, w.block_size) == (bits_, block) and w.zero_points.dtype == np.uint8
    assert w.zero_points.shape == (6 * -(-(512 // block) // (8 // bits_)),)
    assert w.mins.shape == (6, 512 // block) and w.mins.dtype == np.float32
    # d * sc and dmin * m hold at most 17 significant bits, so (q - z) * s and dm - z s
    # are exact in fp32 unless the two terms' exponents are far apart: every random block
    # here is exact; the bound is one rounding of the min term.
    assert np.abs(ours - ref).max() <= np.spacing(np.abs(ref).max())
    assert (ours == ref).mean() > 0.99


@pytest.mark.parametrize("type_name", ["Q4_1", "Q5_0", "Q5_1"])
def test_repack_of_gguf_quantized_weights_matches_its_dequantization(type_name):
    """Blocks made by gguf-py's quantizer (real scales and mins, not random bytes)."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    x = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32) * 0.02
    raw = gguf.quants.quantize(x, qtype)
    ours, ref = quants.dequantize(quants.repack(raw, type_name, x.shape), x.shape), reference(raw, type_name)
    assert np.abs(ours - ref).max() <= np.spacing(np.abs(ref).max())


@pytest.mark.parametrize("type_name", quants.NBITS_TYPES)
def test_onnxruntime_matmulnbits_computes_the_repacked_values(type_name):
    """One MatMulNBits node at accuracy_level 0, A = identity: Y = W^T must be our
    dequantize() value for value (this pins the measured formulas, zero points included);
    the mins term is the graph's, so it is added here as the builder does."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rows, cols = 8, 256
    raw = random_raw(type_name, rows, cols, seed=4)
    w = quants.repack(raw, type_name, (rows, cols))
    inits = [numpy_helper.from_array(w.blob, "B"), numpy_helper.from_array(w.scales, "S")]
    inputs = ["A", "B", "S"]
    if w.zero_points is not None:
        inits.append(numpy_helper.from_array(w.zero_points, "Z"))
        inputs.append("Z")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=cols, N=rows, bits=w.bits,
                            block_size=w.block_size, accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", cols])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", rows])], initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                    helper.make_opsetid("com.microsoft", 1)])
    from dualpath.runtime import session as runtime_session

    so = ort.SessionOptions()
    if runtime_session._global_pool_threads:  # an LLM of an earlier test made ORT's global pool:
        so.use_per_session_threads = False    # ORT then refuses sessions with pools of their own
    else:
        so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"A": np.eye(cols, dtype=np.float32)})[0].T  # (rows, cols)
    if w.mins is not None:
        y = (y.reshape(rows, -1, w.block_size) - w.mins[:, :, None]).reshape(rows, cols)
    assert np.array_equal(y, quants.dequantize(w, (rows, cols)))  # == (ORT may turn -0.0 into 0.0)


def test_pack_and_unpack_are_inverse_for_2_4_and_8_bits():
    rng = np.random.default_rng(5)
    for bits_ in (2, 4, 8):
        u = rng.integers(0, 2 ** bits_, (3, 4, 16), dtype=np.uint8)
        assert np.array_equal(quants.unpack(quants.pack(u, bits_), bits_), u)
    # 4-bit: element 2m in the low nibble of byte m.
    assert quants.pack(np.array([[1, 2]], np.uint8), 4).tolist() == [[0x21]]


def test_synth_writes_llama_cpp_file_types_that_load(tmp_path):
    """``dualpath synth --type Q4_K_M``: an F32 model quantized by llama.cpp, loadable here."""
    pytest.importorskip("llama_cpp")
    import gguf

    from dualpath.models.gguf import load_gguf
    from dualpath.models.synth import synth_gguf

    path = synth_gguf(tmp_path / "k.gguf", "kquant-tiny", "q4_k_m", seed=2)
    assert sorted(os.listdir(tmp_path)) == ["k.gguf"]  # no temporary files left
    types = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types == {"F32", "Q4_K", "Q6_K"}
    spec = load_gguf(path)
    assert spec.metadata["file_type"] == "MOSTLY_Q4_K_M"
    assert spec.weights["output"].dtype == "q6_k" and spec.weights["blk.0.attn_q"].dtype == "q4_k"
    assert spec.weights["token_embd"].dtype == "q4_k"  # gathered row by row, never widened


def test_synth_rejects_an_unknown_type_listing_the_llama_cpp_ones(tmp_path):
    from dualpath.models.synth import synth_gguf

    with pytest.raises(ValueError, match="Q4_K_M"):
        synth_gguf(tmp_path / "x.gguf", "kquant-tiny", "Q7_K")
