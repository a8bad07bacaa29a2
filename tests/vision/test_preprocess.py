"""An image becomes the squares llama.cpp's ``mtmd`` encodes (``vision.preprocess.squares``):
for images of several sizes and shapes, the reference encoder over our squares gives
llama.cpp's embeddings, square by square, in the prompt's order."""

import numpy as np
import pytest

import vision_reference
from dualpath.models.mmproj import read_mmproj
from dualpath.models.synth import synth_gguf
from dualpath.models.synth_vision import VISION_PRESETS, synth_mmproj
from dualpath.vision.preprocess import squares
from tests_shared import copy_gguf

pytest.importorskip("PIL", reason="the [vision] extra (Pillow) resizes images")

SIZES = [(70, 100), (50, 30), (64, 64), (90, 150), (33, 200), (129, 20)]
"""(height, width): smaller and larger than a tile, wide and tall, one side shorter than a patch."""


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """preset -> (projector spec, the reference's weights, its text model's path)."""
    d = tmp_path_factory.mktemp("vision")
    out = {}
    for preset in ("gemma3-vision-tiny", "smolvlm-tiny"):
        spec = read_mmproj(synth_mmproj(d / f"{preset}.gguf", preset, "F32"))
        text = synth_gguf(d / f"{preset}-text.gguf", VISION_PRESETS[preset].text_preset)
        out[preset] = (spec, vision_reference.load_weights(spec), text)
    return out


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", ["gemma3-vision-tiny", "smolvlm-tiny"])
def test_our_squares_encode_to_llama_cpp_embeddings(pairs, preset, size):
    spec, weights, text = pairs[preset]
    image = np.random.default_rng(size[0] * 1000 + size[1]).integers(0, 256, size + (3,), dtype=np.uint8)
    got = squares(image, spec)
    theirs = vision_reference.mtmd_image_embeddings(text, spec.path, image)
    assert len(theirs) == len(got.images)
    for square, embd in zip(got.images, theirs):
        assert square.shape == (spec.image_size, spec.image_size, 3) and square.dtype == np.uint8
        want = vision_reference.encode(spec, weights, square)
        cos = (embd * want).sum(-1) / np.linalg.norm(embd, axis=-1) / np.linalg.norm(want, axis=-1)
        assert cos.min() >= 0.9999, cos


def test_gemma3_fits_the_image_into_one_square_centred_on_black(pairs):
    spec = pairs["gemma3-vision-tiny"][0]
    image = np.full((32, 64, 3), 200, np.uint8)  # half as tall as wide: 64 x 32 in the middle
    got = squares(image, spec)
    assert len(got.images) == 1 and not got.overview
    sq = got.images[0]
    assert (sq[:16] == 0).all() and (sq[48:] == 0).all() and (sq[16:48] == 200).all()
    same = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    assert np.array_equal(squares(same, spec).images[0], same)  # the encoder's size: untouched


@pytest.mark.parametrize("size, grid", [((70, 100), (2, 2)), ((33, 200), (2, 1)), ((200, 33), (1, 2)),
                                        ((64, 64), (2, 2))])
def test_idefics3_cuts_tiles_row_by_row_then_the_overview(pairs, size, grid):
    spec = pairs["smolvlm-tiny"][0]  # a longest edge of 128: two tiles of 64 on the longer side
    got = squares(np.zeros(size + (3,), np.uint8), spec)
    assert got.grid == grid and got.overview
    assert len(got.images) == grid[0] * grid[1] + 1


def test_idefics3_without_its_longest_edge_is_refused(pairs, tmp_path):
    spec = pairs["smolvlm-tiny"][0]
    old = read_mmproj(copy_gguf(spec.path, tmp_path / "old.gguf", drop=frozenset({"clip.vision.preproc_image_size"})))
    with pytest.raises(ValueError, match="predates clip.vision.preproc_image_size"):
        squares(np.zeros((10, 10, 3), np.uint8), old)


@pytest.mark.parametrize("bad", [np.zeros((10, 10), np.uint8), np.zeros((10, 10, 4), np.uint8),
                                 np.zeros((10, 10, 3), np.float32), np.zeros((0, 10, 3), np.uint8)])
def test_an_image_that_is_not_rgb_bytes_is_refused(pairs, bad):
    with pytest.raises(ValueError, match=r"an image is \(height, width, 3\) uint8 RGB"):
        squares(bad, pairs["gemma3-vision-tiny"][0])
