"""Running an encoder (``ModelConfig.causal`` False): token ids of whole texts -> vectors.

The encoder's graph (graph/encoder.py; ONNX Runtime's sessions and, between them, our
kernels' attention and, for a quantized file, products: encoder_program.py) runs over a
batch of texts packed without padding (our attention reads each text's rows through
``starts``; ONNX Runtime's, for a head_dim ours does not take, pads them to the longest
through the ``pad``/``unpad`` rows made here); the embeddings' rows are gathered here
(``TokenEmbedding``, which reads every table type). Texts are sorted by length and cut into
batches of at most ``max_batch_tokens`` tokens (where attention pads, also so that texts of
similar lengths share a batch). No KV cache is kept: an encoder pass is one prefill that is thrown away.

Pooling is llama.cpp's (``build_pooling``): ``mean`` over every token of the text ([CLS] and
[SEP] included), ``cls`` the first token, ``last`` the last, ``none`` every token; then
the L2 normalisation llama.cpp's embedding tools apply by default (a zero vector stays zero).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidPromptError, ModelTaskError, PromptTooLongError
from ..graph.encoder import rope_angles
from ..graph.parts import encoder_graph
from ..models.spec import ModelSpec
from .encoder_program import EncoderProgram
from .runner_step import TokenEmbedding

BATCH_TOKENS = 1024
"""Tokens of one batch, at most (a longer text is a batch of its own): ONNX Runtime's f32
GEMM runs faster over about a thousand rows than over several thousand (docs/performance.md),
and our products block their rows anyway."""
SHORT_WIDTH = 64
"""Texts up to this many tokens share a batch whatever their lengths: attention over so few
positions is cheap beside the matrix products, which gain from more rows."""
POOLINGS = ("mean", "cls", "last", "none")
"""The poolings ``EncoderRunner.embed`` applies (``rank``, a classifier head: rerank.py over ``hidden``)."""


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """One text's vector from its last hidden states ``hidden`` (T, dim), or (T, dim) itself for ``none``."""
    if pooling == "mean":
        return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)
    if pooling == "cls":
        return hidden[0]
    if pooling == "last":
        return hidden[-1]
    if pooling == "none":
        return hidden
    raise ValueError(f"pooling {pooling!r} must be one of {', '.join(POOLINGS)}")


def l2_normalize(v: np.ndarray) -> np.ndarray:
    """``v`` (..., dim) over its Euclidean norm along the last axis; zero rows stay zero."""
    norm = np.sqrt(np.sum(np.square(v, dtype=np.float64), axis=-1, keepdims=True))
    return (v / np.where(norm > 0, norm, 1.0)).astype(np.float32)


