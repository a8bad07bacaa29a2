"""Reranking and decoder embeddings: ``LLM.rerank`` and ``LLM.embed`` on any model kind.

A reranker is a file with pooling type rank (``{arch}.pooling_type`` 4), as llama.cpp's
converter writes a cross-encoder (bert: ms-marco-MiniLM, RoBERTa heads) or Qwen3-Reranker.
Each (query, document) pair is one text, joined as llama.cpp's server joins them
(``format_prompt_rerank``): the file's ``rerank`` template with ``{query}`` and
``{document}`` filled in and its special tokens matched, or else BOS, query, EOS, SEP,
document, EOS as the file's flags say (models/gguf.py ``_rank_metadata``). The text runs
through the model; its pooled row (an encoder's first token, a decoder's last) goes
through the head (executor/rank_head.py); the score is the head's first output, as
llama-server reports it.

Scores are returned best first, ties in the documents' order.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidPromptError, ModelTaskError, PromptTooLongError
from .executor.rank_head import RankHead


@dataclass(frozen=True)
class RerankResult:
    """One document's place in a reranking."""

    index: int
    """The document's position in the request."""
    relevance_score: float
    """The head's first output: a raw logit for a one-label cross-encoder, P("yes") for Qwen3."""
    document: str


_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""LLM -> its RankHead, made on first use (the f32 copies of the head's weights)."""


def _name(llm: Any) -> str:
    return os.path.basename(str(llm.spec.path))


def _kind(llm: Any) -> str:
    """What the model is, for errors."""
    cfg, pooling = llm.spec.config, llm.spec.metadata.get("pooling")
    if cfg.causal:
        return f"a {cfg.arch} text-generation model (pooling {pooling} for embeddings)"
    return f"an embedding model ({cfg.arch}, an encoder, pooling {pooling})"


def rank_head(llm: Any) -> RankHead:
    """``llm``'s reranker head, or ModelTaskError naming what the model is instead."""
    if llm.spec.metadata.get("pooling") != "rank":
        raise ModelTaskError(f"{_name(llm)} is {_kind(llm)}, not a reranker: reranking needs a file with pooling "
                             "type rank (a cross-encoder such as ms-marco-MiniLM, or Qwen3-Reranker, as "
                             "llama.cpp's converter writes them)")
    head = _HEADS.get(llm)
    if head is None:
        head = _HEADS[llm] = RankHead(llm.spec)
    return head


def max_tokens(llm: Any) -> int:
    """Tokens one text may have: an encoder's positions; a decoder's context but one (its
    engine keeps room for a token after every prompt)."""
    return llm.context_tokens - (llm.encoder is None)


def pair_text_ids(llm: Any, query: str, document: str) -> list[int]:
    """The token ids of one (query, document) pair, as llama.cpp's server makes them."""
    rank, tok = llm.spec.metadata["rank"], llm.tokenizer
    if rank["template"] is not None:
        prompt = rank["template"].replace("{query}", query).replace("{document}", document)
        return tok.encode(prompt, add_bos=False, add_eos=False, parse_special=True)
    q = tok.encode(query, add_bos=False, add_eos=False)
    d = tok.encode(document, add_bos=False, add_eos=False)
    eos, sep = rank["eos_id"], rank["sep_id"]
    ids = [rank["bos_id"]] if rank["add_bos"] and rank["bos_id"] is not None else []
    ids += q
    if rank["add_eos"] and eos is not None:
        ids.append(eos)
    if rank["add_sep"] and sep is not None:
        ids.append(sep)
    ids += d
    if rank["add_eos"] and eos is not None:
        ids.append(eos)
    return ids


def _too_long(message: str, param: str) -> PromptTooLongError:
    e = PromptTooLongError(message)
    e.param = param  # type: ignore[attr-defined]  # the request field the server names (server/errors.py)
    return e


def pair_ids(llm: Any, query: str, documents: Sequence[str], truncate: bool = False,
             how_to_truncate: str = "truncate=True, or --truncate on the command line,") -> list[list[int]]:
    """Every pair's token ids. A pair longer than the model's positions raises
    PromptTooLongError naming the document (and ``how_to_truncate``), unless ``truncate``: then
    the document is cut (its end first) until the pair fits; a query that leaves no room
    raises either way."""
    ctx = max_tokens(llm)
    frame = len(pair_text_ids(llm, query, ""))
    if frame >= ctx:
        raise _too_long(f"query: the query makes {frame} tokens with the pair's frame, and the model takes {ctx} "
                        "per (query, document) pair: no room for a document", "query")
    out = []
    for i, doc in enumerate(documents):
        ids = pair_text_ids(llm, query, doc)
        if len(ids) > ctx and not truncate:
            raise _too_long(f"documents[{i}]: the pair has {len(ids)} tokens, more than the {ctx} the model takes "
                            f"per pair ({how_to_truncate} cuts the document to fit)", "documents")
        doc_ids = llm.tokenizer.encode(doc, add_bos=False, add_eos=False)
        while len(ids) > ctx and doc_ids:
            doc_ids = doc_ids[:max(0, len(doc_ids) - (len(ids) - ctx))]
            ids = pair_text_ids(llm, query, llm.tokenizer.decode(doc_ids))
        out.append(ids)
    return out


def head_outputs(llm: Any, ids: list[list[int]]) -> np.ndarray:
    """(len(ids), num_outputs) f32: the reranker head on each pair text's pooled row."""
    head = rank_head(llm)
    if not ids:
        return np.empty((0, head.num_outputs), np.float32)
    if llm.encoder is not None:
        pooled = np.stack([h[0] for h in llm.encoder.hidden(ids)])  # (B, dim): each text's first token
    else:
        import asyncio

        pooled = _stacked(asyncio.run(llm.engine.embed(ids, "rank")))  # (B, dim): each text's last token
    return head.outputs(pooled)


def _stacked(vectors: list[np.ndarray | None]) -> np.ndarray:
    """The engine's vectors of a call as one (B, dim) f32 array; a vector the engine did not
    finish (None: it stopped) cancels the call."""
    import asyncio

    if any(v is None for v in vectors):
        raise asyncio.CancelledError("the engine stopped before the call ended")
    return np.stack([v for v in vectors if v is not None]).astype(np.float32)


async def head_outputs_async(llm: Any, ids: list[list[int]]) -> np.ndarray:
    """``head_outputs`` off the event loop: an encoder in a worker thread, a decoder's texts
    through its engine, batched with other requests."""
    import asyncio

    head = rank_head(llm)
    if llm.encoder is not None or not ids:
        return await asyncio.to_thread(head_outputs, llm, ids)
    return head.outputs(_stacked(await llm.engine.embed(ids, "rank")))


def ranked(scores: np.ndarray, documents: Sequence[str], top_n: int | None) -> list[RerankResult]:
    """The results best first (ties in the documents' order), the first ``top_n`` of them."""
    order = sorted(range(len(documents)), key=lambda i: -float(scores[i]))
    return [RerankResult(i, float(scores[i]), documents[i]) for i in order[:top_n]]


def check_request(query, documents, top_n) -> None:
    """InvalidPromptError naming the argument when the request is malformed."""
    if not isinstance(query, str):
        raise InvalidPromptError(f"query must be a string, got {type(query).__name__}")
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise InvalidPromptError("documents must be a list of strings")
    bad = next((i for i, d in enumerate(documents) if not isinstance(d, str)), None)
    if bad is not None:
        raise InvalidPromptError(f"documents[{bad}] must be a string, got {type(documents[bad]).__name__}")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InvalidPromptError(f"top_n={top_n!r} must be an integer >= 1 (or None: every document)")


def rerank(llm: Any, query: str, documents: Sequence[str], top_n: int | None = None,
           truncate: bool = False) -> list[RerankResult]:
    """``LLM.rerank``: ``documents`` scored against ``query``, best first, the first ``top_n``."""
    check_request(query, documents, top_n)
    rank_head(llm)
    ids = pair_ids(llm, query, documents, truncate)
    return ranked(head_outputs(llm, ids)[:, 0], documents, top_n)


def embed(llm: Any, texts, normalize: bool = True, truncate: bool = False):
    """``LLM.embed``: an encoder's ``EncoderRunner.embed_texts``, or a decoder's pooled final
    hidden states (the file's pooling: Qwen3-Embedding's is last) through its engine: a
    (len(texts), dim) float32 array, one (dim,) row for one string. ``normalize`` False gives
    the raw state for last pooling only (the engine normalises mean and cls)."""
    pooling = str(llm.spec.metadata.get("pooling"))
    if pooling == "rank":
        raise ModelTaskError(f"{_name(llm)} is a reranker (pooling type rank): its head gives relevance scores, "
                             "not embeddings; use LLM.rerank (dualpath rerank, POST /v1/rerank)")
    if llm.encoder is not None:
        return llm.encoder.embed_texts(llm.tokenizer, texts, normalize, truncate)
    if not normalize and pooling != "last":
        raise ValueError(f"normalize=False: a decoder's {pooling}-pooled embedding comes normalised; only last "
                         "pooling gives the raw state")
    single = isinstance(texts, str)
    ids = [llm.tokenize(t) for t in ([texts] if single else texts)]
    if truncate:
        ids = [t[:max_tokens(llm)] for t in ids]
    if not ids:
        return np.empty((0, llm.spec.config.dim), np.float32)
    import asyncio

    out = _stacked(asyncio.run(llm.engine.embed(ids, pooling if normalize else "rank")))
    return out[0] if single else out
