"""GGML block types -> MatMulNBits (models/quants.py), against gguf-py's own dequantization,
and the compiled conversion against its NumPy oracle (quants_reference.py) byte for byte.

Exact types must give gguf.quants.dequantize's values bit for bit. Types with a float
zero point (Q4_K, Q4_1, Q2_K) are exact where fp32(zp * s) == dm and otherwise off by
one rounding of the block's min: we assert max abs error <= 1 ulp of the largest |x|
(measured: 6e-8 abs / 3e-9 relative for Q4_K with d ~ 0.01).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from quants_reference import pack, repack_reference

from dualpath.kernels import GGML_TYPES, ggml_layout, repack_ggml
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
    from dualpath.executor import session as runtime_session

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


def extreme_raw(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """``random_raw`` blocks, then: every fp16 field any finite value (all exponents,
    subnormals, -0.0, +-65504), and some blocks all-zero or with every quant bit set."""
    import gguf

    raw = random_raw(type_name, rows, cols, seed)
    type_size = gguf.constants.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, type_name)][1]
    blocks = raw.reshape(-1, type_size)
    rng = np.random.default_rng(seed + 1)
    blocks[1::7] = 0        # all-zero blocks: zero scales and values
    blocks[2::7] = 0xFF     # every quant bit set (the fp16 fields are made finite below)
    for at in F16_FIELDS[type_name]:
        at %= type_size
        h = rng.integers(0, 1 << 16, len(blocks), dtype=np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= 0x83FF  # inf / NaN -> subnormal of the same sign
        h[3::11], h[4::11], h[5::11], h[6::11] = 0x7BFF, 0xFBFF, 0x0001, 0x8000  # +-65504, 6e-8, -0.0
        h[1::7] = 0
        blocks[:, at:at + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw


def assert_same_nbits(ours: quants.NBits, ref: quants.NBits) -> None:
    assert (ours.bits, ours.block_size) == (ref.bits, ref.block_size)
    for field in ("blob", "scales", "zero_points", "mins"):
        a, b = getattr(ours, field), getattr(ref, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert (a.shape, a.dtype) == (b.shape, b.dtype), field
            differ = np.flatnonzero(np.frombuffer(a.tobytes(), np.uint8) != np.frombuffer(b.tobytes(), np.uint8))
            assert differ.size == 0, f"{field} differs at bytes {differ[:8]}"


@pytest.mark.parametrize("type_name", quants.NBITS_TYPES)
@pytest.mark.parametrize("make", [random_raw, extreme_raw])
def test_compiled_repack_equals_the_numpy_oracle_byte_for_byte(type_name, make):
    """blob, scales, zero points and mins: the same bytes as gguf-py's unpacking and fp32
    products, zero points rounded half to even, for every bit pattern of a finite block."""
    block = quants.block_size(type_name)
    for rows, cols, seed in ((6, 512, 11), (5, 3 * block, 12), (1, block, 13), (64, 256, 14)):
        raw = make(type_name, rows, cols, seed)
        assert_same_nbits(quants.repack(raw, type_name, (rows, cols)), repack_reference(raw, type_name, (rows, cols)))


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K", "Q5_1"])
def test_zero_points_round_half_to_even_and_clamp(type_name):
    """dm / s exactly k + 0.5 rounds to the even k (np.rint), out-of-range ratios clamp."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
    raw = np.zeros((4, type_size), np.uint8)
    f16 = lambda v: np.array([v], np.float16).view(np.uint8)  # noqa: E731
    for i, (d, m) in enumerate([(1.0, 2.5), (1.0, 3.5), (0.5, 1000.0), (-1.0, 3.0)]):
        raw[i, 0:2] = f16(d)
        if type_name == "Q4_K":  # sc = 1, m = 1 in every sub-block: s = d, dm = dmin
            raw[i, 2:4], raw[i, 4:16] = f16(m), [1, 1, 1, 1, 1, 1, 1, 1, 0x11, 0x11, 0x11, 0x11]
        else:                    # x = d * q + m: dm = -m
            raw[i, 2:4] = f16(-m)
    shape = (4, block)
    ours = quants.repack(raw, type_name, shape)
    assert_same_nbits(ours, repack_reference(raw, type_name, shape))
    bits_ = ours.bits
    z = quants.unpack(ours.zero_points.reshape(4, -1), bits_)[:, 0]
    assert z.tolist() == [2, 4, 2 ** bits_ - 1, 0]


