"""The GGUF and llama2.c loaders read stories260K into the same ModelSpec, exactly.

* Both formats give the same hyper-parameters and bit-identical weights.
* F32 GGUF (and llama2.c) weights are read-only views of the memory-mapped file: zero copy.
* Q8_0 / Q4_0 are repacked into MatMulNBits blobs without changing a single value, and
  F16 / BF16 are widened to float32 exactly (every one of the 65536 bit patterns).
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from dualpath.models import ModelSpec, load_model, quants
from dualpath.models.gguf import load_gguf
from dualpath.models.llama2c import load_llama2c
from dualpath.models.spec import LAYER_TENSORS, expected_shapes
from lform_reference import dequantize as dequantize_form

STORIES_CONFIG = {"arch": "llama", "dim": 64, "hidden_dim": 172, "num_layers": 5, "num_heads": 8,
                  "num_kv_heads": 4, "head_dim": 8, "vocab_size": 512}


@pytest.fixture(scope="module")
def gguf_spec(gguf_path) -> ModelSpec:
    return load_model(gguf_path)


@pytest.fixture(scope="module")
def llama2c_spec(llama2c_path, tok512_path) -> ModelSpec:
    return load_model(llama2c_path, tokenizer_path=tok512_path)


def bits(a: np.ndarray) -> np.ndarray:
    """The float32 bit patterns of ``a``: equal bits means bit-identical values (NaN included)."""
    assert a.dtype == np.float32
    return np.ascontiguousarray(a).view(np.uint32)


def mmap_root(a: np.ndarray):
    """The object at the end of ``a``'s ``.base`` chain that owns its memory."""
    while isinstance(a, np.ndarray) and a.base is not None:
        if isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap):
            return a
        a = a.base
    return a


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# --- hyper-parameters and weights: GGUF == llama2.c ------------------------------------------

@pytest.mark.parametrize("which", ["gguf", "llama2c"])
def test_stories260k_hyper_parameters(request, which):
    spec = request.getfixturevalue(f"{which}_spec")
    cfg = spec.config
    assert {k: getattr(cfg, k) for k in STORIES_CONFIG} == STORIES_CONFIG
    assert (cfg.q_dim, cfg.kv_dim) == (64, 32)
    assert cfg.rope_theta == 10000.0
    assert (cfg.rope_dim or cfg.head_dim) == 8
    assert np.float32(cfg.rms_eps) == np.float32(1e-5)
    assert spec.format == which


def test_gguf_and_llama2c_differ_only_in_context_length_and_tied_classifier(gguf_spec, llama2c_spec):
    # GGUF: llama.context_length=2048 (a converter default) and an explicit output.weight;
    # llama2.c: seq_len=512 and a classifier shared with the embedding.
    assert (gguf_spec.config.context_length, llama2c_spec.config.context_length) == (2048, 512)
    assert (gguf_spec.config.tied_output, llama2c_spec.config.tied_output) == (False, True)


def test_every_weight_is_bit_identical_between_gguf_and_llama2c(gguf_spec, llama2c_spec):
    assert set(gguf_spec.weights) == set(llama2c_spec.weights) | {"output"}
    assert len(llama2c_spec.weights) == 3 + 9 * 5 - 1
    for name, w2 in llama2c_spec.weights.items():
        w1 = gguf_spec.weights[name]
        assert (w1.dtype, w2.dtype) == ("f32", "f32"), name
        assert w1.shape == w2.shape == w1.data.shape == w2.data.shape, name
        assert np.array_equal(bits(w1.data), bits(w2.data)), f"{name} differs"
    # The GGUF's explicit classifier is the llama2.c shared embedding, bit for bit.
    assert np.array_equal(bits(gguf_spec.output.data), bits(llama2c_spec.output.data))
    assert llama2c_spec.output is llama2c_spec.weights["token_embd"]


def test_weights_have_the_expected_names_and_shapes(gguf_spec):
    shapes = expected_shapes(gguf_spec.config)
    assert {name: w.shape for name, w in gguf_spec.weights.items()} == shapes
    assert shapes["blk.0.attn_k"] == (32, 64) and shapes["blk.0.ffn_down"] == (64, 172)
    assert sum(int(np.prod(s)) for s in shapes.values()) == 260_032 + 512 * 64  # + the explicit output
    assert all(f"blk.4.{t}" in gguf_spec.weights for t in LAYER_TENSORS)


