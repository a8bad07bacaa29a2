"""The image encoder (executor/vision.py over graph/vision.py): a projector file converted
through the model cache encodes squares as the NumPy reference does, and an image as
llama.cpp's ``mtmd`` does, chunk by chunk; a projector and a text model are never taken for
each other."""

import dataclasses
import importlib.util
import json

import numpy as np
import pytest

import vision_reference
from dualpath.cli import main
from dualpath.errors import ModelLoadError
from dualpath.executor.vision import VisionEncoder
from dualpath.models.mmproj import read_mmproj, vision_spec
from dualpath.models.store import ModelStore
from dualpath.models.synth import synth_gguf
from dualpath.models.synth_vision import VISION_PRESETS, synth_mmproj

TINY = ("smolvlm-tiny", "gemma3-vision-tiny", "llava-tiny")
HD20 = "gemma3-vision-hd20"
"""Gemma 3's tiny twin with a head_dim of 20, not in whole 8s: ONNX Runtime's attention."""
TYPES = ("F32", "F16", "Q8_0")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(preset, weight type) -> projector file."""
    d = tmp_path_factory.mktemp("encoder")
    with pytest.MonkeyPatch.context() as mp:
        shape = VISION_PRESETS["gemma3-vision-tiny"]
        mp.setitem(VISION_PRESETS, HD20, dataclasses.replace(shape, spec=dataclasses.replace(shape.spec, dim=80,
                                                                                             ffn_dim=160)))
        return {(p, t): synth_mmproj(d / f"{p}-{t}.gguf", p, t) for p in TINY + (HD20,) for t in TYPES}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ModelStore(tmp_path_factory.mktemp("store"))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _floor(weight_type: str) -> float:
    return 0.999 if weight_type == "Q8_0" else 0.9999  # Q8_0: the products quantize activations, as llama.cpp's


@pytest.mark.parametrize("preset", TINY + (HD20,))
@pytest.mark.parametrize("weight_type", TYPES)
def test_squares_encode_as_the_reference_does(files, store, preset, weight_type):
    """Three squares in batches of two (a whole batch and a partial one): each square's
    embeddings are the reference's. Attention is ours (head_dims 64 and 24; the real Gemma 3's
    is 72), and ONNX Runtime's for a head_dim of 20."""
    spec = read_mmproj(files[preset, weight_type])
    encoder = VisionEncoder(store.load(spec.path, projector=True), 2, batch=2)
    assert encoder.spec == vision_spec(encoder.model) and encoder.spec.projector == spec.projector
    assert encoder._program.padded == (preset == HD20)
    S = spec.image_size
    images = np.random.default_rng(1).integers(0, 256, (3, S, S, 3), dtype=np.uint8)
    got = encoder.encode(images)
    assert got.shape == (3, spec.tokens_per_image, spec.text_dim) and got.dtype == np.float32
    weights = vision_reference.load_weights(spec)
    for square, out in zip(images, got):
        assert _cosines(out, vision_reference.encode(spec, weights, square)).min() >= _floor(weight_type)
    assert np.array_equal(encoder.encode(images[2]), got[2:])  # alone or in a batch: the same rows


def test_q8_0_matrices_are_our_kernels_products(files, store):
    model = store.load(files["smolvlm-tiny", "Q8_0"], projector=True)
    assert model.weights["blk.0.attn_q"].kernel_form and model.weights["blk.1.ffn_down"].kernel_form
    assert model.weights["patch_embd"].dtype == "f32" and model.weights["patch_embd"].shape == (64, 3 * 16 * 16)


@pytest.mark.parametrize("preset", TINY[:2])
def test_an_image_encodes_to_llama_cpps_chunks(files, store, tmp_path, preset):
    """A wide image of no tile's size, cut by vision/preprocess.py and encoded by us: the
    embeddings of every chunk llama.cpp's ``mtmd`` makes of it, in order."""
    pytest.importorskip("PIL", reason="the [vision] extra (Pillow) resizes images")
    from dualpath.vision.preprocess import squares

    path = files[preset, "F16"]
    encoder = VisionEncoder(store.load(path, projector=True), 2)
    image = np.random.default_rng(7).integers(0, 256, (70, 150, 3), dtype=np.uint8)
    ours = encoder.encode(squares(image, encoder.spec).images)
    text = synth_gguf(tmp_path / "text.gguf", VISION_PRESETS[preset].text_preset)
    theirs = vision_reference.mtmd_image_embeddings(text, path, image)
    assert len(theirs) == len(ours) == (1 if preset == "gemma3-vision-tiny" else 3)  # 2 tiles and the overview
    for got, want in zip(ours, theirs):
        assert _cosines(got, want).min() >= 0.9999


