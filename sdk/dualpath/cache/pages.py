"""Pages for the page tables: the block pool and the prefix index working together.

A new page comes from the block pool (cache/blocks.py); when the pool has no free
slot or block, the prefix index (cache/prefix.py) gives up its least recently
cached page and the pool is asked again. A page nobody references any more stays
cached when the index holds it, else its slot goes back to its block.
"""

from __future__ import annotations

import numpy as np

from .blocks import BlockPool
from .prefix import PrefixIndex


class PageAllocator:
    """Take, give back and let go of pages (see the module docstring)."""

    def __init__(self, pool: BlockPool, prefix: PrefixIndex):
        self.pool = pool
        self.prefix = prefix
        self.evictions = 0
        """Cached pages dropped to make room (or by ``evict_all``)."""
        self.released: np.ndarray | None = None
        """Per page, whether its sliding-window rows were given back (cache/windows.py),
        or None for a model without such layers: a page taken anew is whole again."""

    def free_page_count(self) -> int:
        """Pages an allocation can take: free slots of RAND blocks, free blocks, cached
        pages (evictable). O(1)."""
        return self.pool.free_pages() + len(self.prefix.lru)

    def evict_one(self) -> bool:
        """Drop the least recently cached page; False when none is cached."""
        page = self.prefix.pop_oldest()
        if page is None:
            return False
        self.evictions += 1
        self.pool.release_slot(page)
        return True

    def random_page(self) -> int | None:
        """A page from the random pool, after evicting cached pages if needed, or None."""
        while True:
            page = self.pool.random_slot()
            if page is not None or not self.evict_one():
                return page

    def extent_page(self, blocks: list[int]) -> int | None:
        """Next page of the extent ``blocks`` (see ``BlockPool.extent_page``). With no
        free block, a page from the random pool (evicting cached pages if needed) rather
        than fail: the kernel reads it the same way."""
        page = self.pool.extent_page(blocks)
        return page if page is not None else self.random_page()

    def new_page(self, blocks: list[int], extent: bool) -> int | None:
        """A page for a sequence owning the extent ``blocks``: from the extent when
        ``extent``, else from the random pool. Its reference count is set to 1."""
        page = self.extent_page(blocks) if extent else self.random_page()
        if page is not None:
            self.pool.page_ref[page] = 1
            if self.released is not None:
                self.released[page] = False
        return page

    def give_back(self, blocks: list[int], pages: list[int]) -> None:
        """Pages just taken for the extent ``blocks`` go back unused, last first."""
        for p in reversed(pages):
            self.pool.page_ref[p] = 0
            self.pool.give_back(blocks, p)

    def unref(self, page: int) -> None:
        """One reference to ``page`` fewer: at the last one, it is cached when the prefix
        index holds it, else its slot is free."""
        if self.pool.unref(page):
            if self.prefix.holds(page):
                self.prefix.cache(page)  # cached: reusable until evicted
            else:
                self.pool.release_slot(page)

    def drop_extent(self, blocks: list[int]) -> None:
        """The owner lets go of its extent ``blocks`` (its pages already unreferenced)."""
        for b in blocks:
            self.pool.drop_extent_block(b, self.prefix.lru)
