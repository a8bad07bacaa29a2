"""What the cache reports (``CacheStats``), from counts kept as it changes.

``/metrics`` reads ``KVCacheManager.stats()`` under the engine lock, so it must not
walk the blocks or pages: every count it needs (``Occupancy``) is kept running by
the block pool, the prefix index and ``TokenTally``. ``scan_occupancy`` counts the
same from the tables in O(blocks + pages); ``KVCacheManager.check_invariants``
compares the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass

from .blocks import RAND, BlockPool
from .sequence import Sequence


@dataclass
class CacheStats:
    bytes_total: int
    bytes_used_sequential: int
    bytes_used_random: int
    bytes_cached: int
    bytes_free: int
    token_bytes_needed: int
    fragmentation: float
    """Share of held page bytes not filled by tokens (partial pages, unused extent pages)."""
    prefix_queries: int
    prefix_hit_pages: int
    evictions: int
    migrations: int
    cow_copies: int
    forks: int = 0
    """Sequences forked from another (parallel samples of one prompt)."""
    forked_pages: int = 0
    """Pages those forks share with their parent instead of holding a copy."""

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_pages / self.prefix_queries if self.prefix_queries else 0.0


@dataclass(frozen=True)
class Occupancy:
    """The page counts ``CacheStats`` is made of."""

    extent_blocks: int
    """Blocks owned as extents."""
    extent_pages: int
    """Extent pages handed out to their owners."""
    rand_live: int
    """Pages in use or cached in random-path blocks (cached pages all sit there)."""
    cached_pages: int
    """Pages nobody references, kept for the prefix index."""
    stored_tokens: int
    """Tokens stored, a page shared by several sequences counted once."""


class TokenTally:
    """Tokens stored in the pages sequences hold, a shared page counted once: a page
    holds ``page_tokens`` when any sequence holds it full, else as many as the fullest
    of the sequences it ends (only a sequence's last page is partly filled).

    The manager detaches a sequence's pages from ``first`` on before it changes them
    and attaches them after, so each change costs O(pages changed)."""

    def __init__(self, num_pages: int, page_tokens: int):
        self.page_tokens = page_tokens
        self.full_refs = [0] * num_pages                  # (num_pages,) sequences holding the page full
        self.partial: dict[int, list[int]] = {}           # page -> fills of the sequences it ends
        self.num_tokens = 0                               # sum of every page's fill

    def _fill(self, page: int) -> int:
        if self.full_refs[page]:
            return self.page_tokens
        fills = self.partial.get(page)
        return max(fills) if fills else 0

    def _count(self, page: int, fill: int, delta: int) -> None:
        before = self._fill(page)
        if fill == self.page_tokens:
            self.full_refs[page] += delta
        elif delta > 0:
            self.partial.setdefault(page, []).append(fill)
        else:
            fills = self.partial[page]
            fills.remove(fill)
            if not fills:
                del self.partial[page]
        self.num_tokens += self._fill(page) - before

    def attach(self, seq: Sequence, first: int = 0) -> None:
        """Count the sequence's pages from index ``first`` on, as they are now."""
        self._tally(seq, first, 1)

    def detach(self, seq: Sequence, first: int = 0) -> None:
        """Uncount the sequence's pages from index ``first`` on, as they are now."""
        self._tally(seq, first, -1)

    def _tally(self, seq: Sequence, first: int, delta: int) -> None:
        P, pages, n = self.page_tokens, seq.pages, seq.num_tokens
        for i in range(first, len(pages)):  # indexed: a slice would copy the page table
            self._count(pages[i], min(P, n - i * P), delta)


def unique_tokens(seqs: Iterable[Sequence], page_tokens: int) -> int:
    """Tokens actually stored (a shared page counts once), from the page tables."""
    P = page_tokens
    fill: dict[int, int] = {}
    for s in seqs:
        for i, p in enumerate(s.pages):
            fill[p] = max(fill.get(p, 0), min(P, s.num_tokens - i * P))
    return sum(fill.values())


def scan_occupancy(pool: BlockPool, cached: Sized, seqs: Iterable[Sequence], page_tokens: int) -> Occupancy:
    """``Occupancy`` counted from the block, page and sequence tables: O(blocks + pages)."""
    rand_live = sum(pool.block_live[b] for b in range(pool.num_blocks) if pool.block_state[b] == RAND)
    return Occupancy(extent_blocks=len(pool.extent_used), extent_pages=sum(pool.extent_used.values()),
                     rand_live=rand_live, cached_pages=len(cached),
                     stored_tokens=unique_tokens(seqs, page_tokens))
