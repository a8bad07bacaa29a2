"""Every sequence's page table, and the changes to it.

A table grows by whole pages (a shared, partly filled last page is copied first:
copy-on-write), is cut back (speculative decoding's rejected proposals), is forked
(a child shares every page), moves to fresh pages (migration) or is let go. Pages
come from and go back to the ``PageAllocator`` (cache/pages.py); every change is
all or nothing, and keeps the ``TokenTally`` (cache/stats.py) and the kernel view
(cache/kernel_view.py) up to date in O(pages changed). Which path a sequence
takes is the manager's to decide (cache/manager.py), not this module's.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..kernels import KVArena
from .kernel_view import KernelView
from .pages import PageAllocator
from .results import NoRoom
from .sequence import Sequence, TokenIds
from .stats import TokenTally


class PageTables:
    """The sequences by id, and the operations that change their pages."""

    def __init__(self, pages: PageAllocator, view: KernelView, arena: KVArena):
        self.pages = pages
        self.view = view
        self.arena = arena
        self.page_tokens = view.page_tokens
        self.seqs: dict[int, Sequence] = {}
        self.tally = TokenTally(len(pages.pool.page_ref), view.page_tokens)
        self.cow_copies = 0
        """Shared, partly filled last pages copied before a sequence appended to them."""

    def check_new(self, seq_id: int) -> None:
        """Raise ValueError when ``seq_id`` is taken."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} already exists")

    def add(self, seq: Sequence) -> None:
        """A new, empty sequence (its id checked with ``check_new``)."""
        self.seqs[seq.seq_id] = seq

    def share(self, seq: Sequence, page: int, h: bytes, tokens: list[int]) -> None:
        """Append ``page``, the prefix cache's full page ``h`` holding ``tokens``, to the
        sequence: one more reference to it (a cached page is no longer evictable)."""
        pool = self.pages.pool
        if pool.page_ref[page] == 0:
            self.pages.prefix.reuse(page)
        pool.page_ref[page] += 1
        seq.pages.append(page)
        seq.tokens.extend(tokens)
        seq.hashes.append(h)
        self.tally.attach(seq, len(seq.pages) - 1)

    def unshare(self, seq: Sequence, keep: int) -> None:
        """Let go of the shared pages after the first ``keep`` of a sequence that has only
        shared pages (a prefix match cut short): they stay cached."""
        if keep >= len(seq.pages):
            return
        P = self.page_tokens
        self.tally.detach(seq, keep)
        for page in reversed(seq.pages[keep:]):
            self.pages.unref(page)
        del seq.pages[keep:], seq.tokens[keep * P:], seq.hashes[keep:]
        if seq.span_pages > keep:
            seq.span_pages = -1
        self.tally.attach(seq, keep)

    def grow(self, seq: Sequence, token_ids: TokenIds, use_extent: bool) -> Literal[True] | NoRoom:
        """Pages for ``token_ids`` appended to the sequence, from its extent when
        ``use_extent`` (else from the random pool), and the tokens appended: True. Or
        NoRoom, with nothing changed."""
        first = seq.num_tokens // self.page_tokens  # the first page the new tokens touch
        self.tally.detach(seq, first)
        got = self._take_pages(seq, len(token_ids), use_extent)
        if got is True:
            seq.tokens.extend(int(t) for t in token_ids)
        self.tally.attach(seq, first)
        return got

    def _take_pages(self, seq: Sequence, n: int, use_extent: bool) -> Literal[True] | NoRoom:
        """Pages for ``n`` more tokens of the sequence, all or nothing."""
        P, pages = self.page_tokens, self.pages
        cow = bool(seq.num_tokens % P) and pages.pool.page_ref[seq.pages[-1]] > 1
        need = (seq.num_tokens + n + P - 1) // P - len(seq.pages) + cow
        room = pages.free_page_count() + (pages.pool.extent_spare(seq.blocks) if use_extent else 0)
        if need > room:  # decided before anything is taken or evicted
            return NoRoom(need, room)
        # Copy-on-write: a shared, partly filled last page is copied before appending.
        if cow:
            page = pages.new_page(seq.blocks, use_extent)
            if page is None:
                return NoRoom(1 + (seq.num_tokens % P + n - 1) // P, pages.free_page_count())
            self._copy_pages(seq.pages[-1], page, seq.num_tokens % P)
            pages.unref(seq.pages[-1])
            seq.pages[-1] = page
            seq.span_pages = -1
            self.cow_copies += 1
        taken: list[int] = []
        for _ in range(need - cow):
            page = pages.new_page(seq.blocks, use_extent)
            if page is None:
                del seq.pages[len(seq.pages) - len(taken):]
                pages.give_back(seq.blocks, taken)  # all or nothing
                if seq.span_pages > len(seq.pages):  # a page given back was folded: refold
                    seq.span_pages = -1
                return NoRoom(need, room)
            seq.pages.append(page)
            taken.append(page)
        return True

    def slots(self, seq: Sequence, start: int, n: int) -> np.ndarray:
        """(n, 3) int64 rows (page offset, row in the page, P) of positions [start, start + n)."""
        P = self.page_tokens
        slots = np.empty((n, 3), np.int64)
        if n == 1:
            slots[0] = (self.view.page_offset(seq.pages[start // P]), start % P, P)
        else:
            pos = np.arange(start, start + n)
            first = start // P
            offs = np.array([self.view.page_offset(p) for p in seq.pages[first:]], np.int64)
            slots[:, 0] = offs[pos // P - first]
            slots[:, 1] = pos % P
            slots[:, 2] = P
        return slots

    def cut(self, seq: Sequence, num_tokens: int) -> None:
        """Keep the sequence's first ``num_tokens`` positions (see ``KVCacheManager.truncate``)."""
        if not 0 <= num_tokens <= seq.num_tokens:
            raise ValueError(f"cannot truncate sequence {seq.seq_id} of {seq.num_tokens} tokens to {num_tokens}")
        P, pool, prefix = self.page_tokens, self.pages.pool, self.pages.prefix
        self.tally.detach(seq, num_tokens // P)
        keep = -(-num_tokens // P)
        while len(seq.pages) > keep:
            page = seq.pages.pop()
            prefix.unregister(page)
            if pool.unref(page):
                pool.give_back(seq.blocks, page)
        if num_tokens % P and len(seq.hashes) > num_tokens // P:
            prefix.unregister(seq.pages[-1])  # full no more: its hash names tokens it loses
        del seq.tokens[num_tokens:]
        del seq.hashes[num_tokens // P:]
        seq.committed = min(seq.committed, num_tokens)
        seq.released_upto = min(seq.released_upto, len(seq.pages))
        self.tally.attach(seq, num_tokens // P)
        self.view.unfold(seq)

    def release(self, seq_id: int) -> None:
        """Let go of a sequence: its registered full pages stay cached (LRU)."""
        seq = self.seqs.pop(seq_id)
        self.tally.detach(seq)
        # Last page first: under pressure the LRU then evicts a prefix from its tail,
        # so what stays cached is still a reachable prefix.
        for page in reversed(seq.pages):
            self.pages.unref(page)
        self.pages.drop_extent(seq.blocks)

    def fork(self, parent_id: int, child_id: int) -> Sequence:
        """A new sequence ``child_id`` sharing every page of the parent (copy-on-write on append)."""
        parent = self.seqs[parent_id]
        self.check_new(child_id)
        child = Sequence(child_id, parent.salt, parent.path, parent.register_pages, list(parent.pages),
                         list(parent.tokens), list(parent.hashes), [], parent.committed,
                         prompt_tokens=parent.prompt_tokens, released_upto=parent.released_upto)
        for p in child.pages:
            self.pages.pool.page_ref[p] += 1
        self.seqs[child_id] = child
        self.tally.attach(child)
        return child

    def move(self, seq: Sequence, extent: bool) -> Literal[True] | NoRoom:
        """Copy the sequence's tokens into fresh pages, from a new extent when ``extent``
        (else from the random pool), bit-exact: True. Or NoRoom, with nothing changed."""
        n, P, pages = seq.num_tokens, self.page_tokens, self.pages
        need = (n + P - 1) // P
        room = pages.free_page_count()
        if need > room:  # decided before anything is taken or evicted
            return NoRoom(need, room)
        self.tally.detach(seq)
        old_pages, old_blocks = seq.pages, seq.blocks
        seq.pages, seq.blocks = [], []
        for _ in range(need):
            page = pages.new_page(seq.blocks, extent)
            if page is None:
                pages.give_back(seq.blocks, seq.pages)  # all or nothing
                seq.pages, seq.blocks = old_pages, old_blocks
                self.tally.attach(seq)
                return NoRoom(len(old_pages), pages.free_page_count())
            seq.pages.append(page)
        for i, (src, dst) in enumerate(zip(old_pages, seq.pages)):
            self._copy_pages(src, dst, min(P, n - i * P))
        seq.span_pages = -1
        for p in old_pages:
            pages.unref(p)
        pages.drop_extent(old_blocks)
        # Re-register the new full pages only where the old ones were not the table's.
        if seq.register_pages:
            for h, page in zip(seq.hashes, seq.pages):
                pages.prefix.register(h, page)
        self.tally.attach(seq)
        return True

    def _copy_pages(self, src: int, dst: int, num_tokens: int) -> None:
        """Copy the first ``num_tokens`` rows of page ``src`` to page ``dst``, every layer."""
        P, offset = self.page_tokens, self.view.page_offset
        rows = np.arange(num_tokens, dtype=np.int64)
        s = np.stack([np.full(num_tokens, offset(src)), rows, np.full(num_tokens, P)], 1)
        d = np.stack([np.full(num_tokens, offset(dst)), rows, np.full(num_tokens, P)], 1)
        self.arena.copy(np.ascontiguousarray(s), np.ascontiguousarray(d))
        if self.pages.released is not None:  # a copy of released rows is as released
            self.pages.released[dst] = self.pages.released[src]
