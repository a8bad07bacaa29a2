"""A reranker's classification head, as llama.cpp's ``build_pooling`` applies it for pooling
type rank: on the pooled row of each text (its first token, [CLS], on an encoder; its last on
a decoder), ``y = tanh(cls @ x + cls.bias)`` when the file has the ``cls`` layer, then
``y = cls.output @ y + cls.output.bias`` when it has ``cls.output``, then a softmax over the
outputs for Qwen3 (its two outputs are the LM head's rows of "yes" and "no").

The head is a few rows of a few hundred columns per text, so it runs here in NumPy on f32
copies of its weights (whatever their type in the file) rather than in the graph.
"""

from __future__ import annotations

import numpy as np

from ..models.spec import ModelSpec, Weight
from .runner_step import TokenEmbedding

SOFTMAX_ARCHES = ("qwen3",)
"""Families whose rank outputs llama.cpp turns into probabilities (``ggml_soft_max``)."""


def _f32(w: Weight | None) -> np.ndarray | None:
    """``w`` as a float32 (rows, cols) or (n,) array, or None."""
    if w is None:
        return None
    if len(w.shape) == 1 or (w.dtype == "f32" and not w.kernel_form):  # a float matrix may be a view of data_t
        return np.ascontiguousarray(w.data, np.float32).reshape(w.shape)
    out = np.empty(w.shape, np.float32)  # (rows, cols)
    TokenEmbedding(w, 1.0)(np.arange(w.shape[0], dtype=np.int64), out)
    return out


class RankHead:
    """The head of the reranker ``spec`` (pooling type rank): pooled rows -> scores."""

    def __init__(self, spec: ModelSpec):
        w = spec.weights
        self.dense, self.dense_bias = _f32(w.get("cls")), _f32(w.get("cls.bias"))      # (dim, dim), (dim,)
        self.out, self.out_bias = _f32(w.get("cls.output")), _f32(w.get("cls.output.bias"))  # (n, dim), (n,)
        self.softmax = spec.config.arch in SOFTMAX_ARCHES
        self.num_outputs = int(spec.metadata.get("rank", {}).get("num_outputs", 1))

    def outputs(self, pooled: np.ndarray) -> np.ndarray:
        """Every output (B, num_outputs) f32 of the pooled rows ``pooled`` (B, dim), as llama.cpp
        returns them (``llama_get_embeddings_seq``: the first ``n_cls_out`` values)."""
        y = pooled.astype(np.float32)
        if self.dense is not None:
            y = _products(y, self.dense)
            if self.dense_bias is not None:
                y = y + self.dense_bias
            y = np.tanh(y)
        if self.out is not None:
            y = _products(y, self.out)
            if self.out_bias is not None:
                y = y + self.out_bias
        if self.softmax:
            z = np.exp(y - y.max(axis=-1, keepdims=True))
            y = z / z.sum(axis=-1, keepdims=True)
        return np.ascontiguousarray(y[:, :self.num_outputs], np.float32)

    def scores(self, pooled: np.ndarray) -> np.ndarray:
        """The relevance score (B,) of each pooled row: the first output, as llama.cpp's server
        reports it (a raw logit for a one-label cross-encoder, P("yes") for Qwen3)."""
        return self.outputs(pooled)[:, 0]


def _products(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (B, K) @ w (N, K)^T, each row on its own: BLAS's GEMM takes a batch's last rows through
    other kernels than its first, and equal documents must get equal scores (a tie keeps the
    documents' order)."""
    return np.einsum("bk,nk->bn", x, w)
