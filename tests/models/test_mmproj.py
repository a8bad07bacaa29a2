"""Projector files (``--mmproj``): ``dualpath synth --vision`` writes them as llama.cpp's
converter does (llama.cpp's ``mtmd`` loads them and encodes an image), ``read_mmproj`` reads
the hyper-parameters back, and a file that is not one, or lies about itself, is refused
with the key or tensor named."""

import gguf
import numpy as np
import pytest

import vision_reference
from dualpath.errors import ModelLoadError
from dualpath.models.mmproj import PROJECTORS, check_text_model, expected_tensors, read_mmproj
from dualpath.models.synth import PRESETS, synth_gguf
from dualpath.models.synth_vision import VISION_PRESETS, synth_mmproj
from tests_shared import copy_gguf

TINY = ("smolvlm-tiny", "gemma3-vision-tiny", "llava-tiny")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """(preset, weight type) -> projector file, every tiny preset in every weight type."""
    d = tmp_path_factory.mktemp("mmproj")
    return {(p, t): synth_mmproj(d / f"{p}-{t}.gguf", p, t) for p in TINY for t in ("F32", "F16", "Q8_0")}


def test_every_vision_preset_projects_to_the_width_of_its_text_preset():
    for name, shape in VISION_PRESETS.items():
        assert shape.spec.projector in PROJECTORS, name
        assert PRESETS[shape.text_preset].dim == shape.spec.text_dim, name