def test_compiled_types_are_the_nbits_types_with_gguf_block_sizes():
    import gguf

    assert sorted(quants.EXACT_TYPES + quants.OFFSET_MIN_TYPES + quants.MINS_TYPES) == sorted(GGML_TYPES)
    for name in GGML_TYPES:
        layout = ggml_layout(name)
        block, type_size = gguf.constants.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, name)]
        assert (layout["block"], layout["type_size"]) == (block, type_size)
        assert layout["zero_points"] == (name in quants.OFFSET_MIN_TYPES + quants.MINS_TYPES)


def _outputs(type_name: str, rows: int, cols: int):
    layout = ggml_layout(type_name)
    bits_, sub = layout["bits"], layout["block_size"]
    nb = cols // sub
    out = [np.empty((rows, nb, sub * bits_ // 8), np.uint8), np.empty(rows * nb, np.float32)]
    if layout["zero_points"]:
        out += [np.empty(rows * -(-nb * bits_ // 8), np.uint8), np.empty((rows, nb), np.float32)]
    return out


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q5_0"])
def test_repack_rejects_truncated_input_and_wrong_output_sizes(type_name):
    block = quants.block_size(type_name)
    shape = (3, 2 * block)
    raw = random_raw(type_name, *shape, seed=6).reshape(-1)
    with pytest.raises(ValueError, match=r"truncated"):
        repack_ggml(raw[:-1].copy(), type_name, shape, *_outputs(type_name, *shape))
    with pytest.raises(ValueError, match=r"columns must be a positive multiple of"):
        repack_ggml(raw, type_name, (3, block + 16), *_outputs(type_name, *shape))
    for i in range(len(_outputs(type_name, *shape))):
        out = _outputs(type_name, *shape)
        name = ("blob", "scales", "zero_points", "mins")[i]
        out[i] = out[i].reshape(-1)[:-1]
        with pytest.raises(ValueError, match=rf"{name} has \d+ elements; this weight needs \d+"):
            repack_ggml(raw, type_name, shape, *out)
    with pytest.raises(ValueError, match=r"unsupported GGML block type 'Q7_K' \(supported: Q8_0"):
        repack_ggml(raw, "Q7_K", shape, *_outputs(type_name, *shape))
    with pytest.raises(ValueError, match=r"numpy array"):
        repack_ggml(raw.astype(np.int16), type_name, shape, *_outputs(type_name, *shape))
    read_only = _outputs(type_name, *shape)
    read_only[0].flags.writeable = False
    with pytest.raises(ValueError, match=r"blob must be writeable"):
        repack_ggml(raw, type_name, shape, *read_only)


def test_repack_refuses_zero_points_for_a_type_without_them():
    shape = (2, 256)
    raw = random_raw("Q6_K", *shape, seed=8).reshape(-1)
    blob, scales = _outputs("Q6_K", *shape)
    with pytest.raises(ValueError, match=r"Q6_K has no zero points"):
        repack_ggml(raw, "Q6_K", shape, blob, scales, np.empty(32, np.uint8), np.empty((2, 16), np.float32))


def test_pack_and_unpack_are_inverse_for_2_4_and_8_bits():
    rng = np.random.default_rng(5)
    for bits_ in (2, 4, 8):
        u = rng.integers(0, 2 ** bits_, (3, 4, 16), dtype=np.uint8)
        assert np.array_equal(quants.unpack(pack(u, bits_), bits_), u)
    # 4-bit: element 2m in the low nibble of byte m.
    assert pack(np.array([[1, 2]], np.uint8), 4).tolist() == [[0x21]]


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


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0"])
def test_a_large_form_made_by_several_threads_is_the_one_made_by_one(type_name, monkeypatch):
    # the form rearranges bytes, so any bytes do; 7 groups of 16 rows split unevenly
    n, k = 16 * 7, 512
    layout = ggml_layout(type_name)
    raw = np.random.default_rng(3).integers(0, 256, n * k // layout["block"] * layout["type_size"], np.uint8)
    one = quants.to_kernel_form(raw, type_name, (n, k))
    monkeypatch.setattr(quants, "FORM_THREADS_BYTES", 0)
    monkeypatch.setattr(quants.os, "cpu_count", lambda: 3)
    assert np.array_equal(quants.to_kernel_form(raw, type_name, (n, k)), one)
