"""Every way a model file can be broken ends in ``ModelLoadError`` naming the file and the problem.

Never a segfault, and never a bare ``KeyError``/``IndexError``/``struct.error`` or a plain
``ValueError`` from deep inside a reader: the user must learn which file is wrong and why.
Corrupted copies are written to ``tmp_path``; the shared models are only read.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from dualpath.errors import ModelLoadError
from dualpath.models import load_model
from dualpath.models.gguf import load_gguf
from dualpath.models.llama2c import load_llama2c

GGUF_SIZE = 1_185_376
GGUF_DATA_START = 14176  # first byte of token_embd.weight
LLAMA2C_HEADER = (64, 172, 5, 8, 4, 512, 512)  # dim, hidden, layers, heads, kv heads, vocab, seq_len


def expect_load_error(load, path, *phrases, named=None) -> ModelLoadError:
    """Run ``load(path)``; assert a ModelLoadError whose message names the file and every phrase."""
    with pytest.raises(ModelLoadError) as info:
        load(path)
    err = info.value
    assert type(err) is ModelLoadError
    message = str(err)
    assert message == f"{err.path}: {err.problem}"
    named = os.fspath(path if named is None else named)
    assert named in message, f"message does not name the file {named}: {message!r}"
    assert err.path == named
    problem = err.problem.lower()  # not the whole message: tmp_path holds the test's name
    for phrase in phrases:
        assert phrase.lower() in problem, f"{phrase!r} not in {message!r}"
    return err


def write_bytes(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --- files that are not there, or not files --------------------------------------------------

@pytest.mark.parametrize("load", [load_model, load_gguf, load_llama2c], ids=["load_model", "load_gguf", "load_llama2c"])
def test_missing_file_is_reported_as_missing(tmp_path, load):
    expect_load_error(load, tmp_path / "nope.gguf", "no such file")


@pytest.mark.parametrize("load", [load_model, load_gguf, load_llama2c], ids=["load_model", "load_gguf", "load_llama2c"])
def test_folder_is_reported_as_a_folder(tmp_path, load):
    folder = tmp_path / "model.gguf"
    folder.mkdir()
    expect_load_error(load, folder, "folder")


@pytest.mark.parametrize("name", ["empty.gguf", "empty.bin", "empty"])
def test_empty_file_is_reported_as_empty(tmp_path, name):
    path = write_bytes(tmp_path, name, b"")
    expect_load_error(load_model, path, "empty")


def test_empty_file_is_reported_as_empty_by_each_loader(tmp_path):
    path = write_bytes(tmp_path, "empty.gguf", b"")
    expect_load_error(load_gguf, path, "empty")
    expect_load_error(load_llama2c, path, "empty", "0 bytes")


# --- GGUF: damaged bytes ---------------------------------------------------------------------

@pytest.mark.parametrize("cut", [
    4,                       # magic only
    10,                      # inside the version / counts header
    24,                      # header complete, no metadata
    100,                     # inside tokenizer.ggml.tokens
    5000,                    # inside tokenizer.ggml.tokens
    11100,                   # inside the llama.* hyper-parameters
    12000,                   # inside the tensor infos
    GGUF_DATA_START,         # tensor infos complete, no tensor data
    GGUF_DATA_START + 1,     # one byte of tensor data
    200_000,                 # in the middle of the tensor data
    GGUF_SIZE - 100,         # the last tensor is short
    GGUF_SIZE - 1,
])
def test_truncated_gguf_is_reported_as_truncated(tmp_path, gguf_path, cut):
    data = gguf_path.read_bytes()
    assert len(data) == GGUF_SIZE
    path = write_bytes(tmp_path, f"cut{cut}.gguf", data[:cut])
    expect_load_error(load_model, path, "truncated")
    expect_load_error(load_gguf, path, "truncated")


@pytest.mark.parametrize("magic", [b"GGUX", b"FUGG", b"\x00\x00\x00\x00", b"ggjt"])
def test_wrong_magic_is_not_a_gguf_file(tmp_path, gguf_path, magic):
    data = magic + gguf_path.read_bytes()[4:]
    path = write_bytes(tmp_path, "model.gguf", data)
    expect_load_error(load_model, path, "not a GGUF file")
    expect_load_error(load_gguf, path, "not a GGUF file")


def test_short_file_with_wrong_magic_is_not_a_gguf_file(tmp_path):
    path = write_bytes(tmp_path, "tiny.gguf", b"GG")
    expect_load_error(load_model, path, "not a GGUF file")
    expect_load_error(load_gguf, path, "not a GGUF file")


def test_each_file_rule_has_one_message_whichever_loader_checks_it(tmp_path, gguf_path):
    """models/files.py holds the checks every loader shares: the same words from each."""
    folder = tmp_path / "model.gguf"
    folder.mkdir()
    empty = write_bytes(tmp_path, "empty.bin", b"")
    for path in (folder, tmp_path / "nope.gguf", empty):
        assert len({expect_load_error(load, path).problem for load in (load_model, load_gguf, load_llama2c)}) == 1
    wrong = write_bytes(tmp_path, "wrong.gguf", b"GGUX" + gguf_path.read_bytes()[4:])
    for load in (load_model, load_gguf):
        assert expect_load_error(load, wrong).problem == "not a GGUF file (magic b'GGUX', expected b'GGUF')"


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFF])
def test_unsupported_gguf_version_is_rejected(tmp_path, gguf_path, version):
    data = bytearray(gguf_path.read_bytes())
    data[4:8] = struct.pack("<I", version)
    path = write_bytes(tmp_path, "model.gguf", bytes(data))
    expect_load_error(load_model, path, "GGUF")


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes_named_gguf_are_not_a_gguf_file(tmp_path, seed):
    data = np.random.default_rng(seed).integers(0, 256, size=4096, dtype=np.uint8).tobytes()
    if data[:4] == b"GGUF":  # pragma: no cover - astronomically unlikely
        data = b"XXXX" + data[4:]
    path = write_bytes(tmp_path, f"random{seed}.gguf", data)
    expect_load_error(load_model, path, "not a GGUF file")


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes_named_bin_are_not_a_llama2c_checkpoint(tmp_path, seed):
    data = np.random.default_rng(100 + seed).integers(0, 256, size=4096, dtype=np.uint8).tobytes()
    path = write_bytes(tmp_path, f"random{seed}.bin", data)
    expect_load_error(load_model, path)


@pytest.mark.parametrize("seed", range(12))
def test_random_bytes_after_a_valid_gguf_header_raise_model_load_error(tmp_path, seed):
    rng = np.random.default_rng(200 + seed)
    body = rng.integers(0, 256, size=int(rng.integers(0, 20000)), dtype=np.uint8).tobytes()
    path = write_bytes(tmp_path, f"random{seed}.gguf", b"GGUF" + struct.pack("<I", 3) + body)
    expect_load_error(load_model, path)


@pytest.mark.parametrize("seed", range(40))
def test_random_damage_to_gguf_metadata_never_escapes_as_another_error(tmp_path, gguf_path, seed):
    """Overwrite a few bytes of the header/metadata/tensor infos: the file either still loads
    (e.g. a changed character inside a token) or fails with ModelLoadError."""
    rng = np.random.default_rng(300 + seed)
    data = bytearray(gguf_path.read_bytes())
    for _ in range(int(rng.integers(1, 9))):
        at = int(rng.integers(8, GGUF_DATA_START - 8))
        data[at:at + 8] = rng.integers(0, 256, size=8, dtype=np.uint8).tobytes()
    path = write_bytes(tmp_path, "damaged.gguf", bytes(data))
    try:
        spec = load_model(path)
    except ModelLoadError as e:
        assert type(e) is ModelLoadError and e.path == str(path) and str(path) in str(e)
    else:
        assert spec.config.dim == 64


# --- GGUF: well-formed files with the wrong content ------------------------------------------

@pytest.mark.parametrize("arch", ["gpt2", "mamba", "qwen2moe"])
def test_unsupported_architecture_is_named(tmp_path, arch):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / f"{arch}.gguf"), arch)
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    err = expect_load_error(load_model, tmp_path / f"{arch}.gguf", "unsupported architecture", repr(arch))
    assert "supported: llama, qwen2, qwen3, gemma2, gemma3, phi3" in str(err)  # says what is supported


def test_llama_weights_under_another_architecture_name_are_rejected(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    contents.arch = "mamba"
    path = save_gguf(contents)
    expect_load_error(load_model, path, "unsupported architecture 'mamba'")


def test_llama_file_relabelled_as_another_family_names_the_missing_key(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    contents.arch = "qwen2"  # its keys are still llama.*: the family's own are missing
    expect_load_error(load_model, save_gguf(contents), "missing metadata key 'qwen2.")


def _q_bytes(rows: int, cols: int, qtype, seed: int = 0) -> np.ndarray:
    """Random bytes in the layout of a ``(rows, cols)`` tensor of GGML type ``qtype``."""
    import gguf

    byte_shape = gguf.quants.quant_shape_to_byte_shape((rows, cols), qtype)
    return np.random.default_rng(seed).integers(0, 256, size=byte_shape, dtype=np.uint8)


@pytest.mark.parametrize("type_name", ["MXFP4", "Q8_1"])
def test_unsupported_tensor_type_is_named(stories_gguf, save_gguf, type_name):
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    contents = stories_gguf.copy()
    contents.set_tensor("blk.1.attn_q.weight", _q_bytes(64, 64, qtype), qtype)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "'blk.1.attn_q.weight'", f"unsupported type {type_name}", "Q8_0", "Q6_K",
                      "Q4_K", "IQ4_NL")


def test_iq2_xxs_tensor_is_an_unsupported_type(save_gguf, stories_gguf):
    """IQ2_XXS needs rows of 256: give the classifier a (512, 256) IQ2_XXS matrix (the
    type is checked before the shape, so the message is about the type)."""
    import gguf

    qtype = gguf.GGMLQuantizationType.IQ2_XXS
    contents = stories_gguf.copy()
    contents.set_tensor("output.weight", _q_bytes(512, 256, qtype), qtype)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "'output.weight'", "unsupported type IQ2_XXS")


@pytest.mark.parametrize("type_name, cols", [("Q6_K", 128), ("Q4_K", 320), ("Q5_0", 48), ("Q2_K", 64)])
def test_row_length_not_a_multiple_of_the_block_names_tensor_and_shape(type_name, cols):
    """A GGUF writer cannot even store such a row, so feed the converter a tensor as the
    reader would describe it (shape in GGUF order: columns first)."""
    from types import SimpleNamespace

    import gguf

    from dualpath.errors import ModelLoadError
    from dualpath.models.gguf import convert_tensor

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    t = SimpleNamespace(tensor_type=qtype, shape=np.array([cols, 4]), data=np.zeros(64, np.uint8))
    with pytest.raises(ModelLoadError) as e:
        convert_tensor("m.gguf", "blk.0.ffn_up.weight", t, "blk.0.ffn_up")
    msg = str(e.value)
    assert "'blk.0.ffn_up.weight'" in msg and type_name in msg and f"(4, {cols})" in msg
    assert f"multiple of {gguf.constants.GGML_QUANT_SIZES[qtype][0]}" in msg


def test_float64_tensor_is_an_unsupported_type(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    weight, _ = contents.tensors["blk.0.ffn_norm.weight"]
    contents.set_tensor("blk.0.ffn_norm.weight", weight.astype(np.float64))
    path = save_gguf(contents)
    expect_load_error(load_model, path, "'blk.0.ffn_norm.weight'", "unsupported type F64")


@pytest.mark.parametrize("name", ["blk.3.ffn_up", "blk.0.attn_q", "blk.4.attn_norm", "output_norm", "token_embd"])
def test_missing_tensor_is_named(stories_gguf, save_gguf, name):
    contents = stories_gguf.copy()
    del contents.tensors[name + ".weight"]
    path = save_gguf(contents)
    expect_load_error(load_model, path, f"missing tensor '{name}'")


@pytest.mark.parametrize("name, shape, expected", [
    ("blk.2.attn_k", (64, 64), (32, 64)),        # kv_dim rows expected
    ("blk.0.ffn_down", (172, 64), (64, 172)),    # transposed
    ("token_embd", (511, 64), (512, 64)),        # one token short
    ("output", (512, 32), (512, 64)),
    ("blk.4.ffn_norm", (65,), (64,)),
])
def test_shape_mismatch_names_tensor_and_both_shapes(stories_gguf, save_gguf, name, shape, expected):
    contents = stories_gguf.copy()
    contents.set_tensor(name + ".weight", np.zeros(shape, dtype=np.float32))
    path = save_gguf(contents)
    expect_load_error(load_model, path, f"tensor '{name}' has shape {shape}, expected {expected}")


def test_matrix_where_a_norm_vector_belongs_is_a_shape_mismatch(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    contents.set_tensor("blk.1.attn_norm.weight", np.ones((2, 64), dtype=np.float32))
    path = save_gguf(contents)
    expect_load_error(load_model, path, "'blk.1.attn_norm'", "shape (2, 64), expected (64,)")


def _set_u32(contents, key: str, value: int) -> None:
    import gguf

    contents.fields[key] = (value, gguf.GGUFValueType.UINT32, None)


@pytest.mark.parametrize("head_count", [7, 12, 24])
def test_head_count_not_dividing_embedding_length_is_reported(stories_gguf, save_gguf, head_count):
    contents = stories_gguf.copy()
    _set_u32(contents, "llama.attention.head_count", head_count)
    _set_u32(contents, "llama.attention.head_count_kv", head_count)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "embedding_length=64", f"head_count={head_count}", "multiple")


def test_head_count_not_a_multiple_of_kv_heads_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    _set_u32(contents, "llama.attention.head_count_kv", 3)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "num_heads=8", "num_kv_heads=3")


@pytest.mark.parametrize("key, value, phrase", [
    ("llama.attention.head_count", 0, "num_heads=0"),
    ("llama.block_count", 0, "num_layers=0"),
    ("llama.feed_forward_length", 0, "hidden_dim=0"),
    ("llama.rope.dimension_count", 4, "partial rotary"),
])
def test_out_of_range_hyper_parameter_is_named(stories_gguf, save_gguf, key, value, phrase):
    contents = stories_gguf.copy()
    _set_u32(contents, key, value)
    path = save_gguf(contents)
    expect_load_error(load_model, path, phrase)


def test_wrong_layer_count_shows_up_as_a_missing_tensor(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    _set_u32(contents, "llama.block_count", 6)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "missing tensor 'blk.5.")


@pytest.mark.parametrize("key", ["llama.embedding_length", "llama.feed_forward_length", "llama.block_count",
                                 "llama.attention.head_count", "llama.context_length"])
def test_missing_required_hyper_parameter_names_the_key(stories_gguf, save_gguf, key):
    contents = stories_gguf.copy()
    del contents.fields[key]
    path = save_gguf(contents)
    expect_load_error(load_model, path, f"missing metadata key {key!r}")


@pytest.mark.parametrize("key, value, vtype_name, phrase", [
    ("llama.embedding_length", "64", "STRING", "must be an integer"),
    ("llama.embedding_length", 64.0, "FLOAT32", "must be an integer"),
    ("llama.block_count", [5, 5], "ARRAY", "must be an integer"),
    ("llama.rope.freq_base", "ten thousand", "STRING", "must be a number"),
    ("llama.attention.layer_norm_rms_epsilon", "1e-5", "STRING", "must be a number"),
    ("llama.attention.layer_norm_rms_epsilon", -1.0, "FLOAT32", "must be positive"),
    ("llama.rope.freq_base", [1.0, 2.0], "ARRAY", "must be a number"),
])
def test_hyper_parameter_of_the_wrong_type_names_the_key(stories_gguf, save_gguf, key, value, vtype_name, phrase):
    import gguf

    vtype = getattr(gguf.GGUFValueType, vtype_name)
    sub_type = None
    if vtype == gguf.GGUFValueType.ARRAY:
        sub_type = gguf.GGUFValueType.FLOAT32 if isinstance(value[0], float) else gguf.GGUFValueType.UINT32
    contents = stories_gguf.copy()
    contents.fields[key] = (value, vtype, sub_type)
    path = save_gguf(contents)
    err = expect_load_error(load_model, path, phrase)
    if "positive" not in phrase:
        assert key in str(err)


def test_missing_tokenizer_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    for key in [k for k in contents.fields if k.startswith("tokenizer.")]:
        del contents.fields[key]
    path = save_gguf(contents)
    expect_load_error(load_model, path, "no tokenizer")


def test_missing_token_list_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    del contents.fields["tokenizer.ggml.tokens"]
    path = save_gguf(contents)
    expect_load_error(load_model, path, "no tokenizer", "tokenizer.ggml.tokens")


def test_missing_tokenizer_model_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    del contents.fields["tokenizer.ggml.model"]
    path = save_gguf(contents)
    expect_load_error(load_model, path, "no tokenizer", "tokenizer.ggml.model")


def test_unsupported_tokenizer_model_is_named(stories_gguf, save_gguf):
    import gguf

    contents = stories_gguf.copy()
    contents.fields["tokenizer.ggml.model"] = ("rwkv", gguf.GGUFValueType.STRING, None)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "unsupported tokenizer model 'rwkv'")


def test_token_count_differing_from_the_embedding_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        value, vtype, sub_type = contents.fields[key]
        contents.fields[key] = (value[:511], vtype, sub_type)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "511")


def test_score_count_differing_from_the_token_count_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    value, vtype, sub_type = contents.fields["tokenizer.ggml.scores"]
    contents.fields["tokenizer.ggml.scores"] = (value[:100], vtype, sub_type)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "tokenizer.ggml.scores has 100 entries, expected 512")


@pytest.mark.parametrize("key, value, vtype_name", [
    ("tokenizer.ggml.tokens", "abc", "STRING"),
    ("tokenizer.ggml.scores", 0.0, "FLOAT32"),
    ("tokenizer.ggml.token_type", 1, "INT32"),
    ("tokenizer.ggml.bos_token_id", "1", "STRING"),
    ("tokenizer.ggml.model", 1, "UINT32"),
])
def test_tokenizer_key_of_the_wrong_type_names_the_key(stories_gguf, save_gguf, key, value, vtype_name):
    import gguf

    contents = stories_gguf.copy()
    contents.fields[key] = (value, getattr(gguf.GGUFValueType, vtype_name), None)
    path = save_gguf(contents)
    expect_load_error(load_model, path, key)


def test_quantized_tensor_with_rows_not_a_multiple_of_the_block_is_reported(stories_gguf, save_gguf):
    """ffn_down has 172 inputs: 172 % 32 != 0, so it cannot be Q8_0. Written as raw bytes
    (the writer would refuse), the file claims a (64, 160)-shaped Q8_0 matrix."""
    import gguf

    qtype = gguf.GGMLQuantizationType.Q8_0
    contents = stories_gguf.copy()
    contents.set_tensor("blk.0.ffn_down.weight", _q_bytes(64, 160, qtype), qtype)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "'blk.0.ffn_down'", "(64, 160)", "expected (64, 172)")


def test_bad_alignment_is_reported(stories_gguf, save_gguf):
    contents = stories_gguf.copy()
    _set_u32(contents, "general.alignment", 0)
    path = save_gguf(contents)
    expect_load_error(load_model, path, "corrupt")


# --- llama2.c checkpoints --------------------------------------------------------------------

def _llama2c_copy(tmp_path, llama2c_path, tok512_path, data: bytes | None = None, name="model.bin"):
    """A (possibly altered) copy of stories260K.bin in tmp_path, with tok512.bin beside it."""
    path = write_bytes(tmp_path, name, llama2c_path.read_bytes() if data is None else data)
    (tmp_path / "tok512.bin").write_bytes(tok512_path.read_bytes())
    return path


def test_llama2c_copy_with_its_tokenizer_beside_it_loads(tmp_path, llama2c_path, tok512_path):
    """The baseline for the corruptions below: an unaltered copy loads."""
    spec = load_model(_llama2c_copy(tmp_path, llama2c_path, tok512_path))
    assert spec.format == "llama2c" and spec.config.dim == 64


@pytest.mark.parametrize("cut", [27, 28, 100, 131_100, 1_056_540 - 4 * 4096, 1_056_540 - 4, 1_056_540 - 1])
def test_truncated_llama2c_is_reported_as_truncated(tmp_path, llama2c_path, tok512_path, cut):
    data = llama2c_path.read_bytes()[:cut]
    path = _llama2c_copy(tmp_path, llama2c_path, tok512_path, data)
    expect_load_error(load_model, path, "truncated")
    expect_load_error(load_llama2c, path, "truncated")


@pytest.mark.parametrize("extra", [1, 4, 4 * 64 * 512])  # the last one: a wcls that the header does not announce
def test_llama2c_with_trailing_bytes_is_rejected(tmp_path, llama2c_path, tok512_path, extra):
    data = llama2c_path.read_bytes() + b"\x00" * extra
    path = _llama2c_copy(tmp_path, llama2c_path, tok512_path, data)
    expect_load_error(load_model, path, f"{extra} unexpected trailing bytes")


def _with_header(data: bytes, *fields: int) -> bytes:
    return struct.pack("<7i", *fields) + data[28:]


@pytest.mark.parametrize("fields, phrase", [
    ((-64, 172, 5, 8, 4, 512, 512), "dim=-64"),
    ((64, -172, 5, 8, 4, 512, 512), "hidden_dim=-172"),
    ((64, 172, 0, 8, 4, 512, 512), "n_layers=0"),
    ((64, 172, 5, 8, 4, 512, -7), "seq_len=-7"),
    ((1 << 30, 172, 5, 8, 4, 512, 512), f"dim={1 << 30}"),
    ((64, 172, 5, 8, 4, -(1 << 31), 512), "vocab_size="),
    ((2**31 - 1,) * 7, "out of range"),
    ((64, 172, 5, 7, 7, 512, 512), "n_heads=7"),
    ((64, 172, 5, 8, 3, 512, 512), "num_kv_heads=3"),
    ((64, 172, 5, 64, 64, 512, 512), "head_dim=1"),
    ((64, 172, 5, 8, 4, 1000, 512), "truncated"),
    ((64, 172, 5, 8, 4, 100, 512), "trailing bytes"),
    # Sizes whose products overflow int64: still "truncated", not a wrapped-around byte count.
    ((1 << 23, 1 << 23, 1 << 17, 1 << 20, 1 << 20, 1, 1), "truncated"),
    ((1 << 23, 1 << 23, 1 << 23, 1 << 20, 1 << 20, 1 << 23, 1 << 23), "truncated"),
])
def test_garbage_llama2c_header_is_rejected(tmp_path, llama2c_path, tok512_path, fields, phrase):
    data = _with_header(llama2c_path.read_bytes(), *fields)
    path = _llama2c_copy(tmp_path, llama2c_path, tok512_path, data)
    expect_load_error(load_model, path, phrase)


def test_llama2c_v1_header_with_unknown_version_is_rejected(tmp_path):
    header = struct.pack("<Ii", 0x616B3432, 2) + struct.pack("<7i", *LLAMA2C_HEADER)
    path = write_bytes(tmp_path, "v2.bin", header.ljust(256, b"\x00"))
    expect_load_error(load_model, path, "version 2 is not supported")


def test_llama2c_v1_header_cut_short_is_rejected(tmp_path):
    header = struct.pack("<Ii", 0x616B3432, 1) + struct.pack("<7i", *LLAMA2C_HEADER)
    path = write_bytes(tmp_path, "v1.bin", header)
    expect_load_error(load_model, path, "truncated")


def test_llama2c_without_a_tokenizer_says_to_pass_tokenizer_path(tmp_path, llama2c_path):
    path = write_bytes(tmp_path, "model.bin", llama2c_path.read_bytes())
    expect_load_error(load_model, path, "tokenizer_path", "tok512.bin")
    expect_load_error(load_llama2c, path, "tokenizer_path", "tok512.bin")


def test_llama2c_with_a_missing_tokenizer_path_names_the_tokenizer(tmp_path, llama2c_path):
    tok = tmp_path / "nope" / "tok512.bin"
    with pytest.raises(ModelLoadError) as info:
        load_model(llama2c_path, tokenizer_path=tok)
    assert type(info.value) is ModelLoadError
    assert str(tok) in str(info.value) and "not found" in str(info.value)


def test_llama2c_with_a_folder_as_tokenizer_path_is_rejected(tmp_path, llama2c_path):
    with pytest.raises(ModelLoadError) as info:
        load_model(llama2c_path, tokenizer_path=tmp_path)
    assert type(info.value) is ModelLoadError
    assert str(tmp_path) in str(info.value)


def _bad_tokenizers(tok: bytes) -> dict[str, tuple[bytes, str]]:
    """name -> (tokenizer bytes, phrase of the error)."""
    return {
        "empty": (b"", "truncated"),
        "header_only": (tok[:4], "truncated at token 0"),
        "cut_in_half": (tok[: len(tok) // 2], "truncated at token"),
        "negative_max_len": (struct.pack("<i", -1) + tok[4:], "max_token_length=-1"),
        "huge_max_len": (struct.pack("<i", 1 << 30) + tok[4:], "not a llama2.c tokenizer"),
        "bad_length": (tok[:8] + struct.pack("<i", 1000) + tok[12:], "length 1000"),
        "not_utf8": (tok[:12] + b"\xff" + tok[13:], "UTF-8"),
        "nan_score": (tok[:4] + struct.pack("<f", float("nan")) + tok[8:], "not finite"),
    }


@pytest.mark.parametrize("case", list(_bad_tokenizers(b"x" * 64)))
def test_bad_tokenizer_beside_the_checkpoint_names_the_tokenizer(tmp_path, llama2c_path, tok512_path, case):
    data, phrase = _bad_tokenizers(tok512_path.read_bytes())[case]
    path = _llama2c_copy(tmp_path, llama2c_path, tok512_path)
    tok = write_bytes(tmp_path, "tok512.bin", data)
    expect_load_error(load_model, path, phrase, named=tok)


@pytest.mark.parametrize("case", list(_bad_tokenizers(b"x" * 64)))
def test_bad_tokenizer_path_names_the_tokenizer(tmp_path, llama2c_path, tok512_path, case):
    data, phrase = _bad_tokenizers(tok512_path.read_bytes())[case]
    tok = write_bytes(tmp_path, "bad_tok.bin", data)
    expect_load_error(lambda p: load_model(p, tokenizer_path=tok), llama2c_path, phrase, named=tok)
