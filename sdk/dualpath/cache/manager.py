"""The dual-path KV cache: the one facade the scheduler talks to (the runner reads the arena).

Memory is one ``KVArena`` (C): ``num_layers`` regions of ``num_blocks`` blocks of
``block_bytes`` bytes; every layer uses the same block ids, so one page table per
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
cache's ``policy`` (cache/policy.py), the one home of those rules; the scheduler
swaps in the power profile's policy between steps (``use_policy``).

The manager is a facade over parts that code outside the cache reaches only
through it, each in its own module: the block pool (cache/blocks.py: blocks,
slots, reference counts) and the prefix index (cache/prefix.py: hash table and
LRU of cached pages), which the page allocator (cache/pages.py) combines; the
page tables (cache/page_tables.py, cache/sequence.py) with their kernel view
(cache/kernel_view.py); and the counts ``stats()`` reads (cache/stats.py). The
manager itself decides paths, looks prompts up in the prefix cache and on disk,
and registers committed pages.

Per-token work is O(1) (or O(new pages)), whatever the number of blocks, pages
or sequences: the free pages are a running count, the lowest free block of a
parity and the lowest random block with a free slot come from heaps, and the
kernel view and the locality score are folded forward page by page. ``stats()``
reads running counts too. ``check_invariants`` recomputes every such counter from
scratch.

Allocation failure is a value, ``NoRoom``, never an exception: the caller
queues or preempts. Callers (the scheduler, the benchmarks) use
only the methods below the ``facade`` line and the result types; the page
tables are the manager's own.
"""

from __future__ import annotations

import logging

import numpy as np

from ..config import KVCacheConfig
from ..errors import require
from ..kernels import KVArena
from ..models.spec import ModelConfig
from .blocks import BlockPool
from .disk import PrefixStore
from .geometry import kv_geometry, model_kv_geometry
from .kernel_view import KernelView
from .page_tables import PageTables
from .pages import PageAllocator
from .policy import Path, PathPolicy, Phase
from .prefix import PrefixIndex
from .results import Allocation, NoRoom
from .sequence import Sequence, TokenIds
from .stats import CacheStats, Occupancy, scan_occupancy
from .windows import SlidingWindows

__all__ = ["Allocation", "CacheStats", "KVCacheManager", "NoRoom", "Sequence"]

log = logging.getLogger(__name__)


