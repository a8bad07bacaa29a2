"""Per-token bookkeeping is O(1) (or O(new pages)), whatever the number of blocks, pages,
sequences or context tokens: shown structurally, never by timing.

* A decode step (allocate one token by the policy, commit, the kernel view into a
  buffer) iterates none of the block or page tables, slices only a few entries of the
  sequence's own lists, and allocates no memory that grows with the context.
* ``stats()`` (what /metrics reads) iterates none of them either.
* The incremental counters and heaps (free page count, lowest free block per parity,
  lowest RAND block with a free slot, locality score, stats) equal their from-scratch values
  after thousands of random operations on a cache of many blocks, and pick the same
  blocks the scans picked.

Geometry as in test_manager.py: pages of P = 4 tokens, 2 pages per 4 KiB block.
"""

from __future__ import annotations

import statistics
import tracemalloc
from collections import OrderedDict

import numpy as np

from dualpath.cache.manager import KVCacheManager
from dualpath.cache.policy import Path, PathPolicy
from dualpath.config import KVCacheConfig

P = 4


def make_cache(num_blocks: int, **overrides) -> KVCacheManager:
    cfg = KVCacheConfig(**{"block_bytes": 4096, "page_tokens": P, "kv_dtype": "f32", "locality_window": 8,
                            "seq_path_threshold": 1 << 20, **overrides})  # no migration: routing only
    cache = KVCacheManager(cfg, num_layers=1, num_kv_heads=2, head_dim=32, num_blocks=num_blocks)
    assert cache.pages_per_block == 2
    return cache


def scattered(num_pages: int, num_blocks: int) -> tuple[KVCacheManager, int, int]:
    """A cache with a long sequence on scattered random pages (one span per page), a short
    extent whose next block is taken, and many RAND blocks with one free slot each.
    Returns (cache, long sequence, extent sequence)."""
    cache = make_cache(num_blocks)
    doc, wall, long = cache.new_seq_id(), cache.new_seq_id(), cache.new_seq_id()
    cache.start(doc, [], Path.SEQUENTIAL)
    assert cache.allocate(doc, [1] * 16, Path.SEQUENTIAL)   # blocks 0, 1 (grown in place)
    cache.start(wall, [], Path.SEQUENTIAL)
    assert cache.allocate(wall, [2], Path.SEQUENTIAL)       # block 2: doc grows elsewhere
    cache.start(long, [], Path.RANDOM)
    fillers = []
    for i in range(num_pages):  # long's page, then a filler's page beside it
        assert cache.allocate(long, [i % 7] * P, Path.RANDOM)
        sid = cache.new_seq_id()
        cache.start(sid, [], Path.RANDOM)
        assert cache.allocate(sid, [9, 9, 9], Path.RANDOM)  # partial: released at once when freed
        fillers.append(sid)
    for sid in fillers[::2]:
        cache.free(sid)
    for sid in (doc, wall, long):
        cache.commit(sid)
    assert len(cache.spans(long)) == num_pages
    assert len(cache.pool.rand_free) >= num_pages // 2
    return cache, long, doc


def locality_scan(cache: KVCacheManager, seq_id: int) -> float:
    """The locality score counted from scratch over the whole page table."""
    return cache.view.locality_score_scan(cache.seqs[seq_id], cache.policy.locality_window)


def decode(cache: KVCacheManager, seq_ids, step: int, buf: np.ndarray) -> None:
    """One engine step's bookkeeping for every sequence: the policy's path, commit, kernel view."""
    for sid in seq_ids:
        assert cache.allocate(sid, [step % 5])
        cache.commit(sid)
        cache.spans(sid, out=buf)