def test_gguf_weights_match_the_gguf_reader_bit_for_bit(gguf_path, gguf_spec):
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    assert len(reader.tensors) == 48
    for t in reader.tensors:
        w = gguf_spec.weights[t.name[: -len(".weight")]]
        assert np.array_equal(bits(w.data), bits(np.asarray(t.data))), t.name


def test_both_loaders_give_the_same_tokenizer(gguf_spec, llama2c_spec):
    a, b = gguf_spec.tokenizer, llama2c_spec.tokenizer
    assert a.vocab_size == b.vocab_size == 512
    assert a.tokens == b.tokens
    assert a.scores == b.scores
    assert a.token_types == b.token_types
    assert (a.bos_id, a.eos_id, a.unk_id) == (b.bos_id, b.eos_id, b.unk_id) == (1, 2, 0)


def test_llama2c_finds_tok512_beside_the_checkpoint(llama2c_path, tok512_path):
    spec = load_llama2c(llama2c_path)  # no tokenizer_path: tok512.bin is in the same folder
    assert os.path.samefile(spec.metadata["tokenizer_path"], tok512_path)
    assert spec.tokenizer.vocab_size == 512


def test_format_is_chosen_by_content_not_by_file_name(tmp_path, gguf_path):
    renamed = tmp_path / "stories260K.bin"
    renamed.symlink_to(gguf_path)
    spec = load_model(renamed)
    assert spec.format == "gguf" and spec.config.dim == 64


