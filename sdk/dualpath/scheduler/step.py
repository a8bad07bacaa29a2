"""What a step is, between the scheduler and the runner: its sequences (``SeqStep``), its
plan (``StepPlan``), the arrays the plan is laid out in (``StepArrays``), and what the
step's outputs ask of the cache afterwards (``StepResults``).

The scheduler fills the arrays (token ids, positions, slots, the kernel view's spans, the
per-sequence entries and the rows whose logits are wanted); the runner binds the same
arrays once (ONNX Runtime's IOBinding, our attention stepper) and only reads them, so
the runner never needs the cache: it gets the plan and the arena's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import numpy as np

from ..cache.manager import Allocation
from .request import Request

if TYPE_CHECKING:
    from ..cache.manager import KVCacheManager

RequestT = TypeVar("RequestT", bound=Request)
"""The request type a step's results carry (the engine's: engine/request.py)."""

Ended = tuple[RequestT, str, dict[str, Any]]
"""A request that ended in a step: (request, finish_reason, ``Engine._end`` keywords)."""

__all__ = ["SeqStep", "StepArrays", "StepLayout", "StepPlan", "StepResults"]


class SeqStep:
    """One sequence's part of a step: what the runner needs to run it."""

    __slots__ = ("request", "seq_id", "token_ids", "alloc", "logits", "hidden", "draft", "embeds", "mutual")

    def __init__(self, request: Request | None, seq_id: int, token_ids: list[int], alloc: Allocation,
                 logits: bool, hidden: bool = False, draft: int = 0,
                 embeds: tuple[tuple[int, np.ndarray], ...] = (), mutual: tuple[tuple[int, int], ...] = ()):
        self.request = request     # None for a sequence driven on its own (warm-up, forward, a draft model)
        self.seq_id = seq_id
        self.token_ids = token_ids
        self.alloc = alloc         # where the tokens' KV goes (slots, first position, prefill or not)
        self.logits = logits       # the chunk ends the known tokens: sample after it
        self.hidden = hidden       # every token's final hidden state is wanted (an embedding)
        self.draft = draft         # the last `draft` tokens are proposals: a row each to verify them
        self.embeds = embeds       # ((offset, rows (k, dim) f32), ...): tokens that take these rows as
        #                            their embeddings (an image's), not their ids' rows
        self.mutual = mutual       # ((lo, hi), ...) offsets: tokens lo..hi-1 each see token hi-1
        #                            (``Request.mutual``)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_rows(self) -> int:
        """Output rows the runner returns for it, in step order: every token's with
        ``hidden`` (the last one samples when ``logits``), else one to sample and one per
        proposal, or none."""
        return len(self.token_ids) if self.hidden else int(self.logits) + self.draft


class StepLayout(NamedTuple):
    """How a plan lies in the ``StepArrays`` (``StepArrays.fill``)."""

    num_tokens: int
    """T: the step's tokens, back to back."""
    num_rows: int
    """R: rows whose logits (and final hidden states) the runner returns."""
    prefill: bool
    """Any sequence prefills (the governor's prefill session set runs the step)."""
    num_entries: int
    """Kernel entries (a sequence, or a row of a sequence with proposals)."""
    num_spans: int
    """Kernel-view spans of every sequence together."""
    embeds: tuple[tuple[int, np.ndarray], ...] = ()
    """((row, rows (k, dim) f32), ...): the step's tokens from ``row`` on whose first
    residual is ``rows`` (an image's embeddings) instead of their ids' embeddings."""


@dataclass
class StepPlan:
    """The next step: its sequences in run order, and the requests that failed."""

    seqs: list[SeqStep] = field(default_factory=list)
    failed: list[tuple[Request, str]] = field(default_factory=list)
    """Requests the cache can never hold, with why (the engine fails them)."""
    layout: StepLayout | None = None
    """Where the scheduler laid the plan out in its ``StepArrays`` (None: not laid out yet)."""

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    def __bool__(self) -> bool:
        return bool(self.seqs)


@dataclass
class StepResults(Generic[RequestT]):
    """What a step's outputs ask of the cache (``update_from_output``): the output maker
    returns them instead of touching the cache."""

    rollbacks: list[tuple[RequestT, int]] = field(default_factory=list)
    """(request, known tokens whose KV stays): speculative proposals rejected after them."""
    forked: list[tuple[RequestT, RequestT]] = field(default_factory=list)
    """Forks whose parent's prompt was just computed: they start now."""
    ended: list[Ended[RequestT]] = field(default_factory=list)
    """(request, finish_reason, end keywords) of the requests that ended: their cache is freed."""
    generated: int = 0
    """Tokens sampled."""


