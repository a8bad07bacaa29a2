"""The prefix index: full pages found by their content, and the cached pages nobody holds.

A full page is named by a chained hash, ``hash(parent page's hash, page token ids,
salt)``, so one hash names a whole prefix: the table maps it to the page holding it.
A registered page that no sequence references any more stays cached, in least
recently used order, until the pool needs its slot (``pop_oldest``). The index
does not count references or pick slots: the block pool (cache/blocks.py) does.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

from ..errors import require
from .sequence import TokenIds


class PrefixIndex:
    """hash -> page for registered full pages, each page's hash, and the LRU of cached
    pages. Invariant: ``table[h] == p`` implies ``page_hash[p] == h``."""

    def __init__(self, num_pages: int, salt: bytes):
        self.salt = salt
        self.table: dict[bytes, int] = {}                  # prefix hash -> page
        self.page_hash: list[bytes | None] = [None] * num_pages  # (num_pages,) the page's hash, if registered
        self.lru: OrderedDict[int, None] = OrderedDict()   # cached pages nobody references, oldest first

    def hash(self, parent: bytes, tokens: TokenIds) -> bytes:
        """The chained hash of a page holding ``tokens`` after the page hashed ``parent``
        (``b""`` for the first page)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(parent)
        h.update(struct.pack(f"<{len(tokens)}q", *tokens))
        h.update(self.salt)
        return h.digest()

    def register(self, h: bytes, page: int) -> None:
        """``page`` holds the prefix ``h``, unless another page already does or the page
        is registered under another hash."""
        if h not in self.table and self.page_hash[page] is None:
            self.table[h] = page
            self.page_hash[page] = h

    def unregister(self, page: int) -> None:
        """``page`` no longer holds its prefix (evicted, or cut short)."""
        h = self.page_hash[page]
        if h is not None and self.table.get(h) == page:
            del self.table[h]
        self.page_hash[page] = None

    def holds(self, page: int) -> bool:
        """``page`` is the table's page for its hash: worth caching when nobody holds it."""
        h = self.page_hash[page]
        return h is not None and self.table.get(h) == page

    def cache(self, page: int) -> None:
        """Nobody references ``page`` any more: it stays findable until evicted."""
        self.lru[page] = None

    def reuse(self, page: int) -> None:
        """``page`` (maybe cached) is referenced again: it is no longer evictable."""
        self.lru.pop(page, None)

    def pop_oldest(self) -> int | None:
        """Unregister and return the least recently cached page, or None when none is cached."""
        if not self.lru:
            return None
        page, _ = self.lru.popitem(last=False)
        self.unregister(page)
        return page

    def check_invariants(self, page_ref: list[int]) -> None:
        """Raise InvariantError when a cached page is referenced or unregistered, or the
        table and the page hashes disagree (tests)."""
        for p in self.lru:
            require(page_ref[p] == 0 and self.page_hash[p] is not None, f"cached page {p}")
        for h, p in self.table.items():
            require(self.page_hash[p] == h, f"page {p} under another hash")