def test_llava_encodes_as_llama_cpp_where_its_two_slips_cannot_show(files, store, tmp_path):
    """llama.cpp's LLaVA graph puts the class row after the patches (each patch then takes the
    position row of the one before it, the first patch is dropped and the class row is
    projected instead) and runs one layer fewer than the file holds (its issues 25814 and
    25817). On a copy whose position rows are all alike and whose last layer adds nothing,
    neither shows but in which rows come out: ours are the patches 0 .. P - 1, llama.cpp's the
    patches 1 .. P - 1 and the class row. Everything else (a wide image fitted and padded,
    CLIP's normalisation, the layers, the projector) must agree."""
    pytest.importorskip("PIL", reason="the [vision] extra (Pillow) resizes images")
    from dualpath.vision.preprocess import squares
    from tests_shared import copy_gguf

    src = files["llava-tiny", "F32"]
    spec = read_mmproj(src)
    w = vision_reference.load_weights(spec)
    last = f"v.blk.{spec.num_layers - 1}."
    down = last + ("ffn_up" if spec.ffn_swapped else "ffn_down")
    changed = {"v.position_embd.weight": np.repeat(w["v.position_embd.weight"][:1], spec.rows_per_square, 0)}
    changed |= {n: np.zeros_like(w[n]) for n in (last + "attn_out.weight", last + "attn_out.bias",
                                                   down + ".weight", down + ".bias")}
    path = copy_gguf(src, tmp_path / "llava-even.gguf", drop=frozenset(changed),
                     tensors={n: a.astype(np.float32) for n, a in changed.items()})
    encoder = VisionEncoder(store.load(path, projector=True), 2)
    image = np.random.default_rng(7).integers(0, 256, (70, 150, 3), dtype=np.uint8)
    (ours,) = encoder.encode(squares(image, encoder.spec).images)
    text = synth_gguf(tmp_path / "text.gguf", VISION_PRESETS["llava-tiny"].text_preset)
    (theirs,) = vision_reference.mtmd_image_embeddings(text, path, image)
    assert ours.shape == theirs.shape == (spec.num_patches, spec.text_dim)
    assert _cosines(ours[1:], theirs[:-1]).min() >= 0.9999  # (llama.cpp's projector GELU is tanh's, ours erf's)
    assert _cosines(ours[:1], theirs[-1:]).max() < 0.99  # its last row is the class row's


def test_a_projector_is_cached_like_a_model(files, tmp_path):
    store = ModelStore(tmp_path / "models")
    stats: dict = {}
    first = store.load(files["smolvlm-tiny", "F16"], projector=True, stats=stats)
    assert stats["cache"] == "miss"
    again = store.load(files["smolvlm-tiny", "F16"], projector=True, stats=stats)
    assert stats["cache"] == "hit" and again.config == first.config and again.metadata == first.metadata
    assert np.array_equal(again.weights["mm.fc"].data, first.weights["mm.fc"].data)


def test_a_projector_is_not_a_text_model_nor_the_reverse(files, tmp_path):
    """Each way round, converting or from the cache: the file's kind is named."""
    store = ModelStore(tmp_path / "models")
    projector = files["gemma3-vision-tiny", "F32"]
    text = synth_gguf(tmp_path / "text.gguf", "gemma3-tiny")
    for _ in range(2):  # the second time, the other kind's entry is in the cache
        with pytest.raises(ModelLoadError, match="image projector file.*--mmproj"):
            store.load(projector)
        with pytest.raises(ModelLoadError, match="not a projector file"):
            store.load(text, projector=True)
        store.load(projector, projector=True)
        store.load(text)


def test_squares_of_another_size_are_refused(files, store):
    encoder = VisionEncoder(store.load(files["smolvlm-tiny", "F32"], projector=True), 1)
    with pytest.raises(ValueError, match=r"squares are \(B, 64, 64, 3\) uint8"):
        encoder.encode(np.zeros((1, 32, 32, 3), np.uint8))


def test_bench_vision_times_an_image_beside_llama_cpp(files, tmp_path, capsys):
    """The encode, beside llama.cpp's; the first token of a question after the image; a second
    question in the same process and after a restart (the image's pages from the prefix
    cache, its embeddings from disk: nothing encoded)."""
    from dualpath.models.synth_vision import synth_text

    text = synth_text(tmp_path / "text.gguf", "smolvlm-tiny")
    out = tmp_path / "vision.json"
    peer = [] if importlib.util.find_spec("llama_cpp") else ["--no-peer"]
    assert main(["bench", "vision", "-m", str(text), "--mmproj", files["smolvlm-tiny", "Q8_0"], "--size", "150x70",
                 "-r", "1", "--inner", "1", "--json", str(out), *peer]) == 0
    (res,) = json.loads(out.read_text())
    assert res["image"] == [70, 150] and res["chunks"] == 3 and res["tokens"] == 12 and res["dualpath_ms"] > 0
    if not peer:
        assert (res["llama_cpp_chunks"], res["llama_cpp_tokens"]) == (3, 12)
        assert set(res["settings"]) == {"FA off", "FA on"} and res["llama_cpp_ms"] == min(res["settings"].values())
        assert res["ratio"] == pytest.approx(res["dualpath_ms"] / res["llama_cpp_ms"])
    t = res["ttft"]
    assert t["first_ms"] > 0 and t["second_ms"] > 0 and t["restart_ms"] > 0
    assert t["second_cached"] >= 16 and t["restart_cached"] >= 16 and t["restart_encoded"] == 0
    if not peer:
        assert t["llama_cpp_positions"] == t["positions"] and t["llama_cpp_first_ms"] > 0
    text_out = capsys.readouterr().out
    assert ("time ratio (DualPath / llama.cpp)" in text_out) == (not peer)
    assert "the second question after a restart" in text_out
