"""Speculative decoding's proposals: prompt lookup (n-grams, no second model), or a
draft model.

Decode is bound by memory bandwidth: a step that checks several proposed tokens reads
the weights once, as a step of one token does. A request's next tokens often repeat
its own text (a document it is asked about, code, JSON that echoes field names), so
the proposals come from there: the longest suffix of the known tokens (``MAX_NGRAM``
tokens down to ``MIN_NGRAM``) that occurred before, and the tokens that followed its
latest occurrence; or, while a copy goes on (every proposal kept and the next token
the source's next one), the source's next tokens.

The engine runs the proposals after the last known token in one step, one logits row
each, and samples every row in order as it would without them: a proposal is kept
while the sampled token equals it, and the first sample that differs ends the step's
output (the cache rolls back the proposals after it). Proposals are a deterministic
function of the known tokens, so this is speculative sampling with a point-mass draft:
the output, greedy or sampled with a seed, is the output without proposals.

A draft model (``runtime.draft_model``: a smaller GGUF with the same vocabulary)
proposes its own greedy continuation instead, from a KV cache of its own that keeps
each request's tokens as far as the target kept them. Greedy proposals are again a
deterministic function of the known tokens: the same rule holds.

A proposal that is rejected costs a logits row and its share of the step. The draft
length therefore follows the acceptance: it doubles after a step that kept every
proposal, stays after a step that kept some (copied text has edits; the copy goes on
after them), halves after a step that kept none, and after two such steps in a row the
request decodes plainly for a while (free text is not slowed).
"""

from __future__ import annotations

import numpy as np

MIN_NGRAM, MAX_NGRAM = 2, 4
"""Suffix lengths looked up, longest first (a single repeated token is too weak a cue)."""
COOLDOWN_STEPS = 8
"""Plain decode steps after proposals kept failing (doubled each time it happens again)."""


class Proposer:
    """What every proposer shares: the draft length, which follows the acceptance (see
    the module docstring), and the counts."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.k = max_tokens
        """Draft length of the next proposal."""
        self.misses = 0
        self.cooldown = 0
        self.backoff = COOLDOWN_STEPS
        self.proposed = self.accepted = 0

    def propose(self, ids: np.ndarray, n: int, limit: int) -> list[int]:
        """Up to ``min(k, limit)`` tokens to follow ``ids[:n]``, or []."""
        raise NotImplementedError

    def close(self) -> None:
        """The request ended: release what the proposer holds."""

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
        if accepted:  # the source is right for a while yet: an edit, not the end of the copy
            self.misses = 0
            return
        self.k = max(1, self.k // 2)
        self.misses += 1
        if self.misses >= 2:
            self.cooldown, self.backoff, self.misses = self.backoff, 2 * self.backoff, 0


class NgramProposer(Proposer):
    """One request's n-gram table (see the module docstring)."""

    def __init__(self, max_tokens: int):
        super().__init__(max_tokens)
        self.tables: list[dict] = [{} for _ in range(MAX_NGRAM + 1)]
        """tables[m]: m tokens -> the position after their latest occurrence."""
        self.indexed = 0
        """Positions whose n-grams ending there are in the tables."""
        self.src: int | None = None
        """Where the last proposal ended in ``ids``: a copy in progress continues from there
        rather than from the latest occurrence of the suffix (text that repeats with
        changes has several)."""

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
        src = self.src
        if src is not None and src < n - 1 and ids[src] == ids[n - 1] and ids[src - 1] == ids[n - 2]:
            return self._from(ids, src + 1, n, k)  # the copy goes on where the last proposal ended
        for m in range(min(MAX_NGRAM, n - 1), MIN_NGRAM - 1, -1):
            p = self.tables[m].get(ids[n - m:n].tobytes())
            if p is not None and p < n:
                return self._from(ids, p, n, k)
        self.src = None
        return []

    def _from(self, ids: np.ndarray, p: int, n: int, k: int) -> list[int]:
        out = ids[p:min(p + k, n)].tolist()
        self.src = p + len(out)  # if all are kept, the sample after them is checked against ids[src]
        return out


class DraftModel:
    """A second, smaller model with the target's vocabulary (``runtime.draft_model``): a
    driver (engine/driver.py) over its own scheduler, KV cache and runner, a sequence
    per request."""

    def __init__(self, driver):
        self.driver = driver

    def extend(self, seq_id: int, tokens) -> np.ndarray | None:
        """Run ``tokens`` after the sequence's; the last one's logits (vocab,), or None
        when the draft's cache is full."""
        return self.driver.extend(seq_id, tokens)


class DraftProposer(Proposer):
    """Proposals from a draft model's greedy continuation. The draft's cache holds this
    request's tokens as far as they agree with what the target kept."""

    def __init__(self, model: DraftModel, max_tokens: int):
        super().__init__(max_tokens)
        self.model = model
        self.seq_id: int | None = None
        self.held: list[int] = []
        """The tokens whose KV the draft's cache holds for this request."""

    def propose(self, ids: np.ndarray, n: int, limit: int) -> list[int]:
        if self.cooldown:
            self.cooldown -= 1
            return []
        k = min(self.k, limit)
        if k < 1:
            return []
        driver = self.model.driver
        if self.seq_id is None:
            self.seq_id, _ = driver.open()
        # Keep what still agrees with the known tokens (proposals that were kept), drop the rest.
        held = self.held
        same = 0
        limit_same = min(len(held), n - 1)  # the last known token is run again: its logits are needed
        while same < limit_same and held[same] == ids[same]:
            same += 1
        if same < len(held):
            driver.rollback(self.seq_id, same)
            del held[same:]
        logits = self.model.extend(self.seq_id, ids[same:n])
        if logits is None:
            self.close()
            return []
        held.extend(int(t) for t in ids[same:n])
        out = []
        for j in range(k):
            t = int(np.argmax(logits))
            out.append(t)
            if j == k - 1:
                break
            logits = self.model.extend(self.seq_id, [t])
            if logits is None:
                break
            held.append(t)
        return out

    def close(self) -> None:
        if self.seq_id is not None:
            self.model.driver.close(self.seq_id)
            self.seq_id = None
            self.held = []