class StepArrays:
    """The arrays a step is laid out in, allocated once (T = ``max_step_tokens``): the
    scheduler fills them, the runner binds them once and reads them."""

    def __init__(self, max_step_tokens: int, max_num_seqs: int, max_context_tokens: int, page_tokens: int):
        T = self.max_step_tokens = max_step_tokens
        self.max_context_tokens = max_context_tokens
        self.ids = np.zeros(T, np.int64)                        # (T,)
        self.positions = np.zeros(T, np.int64)                  # (T,)
        self.rows = np.zeros(T, np.int64)                       # (R,) rows whose logits are wanted
        self.arange = np.arange(T, dtype=np.int64)              # (T,) 0, 1, ... T - 1
        self.slots = np.zeros((T, 3), np.int64)                 # (T, 3) where new tokens go
        # Kernel view of every sequence of a step, back to back: a sequence has at most
        # one span per page (shared prefix pages appear in every sequence that reads
        # them), 24 bytes per page_tokens of context: nothing beside the KV itself.
        max_spans = max(1, max_num_seqs) * (-(-max_context_tokens // page_tokens) + 1)
        self.spans = np.zeros((max_spans, 3), np.int64)         # (max_spans, 3)
        # (S, 5) row0, n, pos0, span0, num_spans: an entry per sequence, or per row of a
        # sequence with proposals (speculative decoding), hence room for a row each.
        self.seqs = np.zeros((max(1, max_num_seqs) + T, 5), np.int64)

    def fill(self, plan: StepPlan, cache: KVCacheManager, all_rows: bool = False) -> StepLayout:
        """Lay ``plan`` out (every row with ``all_rows``, else each sequence's
        ``SeqStep.num_rows``) and record it in ``plan.layout``."""
        row = R = span = E = 0
        prefill = False
        embeds: list[tuple[int, np.ndarray]] = []
        a = self.arange
        for e in plan.seqs:
            n = len(e.token_ids)
            alloc = e.alloc
            pos0 = alloc.pos0
            if row + n > self.max_step_tokens:
                raise ValueError(f"a step takes at most {self.max_step_tokens} tokens")
            if pos0 + n > self.max_context_tokens:
                raise ValueError(f"positions {pos0}..{pos0 + n - 1} exceed the context of {self.max_context_tokens}")
            self.ids[row:row + n] = e.token_ids
            for offset, rows in e.embeds:
                if not (0 <= offset and offset + len(rows) <= n):
                    raise ValueError(f"embedding rows {offset}..{offset + len(rows) - 1} lie outside the chunk's {n}")
                embeds.append((row + offset, rows))
            self.slots[row:row + n] = alloc.slots
            np.add(a[:n], pos0, out=self.positions[row:row + n])
            ns = len(cache.spans(e.seq_id, out=self.spans[span:]))
            if e.draft:
                # Each row attends as a one-row decode step at its position would (the same
                # context split, so the same bits): its proposals are checked against exactly
                # the logits plain decoding computes.
                self.seqs[E:E + n, 0] = a[:n] + row
                self.seqs[E:E + n, 1] = 1
                self.seqs[E:E + n, 2] = a[:n] + pos0
                self.seqs[E:E + n, 3:] = (span, ns)
                E += n
            elif e.mutual:
                E = self._mutual_entries(E, e.mutual, row, n, pos0, span, ns)
            else:
                self.seqs[E] = (row, n, pos0, span, ns)
                E += 1
            # The plan's row count (SeqStep.num_rows): an embedding's every token, else the
            # last known token's row and one per proposal after it, which end the chunk.
            k = e.num_rows
            self.rows[R:R + k] = a[:k] + (row if e.hidden else row + n - k)
            R += k
            prefill = prefill or alloc.prefill
            row += n
            span += ns
        if all_rows:
            R = row
            self.rows[:R] = a[:R]
        elif R == 0:  # no entry samples: lm_head still runs on one row, make it a valid one
            self.rows[0] = 0
        plan.layout = StepLayout(row, R, prefill, E, span, tuple(embeds))
        return plan.layout

    def _mutual_entries(self, E: int, mutual: tuple[tuple[int, int], ...], row: int, n: int, pos0: int, span: int,
                        ns: int) -> int:
        """The entries of a chunk with spans of mutual attention (``SeqStep.mutual``): the rows
        between spans as one entry each; a span's rows each an entry of its own that attends
        as a one-row step at the span's last position would, so that it sees the whole span
        (whose KV the step writes before any attention reads it). Returns the next entry."""
        at = 0
        for lo, hi in (*mutual, (n, n)):
            if lo > at:
                self.seqs[E] = (row + at, lo - at, pos0 + at, span, ns)
                E += 1
            k = hi - lo
            self.seqs[E:E + k, 0] = self.arange[:k] + row + lo
            self.seqs[E:E + k, 1] = 1
            self.seqs[E:E + k, 2] = pos0 + hi - 1
            self.seqs[E:E + k, 3:] = (span, ns)
            E += k
            at = hi
        return E
