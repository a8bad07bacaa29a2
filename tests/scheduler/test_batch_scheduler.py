"""BatchScheduler against a real KVCacheManager, with no model and no ONNX Runtime.

Each test drives the scheduler as the engine does: ``schedule()``, then for every
scheduled sequence the cache ``commit`` (the model run would write the KV), and for
every sequence that samples, one generated token appended to its request. The page
arithmetic in the comments is what the asserts pin: exact order, exact chunk sizes,
exact victims.

Geometry (``make_cache``): 1 layer, 1 KV head of head_dim 64 in f32, pages of 4
tokens (2 KiB), 4 KiB blocks = 2 pages per block.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from dualpath.cache.manager import KVCacheManager
from dualpath.config import KVCacheConfig
from dualpath.scheduler.batch import BatchScheduler
from dualpath.scheduler.request import Request, Status

P = 4  # tokens per page


def make_cache(num_blocks: int, **overrides) -> KVCacheManager:
    cfg = KVCacheConfig(block_bytes=4096, page_tokens=P, kv_dtype="f32", **overrides)
    cache = KVCacheManager(cfg, num_layers=1, num_kv_heads=1, head_dim=64, num_blocks=num_blocks)
    assert cache.pages_per_block == 2
    return cache


def make_request(name: str, base: int, n: int, arrival: float) -> Request:
    """Distinct token ids per request (no accidental prefix sharing)."""
    return Request(name, [base + i for i in range(n)], context_tokens=512, arrival=arrival)


def step(sched: BatchScheduler, chunk: int) -> list[tuple[str, int]]:
    """One engine step without the model: returns (request, tokens) in run order."""
    plan = sched.schedule(chunk)
    for s in plan.seqs:
        sched.cache.commit(s.seq_id)
        if s.logits:
            s.request.append(9000 + s.request.n)
    return [(s.request.request_id, s.num_tokens) for s in plan.seqs]


def scheduler(cache, *, max_num_seqs=8, max_batch_tokens=64, attention_tokens=1e12) -> BatchScheduler:
    return BatchScheduler(cache, max_num_seqs=max_num_seqs, max_batch_tokens=max_batch_tokens,
                          attention_tokens=attention_tokens)


def test_decodes_go_first_oldest_first_then_prompts_fewest_chunks_first():
    cache = make_cache(64)
    sched = scheduler(cache)
    t0 = time.perf_counter()
    d1, d2 = make_request("d1", 1000, 4, t0), make_request("d2", 2000, 4, t0 + 1e-3)
    sched.add(d1)
    sched.add(d2)
    assert step(sched, 32) == [("d1", 4), ("d2", 4)]       # both prompts in one step, each samples
    long, short = make_request("long", 3000, 100, t0 + 2e-3), make_request("short", 4000, 20, t0 + 3e-3)
    sched.add(long)
    sched.add(short)
    # Budget 64: two decode tokens, then the short prompt (1 chunk) before the long one
    # (4 chunks) although it came later; the long one gets a full 32-token chunk (cost
    # ~32 at this attention_tokens) and 10 tokens of budget are left.
    assert step(sched, 32) == [("d1", 1), ("d2", 1), ("short", 20), ("long", 32)]
    assert [r.request_id for r in sched.running] == ["d1", "d2", "short", "long"]
    # The short request now decodes beside the others; the long prompt continues.
    assert step(sched, 32) == [("d1", 1), ("d2", 1), ("short", 1), ("long", 32)]
    assert (long.computed, short.computed) == (64, 21)
    assert all(r.status is Status.RUNNING for r in sched.running) and not sched.waiting


def test_prompt_chunks_count_plain_tokens_when_nobody_decodes():
    cache = make_cache(64)
    sched = scheduler(cache, max_batch_tokens=50, attention_tokens=10.0)  # a strong weight, unused
    sched.add(make_request("a", 1000, 100, time.perf_counter()))
    # No decoder: the chunk is cut to the budget (50), not to a weighted cost.
    assert step(sched, 64) == [("a", 50)]


def test_a_chunk_beside_decoders_is_the_largest_whose_weighted_cost_fits():
    K = 100.0
    cache = make_cache(128)
    sched = scheduler(cache, max_batch_tokens=101, attention_tokens=K)
    t0 = time.perf_counter()
    sched.add(make_request("doc", 1000, 200, t0))
    sched.add(make_request("chat", 2000, 4, t0 + 1e-3))
    # Nobody decodes yet: plain tokens; the 1-chunk chat first, then 64 of the document.
    assert step(sched, 64) == [("chat", 4), ("doc", 64)]
    out = step(sched, 64)
    assert out[0] == ("chat", 1)
    name, n = out[1]

    def cost(n, pos=64):
        return n * (1 + (pos + n / 2) / K)

    # 100 budget tokens left after the decode: the largest n with cost(n) <= 100.
    assert name == "doc" and cost(n) <= 100 < cost(n + 1)
    assert n == 52


def test_a_chunk_squeezed_below_the_minimum_waits_for_the_next_step():
    cache = make_cache(64)
    sched = scheduler(cache, max_batch_tokens=40)
    t0 = time.perf_counter()
    sched.add(make_request("a", 1000, 30, t0))
    sched.add(make_request("b", 2000, 64, t0 + 1e-3))
    # a takes 30; b could get only 10 tokens (< 32, the minimum chunk): it is not started.
    assert step(sched, 64) == [("a", 30)]
    assert [r.request_id for r in sched.waiting] == ["b"] and sched.waiting[0].seq_id is None
    assert cache.num_sequences == 1  # b's tentative sequence was freed


def test_a_long_wait_promotes_a_document_past_newer_chats():
    cache = make_cache(128)
    sched = scheduler(cache, max_batch_tokens=64)
    now = time.perf_counter()
    sched.add(make_request("doc", 1000, 100, now - 10.0))  # 4 chunks, waited 10 s: class 1
    sched.add(make_request("chat", 2000, 20, now))         # 1 chunk, just arrived: class 1
    # Same class: first come first served, so the document's first chunk goes first.
    assert step(sched, 32) == [("doc", 32), ("chat", 20)]


def test_max_num_seqs_bounds_the_running_requests():
    cache = make_cache(64)
    sched = scheduler(cache, max_num_seqs=2)
    t0 = time.perf_counter()
    for i, name in enumerate("abc"):
        sched.add(make_request(name, 1000 * (i + 1), 8, t0 + i * 1e-3))
    assert step(sched, 32) == [("a", 8), ("b", 8)]
    assert [r.request_id for r in sched.waiting] == ["c"]
    sched.remove(sched.running[0])                          # a finishes: its slot frees
    assert step(sched, 32) == [("b", 1), ("c", 8)]


def test_a_request_with_forks_is_admitted_only_with_a_slot_for_each():
    cache = make_cache(64)
    sched = scheduler(cache, max_num_seqs=4)
    t0 = time.perf_counter()
    a, b, c = (make_request(name, 1000 * (i + 1), 8, t0 + i * 1e-3) for i, name in enumerate("abc"))
    sched.reserve(b, 2)                                     # n = 3: two forks once its prompt is computed
    for r in (a, b, c):
        sched.add(r)
    # a takes 1 slot, b 1 + 2: c waits although only two requests run.
    assert step(sched, 32) == [("a", 8), ("b", 8)]
    assert sched.num_seqs() == 4 and [r.request_id for r in sched.waiting] == ["c"]
    forks = []
    for i in (1, 2):                                        # the engine forks b after its first sample
        fork = Request(f"b.{i}", b.prompt_ids, context_tokens=512)
        fork.seq_id = cache.new_seq_id()
        cache.fork(b.seq_id, fork.seq_id)
        fork.n = fork.computed = b.computed                 # the prompt; b's own sample follows it
        fork.ids[:b.computed] = b.ids[:b.computed]
        sched.start_fork(b, fork)
        fork.append(8000 + i)
        forks.append(fork)
    assert b.reserved_seqs == 0 and sched.num_seqs() == 4
    assert step(sched, 32) == [("a", 1), ("b", 1), ("b.1", 1), ("b.2", 1)]
    sched.remove(forks[0])                                  # a fork ends: c gets its slot
    assert step(sched, 32) == [("a", 1), ("b", 1), ("b.2", 1), ("c", 8)]
    with pytest.raises(ValueError, match="5 sequences of one request; at most 4"):
        sched.reserve(make_request("d", 4000, 8, t0), 4)
    cache.check_invariants()


def test_a_request_with_forks_is_not_starved_by_requests_behind_it():
    # 4 slots busy with single requests that end at different steps, and more keep
    # arriving behind an n = 3 request: the slots that free up wait for it.
    cache = make_cache(64)
    sched = scheduler(cache, max_num_seqs=4)
    t0 = time.perf_counter()
    singles = [make_request(f"s{i}", 1000 * (i + 1), 4, t0 + i * 1e-3) for i in range(4)]
    big = make_request("big", 9000, 4, t0 + 1.0)
    sched.reserve(big, 2)
    for r in singles + [big]:
        sched.add(r)
    made = 4
    for steps in range(1, 60):  # noqa: B007 (read after the loop)
        for s in sched.schedule(32).seqs:
            sched.cache.commit(s.seq_id)
            if s.logits:
                s.request.append(9000 + s.request.n)
        for r in list(sched.running):
            if r is not big and len(r.generated) >= 2 + int(r.request_id[1:]) % 5:
                sched.remove(r)
                late = make_request(f"s{made}", 1000 * (made + 1), 4, t0 + 2.0 + made)  # arrives after big
                sched.add(late)
                made += 1
        if big.status is Status.RUNNING:
            break
    assert big.status is Status.RUNNING and steps < 10
    assert sched.num_seqs() <= 4


def test_no_plan_exceeds_max_num_seqs_with_forks_preemption_and_chunked_prefill():
    # A small cache (preemptions), short chunks (prompts over several steps), and requests
    # with up to 3 forks that start when their prompt is computed, as the engine starts
    # them; requests end after a few tokens and new ones keep coming. Six seeded runs.
    preemptions = sum(_random_run(seed) for seed in range(6))
    assert preemptions > 0


def _random_run(seed: int) -> int:
    rng = np.random.default_rng(seed)
    max_seqs = 5
    cache = make_cache(12, path_mode=("random", "sequential", "dual")[seed % 3])
    sched = scheduler(cache, max_num_seqs=max_seqs, max_batch_tokens=24)
    pending: dict[int, list[Request]] = {}                  # parent id -> forks not started
    made = widest = forked = 0
    for _ in range(400):
        if rng.random() < 0.5:
            req = make_request(f"r{made}", 10000 * (made + 1), int(rng.integers(2, 30)), time.perf_counter())
            forks = int(rng.integers(0, max_seqs)) if rng.random() < 0.4 else 0
            sched.reserve(req, forks)
            pending[id(req)] = [Request(f"r{made}.{i}", req.prompt_ids, context_tokens=512) for i in range(forks)]
            sched.add(req)
            made += 1
        plan = sched.schedule(int(rng.choice([4, 8, 16])))
        assert len(plan.seqs) <= max_seqs and sched.num_seqs() <= max_seqs
        assert not plan.failed
        widest = max(widest, len(plan.seqs))
        for s in plan.seqs:
            cache.commit(s.seq_id)
        for s in plan.seqs:
            req = s.request
            if not s.logits:
                continue
            for fork in pending.pop(id(req), ()):           # the prompt is computed: fork now
                fork.seq_id = cache.new_seq_id()
                cache.fork(req.seq_id, fork.seq_id)
                fork.ids[:req.n], fork.n, fork.computed = req.ids[:req.n], req.n, req.computed
                sched.start_fork(req, fork)
                fork.append(8000 + fork.n)                  # its own first sample
                forked += 1
            req.append(9000 + req.n)
            if len(req.generated) >= 12 or req.n >= 500:
                sched.remove(req)
        assert sched.num_seqs() <= max_seqs
        cache.check_invariants()
    assert widest == max_seqs and forked > 10
    return sched.preemptions


def test_decode_without_room_preempts_the_newest_running_request_and_keeps_its_prefix():
    # Random path mode, so that pages come one at a time (no extent spares) and the
    # arithmetic is exact: 8 blocks = 16 pages = 64 tokens.
    cache = make_cache(8, path_mode="random")
    sched = scheduler(cache, max_batch_tokens=64)
    t0 = time.perf_counter()
    a, b, c = (make_request("a", 1000, 20, t0), make_request("b", 2000, 20, t0 + 1e-3),
               make_request("c", 3000, 12, t0 + 2e-3))
    for r in (a, b, c):
        sched.add(r)
    # Admission keeps headroom: c needs 3 pages + 1 + one per running request (2) = 6 of
    # the 6 left. 5 + 5 + 3 pages taken, 3 free.
    assert step(sched, 32) == [("a", 20), ("b", 20), ("c", 12)]
    assert cache.free_page_count() == 3
    # Positions 20 (a, b) and 12 (c) open a new page each: the last 3 free pages.
    assert step(sched, 32) == [("a", 1), ("b", 1), ("c", 1)]
    assert cache.free_page_count() == 0
    for _ in range(3):                                      # positions 21-23 / 13-15: no new page
        assert step(sched, 32) == [("a", 1), ("b", 1), ("c", 1)]
    # Position 24 of a needs a page and none is free: the newest running request not yet
    # in this step, c, is preempted. Its 4 full pages go to the prefix cache (tail first
    # in LRU order); a and b each evict one (c's tail pages 3 and 2).
    assert step(sched, 32) == [("a", 1), ("b", 1)]
    assert sched.preemptions == 1 and c.preemptions == 1
    assert (c.status, c.seq_id, c.computed, list(sched.waiting)) == (Status.WAITING, None, 0, [c])
    assert [r.request_id for r in sched.running] == ["a", "b"]
    assert cache.free_page_count() == 2                     # c's first two pages, still cached
    # c re-queues with its prompt and the 5 tokens it sampled (17 tokens, 16 computed).
    # It cannot be admitted yet: 2 of its pages are still cached, so 9 tokens are to
    # recompute = 3 pages, + 1 + one per running request (2) > 2 free.
    assert c.n == 17
    assert step(sched, 32) == [("a", 1), ("b", 1)]
    sched.remove(a)
    sched.remove(b)
    # Now it is: its first 8 tokens come back from the prefix cache, 9 are recomputed.
    assert step(sched, 32) == [("c", 9)]
    assert c.cached_tokens == 0                             # the first admission's figure stays
    cache.check_invariants()


def test_prompt_chunks_never_preempt():
    cache = make_cache(8, path_mode="random")               # 16 pages
    sched = scheduler(cache, max_batch_tokens=64)
    t0 = time.perf_counter()
    a, b = make_request("a", 1000, 40, t0), make_request("b", 2000, 24, t0 + 1e-3)
    sched.add(a)
    sched.add(b)
    # 8-token chunks. b has fewer chunks left at every step, so it goes first; both are
    # admitted (b: 6 + 1 pages of 16; a: 10 + 1 + 1 of 14).
    assert step(sched, 8) == [("b", 8), ("a", 8)]
    assert step(sched, 8) == [("b", 8), ("a", 8)]
    assert step(sched, 8) == [("b", 8), ("a", 8)]            # b's prompt is done: it samples
    assert step(sched, 8) == [("b", 1), ("a", 8)]            # b opens page 7, a takes pages 7-8
    assert cache.free_page_count() == 1
    # a's last chunk needs 2 pages, 1 is free: it waits. A prompt chunk never preempts
    # the decoder that holds the room.
    assert step(sched, 8) == [("b", 1)]
    assert sched.preemptions == 0 and a.computed == 32 and a.status is Status.RUNNING


def test_a_full_cache_refuses_a_waiting_request_before_looking_up_its_prompt():
    cache = make_cache(8, path_mode="random")               # 16 pages
    sched = scheduler(cache, max_batch_tokens=64)
    starts = []
    start = cache.start
    cache.start = lambda seq_id, ids, *args: starts.append(len(ids)) or start(seq_id, ids, *args)
    t0 = time.perf_counter()
    a, b = make_request("a", 1000, 60, t0), make_request("b", 2000, 8, t0 + 1e-3)
    sched.add(a)
    sched.add(b)
    # a: 15 pages + 1 of 16. Then 1 page is free, and b needs at least 1 + 1 + one per
    # running request: refused at once, its prompt never hashed, at every step.
    assert step(sched, 64) == [("a", 60)]
    assert step(sched, 64) == [("a", 1)]                    # takes the last free page
    for _ in range(3):
        assert step(sched, 64) == [("a", 1)]
    assert starts == [60] and list(sched.waiting) == [b] and cache.prefix_queries == 1
    sched.remove(a)                                         # room again: b starts
    assert step(sched, 64) == [("b", 8)]
    assert starts == [60, 8]
    cache.check_invariants()


def test_the_scheduler_imports_no_onnx_runtime():
    code = ("import sys, dualpath.scheduler.batch, dualpath.scheduler.request; "
            "print('onnxruntime' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
