"""The block pool: every block's kind, its page slots, and each page's reference count.

A block is ``FREE``, an extent block (``SEQ``, owned by one sequence, its slots
handed out in order) or a random-path block (``RAND``, its slots given to any
sequence one page at a time). Page ``p`` is slot ``p % pages_per_block`` of block
``p // pages_per_block``. The pool picks blocks and slots; it does not know about
sequences, prefix hashes or the arena: the page allocator (cache/pages.py) pairs it
with the prefix index, and the manager (cache/manager.py) composes both.

Every choice is O(log n) and every count O(1), whatever the number of blocks: the
lowest free block of a parity and the lowest RAND block with a free slot come from
min-heaps, and the free slot count, the extent pages handed out and the live pages
of RAND blocks are running counts. ``check_invariants`` recounts them all.
"""

from __future__ import annotations

import heapq
from collections.abc import Container

from ..errors import require

FREE, SEQ, RAND = 0, 1, 2


class BlockPool:
    """Free blocks, extent blocks and random-path blocks with their free slots (see the
    module docstring). A page's slot is live while a sequence references it or the
    prefix index keeps it cached; a live slot is never handed out."""

    def __init__(self, num_blocks: int, pages_per_block: int):
        self.num_blocks = num_blocks
        self.pages_per_block = pages_per_block
        self.block_state = [FREE] * num_blocks           # (num_blocks,) FREE / SEQ / RAND
        self.block_live = [0] * num_blocks               # (num_blocks,) pages in use or cached per block
        self.page_ref = [0] * (num_blocks * pages_per_block)  # (num_pages,) sequences holding the page
        # Free blocks, and RAND blocks with free slots (a stack of slot numbers each). Every
        # change keeps the min-heaps below (the lowest block in O(log n)) and the counts.
        self.free_blocks = set(range(num_blocks))
        self.rand_free: dict[int, list[int]] = {}        # RAND block -> its free page slots
        self.rand_free_pages = 0                         # sum of len(rand_free[b])
        # Min-heaps with lazy deletion: an entry whose block left the set (grow in place,
        # a RAND block's last slot taken) stays until it reaches the top. A flag per block
        # says whether it has an entry, so none is pushed twice: a heap holds at most
        # num_blocks entries, and a block back in the set reuses its entry.
        self.free_heaps: tuple[list[int], list[int]] = (list(range(0, num_blocks, 2)),
                                                         list(range(1, num_blocks, 2)))  # even, odd
        self.free_heaped = bytearray(b"\x01" * num_blocks)  # (num_blocks,) has an entry in free_heaps
        self.rand_heap: list[int] = []                    # RAND blocks with free slots
        self.rand_heaped = bytearray(num_blocks)          # (num_blocks,) has an entry in rand_heap
        self.extent_used: dict[int, int] = {}             # SEQ block -> pages handed out, in order
        self.extent_pages = 0                             # sum(extent_used.values())
        self.rand_live = 0                                # sum of block_live over RAND blocks

    def free_pages(self) -> int:
        """Free slots of RAND blocks plus the pages of free blocks (cached pages excluded)."""
        return self.rand_free_pages + len(self.free_blocks) * self.pages_per_block

    # -- blocks ------------------------------------------------------------------
    def _lowest_free(self, parity: int) -> int | None:
        """The lowest free block of ``parity`` (0 even, 1 odd), or None."""
        heap = self.free_heaps[parity]
        while heap and heap[0] not in self.free_blocks:  # taken in place: drop the stale entry
            self.free_heaped[heapq.heappop(heap)] = 0
        return heap[0] if heap else None

    def take_block(self, prefer_odd: bool) -> int | None:
        """The lowest free block of the preferred parity, else the lowest free block."""
        best = self._lowest_free(int(prefer_odd))
        if best is None:
            best = self._lowest_free(int(not prefer_odd))
            if best is None:
                return None
        heapq.heappop(self.free_heaps[best & 1])  # it is the top
        self.free_heaped[best] = 0
        self.free_blocks.discard(best)
        return best

    def _free_block(self, b: int) -> None:
        """Block ``b`` holds nothing any more (its live count is 0): back to the free pool."""
        self.block_state[b] = FREE
        self.free_blocks.add(b)
        if not self.free_heaped[b]:
            self.free_heaped[b] = 1
            heapq.heappush(self.free_heaps[b & 1], b)

    def _add_live(self, b: int, delta: int) -> None:
        self.block_live[b] += delta
        if self.block_state[b] == RAND:
            self.rand_live += delta

    # -- random-path slots -------------------------------------------------------
    def _rand_set(self, b: int, slots: list[int]) -> None:
        """RAND block ``b`` (with no free slots listed yet) has free ``slots`` (popped last first)."""
        if not slots:
            return
        self.rand_free[b] = slots
        self.rand_free_pages += len(slots)
        if not self.rand_heaped[b]:
            self.rand_heaped[b] = 1
            heapq.heappush(self.rand_heap, b)

    def _rand_drop(self, b: int) -> None:
        """Block ``b`` leaves the random pool's free slots (it becomes free)."""
        slots = self.rand_free.pop(b, None)
        if slots:
            self.rand_free_pages -= len(slots)

    def random_slot(self) -> int | None:
        """A page from the lowest RAND block with a free slot, else from a new RAND block
        (odd first), else None (the caller evicts a cached page and asks again)."""
        heap, rand_free = self.rand_heap, self.rand_free
        while True:
            while heap and heap[0] not in rand_free:  # its last slot was taken: drop the stale entry
                self.rand_heaped[heapq.heappop(heap)] = 0
            if heap:
                b = heap[0]
                slots = rand_free[b]
                s = slots.pop()
                self.rand_free_pages -= 1
                if not slots:
                    del rand_free[b]
                self._add_live(b, 1)
                return b * self.pages_per_block + s
            nb = self.take_block(prefer_odd=True)
            if nb is None:
                return None
            self.block_state[nb] = RAND
            self._rand_set(nb, list(range(self.pages_per_block - 1, -1, -1)))

    def release_slot(self, page: int) -> None:
        """A page holds nothing any more: give its slot back to its block."""
        b, s = divmod(page, self.pages_per_block)
        self._add_live(b, -1)
        if self.block_state[b] == SEQ:
            return  # its owner still holds the block; the slot is reused only through the owner
        if self.block_live[b] == 0:
            self._rand_drop(b)
            self._free_block(b)
        elif b in self.rand_free:
            self.rand_free[b].append(s)
            self.rand_free_pages += 1
        else:
            self._rand_set(b, [s])

    def unref(self, page: int) -> bool:
        """One reference to ``page`` fewer. True when that was the last one (the caller
        then caches the page or releases its slot)."""
        self.page_ref[page] -= 1
        assert self.page_ref[page] >= 0, "reference count went negative"
        return self.page_ref[page] == 0

    # -- extents -----------------------------------------------------------------
    def extent_page(self, blocks: list[int]) -> int | None:
        """Next page of the extent ``blocks`` (its blocks in order, appended to here):
        the next slot in its last block, the next block in place when free, or a new
        extent. None when no block is free."""
        ppb = self.pages_per_block
        if blocks:
            last = blocks[-1]
            used = self.extent_used.get(last, ppb)
            if used < ppb:
                self.extent_used[last] = used + 1
                self.extent_pages += 1
                self.block_live[last] += 1
                return last * ppb + used
            nxt = last + 1
            if nxt in self.free_blocks:  # grow in place (its heap entry is dropped lazily)
                self.free_blocks.discard(nxt)
                return self._own_block(blocks, nxt)
        b = self.take_block(prefer_odd=False)
        if b is not None:
            return self._own_block(blocks, b)
        return None

    def _own_block(self, blocks: list[int], b: int) -> int:
        self.block_state[b] = SEQ
        blocks.append(b)
        self.extent_used[b] = 1
        self.extent_pages += 1
        self.block_live[b] += 1
        return b * self.pages_per_block

    def extent_spare(self, blocks: list[int]) -> int:
        """Pages still unused in the last block of the extent ``blocks``."""
        if not blocks:
            return 0
        return self.pages_per_block - self.extent_used.get(blocks[-1], self.pages_per_block)

    def drop_extent_block(self, b: int, cached: Container[int]) -> None:
        """The owner lets go of extent block ``b``: unused slots become free, the block
        joins the random pool (its ``cached`` pages live on) or is freed."""
        if b in self.extent_used:
            used = self.extent_used.pop(b)
            self.extent_pages -= used
        else:
            used = self.pages_per_block
        self.block_state[b] = RAND
        live_slots = set()
        for s in range(used):
            p = b * self.pages_per_block + s
            if self.page_ref[p] > 0 or p in cached:
                live_slots.add(s)
        self._rand_drop(b)
        if not live_slots:
            self.block_live[b] = 0
            self._free_block(b)
        else:
            self.block_live[b] = len(live_slots)
            self.rand_live += len(live_slots)
            self._rand_set(b, [s for s in range(self.pages_per_block - 1, -1, -1) if s not in live_slots])

    def give_back(self, blocks: list[int], page: int) -> None:
        """A page just taken for the extent ``blocks`` (or from the random pool) goes back
        unused: an extent's last slot returns to the extent, its block when it empties."""
        b = page // self.pages_per_block
        if self.block_state[b] == SEQ and blocks and blocks[-1] == b \
                and self.extent_used.get(b) == page % self.pages_per_block + 1:
            self.extent_used[b] -= 1
            self.extent_pages -= 1
            self.block_live[b] -= 1
            if self.extent_used[b] == 0:
                blocks.pop()
                self.extent_used.pop(b)
                self._free_block(b)
        else:
            self.release_slot(page)

    # -- checks ------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise InvariantError when the blocks, slots, heaps or free slot count disagree
        with a recount (tests; the stats counts are checked against ``stats.scan_occupancy``)."""
        ppb = self.pages_per_block
        for b in range(self.num_blocks):
            if b in self.free_blocks:
                require(self.block_state[b] == FREE and self.block_live[b] == 0, f"block {b}")
            elif self.block_state[b] == RAND:  # every slot is live (in use or cached) or free
                require(self.block_live[b] + len(self.rand_free.get(b, ())) == ppb, f"block {b}")
            require((self.block_state[b] == SEQ) == (b in self.extent_used), f"block {b}")
        require(all(self.rand_free.values()), "a RAND block listed with no free slot")
        require(self.rand_free_pages == sum(len(v) for v in self.rand_free.values()),
                "the free slot count (free_page_count) disagrees with rand_free")
        for heap in (*self.free_heaps, self.rand_heap):
            require(all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap))), "heap order")
            require(len(set(heap)) == len(heap), "a block twice in a heap")
        for parity in (0, 1):
            require(all(b % 2 == parity for b in self.free_heaps[parity]), "free block in the wrong heap")
        free_heaped = set(self.free_heaps[0]) | set(self.free_heaps[1])
        require(free_heaped == {b for b in range(self.num_blocks) if self.free_heaped[b]}, "free_heaped flags")
        require(self.free_blocks <= free_heaped, "a free block missing from the heaps")
        rand_heaped = set(self.rand_heap)
        require(rand_heaped == {b for b in range(self.num_blocks) if self.rand_heaped[b]}, "rand_heaped flags")
        require(set(self.rand_free) <= rand_heaped, "a RAND block with free slots missing from the heap")
