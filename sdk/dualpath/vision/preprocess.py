"""An image to the squares a projector's encoder reads, as llama.cpp's ``mtmd`` cuts them
(``tools/mtmd/mtmd-image.cpp``), so that both engines encode the same pixels.

llama.cpp's resizes are a port of Pillow's resampling (``resize_pillow``: the same separable
filters and fixed-point rounding), so Pillow does them here. Per projector kind:

- ``gemma3``: one square of the encoder's size: the image scaled to fit it (bilinear; each
  side rounded up), centred on black.
- ``mlp`` (LLaVA 1.5): the same with bicubic scaling, centred on LLaVA's grey (122, 116, 104:
  CLIP's mean colour).
- ``idefics3``: the image scaled (Lanczos) so that its longer side is the file's longest edge
  (the other side truncated, then made even), then stretched to whole tiles of the encoder's
  size: the tiles row by row, then the whole of it shrunk to one tile (the overview), in the
  order of the prompt (Hugging Face's Idefics3 puts the global image last too).

An image is (height, width, 3) uint8 RGB; every square is (S, S, 3) uint8, S the encoder's
``image_size`` (the encoder normalizes them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.mmproj import VisionSpec


@dataclass(frozen=True)
class Squares:
    """What an image becomes: ``images`` in the order the prompt holds them."""

    images: list[np.ndarray]
    """Each (S, S, 3) uint8."""
    grid: tuple[int, int] = (0, 0)
    """(columns, rows) of the tiles before the overview (Idefics3); (0, 0) when not tiled."""

    @property
    def overview(self) -> bool:
        """``images[-1]`` is the whole image shrunk to one tile."""
        return self.grid != (0, 0)


def squares(image: np.ndarray, spec: VisionSpec) -> Squares:
    """The squares of ``image`` (height, width, 3) uint8 for ``spec``'s encoder."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape[:2]:
        raise ValueError(f"an image is (height, width, 3) uint8 RGB, got {image.shape} {image.dtype}")
    if spec.projector == "gemma3":
        return Squares([_fit(image, spec.image_size, "bilinear", (0, 0, 0))])
    if spec.projector == "mlp":
        return Squares([_fit(image, spec.image_size, "bicubic", (122, 116, 104))])
    if spec.projector == "idefics3":
        return _idefics3(image, spec)
    raise ValueError(f"no preprocessing for projector type {spec.projector!r}")


def _fit(image: np.ndarray, S: int, algo: str, pad: tuple[int, int, int]) -> np.ndarray:
    """``image`` scaled to fit an S x S square (each side rounded up), centred on ``pad``."""
    h, w = image.shape[:2]
    f32 = np.float32
    scale = min(f32(S) / f32(w), f32(S) / f32(h))  # in float, as llama.cpp computes the fit
    nw, nh = min(int(np.ceil(f32(w) * scale)), S), min(int(np.ceil(f32(h) * scale)), S)
    out = np.empty((S, S, 3), np.uint8)
    out[:] = pad
    oy, ox = (S - nh) // 2, (S - nw) // 2
    out[oy:oy + nh, ox:ox + nw] = _resize(image, nw, nh, algo)
    return out


def _idefics3(image: np.ndarray, spec: VisionSpec) -> Squares:
    S, edge = spec.image_size, spec.longest_edge
    if not edge:
        raise ValueError(f"{spec.path} predates clip.vision.preproc_image_size, which says how Idefics3 cuts "
                         "an image into tiles: convert the model again with a recent llama.cpp")
    h, w = image.shape[:2]
    aspect = w / h
    if w >= h:
        rw, rh = edge, int(edge / aspect)
        rh += rh % 2
    else:
        rw, rh = int(edge * aspect), edge
        rw += rw % 2
    gx, gy = -(-rw // S), -(-rh // S)
    refined = _resize(_resize(image, rw, rh, "lanczos"), gx * S, gy * S, "lanczos")
    tiles = [refined[y * S:(y + 1) * S, x * S:(x + 1) * S] for y in range(gy) for x in range(gx)]
    return Squares(tiles + [_resize(refined, S, S, "lanczos")], (gx, gy))


def _resize(image: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """``image`` resized to (height, width) by Pillow's ``algo`` resampling (the same size:
    a copy, as llama.cpp skips the resize)."""
    if image.shape[:2] == (height, width):
        return image.copy()
    from PIL import Image  # the [vision] extra

    resample = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
                "lanczos": Image.Resampling.LANCZOS}[algo]
    return np.asarray(Image.fromarray(image, "RGB").resize((width, height), resample, reducing_gap=None))
