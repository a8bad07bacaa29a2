"""The dual-path KV cache: the one facade the scheduler and runner talk to.

Memory is one ``KVArena`` (C): ``num_layers`` regions of ``num_blocks`` blocks of
``block_size`` bytes; every layer uses the same block ids, so one page table per
sequence serves all layers. A block is cut into *pages* of ``page_tokens`` tokens
(the kernel's tile, see kv_arena.h). Both paths store pages; they differ only in
how they find one:

* **sequential path**: a sequence owns whole blocks (an *extent*, a run of
  contiguous blocks) and fills their pages in order; the extent grows in place
  while the next block is free, else a new extent is chained. The kernel view
  merges adjacent pages, so it sees a few long contiguous spans.
* **random path**: pages come one at a time from blocks shared by many sequences,
  located through the prefix hash table (``hash(parent hash, page token ids,
  salt) -> page``); pages nobody references stay cached in LRU order until
  evicted.

Interleaving: blocks start out tagged ``| 0 seq | 1 rand | 2 seq | 3 rand | ...``.
New extents start on even blocks and random pages are carved from odd blocks
first, so a request's extent sits beside the blocks that hold the shared-prefix
pages it reads just before it (hybrid requests read both in one pass), and
neither kind can fence the other out: under pressure either takes any free
block, an extent grows over its odd neighbour when that is free, and freed blocks
return to one pool. The balance between the kinds therefore follows demand.

Every full page is hashed and can be shared, whichever path wrote it (except in
the forced ``sequential`` path mode, the single-path baseline with no prefix cache).
A shared page that would change is copied first (copy-on-write). With a store on
disk (``disk``, cache/disk.py), full prompt pages are also copied out to it when
committed, and a prefix page missing from the table is looked up there before it is
computed: a page read back becomes a cached random-path page like any other.

Which path a sequence's tokens take, and when it migrates, is decided by the
cache's ``policy`` (cache/policy.py), the one home of those rules; the runner
swaps in the power profile's policy between steps.

Per-token work is O(1) (or O(new pages)), whatever the number of blocks, pages
or sequences: the free pages are a running count, the lowest free block of a
parity and the lowest random block with a free slot come from heaps, and the
kernel view and the locality score are folded forward page by page.
``check_invariants`` recomputes every such counter from scratch.

Allocation failure is a value, ``NoRoom``, never an exception: the caller
queues or preempts. Callers (the scheduler, the runner, the benchmarks) use
only the methods below the ``facade`` line and the result types; the page
tables are the manager's own.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..kernels import KVArena
from ..config import DualPathConfig
from .disk import PrefixStore
from .policy import Path, PathPolicy, Phase

log = logging.getLogger(__name__)

FREE, SEQ, RAND = 0, 1, 2


@dataclass(frozen=True)
class NoRoom:
    """Not enough free or evictable pages for ``needed_pages`` more pages."""

    needed_pages: int
    free_pages: int

    def __bool__(self) -> bool:  # so `if not result:` reads naturally
        return False


@dataclass(frozen=True)
class Allocation:
    """Where the new tokens go: slots (num_tokens, 3) int64 rows of (offset, row, P)."""

    slots: np.ndarray
    path: Path
    pos0: int = 0
    """Position of the first new token."""
    prefill: bool = False
    """The tokens are (or end) the sequence's prompt: a prefill step for the kernels."""


@dataclass
class Sequence:
    seq_id: int
    salt: bytes
    path: Path
    register_pages: bool
    """Hash full pages into the prefix table (off only in the forced sequential mode)."""
    pages: list[int] = field(default_factory=list)
    """Page ids in position order; page i holds positions [i * P, (i + 1) * P)."""
    tokens: list[int] = field(default_factory=list)
    """Token id per position whose KV is (or is being) written."""
    hashes: list[bytes] = field(default_factory=list)
    """Chained hash per full page (also for pages not registered)."""
    blocks: list[int] = field(default_factory=list)
    """Blocks this sequence owns as extents (sequential path), in order."""
    committed: int = 0
    """Tokens whose KV is known written (after the step that wrote them)."""
    prompt_tokens: int = 0
    """Length of the prompt given to start(): positions below it are prefill."""
    span_rows: np.ndarray = field(default_factory=lambda: np.zeros((8, 3), np.int64))
    """Kernel view cache: (capacity, 3) rows (offset, tokens if every page were full, P)."""
    span_n: int = 0
    span_pages: int = 0
    """Pages of ``pages`` already folded into ``span_rows``; -1 after a page changed place."""
    span_long: int = 0
    """Tokens in the folded spans but the last (closed: full pages only) that are at least
    ``span_window`` long: the locality score's numerator without the open last span."""
    span_window: int = 0
    """The ``locality_window`` ``span_long`` was counted with (recounted when the policy's changes)."""

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


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


