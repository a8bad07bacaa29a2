"""Token sampling: llama.cpp's default chain over one row of logits.

Order: repetition penalty -> presence/frequency penalties -> logit_bias ->
(temperature 0: argmax) -> top_k -> top_p -> min_p -> temperature -> draw. The
filters see temperature-1 probabilities, as in llama.cpp; temperature only reshapes
what survives them.

Log-probabilities (``logprobs``) are those of the processed logits (after the
penalties and logit_bias) at temperature 1, before the truncating filters: the
distribution the filters and the draw start from. They are computed only when asked
for, with whole-vocabulary numpy calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..errors import SamplingParamsError
from ..sampling_params import SamplingParams
from .reasoning_budget import ReasoningBudget

__all__ = ["Sampler", "SamplerScratch", "SamplingParams"]


class SamplerScratch:
    """Vocabulary-sized work buffers of ``Sampler.sample``, shared by every sampler that
    samples on one thread (the engine's: one request at a time). Per request they would
    cost 13 bytes a vocabulary entry each for every queued request."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.logits = np.empty(vocab_size, np.float32)  # (vocab_size,) penalised copy of the caller's row
        self.cdf = np.empty(vocab_size, np.float64)  # (vocab_size,) probabilities, then their running sum
        self.mask = np.empty(vocab_size, np.bool_)  # (vocab_size,) min_p rejects, full-vocabulary path only
        self.bias = np.empty(vocab_size, np.float32)  # (vocab_size,) a grammar's mask, 0 / -inf


class GrammarMask(Protocol):
    """What ``Sampler.sample`` needs of a grammar's matcher (sampling/grammar.py)."""

    def fill_bias(self, bias: np.ndarray) -> bool: ...
    def allows(self, token_id: int) -> bool: ...


class Sampler:
    """Picks one token id from a row of logits, under one ``SamplingParams``.

    Owns its random generator, so a seeded sampler replays the same tokens for the
    same logits and history. Not thread-safe: one sampler per request, and samplers that
    share a ``scratch`` sample on one thread.
    """

    def __init__(self, params: SamplingParams, vocab_size: int, scratch: SamplerScratch | None = None,
                 budget: ReasoningBudget | None = None):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise SamplingParamsError(f"vocab_size={vocab_size!r} must be an integer >= 1")
        if scratch is not None and scratch.vocab_size != vocab_size:
            raise ValueError(f"scratch buffers of {scratch.vocab_size} entries for a vocabulary of {vocab_size}")
        self.params = params
        self.vocab_size = vocab_size
        self._rng = np.random.Generator(np.random.PCG64(params.seed))
        scratch = scratch or SamplerScratch(vocab_size)
        self._logits, self._cdf, self._mask = scratch.logits, scratch.cdf, scratch.mask
        # (vocab_size,) times each token was sampled: only the presence and frequency
        # penalties read it, so only they pay for it.
        self._counts = (np.zeros(vocab_size, np.int32) if params.presence_penalty or params.frequency_penalty
                        else None)
        self._seen: list[int] = []  # ids with a count, in first-seen order
        if params.logit_bias:
            top = max(t for t, _ in params.logit_bias)  # a Python int: any size, checked before numpy
            if top >= vocab_size:
                raise SamplingParamsError(f"logit_bias names token {top if top < 1 << 64 else 'over 2^64'}, "
                                          f"outside the vocabulary (0..{vocab_size - 1})")
            ids = np.array([t for t, _ in params.logit_bias], np.int64)
            biases = np.array([b for _, b in params.logit_bias], np.float32)
            self._bias: tuple[np.ndarray, np.ndarray] | None = (ids, biases)
        else:
            self._bias = None
        self.budget = budget
        """The request's thinking budget (sampling/reasoning_budget.py), or None: while it
        forces the closing marker, its tokens are taken instead of a draw."""
        self.last_logprobs: tuple | None = None
        """After ``sample`` with ``params.logprobs`` set: (token logprob, ((id, logprob), ...)
        of the most likely tokens, most likely first)."""

    def sample(self, logits: np.ndarray, history: Sequence[int] | np.ndarray = (),
               mask_bias: np.ndarray | None = None, grammar: GrammarMask | None = None) -> int:
        """Next token id. ``logits`` (vocab_size,) is not modified; ``history`` is the
        recent token ids, oldest first (only the last ``repetition_window`` are read);
        ``mask_bias`` (vocab_size,) f32, 0 or -inf, is a grammar's mask (sampling/grammar.py),
        added after logit_bias. Or ``grammar``, a matcher, with ``mask_bias`` the buffer its
        mask is written into only when needed (``_exact_by_rejection``): computing a mask
        over a large vocabulary costs more than a decode step's sampling, and asking the
        grammar about a few tokens gives the same draw."""
        p, n_vocab = self.params, self.vocab_size
        if np.shape(logits) != (n_vocab,):
            raise ValueError(f"logits shape {np.shape(logits)} must be ({n_vocab},)")
        work = self._logits
        np.copyto(work, logits, casting="same_kind")
        self._penalise(work, history)
        if self._seen and self._counts is not None and (p.presence_penalty or p.frequency_penalty):
            seen = np.array(self._seen, np.int64)
            work[seen] -= p.presence_penalty + p.frequency_penalty * self._counts[seen]
        if self._bias is not None:
            work[self._bias[0]] += self._bias[1]
        check = None  # (grammar, its mask's buffer) while the mask is not computed yet
        if grammar is not None:
            if mask_bias is None:
                raise ValueError("a grammar needs mask_bias, the (vocab_size,) buffer its mask is written into")
            if p.logprobs is None and self._exact_by_rejection:
                check, mask_bias = (grammar, mask_bias), None
            elif not grammar.fill_bias(mask_bias):  # a lazy grammar's free text: no mask
                mask_bias = None
        if mask_bias is not None:
            np.add(work, mask_bias, out=work)
        if p.logprobs is not None:
            lse, top_ids = self._log_normaliser(work, p.logprobs)
            top = tuple((int(i), float(work[i] - lse)) for i in top_ids)
        budget = self.budget
        if budget is not None and budget.forced and self._allowed(budget.forced[-1], mask_bias, check):
            token = budget.forced.pop()  # a grammar that refuses the marker wins over the budget
        else:
            token = self._checked_draw(work, check) if check is not None else self._draw(
                work, self._masked_top(work, mask_bias) if mask_bias is not None else None)
        if budget is not None:
            budget.observe(token)
        if p.logprobs is not None:
            self.last_logprobs = (float(work[token] - lse), top)
        if self._counts is not None:
            if self._counts[token] == 0:
                self._seen.append(token)
            self._counts[token] += 1
        return token

    @staticmethod
    def _allowed(token: int, mask_bias: np.ndarray | None, check: tuple[GrammarMask, np.ndarray] | None) -> bool:
        if mask_bias is not None:
            return bool(mask_bias[token] == 0)
        return check is None or check[0].allows(token)

    @property
    def _exact_by_rejection(self) -> bool:
        """True when a draw without the mask, checked against the grammar, is the masked
        draw: greedy; sampling from the whole distribution (a refused draw is drawn again
        under the mask); or top-k first (top-p, min-p or not) when the grammar allows every
        one of the k candidates, since the mask then leaves them, their mass and their
        maximum as they were. Top-p or min-p over the whole vocabulary depend on the mass
        the mask removes: the mask comes first."""
        p = self.params
        return (p.temperature == 0.0 or p.top_k == 1 or 0 < p.top_k < self.vocab_size
                or (p.top_p >= 1.0 and p.min_p == 0.0))

    def _checked_draw(self, work: np.ndarray, check: tuple[GrammarMask, np.ndarray]) -> int:
        grammar, buf = check
        p, n_vocab = self.params, self.vocab_size
        if p.temperature != 0.0 and 1 < p.top_k < n_vocab:  # the k candidates first
            top = np.argpartition(work, n_vocab - p.top_k)[n_vocab - p.top_k:]
            if all(grammar.allows(int(t)) for t in top):
                return self._draw(work, top)
            token = -1
        else:
            token = self._draw(work)
            if grammar.allows(token):
                return token
        if grammar.fill_bias(buf):  # refused: the draw under the mask
            np.add(work, buf, out=work)
            return self._draw(work, self._masked_top(work, buf))
        return token if token >= 0 else self._draw(work)

    def _log_normaliser(self, work: np.ndarray, logprobs: int) -> tuple[float, np.ndarray]:
        """log(sum(exp(work))) and the ids of the ``logprobs`` largest logits, largest first."""
        top = float(work.max())
        buf = self._cdf
        np.subtract(work, top, out=buf)
        np.exp(buf, out=buf)
        lse = top + math.log(float(buf.sum()))
        k = min(logprobs, self.vocab_size)
        if k == 0:
            return lse, np.empty(0, np.int64)
        ids = np.argpartition(work, self.vocab_size - k)[self.vocab_size - k:]
        return lse, ids[np.argsort(-work[ids], kind="stable")]

    def _masked_top(self, work: np.ndarray, mask_bias: np.ndarray) -> np.ndarray | None:
        """The top-k ids of ``work`` under ``mask_bias`` (None without top-k), found among
        the allowed ids: numpy's partition of a vocabulary that is mostly -inf (a grammar
        that allows a few tokens) is slower than a decode step."""
        p, n_vocab = self.params, self.vocab_size
        if p.temperature == 0.0 or not 1 < p.top_k < n_vocab:
            return None
        allowed = np.flatnonzero(mask_bias == 0)
        if len(allowed) <= p.top_k:
            return allowed if len(allowed) else None
        return allowed[np.argpartition(work[allowed], len(allowed) - p.top_k)[len(allowed) - p.top_k:]]

    def _draw(self, work: np.ndarray, top_ids: np.ndarray | None = None) -> int:
        """A token from ``work`` under the params; ``top_ids``: the top-k ids of ``work``,
        when already found."""
        p, n_vocab = self.params, self.vocab_size
        if p.temperature == 0.0 or p.top_k == 1:
            return int(np.argmax(work))

        top = float(work.max())
        if not math.isfinite(top):
            raise ValueError(f"logits have no finite maximum (max={top})")

        # Candidates: ids (n,) token ids sorted by descending logit, vals (n,) their logits;
        # or ids None and vals the whole vocabulary, unsorted, when no filter needs order.
        mass = None  # what top_p is a fraction of: the candidates' own mass when None
        if p.top_k and p.top_k < n_vocab:
            ids = top_ids if top_ids is not None else np.argpartition(work, n_vocab - p.top_k)[n_vocab - p.top_k:]
        elif p.top_p < 1.0:
            ids, mass = self._nucleus_superset(work, top)
        else:
            ids = None
        if ids is not None:
            ids = ids[np.argsort(-work[ids], kind="stable")]
        vals = work if ids is None else work[ids]

        if ids is not None and p.top_p < 1.0:
            cdf = self._softmax_cdf(vals, top, 1.0)
            mass = cdf[-1] if mass is None else mass
            vals = vals[:min(int(np.searchsorted(cdf, p.top_p * mass)) + 1, len(vals))]
        if p.min_p > 0.0:
            floor = top + math.log(p.min_p)  # prob < min_p * max prob  <=>  logit < max logit + log(min_p)
            if ids is None:
                np.less(work, floor, out=self._mask)
                np.copyto(work, -np.inf, where=self._mask)
            else:
                vals = vals[:int(np.count_nonzero(vals >= floor))]  # sorted: survivors are a prefix
        if len(vals) == 1:
            return 0 if ids is None else int(ids[0])

        cdf = self._softmax_cdf(vals, top, p.temperature)
        i = min(int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right")), len(vals) - 1)
        return i if ids is None else int(ids[i])

    def _penalise(self, work: np.ndarray, history: Sequence[int] | np.ndarray) -> None:
        """Apply the repetition penalty in place, once per distinct recent token."""
        p = self.params
        if p.repetition_penalty == 1.0 or p.repetition_window == 0 or len(history) == 0:
            return
        recent = np.unique(np.asarray(history[-p.repetition_window:], dtype=np.int64))
        if recent[0] < 0 or recent[-1] >= self.vocab_size:
            raise ValueError(f"history has token ids outside 0..{self.vocab_size - 1}")
        vals = work[recent]
        work[recent] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)

    def _nucleus_superset(self, work: np.ndarray, top: float) -> tuple[np.ndarray, float]:
        """Ids (unsorted) of the k most likely tokens for the first k in 64, 512, ... whose mass
        reaches top_p, and the whole vocabulary's mass: a nucleus usually costs one
        argpartition instead of a sort of the whole vocabulary."""
        n_vocab, probs = self.vocab_size, self._cdf
        np.subtract(work, top, out=probs)
        np.exp(probs, out=probs)
        mass = float(probs.sum())
        k = 64
        while k < n_vocab:
            ids = np.argpartition(work, n_vocab - k)[n_vocab - k:]
            if probs[ids].sum() >= self.params.top_p * mass:
                return ids, mass
            k *= 8
        return np.arange(n_vocab), mass

    def _softmax_cdf(self, vals: np.ndarray, top: float, temperature: float) -> np.ndarray:
        """Unnormalised running sum of exp((vals - top) / temperature), in the preallocated buffer."""
        cdf = self._cdf[:len(vals)]
        np.subtract(vals, top, out=cdf)
        if temperature != 1.0:
            cdf /= temperature
        np.exp(cdf, out=cdf)
        return np.cumsum(cdf, out=cdf)