@pytest.mark.parametrize("preset", TINY)
@pytest.mark.parametrize("weight_type", ["F32", "F16", "Q8_0"])
def test_a_synthetic_projector_reads_back_as_its_preset(tiny_files, preset, weight_type):
    spec = read_mmproj(tiny_files[preset, weight_type])
    s = VISION_PRESETS[preset].spec
    assert (spec.projector, spec.image_size, spec.patch_size, spec.dim, spec.ffn_dim, spec.num_layers,
            spec.num_heads, spec.merge, spec.text_dim) == (s.projector, s.image_size, s.patch_size, s.dim, s.ffn_dim,
                                                           s.num_layers, s.num_heads, s.merge, s.text_dim)
    assert spec.activation == s.activation and spec.eps == pytest.approx(s.eps)
    assert spec.image_mean == pytest.approx(s.image_mean) and spec.image_std == pytest.approx(s.image_std)
    assert spec.tokens_per_image == (s.image_size // s.patch_size // s.merge) ** 2
    assert spec.tensors["v.blk.0.attn_q.weight"] == ((s.dim, s.dim), weight_type)
    # positions stay F32, as the new converter keeps them; LLaVA's legacy one makes them F16 in an F16 file
    llava_f16 = preset == "llava-tiny" and weight_type == "F16"
    assert spec.tensors["v.position_embd.weight"][1] == ("F16" if llava_f16 else "F32")
    assert set(spec.tensors) == set(expected_tensors(spec))
    assert (spec.class_token, spec.pre_norm, spec.post_norm, spec.patch_bias, spec.ffn_swapped) == (
        s.class_token, s.pre_norm, s.post_norm, s.patch_bias, s.ffn_swapped)


@pytest.mark.parametrize("preset", TINY[:2])
@pytest.mark.parametrize("weight_type", ["F32", "F16", "Q8_0"])
def test_llama_cpp_encodes_an_image_as_the_reference_does(tiny_files, tmp_path, preset, weight_type):
    """llama.cpp's ``mtmd`` loads each synthetic pair, and its embeddings of an image of the
    encoder's own size (no resize in play) are the NumPy reference's (vision_reference.py).
    Idefics3's file is given a longest edge of one tile: an overview and one tile, both the
    image itself. (LLaVA's are not llama.cpp's: tests/vision/test_encoder.py shows where.)"""
    path = tiny_files[preset, weight_type]
    if preset == "smolvlm-tiny":
        path = _variant(tmp_path, path, fields={"clip.vision.preproc_image_size": (64, gguf.GGUFValueType.UINT32)})
    spec = read_mmproj(path)
    text = synth_gguf(tmp_path / "text.gguf", VISION_PRESETS[preset].text_preset)
    image = np.random.default_rng(0).integers(0, 256, (spec.image_size, spec.image_size, 3), dtype=np.uint8)
    chunks = vision_reference.mtmd_image_embeddings(text, spec.path, image)
    want = vision_reference.encode(spec, vision_reference.load_weights(spec), image)
    assert len(chunks) == (2 if preset == "smolvlm-tiny" else 1)
    for got in chunks:
        assert got.shape == want.shape == (spec.tokens_per_image, spec.text_dim)
        cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
        # Q8_0: llama.cpp quantizes the activations to 8 bits as well
        assert cos.min() >= (0.999 if weight_type == "Q8_0" else 0.9999), cos


def _variant(tmp_path, src, **kw):
    return str(copy_gguf(src, tmp_path / "variant.gguf", **kw))


def test_a_text_model_is_not_a_projector(tmp_path):
    text = synth_gguf(tmp_path / "text.gguf", "llama3-tiny")
    with pytest.raises(ModelLoadError, match="not a projector file: general.architecture is 'llama'"):
        read_mmproj(text)


def test_an_unknown_projector_type_is_refused_by_name(tmp_path, tiny_files):
    bad = _variant(tmp_path, tiny_files["smolvlm-tiny", "F16"],
                   fields={"clip.projector_type": ("pixtral", gguf.GGUFValueType.STRING)})
    with pytest.raises(ModelLoadError, match="type 'pixtral' is not supported; supported: gemma3, idefics3, mlp"):
        read_mmproj(bad)


@pytest.mark.parametrize("key, value, vtype, message", [
    ("clip.vision.image_grid_pinpoints", [336, 672, 672, 336], gguf.GGUFValueType.ARRAY, "LLaVA 1.6's tiling"),
    ("clip.vision.feature_layer", [1, 2], gguf.GGUFValueType.ARRAY, "not a stack of several layers' outputs"),
])
def test_llava_kinds_not_supported_are_refused_by_name(tmp_path, tiny_files, key, value, vtype, message):
    bad = _variant(tmp_path, tiny_files["llava-tiny", "F16"], fields={key: (value, vtype, gguf.GGUFValueType.INT32)})
    with pytest.raises(ModelLoadError, match=message):
        read_mmproj(bad)


def test_llava_with_the_feature_layer_of_its_last_layer_is_read(tmp_path, tiny_files):
    """The legacy converter writes ``clip.vision.feature_layer`` where LLaVA's config names one;
    it has then kept the layers up to it, so it is the last stored one."""
    path = _variant(tmp_path, tiny_files["llava-tiny", "F16"],
                    fields={"clip.vision.feature_layer": ([2], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)})
    assert read_mmproj(path).num_layers == 2


def test_an_audio_only_file_is_refused(tmp_path, tiny_files):
    bad = _variant(tmp_path, tiny_files["smolvlm-tiny", "F16"],
                   fields={"clip.has_vision_encoder": (False, gguf.GGUFValueType.BOOL)})
    with pytest.raises(ModelLoadError, match="no vision encoder"):
        read_mmproj(bad)


@pytest.mark.parametrize("key, value, vtype, message", [
    ("clip.vision.patch_size", 24, gguf.GGUFValueType.UINT32, "image_size=64 is not a multiple of"),
    ("clip.vision.attention.head_count", 5, gguf.GGUFValueType.UINT32, "embedding_length=64 is not a multiple"),
    ("clip.vision.projector.scale_factor", 3, gguf.GGUFValueType.UINT32, "patches a side do not merge"),
    ("clip.vision.block_count", 0, gguf.GGUFValueType.UINT32, "block_count=0 must be an integer from 1"),
    ("clip.vision.image_std", [0.5, 0.0, 0.5], gguf.GGUFValueType.ARRAY, "image_std must be 3 numbers above 0"),
    ("clip.vision.attention.layer_norm_epsilon", 5.0, gguf.GGUFValueType.FLOAT32, "must be a number from"),
])
def test_a_lying_key_is_refused_by_name(tmp_path, tiny_files, key, value, vtype, message):
    src = tiny_files["smolvlm-tiny", "F16"]
    items = (gguf.GGUFValueType.FLOAT32,) if vtype == gguf.GGUFValueType.ARRAY else ()
    bad = _variant(tmp_path, src, fields={key: (value, vtype, *items)})
    with pytest.raises(ModelLoadError, match=message):
        read_mmproj(bad)


def test_a_missing_key_is_named(tmp_path, tiny_files):
    bad = _variant(tmp_path, tiny_files["gemma3-vision-tiny", "F16"], drop=frozenset({"clip.vision.image_size"}))
    with pytest.raises(ModelLoadError, match="clip.vision.image_size is missing"):
        read_mmproj(bad)


def test_a_missing_tensor_is_named(tmp_path, tiny_files):
    bad = _variant(tmp_path, tiny_files["gemma3-vision-tiny", "F16"], drop=frozenset({"v.blk.1.ffn_down.bias"}))
    with pytest.raises(ModelLoadError, match="tensor v.blk.1.ffn_down.bias is missing"):
        read_mmproj(bad)


def test_a_tensor_nothing_here_uses_is_refused_by_name(tmp_path, tiny_files):
    # A q/k norm would change the encoder's output: ignoring it would give wrong embeddings.
    bad = _variant(tmp_path, tiny_files["smolvlm-tiny", "F16"],
                   tensors={"v.blk.0.attn_q_norm.weight": np.ones(64, np.float32)})
    with pytest.raises(ModelLoadError, match="does not use here: v.blk.0.attn_q_norm.weight"):
        read_mmproj(bad)


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path, tiny_files):
    src = tiny_files["smolvlm-tiny", "F32"]
    bad = _variant(tmp_path, src, drop=frozenset({"v.post_ln.bias"}),
                   tensors={"v.post_ln.bias": np.zeros(32, np.float32)})
    with pytest.raises(ModelLoadError, match=r"v.post_ln.bias has shape \(32,\), expected \(64,\)"):
        read_mmproj(bad)