def test_gguf_without_output_weight_ties_the_classifier(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    del contents.tensors["output.weight"]
    spec = load_model(save_gguf(contents))
    assert spec.config.tied_output
    assert "output" not in spec.weights
    assert spec.output is spec.weights["token_embd"]


def test_gguf_rewritten_by_gguf_writer_loads_the_same_weights(stories_gguf, save_gguf, gguf_spec):
    """The GGUF rewriter used by the error tests is faithful: its baseline loads identically."""
    spec = load_model(save_gguf(stories_gguf.copy()))
    assert spec.config == gguf_spec.config
    for name, w in gguf_spec.weights.items():
        assert np.array_equal(bits(spec.weights[name].data), bits(w.data)), name


# --- zero copy -------------------------------------------------------------------------------

def test_gguf_f32_weights_are_read_only_views_of_the_file_map(gguf_path, gguf_spec):
    import gguf

    offsets = {t.name[: -len(".weight")]: t.data_offset for t in gguf.GGUFReader(str(gguf_path)).tensors}
    roots = set()
    for name, w in gguf_spec.weights.items():
        assert w.dtype == "f32" and w.data.dtype == np.float32 and w.source_type == ""
        assert not w.data.flags.writeable, f"{name} is writeable: a copy, or a writable map of the model file"
        root = mmap_root(w.data)
        assert isinstance(root, np.memmap), f"{name} is not backed by a memory map (base chain ends in {type(root)})"
        assert np.shares_memory(w.data, root)
        # It points exactly at the tensor's bytes in the file.
        assert address(w.data) - address(root) == offsets[name], name
        roots.add(id(root))
    assert len(roots) == 1  # one map of the file, shared by every weight


def test_llama2c_weights_are_read_only_views_of_the_file_map(llama2c_spec):
    roots = set()
    for name, w in llama2c_spec.weights.items():
        assert not w.data.flags.writeable, name
        root = mmap_root(w.data)
        assert isinstance(root, np.memmap), name
        assert np.shares_memory(w.data, root)
        roots.add(id(root))
    assert len(roots) == 1
    # The first float after the 28-byte header is token_embd[0, 0].
    assert address(llama2c_spec.weights["token_embd"].data) - address(root) == 0
    assert root.offset == 28


# --- Q8_0 / Q4_0 -> MatMulNBits --------------------------------------------------------------

def dequantize_nbits(blob: np.ndarray, scales: np.ndarray, bits_: int, shape: tuple[int, int]) -> np.ndarray:
    """MatMulNBits blob + scales -> float32 ``shape``, straight from the format's definition.

    8 bits: value = scale * (u8 - 128). 4 bits: byte m of a block holds element 2m in its low
    nibble and element 2m + 1 in its high nibble; value = scale * (nibble - 8).
    """
    rows, cols = shape
    num_blocks = cols // 32
    assert blob.dtype == np.uint8 and blob.shape == (rows, num_blocks, 32 if bits_ == 8 else 16)
    assert scales.dtype == np.float32 and scales.shape == (rows * num_blocks,)
    if bits_ == 8:
        q = blob.astype(np.int32) - 128
    else:
        q = np.empty((rows, num_blocks, 32), dtype=np.int32)
        q[:, :, 0::2] = (blob & 0x0F).astype(np.int32) - 8
        q[:, :, 1::2] = (blob >> 4).astype(np.int32) - 8
    values = scales.reshape(rows, num_blocks, 1) * q.astype(np.float32)
    return values.reshape(rows, cols)


def random_blocks(rows: int, cols: int, type_name: str, seed: int) -> np.ndarray:
    """GGML blocks with random (finite) fp16 scales and every possible quant byte."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=gguf.quants.quant_shape_to_byte_shape((rows, cols), qtype), dtype=np.uint8)
    blocks = raw.reshape(rows, cols // 32, -1)
    scales = rng.standard_normal((rows, cols // 32)).astype(np.float16)
    scales[0, 0], scales[-1, -1] = np.float16(0.0), np.float16(-65504.0)  # zero and the largest magnitude
    scales[rows // 2, 0] = np.float16(6e-8)  # a subnormal scale
    blocks[:, :, :2] = scales.view(np.uint8).reshape(rows, cols // 32, 2)
    return raw


@pytest.mark.parametrize("type_name, bits_", [("Q8_0", 8), ("Q4_0", 4)])
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (64, 96), (7, 256)])
def test_q8_0_and_q4_0_repack_keeps_every_value_exactly(type_name, bits_, shape):
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    raw = random_blocks(*shape, type_name, seed=shape[0] * 1000 + shape[1])
    w = quants.repack(raw, type_name, shape)
    blob, scales = w.blob, w.scales
    ours = dequantize_nbits(blob, scales, bits_, shape)
    reference = gguf.quants.dequantize(raw, qtype)
    assert reference.shape == shape
    assert np.array_equal(bits(ours), bits(reference))


@pytest.mark.parametrize("type_name, bits_", [("Q8_0", 8), ("Q4_0", 4)])
def test_q8_0_and_q4_0_repack_of_quantized_real_weights_is_exact(gguf_spec, type_name, bits_):
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    weights = gguf_spec.weights["token_embd"].data  # (512, 64)
    raw = gguf.quants.quantize(np.asarray(weights), qtype)
    w = quants.repack(raw, type_name, weights.shape)
    blob, scales = w.blob, w.scales
    assert np.array_equal(bits(dequantize_nbits(blob, scales, bits_, weights.shape)),
                          bits(gguf.quants.dequantize(raw, qtype)))


def quantized_stories(stories_gguf, type_name: str):
    """stories260K with every matrix whose rows are a multiple of 32 stored as ``type_name``
    (ffn_down has 172 inputs and stays F32, as do the norm vectors)."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    contents = stories_gguf.copy()
    quantized = {}
    for name, (array, _raw_dtype) in list(contents.tensors.items()):
        if array.ndim == 2 and array.shape[1] % 32 == 0:
            raw = gguf.quants.quantize(array, qtype)
            contents.set_tensor(name, raw, qtype)
            quantized[name[: -len(".weight")]] = raw
    return contents, quantized


@pytest.mark.parametrize("type_name, bits_", [("Q8_0", 8), ("Q4_0", 4)])
def test_quantized_gguf_loads_exactly(stories_gguf, save_gguf, gguf_spec, type_name, bits_):
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    contents, quantized = quantized_stories(stories_gguf, type_name)
    spec = load_model(save_gguf(contents))
    assert len(quantized) == 2 + 5 * 6  # token_embd, output, and q/k/v/o/gate/up per layer
    for name, w in spec.weights.items():
        if name not in quantized:
            assert w.dtype == "f32", name
            assert np.array_equal(bits(w.data), bits(gguf_spec.weights[name].data)), name
            continue
        assert w.dtype == type_name.lower() and w.shape == gguf_spec.weights[name].shape, name
        assert w.data.flags.c_contiguous
        # a layer's matrices and the classifier, in rows of whole 16s, are our kernels' form;
        # the rest MatMulNBits
        classifier = name == ("token_embd" if spec.config.tied_output else "output")
        assert w.kernel_form == quants.kernel_form(name, type_name, w.shape, classifier), name
        if w.kernel_form:
            ours = dequantize_form(w.data, type_name, w.shape)
        else:
            ours = dequantize_nbits(w.data, w.scales, bits_, w.shape)
        assert np.array_equal(bits(ours), bits(gguf.quants.dequantize(quantized[name], qtype))), name
    assert any(w.kernel_form for w in spec.weights.values())
    assert spec.metadata["tensor_types"] == sorted({"F32", type_name})


@pytest.mark.parametrize("type_name, bits_", [("Q8_0", 8), ("Q4_0", 4)])
def test_synthetic_quantized_model_loads_exactly(tmp_path, type_name, bits_):
    """A whole stories15M-shaped model written by ``dualpath.models.synth``."""
    import gguf

    from dualpath.models.synth import synth_gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    path = synth_gguf(tmp_path / f"s15-{type_name}.gguf", "stories15M", type_name, seed=1)
    spec = load_gguf(path)
    assert (spec.config.dim, spec.config.num_layers, spec.config.vocab_size) == (288, 6, 32000)
    reader = gguf.GGUFReader(path)
    num_quantized = 0
    for t in reader.tensors:
        w = spec.weights[t.name[: -len(".weight")]]
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            assert w.dtype == "f32" and np.array_equal(bits(w.data), bits(np.asarray(t.data))), t.name
            continue
        assert t.tensor_type == qtype and w.dtype == type_name.lower(), t.name
        # every layer matrix (288 rows and more) and the classifier (32,000 rows)
        assert w.kernel_form == (t.name.startswith("blk.") or t.name == "output.weight"), t.name
        if w.kernel_form:
            ours = dequantize_form(w.data, type_name, w.shape)
        else:
            ours = dequantize_nbits(w.data, w.scales, bits_, w.shape)
        assert np.array_equal(bits(ours), bits(gguf.quants.dequantize(np.asarray(t.data), qtype))), t.name
        num_quantized += 1
    assert num_quantized == 2 + 7 * 6


# --- F16 / BF16 -> F32 -----------------------------------------------------------------------

def f16_reference(u16: np.ndarray) -> np.ndarray:
    """IEEE binary16 bit patterns -> float32, from the definition (sign, exponent, mantissa)."""
    u16 = u16.astype(np.int64)
    sign = np.where(u16 >> 15, -1.0, 1.0)
    exponent = (u16 >> 10) & 0x1F
    mantissa = u16 & 0x3FF
    value = np.where(exponent == 0, np.ldexp(mantissa.astype(np.float64), -24),  # zero / subnormal
                     np.ldexp((1024 + mantissa).astype(np.float64), (exponent - 25).astype(np.int32)))
    value = np.where(exponent == 31, np.where(mantissa == 0, np.inf, np.nan), value)
    return np.copysign(value, sign).astype(np.float32)  # exact: every binary16 value is a binary32 value


def bf16_reference(u16: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns -> float32: the top half of the float32 bits."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


def half_stories(stories_gguf, type_name: str):
    """stories260K with every matrix replaced by 16-bit patterns of ``type_name`` that, over
    all the matrices, cover all 65536 patterns (NaNs, infinities, subnormals, -0 included)."""
    import gguf

    contents = stories_gguf.copy()
    patterns = {}
    start = 0
    for name, (array, _) in list(contents.tensors.items()):
        if array.ndim != 2:
            continue
        u16 = ((start + np.arange(array.size)) % 65536).astype(np.uint16).reshape(array.shape)
        start += array.size
        if type_name == "F16":
            contents.set_tensor(name, u16.view(np.float16))
        else:
            contents.set_tensor(name, u16.view(np.uint8).reshape(array.shape[0], -1), gguf.GGMLQuantizationType.BF16)
        patterns[name[: -len(".weight")]] = u16
    assert start >= 65536
    return contents, patterns


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_f16_and_bf16_tensors_are_widened_to_f32_exactly(stories_gguf, save_gguf, type_name):
    import gguf

    contents, patterns = half_stories(stories_gguf, type_name)
    spec = load_model(save_gguf(contents))
    assert spec.metadata["tensor_types"] == sorted({"F32", type_name})
    reference = f16_reference if type_name == "F16" else bf16_reference
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    for name, u16 in patterns.items():
        w = spec.weights[name]
        assert (w.dtype, w.source_type, w.data.dtype, w.data.shape) == ("f32", type_name, np.float32, u16.shape)
        expected = reference(u16)
        got = w.data
        nan = np.isnan(expected)
        assert np.array_equal(np.isnan(got), nan), name
        assert np.array_equal(bits(got)[~nan], bits(expected)[~nan]), name
        assert np.array_equal(np.signbit(got), np.signbit(expected)), name
        if type_name == "BF16":  # a shift: even NaN payloads are kept
            assert np.array_equal(bits(got), bits(expected)), name
        # and the gguf package's own reading agrees
        ref_gguf = gguf.quants.dequantize(u16.view(np.uint8).reshape(u16.shape[0], -1), qtype)
        assert np.array_equal(bits(got)[~nan], bits(ref_gguf.reshape(u16.shape))[~nan]), name


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_real_weights_stored_as_f16_or_bf16_load_as_their_rounded_values(stories_gguf, save_gguf, gguf_spec,
                                                                          type_name):
    import gguf

    contents = stories_gguf.copy()
    for name, (array, _) in list(contents.tensors.items()):
        if type_name == "F16":
            contents.set_tensor(name, array.astype(np.float16))
        else:
            raw = gguf.quants.quantize(array, gguf.GGMLQuantizationType.BF16)
            contents.set_tensor(name, raw, gguf.GGMLQuantizationType.BF16)
    spec = load_model(save_gguf(contents))
    for name, w in spec.weights.items():
        exact = np.asarray(gguf_spec.weights[name].data)
        if type_name == "F16":
            expected = exact.astype(np.float16).astype(np.float32)
        else:  # round to nearest even on the top 16 bits (no NaNs in a trained model)
            u32 = exact.view(np.uint32).astype(np.uint64)
            expected = (((u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16).astype(np.uint32) << 16).view(np.float32)
        assert np.array_equal(bits(w.data), bits(expected)), name
        assert np.max(np.abs(w.data - exact)) <= np.max(np.abs(exact)) * (2.0 ** -8), name


# --- metadata ----------------------------------------------------------------------------------

def _metadata_of(path):
    from dualpath.models.gguf import _Metadata, open_reader

    return _Metadata(str(path), open_reader(str(path)))


def test_metadata_arrays_read_in_one_part_equal_gguf_py_field_by_field(gguf_path, tmp_path):
    """Our reader keeps an array's items in one part (gguf-py makes one or two numpy views
    per item: seconds for a 262k-token vocabulary); every field must still read as gguf-py
    reads it, on the real file, a byte-level BPE synth file with merges, and a file holding
    non-ASCII, empty-string and nested arrays written by gguf-py's writer."""
    import gguf

    from dualpath.models.synth import synth_gguf

    w = gguf.GGUFWriter(str(tmp_path / "kv.gguf"), "llama")
    w.add_array("t.strings", ["", "a", "\u2581the", "\u00e9t\u00e9", "\U0001f600", "x" * 300])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_string("t.s", "plain")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    files = [gguf_path, synth_gguf(tmp_path / "l3.gguf", "llama3-tiny", "F32", seed=1), tmp_path / "kv.gguf"]
    for path in files:
        meta, ref = _metadata_of(path), gguf.GGUFReader(str(path))
        assert set(meta.fields) == set(ref.fields), path
        for key, field in ref.fields.items():
            assert meta.get(key) == field.contents(), (path, key)
    meta = _metadata_of(tmp_path / "kv.gguf")
    assert meta.get("t.strings")[3:5] == ["\u00e9t\u00e9", "\U0001f600"]


def test_a_string_array_running_past_the_end_is_a_clear_error(gguf_path, tmp_path):
    """A vocabulary whose last string claims more bytes than the file holds is refused by
    name, not read from past the end of the map."""
    from dualpath.errors import ModelLoadError

    data = bytearray(gguf_path.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4 + 8  # the value type, item type, count
    data[at:at + 8] = (len(data)).to_bytes(8, "little")  # the first token's length
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="string at byte .* claims .* bytes, more than the rest of the file"):
        load_gguf(bad)
