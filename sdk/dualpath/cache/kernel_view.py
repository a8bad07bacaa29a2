"""The kernel view of a page table, and the locality score read from it.

The attention kernels read a sequence as spans, (byte offset, num_tokens,
page_tokens) rows, with physically adjacent pages merged into one span. A span is
folded forward page by page as the sequence grows (``fold``) and cut back when it
is truncated (``unfold``), so a decode step costs O(new pages), never a scan of the
page table; ``spans_scan`` and ``locality_score_scan`` are the same values from
scratch, for ``check``.
"""

from __future__ import annotations

import numpy as np

from ..errors import require
from .sequence import Sequence


class KernelView:
    """Where a page lives in the arena, and each sequence's spans over its pages."""

    def __init__(self, block_bytes: int, page_bytes: int, pages_per_block: int, page_tokens: int):
        self.block_bytes = block_bytes
        self.page_bytes = page_bytes
        self.pages_per_block = pages_per_block
        self.page_tokens = page_tokens

    def page_offset(self, page: int) -> int:
        """Byte offset of ``page`` in every layer's region of the arena."""
        b, s = divmod(page, self.pages_per_block)
        return b * self.block_bytes + s * self.page_bytes

    def fold(self, seq: Sequence, window: int) -> np.ndarray:
        """Fold the pages added since the last fold into the sequence's kernel view rows
        (``span_rows[:span_n]``, every page counted full) and ``span_long`` (spans of at
        least ``window`` tokens): O(new pages). Returns ``span_rows``."""
        P, pb = self.page_tokens, self.page_bytes
        if seq.span_pages < 0:
            seq.span_n = seq.span_pages = seq.span_long = 0
        rows = seq.span_rows
        if seq.span_window != window:  # another policy's window: recount the closed spans once
            closed = rows[:max(seq.span_n - 1, 0), 1]
            seq.span_long = int(closed[closed >= window].sum())
            seq.span_window = window
        for page in seq.pages[seq.span_pages:]:
            off = self.page_offset(page)
            r = seq.span_n
            if r and rows[r - 1, 0] + (rows[r - 1, 1] // P) * pb == off:
                rows[r - 1, 1] += P
            else:
                if r:  # the last span closes: only full pages in it from now on
                    n = int(rows[r - 1, 1])
                    if n >= window:
                        seq.span_long += n
                if r == len(rows):
                    rows = seq.span_rows = np.concatenate([rows, np.zeros_like(rows)])
                rows[r] = (off, P, P)
                seq.span_n = r + 1
        seq.span_pages = len(seq.pages)
        return rows

    def unfold(self, seq: Sequence) -> None:
        """Take the pages a truncation dropped back out of the kernel view: the last
        spans shrink or go, and ``span_long`` loses the span that becomes the open one."""
        if seq.span_pages <= len(seq.pages):
            return
        P, rows = self.page_tokens, seq.span_rows
        while seq.span_pages > len(seq.pages):
            r = seq.span_n
            pages = int(rows[r - 1, 1]) // P
            drop = seq.span_pages - len(seq.pages)
            if drop < pages:
                rows[r - 1, 1] -= drop * P
                seq.span_pages -= drop
                break
            seq.span_n = r - 1  # the whole last span goes: the one before it is open again
            seq.span_pages -= pages
            if r > 1 and rows[r - 2, 1] >= seq.span_window:
                seq.span_long -= int(rows[r - 2, 1])

    def spans(self, seq: Sequence, window: int, out: np.ndarray | None = None) -> np.ndarray:
        """The kernel view, (num_spans, 3) int64 rows, into ``out`` when given (see
        ``KVCacheManager.spans``)."""
        rows = self.fold(seq, window)
        r = seq.span_n
        dst = out if out is not None else np.empty((r, 3), np.int64)
        dst[:r] = rows[:r]
        if r:
            dst[r - 1, 1] -= len(seq.pages) * self.page_tokens - seq.num_tokens  # the last page may be partial
        return dst[:r]

    def locality_score(self, seq: Sequence, window: int) -> float:
        """Share of the sequence's tokens in spans of at least ``window`` tokens, folded
        forward (``locality_score_scan`` is the same value from scratch)."""
        if seq.num_tokens == 0:
            return 0.0
        rows = self.fold(seq, window)
        last = int(rows[seq.span_n - 1, 1]) - (len(seq.pages) * self.page_tokens - seq.num_tokens)
        long = seq.span_long + (last if last >= seq.span_window else 0)
        return float(long) / seq.num_tokens

    def spans_scan(self, seq: Sequence) -> np.ndarray:
        """The kernel view rebuilt from the page table (checks ``spans``)."""
        P = self.page_tokens
        offs = np.array([self.page_offset(p) for p in seq.pages], np.int64)  # (num_pages,)
        if not len(offs):
            return np.zeros((0, 3), np.int64)
        cut = np.flatnonzero(np.diff(offs) != self.page_bytes) + 1  # first page of each span but the first
        first = np.concatenate([[0], cut])
        end = np.concatenate([cut, [len(offs)]])
        rows = np.stack([offs[first], (end - first) * P, np.full(len(first), P)], 1).astype(np.int64)
        rows[-1, 1] -= len(offs) * P - seq.num_tokens
        return rows

    def locality_score_scan(self, seq: Sequence, window: int) -> float:
        """``locality_score`` from scratch, over the whole page table (checks it)."""
        if seq.num_tokens == 0:
            return 0.0
        sp = self.spans_scan(seq)
        long = sp[sp[:, 1] >= window, 1].sum()
        return float(long) / seq.num_tokens

    def check(self, seq: Sequence, window: int) -> None:
        """Raise InvariantError when the folded view of ``seq`` disagrees with a scan (tests)."""
        sid = seq.seq_id
        require(np.array_equal(self.spans(seq, window), self.spans_scan(seq)), f"spans of {sid}")
        closed = seq.span_rows[:max(seq.span_n - 1, 0), 1]
        require(seq.span_long == closed[closed >= seq.span_window].sum(), f"span_long of {sid}")
        require(self.locality_score(seq, window) == self.locality_score_scan(seq, window), f"locality of {sid}")