class EncoderRunner:
    """The encoder ``spec`` (loaded through the converted-model cache: its graph lives in the
    entry) on ONNX Runtime and our kernels (``kernel``: an ISA's name, None the best) with
    ``num_threads`` threads."""

    def __init__(self, spec: ModelSpec, num_threads: int, accuracy_level: int = 4,
                 max_batch_tokens: int = BATCH_TOKENS, max_score_bytes: int = 256 << 20, kernel: str | None = None):
        cfg = spec.config
        if cfg.causal:
            raise ValueError(f"{spec.path}: {cfg.arch} is a decoder, not an encoder")
        self.spec = spec
        self.max_batch_tokens = max(max_batch_tokens, cfg.context_length)
        self.max_score_bytes = max_score_bytes
        """Bound on one batch's attention scores (B, heads, T, T) f32 where attention pads
        (ONNX Runtime's), with ``max_batch_tokens``."""
        # Spinning workers and prepacked float weights: a batch runs many products back to back,
        # and one session set packs its copy in place of the mapped pages (create_sessions).
        self._program = EncoderProgram(spec, encoder_graph(spec, accuracy_level), num_threads,
                                       self.max_batch_tokens, int8_act=accuracy_level == 4, kernel=kernel)
        self._tokens = TokenEmbedding(spec.weights["token_embd"], 1.0)
        w = spec.weights
        self._positions = TokenEmbedding(w["position_embd"], 1.0) if cfg.learned_positions else None
        self._type0 = np.zeros((1, cfg.dim), np.float32)  # llama.cpp adds type 0's row to every token
        if "token_types" in w:
            TokenEmbedding(w["token_types"], 1.0)(np.zeros(1, np.int64), self._type0)

    @property
    def context_tokens(self) -> int:
        return self.spec.config.context_length

    def check(self, ids: list[int], index: int = 0) -> None:
        """Raise unless ``ids`` (text ``index`` of a request) fits the encoder."""
        vocab = self.spec.config.vocab_size
        if not ids:
            raise InvalidPromptError(f"text {index} has no tokens")
        if len(ids) > self.context_tokens:
            raise PromptTooLongError(f"text {index} has {len(ids)} tokens, more than the {self.context_tokens} "
                                     "positions the encoder has (truncate=True, or --truncate on the command "
                                     "line, keeps its first positions)")
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidPromptError(f"text {index} holds token id {bad}, outside the vocabulary [0, {vocab})")

    def hidden(self, texts: list[list[int]]) -> list[np.ndarray]:
        """The last hidden states (T_i, dim) of each text's token ids, in the order given."""
        for i, ids in enumerate(texts):
            self.check(ids, i)
        out: list[np.ndarray] = [np.empty(0)] * len(texts)
        for batch in self._batches(texts):
            for i, h in zip(batch, self._run([texts[i] for i in batch])):
                out[i] = h
        return out

    def embed(self, texts: list[list[int]], pooling: str, normalize: bool = True) -> list[np.ndarray]:
        """Each text's pooled vector (dim,), or its (T, dim) states for ``none``; L2-normalised
        with ``normalize``."""
        if pooling == "rank":
            raise ModelTaskError(f"{self.spec.path}: pooling type rank (a reranker's classification head) gives "
                                 "relevance scores, not embeddings; use LLM.rerank")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} must be one of {', '.join(POOLINGS)}")
        vectors = [pool(h, pooling) for h in self.hidden(texts)]
        return [l2_normalize(v) for v in vectors] if normalize else vectors

    @property
    def pooling(self) -> str:
        """How ``embed_texts`` makes one vector of a text's states: the file's ``pooling_type``
        (``mean``, ``cls``, ``last``; ``none``: a vector per token)."""
        return str(self.spec.metadata.get("pooling", "none"))

    def embed_texts(self, tokenizer, texts, normalize: bool = True, truncate: bool = False):
        """``LLM.embed``: a (len(texts), dim) float32 array, one row per text pooled as the file
        says (``pooling``), L2-normalised with ``normalize``; one string gives one (dim,) row.
        With pooling ``none``, a (tokens, dim) array per text instead. A text longer than the encoder's positions raises
        ``PromptTooLongError`` unless ``truncate``, which keeps its first positions (as
        llama.cpp's ``embed`` does: [SEP] goes with the rest)."""
        single = isinstance(texts, str)
        ids = [tokenizer.encode(t) for t in ([texts] if single else texts)]
        if truncate:
            ids = [t[:self.context_tokens] for t in ids]
        vectors = self.embed(ids, self.pooling, normalize)
        if self.pooling == "none":
            return vectors[0] if single else vectors
        out = np.stack(vectors) if vectors else np.empty((0, self.spec.config.dim), np.float32)
        return out[0] if single else out

    def _batches(self, texts: list[list[int]]) -> list[list[int]]:
        """Indices of ``texts``, longest first, cut so that each batch's tokens stay within
        ``max_batch_tokens``; where attention is ONNX Runtime's over padded texts, also its
        padded scores within ``max_score_bytes``, and no text padded to more than twice its
        length (a short text in a batch of long ones would cost attention over the longest's
        width)."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        heads, padded = self.spec.config.num_heads, self._program.padded
        batches: list[list[int]] = []
        tokens = 0
        for i in order:
            n = len(texts[i])
            if batches:
                b = batches[-1]
                width = len(texts[b[0]])  # the batch's longest: its first
                rows = len(b) + 1
                if tokens + n <= self.max_batch_tokens and (not padded or (
                        rows * heads * width * width * 4 <= self.max_score_bytes
                        and (2 * n >= width or width <= SHORT_WIDTH))):
                    b.append(i)
                    tokens += n
                    continue
            batches.append([i])
            tokens = n
        return batches

    def _run(self, texts: list[list[int]]) -> list[np.ndarray]:
        """One batch through the graph, packed (graph/encoder.py): each text's hidden states,
        views into one (N, dim) array."""
        cfg = self.spec.config
        lens = np.array([len(t) for t in texts], np.int64)          # (B,)
        B, T = len(texts), int(lens.max())
        ends = np.cumsum(lens)
        starts = ends - lens                                         # (B,) first row of each text
        t = np.arange(T, dtype=np.int64)
        inside = t[None, :] < lens[:, None]                          # (B, T)
        positions = np.broadcast_to(t, (B, T))[inside]               # (N,)
        ids = np.fromiter((i for ids in texts for i in ids), np.int64, int(lens.sum()))
        x = np.empty((len(ids), cfg.dim), np.float32)                # (N, dim)
        self._tokens(ids, x)
        x += self._type0
        feeds = {"x": x, "starts": np.concatenate(([0], ends))}    # (B + 1,): our attention's texts
        if self._program.padded:
            feeds["pad"] = starts[:, None] + np.minimum(t[None, :], lens[:, None] - 1)  # (B, T): padding reads its text
            feeds["unpad"] = (np.arange(B, dtype=np.int64)[:, None] * T + t[None, :])[inside]  # (N,)
            feeds["mask"] = inside.astype(np.int32)
        if self._positions is not None:
            rows = np.empty((T, cfg.dim), np.float32)
            self._positions(t, rows)
            x += rows[positions]
        else:
            feeds["cos"], feeds["sin"] = rope_angles(self.spec, positions)
        hidden = self._program.run(feeds, len(ids))
        return np.split(hidden, ends[:-1])
