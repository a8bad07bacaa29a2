"""Sliding-window layers keep their window: the memory of positions behind it goes back.

A sliding-window layer (Gemma 2 and 3: 15 of 18 layers see the last 512 positions)
never reads a position again once every later query is past its window. Such pages
are *released* in those layers only (``KVArena.release_tiles``: their OS pages go
back, and read as zeros, which the kernels mask with the window anyway); the
global layers keep every position, and the page stays in its sequence's table and
in the prefix index.

What must stay for prefix reuse: a later request that reuses a prefix ending at
position m runs its first query at m, whose window reaches back to m - W. So the
prefix lookup (``reusable``) shortens a match to the last page boundary whose W
positions before it are intact, and a sequence keeps, besides its last W positions
(and ``MARGIN`` for speculative decoding's rollback):

* 2 W positions before its prompt's end: the same prompt again, or one that differs
  only in its last W tokens (a question after a shared document), is reused whole;
* W positions before every ``checkpoint``-th position (``swa_checkpoint_tokens``;
  0: none): a prompt that shares a long prefix is reused up to the last checkpoint
  before it parts.

The cost is stated in docs/performance.md. A page is released only while this
sequence is its one user (a shared page may be another sequence's window).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..kernels import KVArena
from .sequence import Sequence

MARGIN = 64
"""Positions kept beyond the window: speculative decoding may cut a sequence back by
its rejected proposals (at most ``runtime.speculative_tokens``, 16) and run again from there."""


class SlidingWindows:
    """Which layers slide, and the pages released in them."""

    def __init__(self, arena: KVArena, offset: Callable[[int], int], windows: list[int], page_tokens: int,
                 num_pages: int, checkpoint: int):
        self.arena = arena
        self.offset = offset
        """page -> its byte offset in every layer's region (the kernel view's)."""
        self.layers = np.array([w > 0 for w in windows], np.uint8)
        # One window for the rules: the largest (Gemma's layers all slide by the same).
        self.window = max(windows)
        self.page_tokens = page_tokens
        self.checkpoint = checkpoint
        self.released = np.zeros(num_pages, bool)
        """Per page: its sliding-window layers' rows were given back (they read as zeros)."""
        self.released_pages = 0
        """Pages released so far (counted once per release)."""
        # Huge pages would be filled back in by khugepaged, a whole 2 MiB at a time.
        arena.small_pages(self.layers)

    def _kept(self, lo: int, hi: int, prompt_end: int) -> bool:
        """Whether positions [lo, hi) lie in a window that prefix reuse needs."""
        W, C = self.window, self.checkpoint
        if hi > prompt_end - 2 * W and lo < prompt_end:
            return True
        # a checkpoint k * C (k >= 1) with [k * C - W, k * C) meeting [lo, hi)
        return C > 0 and (lo // C + 1) * C < hi + W

    def release(self, seq: Sequence, page_ref: list[int]) -> None:
        """After a step: release the sequence's pages that no later query of its own
        can see and that no prefix reuse needs. O(pages newly behind the window)."""
        P = self.page_tokens
        last = (seq.committed - self.window - MARGIN) // P  # pages [.., last) lie wholly behind
        first = seq.released_upto
        if last <= first:
            return
        prompt_end = seq.prompt_tokens // P * P
        pages = [seq.pages[i] for i in range(first, last)
                 if page_ref[seq.pages[i]] == 1 and not self.released[seq.pages[i]]
                 and not self._kept(i * P, (i + 1) * P, prompt_end)]
        seq.released_upto = last
        if pages:
            self._release(pages)

    def _release(self, pages: list[int]) -> None:
        offsets = np.array([self.offset(p) for p in pages], np.int64)
        self.arena.release_tiles(self.layers, offsets, self.page_tokens)
        self.released[pages] = True
        self.released_pages += len(pages)

    def reusable(self, pages: list[int]) -> int:
        """How many of ``pages`` (a prefix match, in order) a new request may reuse: the
        longest run from the start whose last W positions are intact."""
        P, k = self.page_tokens, len(pages)
        while k > 0:
            first = max(0, (k * P - self.window) // P)
            hit = [j for j in range(first, k) if self.released[pages[j]]]
            if not hit:
                return k
            k = hit[-1]  # a boundary after a released page of its window is no good
        return 0
