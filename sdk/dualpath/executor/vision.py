"""Running an image encoder: squares of pixels (vision/preprocess.py) -> the embeddings a text
model reads in their place.

The projector file is converted through the model cache like any model (models/mmproj.py
``load_projector``) and its graph (graph/vision.py) runs as an encoder's does
(``EncoderProgram``: ONNX Runtime's graphs, our kernels' products and attention). A square is
one of the encoder's texts: every square has the encoder's R rows (its P patches, and a class
row first where the encoder has one), so a batch of B squares is B * R rows, attention sees
each square alone (``starts`` every R rows) and the projector makes ``tokens_per_image`` rows
of each.

Pixels are normalised as llama.cpp's ``normalize_image_u8_to_f32`` does ((v / 255 - mean) /
std per channel, in f32) and cut into patches in the patch convolution's order (channel,
then row, then column within a patch).
"""

from __future__ import annotations

import numpy as np

from ..graph.parts import encoder_graph
from ..models.mmproj import VisionSpec, vision_spec
from ..models.spec import ModelSpec
from .encoder_program import EncoderProgram, run_pieces


class VisionEncoder:
    """The image encoder of the converted projector ``model`` (``ModelStore.load(path,
    projector=True)``) on ``num_threads`` threads, ``batch`` squares a run at most."""

    def __init__(self, model: ModelSpec, num_threads: int, accuracy_level: int = 4, batch: int = 1,
                 kernel: str | None = None, lend: bool = False):
        if model.config.arch != "clip":
            raise ValueError(f"{model.path}: {model.config.arch} is not an image projector")
        self.model = model
        self.spec: VisionSpec = vision_spec(model)
        self.batch = max(1, batch)
        self._program = EncoderProgram(model, encoder_graph(model, accuracy_level), num_threads,
                                       self.spec.rows_per_square * self.batch, int8_act=accuracy_level == 4,
                                       kernel=kernel, out_width=self.spec.text_dim, lend=lend)
        # the position rows of a batch's rows: the table once per square, made once
        self._pos = np.tile(np.asarray(model.weights["position_embd"].data, np.float32), (self.batch, 1))
        self._cls = np.zeros((self.spec.rows_per_square * self.batch, 1), bool)
        self._cls[::self.spec.rows_per_square] = self.spec.class_token
        self._mean = np.array(self.spec.image_mean, np.float32)
        self._std = np.array(self.spec.image_std, np.float32)

    @property
    def tokens_per_square(self) -> int:
        return self.spec.tokens_per_image

    @property
    def pool(self):
        """Our kernels' pool (None: every step is ONNX Runtime's)."""
        return self._program.pool

    @property
    def lends_threads(self) -> bool:
        """``EncoderProgram.lends_threads``: asked for (``lend``), and the layers' products are
        ours (Q8_0 projectors; F16 ones are ONNX Runtime's GEMM, on threads of its own)."""
        return self._program.lends_threads

    def patches(self, squares: np.ndarray) -> np.ndarray:
        """``squares`` (B, S, S, 3) uint8 -> (B * R, 3 * p * p) f32: each patch normalised, in the
        patch convolution's order (a class row, where the encoder has one, is zeros: the graph
        puts the class embedding there)."""
        B, S = len(squares), self.spec.image_size
        p = self.spec.patch_size
        side = S // p
        if squares.shape[1:] != (S, S, 3) or squares.dtype != np.uint8:
            raise ValueError(f"squares are (B, {S}, {S}, 3) uint8, got {squares.shape} {squares.dtype}")
        x = (squares.astype(np.float32) / np.float32(255) - self._mean) / self._std
        x = x.reshape(B, side, p, side, p, 3).transpose(0, 1, 3, 5, 2, 4).reshape(B, side * side, 3 * p * p)
        if self.spec.class_token:
            x = np.concatenate([np.zeros((B, 1, 3 * p * p), np.float32), x], axis=1)
        return np.ascontiguousarray(x.reshape(B * self.spec.rows_per_square, 3 * p * p))

    def encode(self, squares) -> np.ndarray:
        """The embeddings (B, tokens_per_square, text_dim) f32 of ``squares``, a sequence of
        (S, S, 3) uint8 images, ``batch`` squares a run."""
        return run_pieces(self.pieces(squares))

    def pieces(self, squares):
        """``encode`` a piece at a time (``EncoderProgram.pieces``): a generator that yields
        between the pieces and returns the embeddings, for a caller that runs other work
        between them (the engine's steps: engine/encoder_queue.py)."""
        squares = np.asarray(squares)
        if squares.ndim == 3:
            squares = squares[None]
        out = np.empty((len(squares), self.tokens_per_square, self.spec.text_dim), np.float32)
        for i in range(0, len(squares), self.batch):
            part = squares[i:i + self.batch]
            rows = yield from self._pieces(part)
            out[i:i + len(part)] = rows.reshape(len(part), self.tokens_per_square, -1)
        return out

    def _pieces(self, squares: np.ndarray):
        B, P = len(squares), self.spec.rows_per_square
        n = B * P
        rows = np.arange(n, dtype=np.int64)
        feeds = {"x": self.patches(squares), "pos": self._pos[:n], "starts": np.arange(0, n + 1, P, dtype=np.int64)}
        if self.spec.class_token:
            feeds["cls"] = self._cls[:n]
        if self._program.padded:  # ONNX Runtime's attention: every square is whole, nothing is padded
            feeds["pad"], feeds["unpad"] = rows.reshape(B, P), rows
            feeds["mask"] = np.ones((B, P), np.int32)
        return (yield from self._program.pieces(feeds, n, B * self.tokens_per_square))