class KVCacheManager:
    """Allocate, free, fork, look up prefixes and migrate sequences (see module docstring)."""

    def __init__(self, cfg: KVCacheConfig, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 num_blocks: int, salt: bytes = b"", windows: list[int] | None = None,
                 disk: PrefixStore | None = None):
        self.cfg = cfg
        self.geometry = g = kv_geometry(cfg, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                        num_blocks=num_blocks, windows=windows or ())
        """Page bytes, pages per block, blocks (cache/geometry.py, the one home of those sums)."""
        self.policy = PathPolicy.from_config(cfg)
        """The path rules in force (``use_policy``): the scheduler swaps in the power profile's
        between steps (it applies to new requests and to the next decode step of running ones)."""
        self.page_tokens = P = g.page_tokens
        self.arena = KVArena(g.block_bytes, num_blocks, num_layers, num_kv_heads, head_dim, g.kv_dtype,
                             cfg.numa_node)
        if cfg.numa_node >= 0 and self.arena.numa_node != cfg.numa_node:
            log.warning("could not bind the KV arena to NUMA node %d (mbind refused); memory is unbound",
                        cfg.numa_node)
        self.page_bytes = g.page_bytes
        self.pages_per_block = g.pages_per_block
        self.num_blocks = num_blocks
        self.salt = salt
        self.pool = BlockPool(num_blocks, self.pages_per_block)
        self.prefix = PrefixIndex(num_blocks * self.pages_per_block, salt)
        self.pages = PageAllocator(self.pool, self.prefix)
        self.view = KernelView(cfg.block_bytes, self.page_bytes, self.pages_per_block, P)
        self.tables = PageTables(self.pages, self.view, self.arena)
        self.windows: SlidingWindows | None = None
        """The sliding-window layers' releases (cache/windows.py), or None: no such layers
        (``windows``: per layer, 0 or its window), or ``swa_cache: full``."""
        if windows is not None and max(windows, default=0) > 0 and cfg.swa_cache == "window":
            self.windows = SlidingWindows(self.arena, self.view.page_offset, list(windows), P,
                                          len(self.pool.page_ref), cfg.swa_checkpoint_tokens)
            self.pages.released = self.windows.released
        self.seqs: dict[int, Sequence] = self.tables.seqs
        """Every live sequence by id: the page tables' own dict (read it, never change it)."""
        self._next_seq_id = 0
        self.migrations = 0
        self.forks = self.forked_pages = 0  # fork() calls, and the pages they shared instead of copying
        self.prefix_queries = self.prefix_hit_pages = 0
        self.disk = disk
        """The prefix pages on disk (cache/disk.py), or None: opened by the caller (its
        namespace comes from ``geometry``), given here, closed by the caller."""

    @classmethod
    def for_model(cls, cfg: KVCacheConfig, model: ModelConfig, *, max_context_tokens: int,
                  kv_cache_tokens: int = 0, salt: bytes = b"", disk: PrefixStore | None = None) -> KVCacheManager:
        """The KV cache of a model at a context: ``model_kv_geometry``'s blocks (0
        ``kv_cache_tokens``: the context twice over, the live sequence plus cached prefixes)."""
        g = model_kv_geometry(cfg, model, max_context_tokens, kv_cache_tokens)
        return cls(cfg, num_layers=g.num_layers, num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                   num_blocks=g.num_blocks, salt=salt, windows=list(g.windows), disk=disk)

    def use_policy(self, policy: PathPolicy) -> None:
        """Route by ``policy`` from now on (the power profile changed)."""
        self.policy = policy

    # Counts the parts keep, read on the facade (metrics, benchmarks, tests).
    evictions = property(lambda self: self.pages.evictions)
    cow_copies = property(lambda self: self.tables.cow_copies)
    free_blocks = property(lambda self: self.pool.free_blocks, doc="The free blocks (the pool's own set).")

    def page_offset(self, page: int) -> int:
        return self.view.page_offset(page)

    # -- prefix pages on disk ------------------------------------------------------
    def _page_from_disk(self, h: bytes, tokens: list[int]) -> int | None:
        """A cached page holding the disk store's copy of page ``h``, or None (no store,
        not on disk, damaged, or no room)."""
        if self.disk is None:
            return None
        data = self.disk.read(h, tokens)
        if data is None:
            return None
        page = self.pages.random_page()
        if page is None:
            return None
        if self.windows is not None:
            self.windows.released[page] = False
        self.arena.write_tiles(np.array([self.page_offset(page)], np.int64), self.page_tokens, data[None])
        self.prefix.register(h, page)
        self.prefix.cache(page)  # the caller takes its reference as for any cached page
        return page

    def _page_to_disk(self, seq: Sequence, i: int, h: bytes) -> None:
        """Copy full page ``i`` (hash ``h``) of the sequence's prompt out to the disk store,
        unless it is there or queued already: what a restarted process is asked again."""
        P = self.page_tokens
        if self.disk is not None and seq.register_pages and (i + 1) * P <= seq.prompt_tokens \
                and self.disk.wants(h):
            offset = np.array([self.page_offset(seq.pages[i])], np.int64)
            self.disk.put(h, seq.tokens[i * P:(i + 1) * P], self.arena.read_tiles(offset, P)[0])

    # -- facade ----------------------------------------------------------------
    def new_seq_id(self) -> int:
        """A sequence id no live or past sequence of this cache has used: the one id
        allocator for every caller (scheduler, benchmarks)."""
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

    def start(self, seq_id: int, prompt_ids: TokenIds, path: Path | None = None) -> int:
        """Begin a sequence. Returns how many leading prompt tokens are already in the
        cache (reused pages): the caller runs only the rest through the model."""
        self.tables.check_new(seq_id)
        n = len(prompt_ids)
        path = path or self.policy.route(Phase.PREFILL, n)
        # Prefix pages are looked up and registered whatever the route (a long document
        # asked about twice is reused whole); only the forced sequential-only mode,
        # the single-path baseline, has no prefix cache.
        reuse = self.cfg.path_mode != "sequential"
        seq = Sequence(seq_id, self.salt, path, register_pages=reuse, prompt_tokens=n)
        self.tables.add(seq)
        if not reuse:
            return 0
        P = self.page_tokens
        parent = b""
        # At least one prompt token must be run to get logits: never reuse the last one.
        for i in range((n - 1) // P):
            chunk = list(prompt_ids[i * P:(i + 1) * P])
            h = self.prefix.hash(parent, chunk)
            self.prefix_queries += 1
            page = self.prefix.table.get(h)
            if page is None:
                page = self._page_from_disk(h, chunk)
                if page is None:
                    break
            self.prefix_hit_pages += 1
            self.tables.share(seq, page, h, chunk)  # referenced at once: no lookup evicts it
            parent = h
        if self.windows is not None:  # the first new query's window must be intact
            keep = self.windows.reusable(seq.pages)
            self.prefix_hit_pages -= len(seq.pages) - keep
            self.tables.unshare(seq, keep)
        seq.committed = seq.num_tokens
        return seq.num_tokens

    def allocate(self, seq_id: int, token_ids: TokenIds, path: Path | None = None) -> Allocation | NoRoom:
        """Room for ``token_ids`` appended to the sequence. ``path`` (SEQUENTIAL or RANDOM)
        decides where new pages come from. By default the policy decides: within the
        prompt, the request's prefill path; past it, a decode step, which first
        migrates a long scattered sequence into an extent (a NoRoom answer to that
        leaves it where it is) and then routes by measured locality."""
        seq = self.seqs[seq_id]
        n = len(token_ids)
        start = seq.num_tokens
        if path is None:
            path = self._route(seq)
        got = self.tables.grow(seq, token_ids, path in (Path.SEQUENTIAL, Path.HYBRID))
        if got is not True:
            return got
        return Allocation(self.tables.slots(seq, start, n), path, start, n > 1 or start + n <= seq.prompt_tokens)

    def _route(self, seq: Sequence) -> Path:
        """The policy's path for the sequence's next tokens (see ``allocate``)."""
        start = seq.num_tokens
        if start < seq.prompt_tokens or start == 0:
            return seq.path  # still the prompt: the request's prefill path
        policy = self.policy
        locality = self.locality_score(seq.seq_id)
        if policy.migrates(seq.path, start, locality) and self.migrate(seq.seq_id, Path.SEQUENTIAL) is True:
            locality = self.locality_score(seq.seq_id)
        return policy.route(Phase.DECODE, start, locality)

    def commit(self, seq_id: int) -> None:
        """The step that wrote the sequence's pending tokens finished: full pages become
        shareable (hashed into the prefix table)."""
        seq = self.seqs[seq_id]
        P = self.page_tokens
        seq.committed = seq.num_tokens
        while len(seq.hashes) < seq.num_tokens // P:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else b""
            h = self.prefix.hash(parent, seq.tokens[i * P:(i + 1) * P])
            seq.hashes.append(h)
            if seq.register_pages:
                self.prefix.register(h, seq.pages[i])
            self._page_to_disk(seq, i, h)
        if self.windows is not None:
            self.windows.release(seq, self.pool.page_ref)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep the sequence's first ``num_tokens`` positions (speculative decoding rolls
        back the proposals it rejected): pages past them go back where they came from (an
        extent's last slots to the extent), and pages no longer full leave the prefix
        table. O(pages dropped), the kernel view included."""
        self.tables.cut(self.seqs[seq_id], num_tokens)

    def free(self, seq_id: int) -> None:
        """Release a sequence at once; its registered full pages stay cached (LRU)."""
        self.tables.release(seq_id)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every page of the parent (copy-on-write on append)."""
        child = self.tables.fork(parent_id, child_id)
        self.forks += 1
        self.forked_pages += len(child.pages)

    def migrate(self, seq_id: int, to: Path) -> bool | NoRoom:
        """Move a sequence's tokens into a fresh extent (SEQUENTIAL) or into random
        pages (RANDOM), bit-exact. Returns NoRoom (and changes nothing) when memory is short."""
        seq = self.seqs[seq_id]
        if seq.num_tokens == 0:
            return True
        got = self.tables.move(seq, to is Path.SEQUENTIAL)
        if got is True:
            seq.path = to
            self.migrations += 1
        return got

    def evict_all(self) -> int:
        """Drop every cached page nobody references. Returns how many."""
        n = 0
        while self.pages.evict_one():
            n += 1
        return n

    # -- kernel view and measurements -----------------------------------------
    def spans(self, seq_id: int, out: np.ndarray | None = None) -> np.ndarray:
        """Kernel view: (num_spans, 3) int64 rows (byte offset, num_tokens, page_tokens);
        physically adjacent pages are merged into one span. Kept incrementally: a step
        folds in only the pages added since the last call (the copy into ``out`` is one
        memcpy of 24 bytes per span)."""
        return self.view.spans(self.seqs[seq_id], self.policy.locality_window, out)

    def locality_score(self, seq_id: int) -> float:
        """Share of the sequence's KV reads in contiguous runs >= locality_window tokens.
        Incremental: every decode step asks, so it must not scan the sequence;
        ``KernelView.locality_score_scan`` is the same value from scratch."""
        return self.view.locality_score(self.seqs[seq_id], self.policy.locality_window)

    def bytes_held(self) -> int:
        """KV bytes (all layers) held by sequences: pages in use plus the unused rest of
        their extents; cached and free pages excluded. Cheap enough for every step."""
        total = self.num_blocks * self.pages_per_block
        return (total - self.free_page_count()) * self.page_bytes * self.geometry.num_layers  # the arena's

    def free_page_count(self) -> int:
        """Pages an allocation can take: free slots of RAND blocks, free blocks, cached
        pages (evictable). O(1): every allocation and admission asks."""
        return self.pages.free_page_count()

    def stats(self) -> CacheStats:
        """Bytes are for all layers. ``token_bytes_needed`` counts the tokens stored once
        each (a shared prefix page counts once); fragmentation compares it with the
        bytes held: pages in use plus extent pages reserved but not handed out yet.
        O(1), from running counts: ``/metrics`` asks under the engine lock."""
        pool = self.pool
        return self._stats(Occupancy(extent_blocks=len(pool.extent_used), extent_pages=pool.extent_pages,
                                     rand_live=pool.rand_live, cached_pages=len(self.prefix.lru),
                                     stored_tokens=self.tables.tally.num_tokens))

    def recount_stats(self) -> CacheStats:
        """``stats()`` counted from the block, page and sequence tables instead of the
        running counts: O(blocks + pages), for checks (``check_invariants``, tests)."""
        return self._stats(scan_occupancy(self.pool, self.prefix.lru, self.seqs.values(), self.page_tokens))

    def _stats(self, occ: Occupancy) -> CacheStats:
        pb = self.page_bytes * self.arena.num_layers
        ppb = self.pages_per_block
        in_use_random = occ.rand_live - occ.cached_pages  # cached pages sit in RAND blocks
        held = (occ.extent_blocks * ppb + in_use_random) * pb
        stored = occ.stored_tokens * pb // self.page_tokens
        return CacheStats(
            bytes_total=self.num_blocks * ppb * pb,
            bytes_used_sequential=occ.extent_pages * pb,
            bytes_used_random=in_use_random * pb,
            bytes_cached=occ.cached_pages * pb,
            bytes_free=(self.free_page_count() - occ.cached_pages) * pb,
            token_bytes_needed=stored,
            fragmentation=1.0 - stored / held if held else 0.0,
            prefix_queries=self.prefix_queries, prefix_hit_pages=self.prefix_hit_pages,
            evictions=self.evictions, migrations=self.migrations, cow_copies=self.cow_copies,
            forks=self.forks, forked_pages=self.forked_pages)

    def check_invariants(self) -> None:
        """Raise InvariantError when the bookkeeping is inconsistent (``check_manager``)."""
        check_manager(self)


def check_manager(m: KVCacheManager) -> None:
    """Raise InvariantError when the bookkeeping is inconsistent (tests): every part's
    tables, and every running count (``stats()`` included) against a recount."""
    refs = [0] * len(m.pool.page_ref)
    for s in m.seqs.values():
        require(len(s.pages) == (s.num_tokens + m.page_tokens - 1) // m.page_tokens,
                f"sequence {s.seq_id}'s page table does not fit its tokens")
        for p in s.pages:
            refs[p] += 1
    require(refs == m.pool.page_ref, "reference counts disagree with the page tables")
    m.prefix.check_invariants(m.pool.page_ref)
    m.pool.check_invariants()
    for s in m.seqs.values():
        m.view.check(s, m.policy.locality_window)
    if m.windows is not None:  # what a sequence's next query sees is whole
        P, W = m.page_tokens, m.windows.window
        for s in m.seqs.values():
            seen = s.pages[max(0, s.committed - W) // P:]
            require(not m.windows.released[seen].any(), f"sequence {s.seq_id} lost rows of its window")
    fast, slow = m.stats(), m.recount_stats()
    require(fast == slow, f"stats() {fast} disagrees with a recount {slow}")