class KVCacheManager:
    """Allocate, free, fork, look up prefixes and migrate sequences (see module docstring)."""

    def __init__(self, cfg: DualPathConfig, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 num_blocks: int, salt: bytes = b""):
        self.cfg = cfg
        self.policy = PathPolicy.from_config(cfg)
        """The path rules in force; the runner replaces it when the power profile changes
        (it applies to new requests and to the next decode step of running ones)."""
        self.page_tokens = P = cfg.page_tokens
        self.arena = KVArena(cfg.block_size, num_blocks, num_layers, num_kv_heads, head_dim, cfg.kv_dtype,
                             cfg.numa_node)
        if cfg.numa_node >= 0 and self.arena.numa_node != cfg.numa_node:
            log.warning("could not bind the KV arena to NUMA node %d (mbind refused); memory is unbound",
                        cfg.numa_node)
        self.page_bytes = self.arena.tile_bytes(P)
        if self.page_bytes > cfg.block_size:
            raise ValueError(f"dualpath_config.block_size={cfg.block_size} cannot hold one page of "
                             f"page_tokens={P} tokens ({self.page_bytes} bytes for this model); "
                             "raise block_size or lower page_tokens")
        self.pages_per_block = cfg.block_size // self.page_bytes
        self.num_blocks = num_blocks
        self.salt = salt
        npages = num_blocks * self.pages_per_block
        self.block_state = [FREE] * num_blocks           # (num_blocks,) FREE / SEQ / RAND
        self.block_live = [0] * num_blocks               # pages in use or cached per block
        # Free blocks, and RAND blocks with free slots (a stack of slot numbers each). Every
        # change (_take_block, _free_block, _rand_set, _rand_drop, _random_page, _release_slot)
        # keeps the min-heaps below (the lowest block in O(log n)) and the free slot count;
        # check_invariants recounts both.
        self.free_blocks = set(range(num_blocks))
        self.rand_free: dict[int, list[int]] = {}        # RAND block -> its free page slots
        self._rand_free_pages = 0                        # sum of len(rand_free[b])
        # Min-heaps with lazy deletion: an entry whose block left the set (grow in place,
        # a RAND block's last slot taken) stays until it reaches the top. A flag per block
        # says whether it has an entry, so none is pushed twice: a heap holds at most
        # num_blocks entries, and a block back in the set reuses its entry.
        self._free_heaps: tuple[list[int], list[int]] = (list(range(0, num_blocks, 2)),
                                                         list(range(1, num_blocks, 2)))  # even, odd
        self._free_heaped = bytearray(b"\x01" * num_blocks)  # (num_blocks,) has an entry in _free_heaps
        self._rand_heap: list[int] = []                   # RAND blocks with free slots
        self._rand_heaped = bytearray(num_blocks)         # (num_blocks,) has an entry in _rand_heap
        self.page_ref = [0] * npages
        self.page_hash: list[bytes | None] = [None] * npages
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached pages nobody references, oldest first
        self.table: dict[bytes, int] = {}                 # prefix hash -> page
        self.seqs: dict[int, Sequence] = {}
        self._next_seq_id = 0
        self._extent_used: dict[int, int] = {}             # SEQ block -> pages handed out, in order
        self.evictions = self.migrations = self.cow_copies = 0
        self.forks = self.forked_pages = 0  # fork() calls, and the pages they shared instead of copying
        self.prefix_queries = self.prefix_hit_pages = 0
        self.disk: PrefixStore | None = None
        """The prefix pages on disk (cache/disk.py), or None: set by whoever opens the store."""

    # -- pages and blocks ------------------------------------------------------
    def page_offset(self, page: int) -> int:
        b, s = divmod(page, self.pages_per_block)
        return b * self.cfg.block_size + s * self.page_bytes

    def _lowest_free(self, parity: int) -> int | None:
        """The lowest free block of ``parity`` (0 even, 1 odd), or None."""
        heap = self._free_heaps[parity]
        while heap and heap[0] not in self.free_blocks:  # taken in place: drop the stale entry
            self._free_heaped[heapq.heappop(heap)] = 0
        return heap[0] if heap else None

    def _take_block(self, prefer_odd: bool) -> int | None:
        """The lowest free block of the preferred parity, else the lowest free block."""
        best = self._lowest_free(int(prefer_odd))
        if best is None:
            best = self._lowest_free(int(not prefer_odd))
            if best is None:
                return None
        heapq.heappop(self._free_heaps[best & 1])  # it is the top
        self._free_heaped[best] = 0
        self.free_blocks.discard(best)
        return best

    def _free_block(self, b: int) -> None:
        """Block ``b`` holds nothing any more (its live count is 0): back to the free pool."""
        self.block_state[b] = FREE
        self.free_blocks.add(b)
        if not self._free_heaped[b]:
            self._free_heaped[b] = 1
            heapq.heappush(self._free_heaps[b & 1], b)

    def _rand_set(self, b: int, slots: list[int]) -> None:
        """RAND block ``b`` (with no free slots listed yet) has free ``slots`` (popped last first)."""
        if not slots:
            return
        self.rand_free[b] = slots
        self._rand_free_pages += len(slots)
        if not self._rand_heaped[b]:
            self._rand_heaped[b] = 1
            heapq.heappush(self._rand_heap, b)

    def _rand_drop(self, b: int) -> None:
        """Block ``b`` leaves the random pool's free slots (it becomes free)."""
        slots = self.rand_free.pop(b, None)
        if slots:
            self._rand_free_pages -= len(slots)

    def _release_slot(self, page: int) -> None:
        """A page holds nothing any more: give its slot back to its block."""
        b, s = divmod(page, self.pages_per_block)
        self.block_live[b] -= 1
        if self.block_state[b] == SEQ:
            return  # its owner still holds the block; the slot is reused only through the owner
        if self.block_live[b] == 0:
            self._rand_drop(b)
            self._free_block(b)
        elif b in self.rand_free:
            self.rand_free[b].append(s)
            self._rand_free_pages += 1
        else:
            self._rand_set(b, [s])

    def _evict_one(self) -> bool:
        if not self.lru:
            return False
        page, _ = self.lru.popitem(last=False)
        self._unregister(page)
        self.evictions += 1
        self._release_slot(page)
        return True

    def _random_page(self) -> int | None:
        """A page from the lowest RAND block with a free slot, else from a new RAND block
        (odd first), else after evicting the oldest cached page."""
        heap, rand_free = self._rand_heap, self.rand_free
        while True:
            while heap and heap[0] not in rand_free:  # its last slot was taken: drop the stale entry
                self._rand_heaped[heapq.heappop(heap)] = 0
            if heap:
                b = heap[0]
                slots = rand_free[b]
                s = slots.pop()
                self._rand_free_pages -= 1
                if not slots:
                    del rand_free[b]
                self.block_live[b] += 1
                return b * self.pages_per_block + s
            b = self._take_block(prefer_odd=True)
            if b is not None:
                self.block_state[b] = RAND
                self._rand_set(b, list(range(self.pages_per_block - 1, -1, -1)))
                continue
            if not self._evict_one():
                return None

    def _sequential_page(self, seq: Sequence) -> int | None:
        """Next page of the sequence's extent: the next slot in its last block, the
        next block in place when free, or a new extent."""
        ppb = self.pages_per_block
        if seq.blocks:
            last = seq.blocks[-1]
            used = self._extent_used.get(last, ppb)
            if used < ppb:
                self._extent_used[last] = used + 1
                self.block_live[last] += 1
                return last * ppb + used
            nxt = last + 1
            if nxt in self.free_blocks:  # grow in place (its heap entry is dropped lazily)
                self.free_blocks.discard(nxt)
                return self._own_block(seq, nxt)
        b = self._take_block(prefer_odd=False)
        if b is not None:
            return self._own_block(seq, b)
        # No free block: take a page from the random pool (evicting cached pages if
        # needed) rather than fail; the kernel reads it the same way.
        return self._random_page()

    def _own_block(self, seq: Sequence, b: int) -> int:
        self.block_state[b] = SEQ
        seq.blocks.append(b)
        self._extent_used[b] = 1
        self.block_live[b] += 1
        return b * self.pages_per_block

    def _drop_extent_block(self, b: int) -> None:
        """The owner lets go of an extent block: unused slots become free, the
        block joins the random pool (its cached pages live on) or is freed."""
        used = self._extent_used.pop(b, self.pages_per_block)
        self.block_state[b] = RAND
        live_slots = set()
        for s in range(used):
            p = b * self.pages_per_block + s
            if self.page_ref[p] > 0 or p in self.lru:
                live_slots.add(s)
        self._rand_drop(b)
        if not live_slots:
            self.block_live[b] = 0
            self._free_block(b)
        else:
            self.block_live[b] = len(live_slots)
            self._rand_set(b, [s for s in range(self.pages_per_block - 1, -1, -1) if s not in live_slots])

    def _unref(self, page: int) -> None:
        self.page_ref[page] -= 1
        assert self.page_ref[page] >= 0, "reference count went negative"
        if self.page_ref[page] == 0:
            b = page // self.pages_per_block
            if self.page_hash[page] is not None and self.table.get(self.page_hash[page]) == page:
                self.lru[page] = None  # cached: reusable until evicted
            elif self.block_state[b] != SEQ:
                self._release_slot(page)
            else:
                self.block_live[b] -= 1  # slot of a live extent: freed with the extent

    # -- hashing ---------------------------------------------------------------
    def _page_hash(self, parent: bytes, tokens) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(parent)
        h.update(struct.pack(f"<{len(tokens)}q", *tokens))
        h.update(self.salt)
        return h.digest()

    # -- facade ----------------------------------------------------------------
    def new_seq_id(self) -> int:
        """A sequence id no live or past sequence of this cache has used: the one id
        allocator for every caller (scheduler, runner, benchmarks)."""
        while self._next_seq_id in self.seqs:  # skip ids a caller chose itself (tests)
            self._next_seq_id += 1
        self._next_seq_id += 1
        return self._next_seq_id - 1

    def num_tokens(self, seq_id: int) -> int:
        """Positions of the sequence in the cache (including tokens allocated this step)."""
        return len(self.seqs[seq_id].tokens)

    def path_of(self, seq_id: int) -> Path:
        """The path the sequence was started on (or migrated to)."""
        return self.seqs[seq_id].path

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    @property
    def num_sequences(self) -> int:
        return len(self.seqs)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache holds, all sequences together."""
        return self.num_blocks * self.pages_per_block * self.page_tokens

    def start(self, seq_id: int, prompt_ids, path: Path | None = None) -> int:
        """Begin a sequence. Returns how many leading prompt tokens are already in the
        cache (reused pages): the caller runs only the rest through the model."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} already exists")
        n = len(prompt_ids)
        path = path or self.policy.route(Phase.PREFILL, n)
        # Prefix pages are looked up and registered whatever the route (a long document
        # asked about twice is reused whole); only the forced sequential-only mode,
        # the single-path baseline, has no prefix cache.
        reuse = self.cfg.path_mode != "sequential"
        seq = Sequence(seq_id, self.salt, path, register_pages=reuse, prompt_tokens=n)
        self.seqs[seq_id] = seq
        if not reuse:
            return 0
        P = self.page_tokens
        parent = b""
        # At least one prompt token must be run to get logits: never reuse the last one.
        for i in range((n - 1) // P):
            chunk = list(prompt_ids[i * P:(i + 1) * P])
            h = self._page_hash(parent, chunk)
            self.prefix_queries += 1
            page = self.table.get(h)
            if page is None:
                page = self._page_from_disk(h, chunk)
                if page is None:
                    break
            self.prefix_hit_pages += 1
            if self.page_ref[page] == 0:
                self.lru.pop(page, None)
            self.page_ref[page] += 1
            seq.pages.append(page)
            seq.tokens.extend(chunk)
            seq.hashes.append(h)
            parent = h
        seq.committed = seq.num_tokens
        return seq.num_tokens

    def _page_from_disk(self, h: bytes, tokens: list[int]) -> int | None:
        """A cached page holding the disk store's copy of page ``h``, or None (no store,
        not on disk, damaged, or no room)."""
        if self.disk is None:
            return None
        data = self.disk.read(h, tokens)
        if data is None:
            return None
        page = self._random_page()
        if page is None:
            return None
        self.arena.write_tiles(np.array([self.page_offset(page)], np.int64), self.page_tokens, data[None])
        self.table[h] = page
        self.page_hash[page] = h
        self.lru[page] = None  # the caller takes its reference as for any cached page
        return page

    def allocate(self, seq_id: int, token_ids, path: Path | None = None) -> Allocation | NoRoom:
        """Room for ``token_ids`` appended to the sequence. ``path`` (SEQUENTIAL or RANDOM)
        decides where new pages come from. By default the policy decides: within the
        prompt, the request's prefill path; past it, a decode step, which first
        migrates a long scattered sequence into an extent (a NoRoom answer to that
        leaves it where it is) and then routes by measured locality."""
        seq = self.seqs[seq_id]
        n = len(token_ids)
        P = self.page_tokens
        start = seq.num_tokens
        if path is None:
            if start < seq.prompt_tokens or start == 0:
                path = seq.path  # still the prompt: the request's prefill path
            else:
                policy = self.policy
                locality = self.locality_score(seq_id)
                if policy.migrates(seq.path, start, locality) and self.migrate(seq_id, Path.SEQUENTIAL) is True:
                    locality = self.locality_score(seq_id)
                path = policy.route(Phase.DECODE, start, locality)
        use_extent = path in (Path.SEQUENTIAL, Path.HYBRID)
        taken: list[int] = []
        cow = bool(seq.num_tokens % P) and self.page_ref[seq.pages[-1]] > 1
        need = (seq.num_tokens + n + P - 1) // P - len(seq.pages) + cow
        room = self.free_page_count() + (self._extent_spare(seq) if use_extent else 0)
        if need > room:  # decided before anything is taken or evicted
            return NoRoom(need, room)
        # Copy-on-write: a shared, partly filled last page is copied before appending.
        if cow:
            page = self._sequential_page(seq) if use_extent else self._random_page()
            if page is None:
                return NoRoom(1 + (seq.num_tokens % P + n - 1) // P, self.free_page_count())
            self._copy_pages(seq.pages[-1], page, seq.num_tokens % P)
            self._unref(seq.pages[-1])
            self.page_ref[page] = 1
            seq.pages[-1] = page
            seq.span_pages = -1
            self.cow_copies += 1
        for _ in range(need - cow):
            page = self._sequential_page(seq) if use_extent else self._random_page()
            if page is None:
                for p in reversed(taken):  # all or nothing
                    seq.pages.pop()
                    self.page_ref[p] = 0
                    self._give_back_new(seq, p)
                if seq.span_pages > len(seq.pages):  # a page given back was folded: refold
                    seq.span_pages = -1
                return NoRoom(need, room)
            self.page_ref[page] = 1
            seq.pages.append(page)
            taken.append(page)
        seq.tokens.extend(int(t) for t in token_ids)
        slots = np.empty((n, 3), np.int64)
        if n == 1:
            slots[0] = (self.page_offset(seq.pages[start // P]), start % P, P)
        else:
            pos = np.arange(start, start + n)
            first = start // P
            offs = np.array([self.page_offset(p) for p in seq.pages[first:]], np.int64)
            slots[:, 0] = offs[pos // P - first]
            slots[:, 1] = pos % P
            slots[:, 2] = P
        return Allocation(slots, path, start, n > 1 or start + n <= seq.prompt_tokens)

    def _extent_spare(self, seq: Sequence) -> int:
        """Pages still unused in the sequence's last extent block."""
        if not seq.blocks:
            return 0
        return self.pages_per_block - self._extent_used.get(seq.blocks[-1], self.pages_per_block)

    def _give_back_new(self, seq: Sequence, page: int) -> None:
        b = page // self.pages_per_block
        if self.block_state[b] == SEQ and seq.blocks and seq.blocks[-1] == b \
                and self._extent_used.get(b) == page % self.pages_per_block + 1:
            self._extent_used[b] -= 1
            self.block_live[b] -= 1
            if self._extent_used[b] == 0:
                seq.blocks.pop()
                self._extent_used.pop(b)
                self._free_block(b)
        else:
            self._release_slot(page)

    def commit(self, seq_id: int) -> None:
        """The step that wrote the sequence's pending tokens finished: full pages become
        shareable (hashed into the prefix table)."""
        seq = self.seqs[seq_id]
        P = self.page_tokens
        seq.committed = seq.num_tokens
        while len(seq.hashes) < seq.num_tokens // P:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else b""
            h = self._page_hash(parent, seq.tokens[i * P:(i + 1) * P])
            seq.hashes.append(h)
            page = seq.pages[i]
            if seq.register_pages and h not in self.table and self.page_hash[page] is None:
                self.table[h] = page
                self.page_hash[page] = h
            # Prompt pages go to disk (what a restarted process is asked again); a page
            # already there or queued is not copied again.
            if self.disk is not None and seq.register_pages and (i + 1) * P <= seq.prompt_tokens \
                    and self.disk.wants(h):
                offset = np.array([self.page_offset(page)], np.int64)
                self.disk.put(h, seq.tokens[i * P:(i + 1) * P], self.arena.read_tiles(offset, P)[0])

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep the sequence's first ``num_tokens`` positions (speculative decoding rolls
        back the proposals it rejected): pages past them go back where they came from (an
        extent's last slots to the extent), and pages no longer full leave the prefix
        table. O(pages dropped), the kernel view included."""
        seq = self.seqs[seq_id]
        if not 0 <= num_tokens <= seq.num_tokens:
            raise ValueError(f"cannot truncate sequence {seq_id} of {seq.num_tokens} tokens to {num_tokens}")
        P = self.page_tokens
        keep = -(-num_tokens // P)
        while len(seq.pages) > keep:
            page = seq.pages.pop()
            self._unregister(page)
            self.page_ref[page] -= 1
            if self.page_ref[page] == 0:
                self._give_back_new(seq, page)
        if num_tokens % P and len(seq.hashes) > num_tokens // P:
            self._unregister(seq.pages[-1])  # full no more: its hash names tokens it loses
        del seq.tokens[num_tokens:]
        del seq.hashes[num_tokens // P:]
        seq.committed = min(seq.committed, num_tokens)
        self._unfold_spans(seq)

    def _unregister(self, page: int) -> None:
        h = self.page_hash[page]
        if h is not None and self.table.get(h) == page:
            del self.table[h]
        self.page_hash[page] = None

    def free(self, seq_id: int) -> None:
        """Release a sequence at once; its registered full pages stay cached (LRU)."""
        seq = self.seqs.pop(seq_id)
        # Last page first: under pressure the LRU then evicts a prefix from its tail,
        # so what stays cached is still a reachable prefix.
        for page in reversed(seq.pages):
            self._unref(page)
        for b in seq.blocks:
            self._drop_extent_block(b)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every page of the parent (copy-on-write on append)."""
        parent = self.seqs[parent_id]
        if child_id in self.seqs:
            raise ValueError(f"sequence {child_id} already exists")
        child = Sequence(child_id, parent.salt, parent.path, parent.register_pages, list(parent.pages),
                         list(parent.tokens), list(parent.hashes), [], parent.committed,
                         prompt_tokens=parent.prompt_tokens)
        for p in child.pages:
            self.page_ref[p] += 1
        self.seqs[child_id] = child
        self.forks += 1
        self.forked_pages += len(child.pages)

    def migrate(self, seq_id: int, to: Path) -> bool | NoRoom:
        """Move a sequence's tokens into a fresh extent (SEQUENTIAL) or into random
        pages (RANDOM), bit-exact. Returns NoRoom (and changes nothing) when memory is short."""
        seq = self.seqs[seq_id]
        n = seq.num_tokens
        if n == 0:
            return True
        P = self.page_tokens
        need = (n + P - 1) // P
        room = self.free_page_count()
        if need > room:  # decided before anything is taken or evicted
            return NoRoom(need, room)
        old_pages, old_blocks = seq.pages, seq.blocks
        seq.pages, seq.blocks = [], []
        new: list[int] = []
        for _ in range((n + P - 1) // P):
            page = self._sequential_page(seq) if to is Path.SEQUENTIAL else self._random_page()
            if page is None:
                for p in reversed(new):  # all or nothing
                    self.page_ref[p] = 0
                    self._give_back_new(seq, p)
                seq.pages, seq.blocks = old_pages, old_blocks
                return NoRoom(len(old_pages), self.free_page_count())
            self.page_ref[page] = 1
            new.append(page)
        for i, (src, dst) in enumerate(zip(old_pages, new)):
            self._copy_pages(src, dst, min(P, n - i * P))
        seq.pages = new
        seq.span_pages = -1
        new_blocks = seq.blocks
        for p in old_pages:
            self._unref(p)
        for b in old_blocks:
            self._drop_extent_block(b)
        seq.blocks = new_blocks
        # Re-register the new full pages only where the old ones were not the table's.
        for i, h in enumerate(seq.hashes):
            if seq.register_pages and h not in self.table and self.page_hash[new[i]] is None:
                self.table[h] = new[i]
                self.page_hash[new[i]] = h
        seq.path = to
        self.migrations += 1
        return True

    def evict_all(self) -> int:
        """Drop every cached page nobody references. Returns how many."""
        n = 0
        while self._evict_one():
            n += 1
        return n

    def _copy_pages(self, src: int, dst: int, num_tokens: int) -> None:
        P = self.page_tokens
        rows = np.arange(num_tokens, dtype=np.int64)
        s = np.stack([np.full(num_tokens, self.page_offset(src)), rows, np.full(num_tokens, P)], 1)
        d = np.stack([np.full(num_tokens, self.page_offset(dst)), rows, np.full(num_tokens, P)], 1)
        self.arena.copy(np.ascontiguousarray(s), np.ascontiguousarray(d))

    # -- kernel view and measurements -----------------------------------------
    def _fold_spans(self, seq: Sequence) -> np.ndarray:
        """Fold the pages added since the last fold into the sequence's kernel view rows
        (``span_rows[:span_n]``, every page counted full) and ``span_long``: O(new pages).
        Returns ``span_rows``."""
        P, pb = self.page_tokens, self.page_bytes
        window = self.policy.locality_window
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

    def _unfold_spans(self, seq: Sequence) -> None:
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

    def spans(self, seq_id: int, out: np.ndarray | None = None) -> np.ndarray:
        """Kernel view: (num_spans, 3) int64 rows (byte offset, num_tokens, page_tokens);
        physically adjacent pages are merged into one span. Kept incrementally: a step
        folds in only the pages added since the last call (the copy into ``out`` is one
        memcpy of 24 bytes per span)."""
        seq = self.seqs[seq_id]
        rows = self._fold_spans(seq)
        r = seq.span_n
        dst = out if out is not None else np.empty((r, 3), np.int64)
        dst[:r] = rows[:r]
        if r:
            dst[r - 1, 1] -= len(seq.pages) * self.page_tokens - seq.num_tokens  # the last page may be partial
        return dst[:r]

    def locality_score(self, seq_id: int) -> float:
        """Share of the sequence's KV reads in contiguous runs >= locality_window tokens.
        Incremental (``_fold_spans``): every decode step asks, so it must not scan the
        sequence; ``_locality_score_scan`` is the same value from scratch."""
        seq = self.seqs[seq_id]
        if seq.num_tokens == 0:
            return 0.0
        rows = self._fold_spans(seq)
        last = int(rows[seq.span_n - 1, 1]) - (len(seq.pages) * self.page_tokens - seq.num_tokens)
        long = seq.span_long + (last if last >= seq.span_window else 0)
        return float(long) / seq.num_tokens

    def _spans_scan(self, seq: Sequence) -> np.ndarray:
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

    def _locality_score_scan(self, seq_id: int) -> float:
        """``locality_score`` from scratch, over the whole page table (checks it)."""
        seq = self.seqs[seq_id]
        if seq.num_tokens == 0:
            return 0.0
        sp = self._spans_scan(seq)
        long = sp[sp[:, 1] >= self.policy.locality_window, 1].sum()
        return float(long) / seq.num_tokens

    def bytes_held(self) -> int:
        """KV bytes (all layers) held by sequences: pages in use plus the unused rest of
        their extents; cached and free pages excluded. Cheap enough for every step."""
        total = self.num_blocks * self.pages_per_block
        return (total - self.free_page_count()) * self.page_bytes * self.arena.num_layers

    def free_page_count(self) -> int:
        """Pages an allocation can take: free slots of RAND blocks, free blocks, cached
        pages (evictable). O(1): every allocation and admission asks."""
        return self._rand_free_pages + len(self.free_blocks) * self.pages_per_block + len(self.lru)

    def stats(self) -> CacheStats:
        """Bytes are for all layers. ``token_bytes_needed`` counts the tokens stored once
        each (a shared prefix page counts once); fragmentation compares it with the
        bytes held: pages in use plus extent pages reserved but not handed out yet."""
        pb = self.page_bytes * self.arena.num_layers
        ppb = self.pages_per_block
        extent_blocks = len(self._extent_used)
        extent_pages_used = sum(self._extent_used.values())
        rand_live = sum(self.block_live[b] for b in range(self.num_blocks) if self.block_state[b] == RAND)
        cached = len(self.lru)
        # Cached pages sit in RAND blocks (a dropped extent becomes RAND).
        in_use_random = rand_live - cached
        held = (extent_blocks * ppb + in_use_random) * pb
        stored = self._unique_tokens() * pb // self.page_tokens
        return CacheStats(
            bytes_total=self.num_blocks * ppb * pb,
            bytes_used_sequential=extent_pages_used * pb,
            bytes_used_random=in_use_random * pb,
            bytes_cached=cached * pb,
            bytes_free=(self.free_page_count() - cached) * pb,
            token_bytes_needed=stored,
            fragmentation=1.0 - stored / held if held else 0.0,
            prefix_queries=self.prefix_queries, prefix_hit_pages=self.prefix_hit_pages,
            evictions=self.evictions, migrations=self.migrations, cow_copies=self.cow_copies,
            forks=self.forks, forked_pages=self.forked_pages)

    def _unique_tokens(self) -> int:
        """Tokens actually stored (a shared page counts once)."""
        P = self.page_tokens
        fill: dict[int, int] = {}
        for s in self.seqs.values():
            for i, p in enumerate(s.pages):
                fill[p] = max(fill.get(p, 0), min(P, s.num_tokens - i * P))
        return sum(fill.values())

    def check_invariants(self) -> None:
        """Raise AssertionError when the bookkeeping is inconsistent (tests)."""
        refs = [0] * len(self.page_ref)
        for s in self.seqs.values():
            assert len(s.pages) == (s.num_tokens + self.page_tokens - 1) // self.page_tokens
            for p in s.pages:
                refs[p] += 1
        assert refs == self.page_ref, "reference counts disagree with the page tables"
        for p in self.lru:
            assert self.page_ref[p] == 0 and self.page_hash[p] is not None
        for h, p in self.table.items():
            assert self.page_hash[p] == h
        ppb = self.pages_per_block
        for b in range(self.num_blocks):
            if b in self.free_blocks:
                assert self.block_state[b] == FREE and self.block_live[b] == 0, f"block {b}"
            elif self.block_state[b] == RAND:  # every slot is live (in use or cached) or free
                assert self.block_live[b] + len(self.rand_free.get(b, ())) == ppb, f"block {b}"
            assert (self.block_state[b] == SEQ) == (b in self._extent_used), f"block {b}"
        # The incremental counters and heaps against a recomputation.
        assert all(self.rand_free.values()), "a RAND block listed with no free slot"
        assert self._rand_free_pages == sum(len(v) for v in self.rand_free.values()), \
            "the free slot count (free_page_count) disagrees with rand_free"
        for heap in (*self._free_heaps, self._rand_heap):
            assert all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap))), "heap order"
            assert len(set(heap)) == len(heap), "a block twice in a heap"
        for parity in (0, 1):
            assert all(b % 2 == parity for b in self._free_heaps[parity]), "free block in the wrong heap"
        free_heaped = set(self._free_heaps[0]) | set(self._free_heaps[1])
        assert free_heaped == {b for b in range(self.num_blocks) if self._free_heaped[b]}
        assert self.free_blocks <= free_heaped, "a free block missing from the heaps"
        rand_heaped = set(self._rand_heap)
        assert rand_heaped == {b for b in range(self.num_blocks) if self._rand_heaped[b]}
        assert set(self.rand_free) <= rand_heaped, "a RAND block with free slots missing from the heap"
        for sid, s in self.seqs.items():
            np.testing.assert_array_equal(self.spans(sid), self._spans_scan(s), err_msg=f"spans of {sid}")
            closed = s.span_rows[:max(s.span_n - 1, 0), 1]
            assert s.span_long == closed[closed >= s.span_window].sum(), f"span_long of {sid}"
            assert self.locality_score(sid) == self._locality_score_scan(sid), f"locality of {sid}"