class Counting:
    """Counts full iterations of the containers it wraps, and entries taken by slices."""

    def __init__(self):
        self.iterations: dict[str, int] = {}
        self.sliced = 0

    def _wrap(self, base, name):
        counter = self

        class Wrapped(base):
            def __iter__(self):
                counter.iterations[name] = counter.iterations.get(name, 0) + 1
                return base.__iter__(self)

            if base is not list:
                def keys(self):
                    counter.iterations[name] = counter.iterations.get(name, 0) + 1
                    return base.keys(self)

                def values(self):
                    counter.iterations[name] = counter.iterations.get(name, 0) + 1
                    return base.values(self)

                def items(self):
                    counter.iterations[name] = counter.iterations.get(name, 0) + 1
                    return base.items(self)
            else:
                def __getitem__(self, i):
                    got = base.__getitem__(self, i)
                    if isinstance(i, slice):
                        counter.sliced += len(got)
                    return got

        return Wrapped

    def install(self, cache: KVCacheManager) -> None:
        pool, prefix, tally = cache.pool, cache.prefix, cache.tables.tally
        pool.free_blocks = self._wrap(set, "free_blocks")(pool.free_blocks)
        pool.rand_free = self._wrap(dict, "rand_free")(pool.rand_free)
        pool.extent_used = self._wrap(dict, "extent_used")(pool.extent_used)
        prefix.lru = self._wrap(OrderedDict, "lru")(prefix.lru)
        prefix.table = self._wrap(dict, "table")(prefix.table)
        tally.partial = self._wrap(dict, "partial")(tally.partial)
        for owner, name in ((pool, "block_state"), (pool, "block_live"), (pool, "page_ref"),
                            (prefix, "page_hash"), (tally, "full_refs")):
            setattr(owner, name, self._wrap(list, name)(getattr(owner, name)))
        for sid, seq in cache.seqs.items():
            for name in ("pages", "tokens", "hashes", "blocks"):
                setattr(seq, name, self._wrap(list, f"{name} of {sid}")(getattr(seq, name)))


def test_a_decode_step_iterates_no_block_or_page_table():
    cache, long, doc = scattered(num_pages=600, num_blocks=1024)
    calls = {"take_block": 0, "random_page": 0}
    for owner, name in ((cache.pool, "take_block"), (cache.pages, "random_page")):
        method = getattr(owner, name)  # the block-choosing paths really run during the steps

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(owner, name, counted)
    counting = Counting()
    counting.install(cache)
    buf = np.zeros((1024, 3), np.int64)
    steps = 64
    for i in range(steps):
        decode(cache, (long, doc), i, buf)
    assert counting.iterations == {}
    # Per step and sequence: the pages added since the last fold, a page of tokens to hash.
    assert counting.sliced <= steps * 2 * (2 + P)
    assert calls["take_block"] >= 4 and calls["random_page"] >= steps // P
    assert cache.seqs[long].path is Path.RANDOM and len(cache.spans(long)) > 600  # still scattered
    cache.check_invariants()


def test_stats_iterates_no_block_or_page_table():
    """/metrics reads stats() under the engine lock: running counts, no walk, whatever the size."""
    cache, long, doc = scattered(num_pages=600, num_blocks=1024)
    decode(cache, (long, doc), 0, np.zeros((1024, 3), np.int64))
    counting = Counting()
    counting.install(cache)
    for _ in range(3):
        stats = cache.stats()
    assert counting.iterations == {} and counting.sliced == 0
    assert stats == cache.recount_stats()
    assert counting.iterations  # the recount walks the tables: the wrapping sees a walk


def test_a_decode_step_allocates_no_memory_that_grows_with_the_context():
    def median_step_bytes(num_pages):
        cache, long, doc = scattered(num_pages=num_pages, num_blocks=2 * num_pages + 64)
        buf = np.zeros((num_pages + 256, 3), np.int64)
        decode(cache, (long, doc), 0, buf)
        peaks = []
        tracemalloc.start()
        try:
            for i in range(1, 33):
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                decode(cache, (long, doc), i, buf)
                peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
        cache.check_invariants()
        return statistics.median(peaks)  # the median step: no amortised list growth in it

    small, large = median_step_bytes(100), median_step_bytes(4000)
    # A scan of the kernel view would allocate 24 bytes per span, ~96 KB at 4000 spans.
    assert large < 4096, (small, large)
    assert large < small + 1024, (small, large)