def test_a_weight_type_projectors_do_not_use_is_refused(tmp_path, tiny_files):
    src = tiny_files["smolvlm-tiny", "F32"]
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    bad = _variant(tmp_path, src, drop=frozenset({"v.blk.0.attn_k.weight"}),
                   tensors={"v.blk.0.attn_k.weight": (q, gguf.GGMLQuantizationType.Q4_0)})
    with pytest.raises(ModelLoadError, match="v.blk.0.attn_k.weight is Q4_0; projector weights may be F32, F16, Q8_0"):
        read_mmproj(bad)


def test_a_truncated_file_is_refused(tmp_path, tiny_files):
    data = open(tiny_files["smolvlm-tiny", "F16"], "rb").read()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="not a readable GGUF projector file"):
        read_mmproj(bad)


def test_a_projector_of_another_text_model_is_refused(tiny_files):
    spec = read_mmproj(tiny_files["gemma3-vision-tiny", "F16"])
    check_text_model(spec, 256, "gemma3-tiny.gguf")
    with pytest.raises(ModelLoadError, match="makes embeddings of 256 values, but other.gguf takes 576"):
        check_text_model(spec, 576, "other.gguf")


def test_synth_refuses_a_weight_type_projectors_do_not_use(tmp_path):
    with pytest.raises(ValueError, match="F32, F16, Q8_0, not 'Q4_0'"):
        synth_mmproj(tmp_path / "x.gguf", "smolvlm-tiny", "Q4_0")
