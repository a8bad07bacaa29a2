"""A request as the scheduler sees it: its tokens and where it stands between steps.

It lives here, below the runtime, so that the scheduler and the engine share one
type without importing each other (vLLM's ``v1/request.py`` does the same). The
engine subclasses it with what generating text needs (sampler, text stream,
output sink); the scheduler never reads those.
"""

from __future__ import annotations

import enum
import time

import numpy as np

from ..cache.policy import Path


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One generation between steps.

    Invariants: ``ids[:n]`` are the known tokens (prompt, then generated ones);
    ``computed <= n`` of them have KV in the cache, in sequence ``seq_id``, while
    RUNNING; a WAITING request holds no cache (``seq_id`` None, ``computed`` 0).
    """

    def __init__(self, request_id: str, prompt_ids: list[int], context_tokens: int,
                 arrival: float | None = None, reserve_tokens: int = 64):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.context_tokens = context_tokens
        # (capacity,) prompt then generated tokens: room for ``reserve_tokens`` generated ones
        # (at most the context), doubled when full, so a queued request holds its prompt's
        # size, not the context's.
        self.ids = np.zeros(min(context_tokens, len(prompt_ids) + max(1, min(reserve_tokens, 1024))), np.int64)
        self.n = len(prompt_ids)
        """Known tokens: the prompt plus the tokens generated so far."""
        self.ids[:self.n] = prompt_ids
        self.generated: list[int] = []
        self.status = Status.WAITING
        self.seq_id: int | None = None
        """The cache sequence holding its KV while RUNNING."""
        self.computed = 0
        """Known tokens whose KV is in the cache (or scheduled in the current step)."""
        self.cached_tokens: int | None = None
        """Prompt tokens found in the prefix cache when it first started."""
        self.preemptions = 0
        self.path: Path | None = None
        """The path the router gave the request when it (last) started."""
        self.arrival = time.perf_counter() if arrival is None else arrival
        """``time.perf_counter()`` when it was queued: first come, first served."""
        self.prompt_logits = False
        """Wants the logits of every prompt position (the prompt's log-probabilities, for
        ``echo``): like an embedding, its prompt is never served from the prefix cache."""
        self.embedding = False
        """Wants the final hidden state of every prompt token (an embedding) and samples
        nothing: its prompt is never served from the prefix cache (every token is computed)."""
        self.reserved_seqs = 0
        """Sequences it will add to the running set beyond its own (the forks of an ``n`` > 1
        request not started yet): the scheduler admits it only with a slot for each, so a
        step never carries more than ``max_num_seqs`` sequences."""
        self.failed_steps = 0
        """Steps that failed while it was in them (it is recomputed once, then failed)."""
        self.draft: list[int] = []
        """Proposed next tokens (speculative decoding): the next decode step runs them after
        the last known token, each with its logits row; the engine keeps those its samples
        agree with and the cache rolls back the rest."""
        self.embeds: tuple[tuple[int, np.ndarray], ...] = ()
        """((prompt position, rows (k, dim) f32), ...), in order, not overlapping: prompt
        tokens whose first residual is given (an image's embeddings), not their ids' rows.
        Every chunk that computes them takes its part (``chunk_embeds``), a recompute after
        preemption included."""
        self.mutual: tuple[tuple[int, int], ...] = ()
        """((start, end), ...) prompt positions whose tokens attend to each other, not only to
        those before them (Gemma 3's image rows, as llama.cpp decodes an image's batch with
        causal attention off): each token of a span sees the span's last position. Its
        sliding window ends there too, where llama.cpp's ends at the token itself: the same
        keys unless more than (window - span length) tokens precede the span."""

    def chunk_tokens(self, start: int, n: int) -> int:
        """``n``, or fewer, so that a chunk from ``start`` does not end inside a ``mutual``
        span that begins after it (the span then starts the next chunk, whole)."""
        for lo, hi in self.mutual:
            if start < lo < start + n < hi:
                return int(lo - start)
        return n

    def chunk_mutual(self, start: int, end: int) -> tuple[tuple[int, int], ...]:
        """``SeqStep.mutual`` of a chunk of known tokens [start, end): the ``mutual`` spans'
        parts inside it, as offsets from ``start``."""
        return tuple((max(lo, start) - start, min(hi, end) - start) for lo, hi in self.mutual
                     if max(lo, start) < min(hi, end))

    def chunk_embeds(self, start: int, end: int) -> tuple[tuple[int, np.ndarray], ...]:
        """``SeqStep.embeds`` of a chunk of known tokens [start, end): the parts of
        ``embeds`` inside it, at their offsets from ``start``."""
        out = []
        for pos, rows in self.embeds:
            lo, hi = max(pos, start), min(pos + len(rows), end)
            if lo < hi:
                out.append((lo - start, rows[lo - pos:hi - pos]))
        return tuple(out)

    @property
    def running_seq(self) -> int:
        """``seq_id`` of a request that holds cache (RUNNING); raises for one that holds none."""
        if self.seq_id is None:
            raise RuntimeError(f"request {self.request_id} holds no cache sequence")
        return self.seq_id

    def append(self, token: int) -> None:
        """A generated token becomes known (its KV is computed by the next step)."""
        self.generated.append(token)
        if self.n == len(self.ids):
            grown = np.zeros(min(max(self.context_tokens, self.n + 1), 2 * len(self.ids)), np.int64)
            grown[:self.n] = self.ids
            self.ids = grown
        self.ids[self.n] = token
        self.n += 1
