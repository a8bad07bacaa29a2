"""Speculative decoding's proposals: prompt lookup (n-grams), no second model.

Decode is bound by memory bandwidth: a step that checks several proposed tokens reads
the weights once, as a step of one token does. A request's next tokens often repeat
its own text (a document it is asked about, code, JSON that echoes field names), so
the proposals come from there: the longest suffix of the known tokens (``MAX_NGRAM``
tokens down to ``MIN_NGRAM``) that occurred before, and the tokens that followed its
latest occurrence.

The engine runs the proposals after the last known token in one step, one logits row
each, and samples every row in order as it would without them: a proposal is kept
while the sampled token equals it, and the first sample that differs ends the step's
output (the cache rolls back the proposals after it). Proposals are a deterministic
function of the known tokens, so this is speculative sampling with a point-mass draft:
the output, greedy or sampled with a seed, is the output without proposals.

A proposal that is rejected costs a logits row and its share of the step. The draft
length therefore follows the acceptance: it doubles after a step that kept every
proposal, falls to one past what was kept otherwise, and after repeated misses the
request decodes plainly for a while (free text is not slowed).
"""

from __future__ import annotations

import numpy as np

MIN_NGRAM, MAX_NGRAM = 2, 4
"""Suffix lengths looked up, longest first (a single repeated token is too weak a cue)."""
COOLDOWN_STEPS = 8
"""Plain decode steps after proposals kept failing (doubled each time it happens again)."""


class NgramProposer:
    """One request's n-gram table and draft length (see the module docstring)."""

    __slots__ = ("max_tokens", "k", "tables", "indexed", "misses", "cooldown", "backoff", "proposed", "accepted")

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.k = max_tokens
        """Draft length of the next proposal."""
        self.tables: list[dict] = [{} for _ in range(MAX_NGRAM + 1)]
        """tables[m]: m tokens -> the position after their latest occurrence."""
        self.indexed = 0
        """Positions whose n-grams ending there are in the tables."""
        self.misses = 0
        self.cooldown = 0
        self.backoff = COOLDOWN_STEPS
        self.proposed = self.accepted = 0

    def _index(self, ids: np.ndarray, end: int) -> None:
        """Enter the n-grams ending before ``end`` (O(new tokens))."""
        tables = self.tables
        for j in range(max(self.indexed, MIN_NGRAM), end + 1):
            for m in range(MIN_NGRAM, min(MAX_NGRAM, j) + 1):
                tables[m][ids[j - m:j].tobytes()] = j
        self.indexed = end + 1

    def propose(self, ids: np.ndarray, n: int, limit: int) -> list[int]:
        """Up to ``min(k, limit)`` tokens to follow ``ids[:n]``, or [] (no match, cooling down)."""
        if self.cooldown:
            self.cooldown -= 1
            self._index(ids, n - 1)
            return []
        k = min(self.k, limit)
        if k < 1 or n <= MIN_NGRAM:
            return []
        self._index(ids, n - 1)  # every occurrence that ends before the current suffix
        for m in range(min(MAX_NGRAM, n - 1), MIN_NGRAM - 1, -1):
            p = self.tables[m].get(ids[n - m:n].tobytes())
            if p is not None and p < n:
                return ids[p:min(p + k, n)].tolist()
        return []

    def update(self, proposed: int, accepted: int) -> None:
        """How the last proposal went: the next draft length, or a rest from proposing."""
        if not proposed:
            return
        self.proposed += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.k = min(self.max_tokens, 2 * self.k)
            self.misses = 0
            self.backoff = COOLDOWN_STEPS
            return
        self.k = max(1, accepted + 1)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= 2:
            self.cooldown, self.backoff, self.misses = self.backoff, 2 * self.backoff, 0