def test_counters_and_heaps_match_a_recount_after_random_operations_on_many_blocks():
    cache = make_cache(512, seq_path_threshold=24)  # migrations happen too
    rng = np.random.default_rng(7)
    ppb = cache.pages_per_block
    picks = {"take": 0, "random": 0}
    take_block, random_page = cache.pool.take_block, cache.pages.random_page

    def checked_take_block(prefer_odd=False):  # the block the scan of the old code chose
        parity = 1 if prefer_odd else 0
        want = min((b for b in cache.free_blocks if b % 2 == parity), default=None)
        if want is None:
            want = min(cache.free_blocks, default=None)
        got = take_block(prefer_odd)
        assert got == want
        picks["take"] += 1
        return got

    def checked_random_page():
        want = min(cache.pool.rand_free) if cache.pool.rand_free else None
        page = random_page()
        if want is not None:
            assert page // ppb == want
            picks["random"] += 1
        return page

    cache.pool.take_block, cache.pages.random_page = checked_take_block, checked_random_page
    live: list[int] = []
    base = [int(t) for t in rng.integers(0, 3, 64)]
    for op in range(3000):
        r = rng.random()
        if r < 0.15 or not live:
            sid = cache.new_seq_id()
            n = int(rng.integers(1, 48))
            prompt = base[:n] if rng.random() < 0.5 else [int(t) for t in rng.integers(0, 3, n)]
            path = [None, Path.SEQUENTIAL, Path.HYBRID, Path.RANDOM][int(rng.integers(4))]
            cache.start(sid, prompt, path)
            rest = prompt[cache.num_tokens(sid):]
            if rest and not cache.allocate(sid, rest):
                cache.free(sid)
                continue
            cache.commit(sid)
            live.append(sid)
            continue
        sid = live[int(rng.integers(len(live)))]
        if r < 0.7:
            path = [None, None, Path.SEQUENTIAL, Path.RANDOM][int(rng.integers(4))]
            if cache.allocate(sid, [int(t) for t in rng.integers(0, 3, int(rng.integers(1, 6)))], path):
                cache.commit(sid)
        elif r < 0.78:
            child = cache.new_seq_id()
            cache.fork(sid, child)
            live.append(child)
        elif r < 0.9:
            cache.free(sid)
            live.remove(sid)
        elif r < 0.97:
            cache.migrate(sid, [Path.SEQUENTIAL, Path.RANDOM][int(rng.integers(2))])
        else:
            cache.evict_all()
        if op % 50 == 0:
            cache.check_invariants()
    cache.check_invariants()
    assert picks["take"] > 100 and picks["random"] > 100
    assert cache.migrations > 0 and cache.evictions > 0
    for sid in live:
        cache.free(sid)
    cache.evict_all()
    cache.check_invariants()
    assert cache.free_page_count() == 512 * ppb and len(cache.free_blocks) == 512


def test_locality_score_is_recounted_once_for_a_policy_with_another_window():
    cache, long, doc = scattered(num_pages=40, num_blocks=128)
    for sid in (long, doc):
        assert cache.locality_score(sid) == locality_scan(cache, sid)
    assert cache.locality_score(doc) == 1.0                 # one 16-token run >= 8
    cache.policy = PathPolicy(locality_window=32)
    assert cache.locality_score(doc) == 0.0                 # shorter than 32
    assert cache.locality_score(doc) == locality_scan(cache, doc)
    buf = np.zeros((256, 3), np.int64)
    for i in range(40):
        decode(cache, (long, doc), i, buf)
        assert cache.locality_score(doc) == locality_scan(cache, doc)
        assert cache.locality_score(long) == locality_scan(cache, long)
    cache.policy = PathPolicy(locality_window=8)
    cache.check_invariants()
