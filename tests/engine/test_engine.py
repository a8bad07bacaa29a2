"""The continuous-batching engine on stories260K: batch invariance, chunked prefill,
preemption under a small cache, aborts, per-request seeds, the async API, queue limits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dualpath
from dualpath import SamplingParams
from dualpath.cache.policy import Path
from dualpath.engine.engine import QueueFullError
from dualpath.executor.ort_sessions import SMALL_ARRAY_BYTES
from dualpath.scheduler.request import Status

NAMES = ["Lily", "Tom", "Sue", "Max", "Ben", "Anna", "Sam", "Mia", "Tim", "Lucy", "Jack", "Zoe", "Bob", "Kate",
         "Leo", "Amy"]
PROMPTS = [f"{name} and the {thing}" for name, thing in zip(NAMES, [
    "dog", "big tree", "red ball", "cat", "sun", "little bird", "car", "park", "boat", "cake", "fish", "moon",
    "toy", "flower", "rain", "box"])]


def make_llm(gguf_path, **overrides) -> dualpath.LLM:
    base = {"runtime.max_context_tokens": 256}
    base.update(overrides)
    return dualpath.LLM(gguf_path, dualpath.load_config(None, base))


@pytest.fixture(scope="module")
def solo(gguf_path):
    """Greedy token ids of every prompt, each run alone (one request at a time)."""
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 1})
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    return {p: llm.generate(p, params).token_ids for p in PROMPTS}


def run_together(llm, prompts, params):
    """Submit every prompt, then step until all end; the completions in order."""
    engine = llm.engine
    reqs = [engine.add_request(llm.tokenize(p), params) for p in prompts]
    widest = 0
    while engine.step():
        widest = max(widest, engine.num_running)
    return [r.completion for r in reqs], widest


def test_sixteen_concurrent_greedy_requests_match_their_solo_runs(gguf_path, solo):
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 16})
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    completions, widest = run_together(llm, PROMPTS, params)
    assert widest == 16  # they really ran in one batch
    for p, c in zip(PROMPTS, completions):
        assert c.token_ids == solo[p], p
        assert c.finish_reason == "length"
    assert not llm.cache.seqs  # every request let go of its cache


def test_chunked_prefill_in_a_mixed_batch_matches_solo(gguf_path, solo):
    # 8-token prefill chunks: every prompt is cut, and chunks share steps with decodes.
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 4, "runtime.prefill_chunk_tokens": 4,
                                 "runtime.max_batch_tokens": 8})
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    completions, _ = run_together(llm, PROMPTS[:6], params)
    for p, c in zip(PROMPTS, completions):
        assert c.token_ids == solo[p], p


def test_pages_too_large_for_a_block_hold_fewer_tokens(gguf_path, solo):
    """A page of 64 tokens of this model is 8 KiB, more than a block of 4 KiB: pages of 32
    are made instead (as for a model with wide KV heads at the default block), and the
    greedy text is what pages of 16 gave."""
    llm = make_llm(gguf_path, **{"kv_cache.block_bytes": 4096, "kv_cache.page_tokens": 64})
    assert llm.cache.page_tokens == 32 and llm.cache.page_bytes <= 4096
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for prompt in PROMPTS[:2]:
        assert llm.generate(prompt, params).token_ids == solo[prompt]


def test_preemption_under_a_cache_for_about_three_requests(gguf_path, solo):
    # 4 KiB blocks = 32 tokens of stories260K (f16 KV); 384 tokens = 12 blocks: about
    # three requests of 5 + 64 tokens with their partly filled pages, and 12 at once.
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 12, "runtime.kv_cache_tokens": 384,
                                 "kv_cache.block_bytes": 4096})
    assert llm.runner.kv_cache_tokens == 384
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    completions, _ = run_together(llm, PROMPTS[:12], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    assert llm.engine.scheduler.preemptions > 0
    for p, c in zip(PROMPTS, completions):
        assert c.token_ids == solo[p], p
    llm.runner.cache.check_invariants()
    del params


def test_seeded_sampling_is_the_same_alone_and_batched(gguf_path):
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 8})
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=s) for s in range(4)]
    alone = [llm.generate(PROMPTS[0], p).token_ids for p in params]
    engine = llm.engine
    reqs = [engine.add_request(llm.tokenize(PROMPTS[0]), p) for p in params]
    engine.run_until_done()
    assert [r.completion.token_ids for r in reqs] == alone
    assert len(set(alone)) == 4  # the seeds really differ


def test_abort_frees_the_cache_at_once(gguf_path):
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 4})
    engine, cache = llm.engine, llm.runner.cache
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    reqs = [engine.add_request(llm.tokenize(p), params) for p in PROMPTS[:3]]
    for _ in range(20):
        engine.step()
    victim = reqs[1]
    seq_id = victim.seq_id
    assert seq_id in cache.seqs
    used = cache.stats().bytes_used_random + cache.stats().bytes_used_sequential
    assert engine.abort(victim.request_id)
    assert seq_id not in cache.seqs and victim.status is Status.FINISHED
    after = cache.stats().bytes_used_random + cache.stats().bytes_used_sequential
    assert after < used
    assert victim.completion.finish_reason == "abort" and len(victim.completion.token_ids) == 20
    engine.run_until_done()
    assert [r.completion.finish_reason for r in reqs] == ["length", "abort", "length"]
    assert not engine.abort(victim.request_id)  # already over
    cache.check_invariants()


def test_generation_close_aborts_the_request(gguf_path):
    llm = make_llm(gguf_path)
    gen = llm.stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    next(gen)
    gen.close()
    assert gen.completion.finish_reason == "abort"
    assert not llm.engine.has_work()


@pytest.mark.parametrize("background", [True, False])
def test_generation_closed_from_another_thread_ends_both(gguf_path, background):
    """One thread iterates while another closes: each returns, and both see the abort (a
    close that drained the deltas itself left the iterating thread waiting for good)."""
    import threading
    import time

    llm = make_llm(gguf_path)
    run = llm.engine.driver.run

    def slow_run(plan):  # each step takes long enough that the request is still running at close
        time.sleep(0.02)
        return run(plan)

    llm.engine.driver.run = slow_run
    if background:
        llm.engine.start()
    gen = llm.stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    first, texts = threading.Event(), []

    def reader():
        for text in gen:
            texts.append(text)
            first.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert first.wait(60)
    closer = threading.Thread(target=gen.close, daemon=True)
    closer.start()
    closer.join(60)
    t.join(60)
    assert not closer.is_alive() and not t.is_alive()
    c = gen.completion
    assert c is not None and c.finish_reason == "abort"
    assert 0 < len(c.token_ids) < 200 and "".join(texts) == c.text
    assert not llm.engine.has_work()
    llm.engine.shutdown()


def test_async_submit_streams_deltas_that_add_up(gguf_path, solo):
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 4})
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)

    async def one(prompt):
        handle = await llm.engine.submit(prompt, params)
        deltas = [d async for d in handle]
        return deltas, handle.completion

    async def main():
        return await asyncio.gather(*(one(p) for p in PROMPTS[:4]))

    try:
        results = asyncio.run(main())
    finally:
        llm.engine.shutdown()
    for p, (deltas, c) in zip(PROMPTS, results):
        assert c.token_ids == solo[p]
        assert "".join(d.text for d in deltas) == c.text
        assert sum(len(d.token_ids) for d in deltas) == len(c.token_ids)
        assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])


def test_a_full_queue_refuses_with_queue_full_error(gguf_path):
    llm = make_llm(gguf_path, **{"server.max_queued_requests": 2, "runtime.max_num_seqs": 3})
    ids = llm.tokenize(PROMPTS[0])
    for _ in range(3 + 2):  # three take the free slots at the next step, two wait beyond them
        llm.engine.add_request(ids)
    with pytest.raises(QueueFullError, match=r"2 requests are already waiting \(limit 2\)"):
        llm.engine.add_request(ids)
    llm.engine.shutdown()
    assert not llm.engine.has_work()


def test_the_router_sends_long_prompts_to_the_sequential_path(gguf_path):
    llm = make_llm(gguf_path, **{"kv_cache.seq_path_threshold": 32, "runtime.max_num_seqs": 2})
    engine = llm.engine
    long_prompt = llm.tokenize(" ".join(NAMES * 3))
    assert len(long_prompt) > 32
    long_req = engine.add_request(long_prompt, SamplingParams(temperature=0, max_tokens=4))
    short_req = engine.add_request(llm.tokenize(PROMPTS[0]), SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    seqs = llm.runner.cache.seqs
    assert seqs[long_req.seq_id].path is Path.SEQUENTIAL
    assert seqs[short_req.seq_id].path is Path.HYBRID
    engine.run_until_done()


def test_a_shared_prefix_is_reused_across_requests(gguf_path):
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 4})
    system = "Once upon a time there was a little girl named Lily who loved to play in the park with her dog."
    params = SamplingParams(temperature=0, max_tokens=8)
    first = llm.generate(system + " One day", params)
    engine = llm.engine
    reqs = [engine.add_request(llm.tokenize(system + tail), params) for tail in (" The end", " She ran", " It was")]
    engine.run_until_done()
    page = llm.config.kv_cache.page_tokens
    assert first.usage.cached_prompt_tokens == 0
    for r in reqs:
        assert r.completion.usage.cached_prompt_tokens >= page  # the system prompt's full pages
    assert llm.runner.cache.stats().prefix_hit_rate > 0


def test_a_bad_prompt_is_refused_before_it_is_queued(gguf_path):
    llm = make_llm(gguf_path)
    with pytest.raises(dualpath.PromptTooLongError, match="context window holds 256"):
        llm.engine.add_request([1] * 300)
    with pytest.raises(dualpath.InvalidPromptError, match="outside the vocabulary"):
        llm.engine.add_request([1, 99999])
    assert not llm.engine.has_work()


def test_kv_cache_smaller_than_the_context_is_a_config_error(gguf_path):
    with pytest.raises(dualpath.ConfigError, match="kv_cache_tokens=100 must hold at least one full context"):
        make_llm(gguf_path, **{"runtime.kv_cache_tokens": 100})


def test_many_requests_reading_one_long_shared_prefix_from_a_small_cache(gguf_path):
    # 8 requests each read the same 11 prefix pages: the step's kernel view (8 x 12
    # spans) is larger than the cache has pages (16 here).
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 8, "runtime.kv_cache_tokens": 256,
                                 "kv_cache.block_bytes": 4096})
    prefix = llm.tokenize(" ".join(NAMES * 4))[:210]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    solo = llm.generate(prefix + [300], params).token_ids
    engine = llm.engine
    reqs = [engine.add_request(prefix + [300], params) for _ in range(8)]
    widest = 0
    while engine.step():
        widest = max(widest, engine.num_running)
    assert widest >= 2
    assert all(r.completion.token_ids == solo for r in reqs)
    full_pages = (len(prefix) + 1 - 1) // 16 * 16  # the last prompt token always runs
    assert all(r.completion.usage.cached_prompt_tokens == full_pages for r in reqs)
    llm.runner.cache.check_invariants()


def test_a_model_run_that_fails_once_is_recomputed_and_the_output_is_unchanged(gguf_path, solo):
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 2})
    engine, runner = llm.engine, llm.runner
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    reqs = [engine.add_request(llm.tokenize(p), params) for p in PROMPTS[:2]]
    real_run, calls = runner.run, [0]

    def flaky(entries):  # fault injection: the 4th model run (mid-decode) raises
        calls[0] += 1
        if calls[0] == 4:
            raise MemoryError("injected failure")
        return real_run(entries)

    runner.run = flaky
    engine.run_until_done()
    for p, r in zip(PROMPTS, reqs):
        assert r.completion.token_ids == solo[p]
    assert engine.metrics.retried_requests == 2 and engine.metrics.failed_requests == 0
    assert not runner.cache.seqs
    runner.cache.check_invariants()


def test_a_request_in_two_failed_runs_ends_with_an_internal_error_and_the_engine_keeps_serving(gguf_path, solo):
    from dualpath.errors import InternalError

    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 2})
    engine, runner = llm.engine, llm.runner
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    errors = []
    doomed = engine.add_request(llm.tokenize(PROMPTS[0]), params, sink=lambda d, e: e and errors.append(e))
    real_run = runner.run

    def broken(entries):  # fault injection: every model run raises
        raise MemoryError("injected failure")

    runner.run = broken
    engine.step()
    assert not errors and doomed.status is Status.WAITING  # sent back to be recomputed
    engine.step()
    assert len(errors) == 1 and isinstance(errors[0], InternalError)
    assert "injected" not in str(errors[0]) and isinstance(errors[0].__cause__, MemoryError)
    assert doomed.status is Status.FINISHED and doomed.seq_id is None
    assert not runner.cache.seqs  # its cache was freed
    runner.run = real_run
    c = llm.generate(PROMPTS[1], params)  # the engine still serves, with the same output
    assert c.token_ids == solo[PROMPTS[1]]
    assert engine.metrics.failed_requests == 1
    runner.cache.check_invariants()


def bad_and_good(gguf_path, max_tokens: int):
    """Two greedy requests in one engine: the first's consumer collects its errors."""
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 2})
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    errors = []
    bad = llm.engine.add_request(llm.tokenize(PROMPTS[0]), params, sink=lambda d, e: e and errors.append(e))
    good = llm.engine.add_request(llm.tokenize(PROMPTS[1]), params)
    return llm, llm.engine, errors, bad, good


def test_an_error_while_one_request_samples_ends_that_request_alone(gguf_path, solo):
    from dualpath.errors import InternalError

    llm, engine, errors, bad, good = bad_and_good(gguf_path, 64)
    real_sample, calls = bad.sampler.sample, [0]

    def broken(*args):  # fault injection: the bad request's 5th sample raises
        calls[0] += 1
        if calls[0] == 5:
            raise ValueError("injected sampler failure")
        return real_sample(*args)

    bad.sampler.sample = broken
    engine.run_until_done()
    assert len(errors) == 1 and isinstance(errors[0], InternalError) and bad.status is Status.FINISHED
    assert good.completion.token_ids == solo[PROMPTS[1]]  # in the same steps, untouched
    assert not llm.runner.cache.seqs
    llm.runner.cache.check_invariants()


def test_n_samples_of_many_requests_never_overflow_a_step(gguf_path, solo):
    # 10 requests of 1 to 4 samples each over 4 sequence slots: forks start when their
    # parent's prompt is computed, and each holds a slot reserved for it at admission.
    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 4})
    engine, runner = llm.engine, llm.runner
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    errors = []
    sink = lambda d, e: e and errors.append(e)  # noqa: E731
    reqs = [engine.add_request(llm.tokenize(p), params, sink=sink, fork_sinks=[sink] * (i % 4))
            for i, p in enumerate(PROMPTS[:10])]
    widest = 0
    while True:
        widest = max(widest, engine.scheduler.num_seqs())
        if not engine.step():
            break
        assert engine.scheduler.num_seqs() <= 4
    assert not errors and widest == 4
    for i, (p, r) in enumerate(zip(PROMPTS, reqs)):
        assert len(r.forks) == i % 4
        for sample in [r] + r.forks:  # greedy: every sample is the solo output
            assert sample.completion.token_ids == solo[p][:24], sample.request_id
    assert engine.metrics.retried_requests == 0 and runner.cache.forks == sum(i % 4 for i in range(10))
    assert not runner.cache.seqs
    runner.cache.check_invariants()
    with pytest.raises(ValueError, match="5 samples of one prompt need as many sequences at once; "
                                         "this engine runs at most 4"):
        engine.add_request(llm.tokenize(PROMPTS[0]), params, fork_sinks=[None] * 4)


def test_a_step_where_no_request_samples_runs_after_a_longer_one(gguf_path):
    # A 39-token step leaves its sampled row (38) behind; a 3-token mid-prompt chunk
    # that samples nothing must not read that row (ORT's Gather would be out of bounds).
    llm = make_llm(gguf_path)
    runner, scheduler = llm.runner, llm.engine.scheduler
    prompt = llm.tokenize(" ".join(NAMES * 2))[:42]
    seq, _ = scheduler.open_sequence(prompt)
    plan = scheduler.plan_sequence(seq, prompt[:39])
    assert runner.run(plan).shape[0] == 1
    scheduler.update_from_output(plan)
    plan = scheduler.plan_sequence(seq, prompt[39:])
    plan.seqs[0].logits = False  # a mid-prompt chunk: it samples nothing
    scheduler.arrays.fill(plan, scheduler.cache)
    assert runner.run(plan).shape[0] == 0
    scheduler.update_from_output(plan)
    assert runner.cache.num_tokens(seq) == 42


def test_submits_and_metrics_do_not_wait_for_a_step_that_is_sampling(gguf_path):
    # While the stepping thread samples (here held inside the sampler), the event loop's
    # calls (add_request for a submit, metrics_text for /metrics) take the engine lock;
    # they must get it: the step holds it only to schedule and to finish requests.
    import threading

    llm = make_llm(gguf_path)
    engine = llm.engine
    req = engine.add_request(llm.tokenize(PROMPTS[0]), SamplingParams(temperature=0, max_tokens=2))
    entered, release = threading.Event(), threading.Event()
    sample = req.sampler.sample

    def held_sample(logits, history, *rest):
        entered.set()
        release.wait(300)  # set by the test (long after done.wait gives up, if it does)
        return sample(logits, history, *rest)

    req.sampler.sample = held_sample
    stepper = threading.Thread(target=engine.step)
    stepper.start()
    try:
        assert entered.wait(30), "the step never reached sampling"
        done = threading.Event()
        got = {}

        def event_loop_calls():
            got["metrics"] = engine.metrics_text()
            got["request"] = engine.add_request(llm.tokenize(PROMPTS[1]), SamplingParams(max_tokens=1))
            done.set()

        threading.Thread(target=event_loop_calls, daemon=True).start()
        assert done.wait(10), "metrics_text/add_request waited for the sampling step"
        assert "dualpath_running_requests 1" in got["metrics"]
    finally:
        release.set()
        stepper.join(30)
    engine.run_until_done()
    assert req.completion is not None and got["request"].completion is not None


def test_the_sessions_keep_alive_the_ort_values_they_read_in_place(gguf_path):
    # ONNX Runtime requires add_initializer's OrtValues to outlive the session: the
    # session set holds one per shared weight of every part that reads ours in place.
    import onnxruntime as ort

    llm = make_llm(gguf_path)
    values = llm.runner.sessions.initializers
    assert values and all(isinstance(v, ort.OrtValue) for v in values)
    # Each is a view of one of our weight arrays or of the entry's fused matrices (no
    # copy), held for the sessions' life, or of the graph folder's RoPE tables: one
    # cos/sin pair for this model, which every part reads from the same mapping; or a copy
    # of an array of weights.bin under SMALL_ARRAY_BYTES (a fault-around window).
    ours = {a.ctypes.data for w in llm.spec.weights.values() for a in w.arrays().values()}
    ours |= {a.ctypes.data for d in llm.spec.entry.derived_arrays.values() for a in d.values()}
    ptrs = [v.data_ptr() for v in values]
    shared = {p for p in set(ptrs) - ours if ptrs.count(p) > 1}
    assert len(shared) == 2
    assert sum(p in shared for p in ptrs) == 2 * llm.spec.config.num_layers  # shared, not copied
    copies = [v for v in values if v.data_ptr() not in ours | shared]
    assert copies and all(v.numpy().nbytes < SMALL_ARRAY_BYTES for v in copies)
    ids = llm.tokenize(PROMPTS[0])
    assert llm.generate(ids, SamplingParams(temperature=0, max_tokens=4)).token_ids  # still valid


def test_a_queued_request_holds_memory_for_its_prompt_not_the_vocabulary_or_context(gguf_path):
    # 64 queued requests at a 4,096 context: the samplers share vocabulary-sized scratch
    # buffers and each request's token array starts at its prompt (plus a reserve).
    import tracemalloc

    llm = make_llm(gguf_path, **{"runtime.max_context_tokens": 4096, "server.max_queued_requests": 100})
    ids = llm.tokenize(PROMPTS[0])
    params = SamplingParams(temperature=0.8, max_tokens=48, seed=1)
    llm.engine.abort(llm.engine.add_request(ids, params).request_id)  # first use imports modules
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    reqs = [llm.engine.add_request(ids, params) for _ in range(64)]
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    per_request = grown / len(reqs)
    assert per_request < 8 * 1024, per_request  # a context-sized int64 array alone would be 32 KiB
    for r in reqs[1:]:
        llm.engine.abort(r.request_id)
    llm.engine.run_until_done()
    assert len(reqs[0].completion.token_ids) == 48  # grew past its first capacity as it generated


def test_samplers_sharing_scratch_buffers_draw_what_lone_samplers_draw():
    import numpy as np

    from dualpath.sampling.sampler import Sampler, SamplerScratch

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(40, 300)).astype(np.float32)
    kinds = [SamplingParams(temperature=0.9, top_p=0.8, seed=3), SamplingParams(temperature=1.2, min_p=0.05, seed=4),
             SamplingParams(temperature=0.7, top_k=20, presence_penalty=0.5, frequency_penalty=0.2, seed=5)]
    scratch = SamplerScratch(300)
    shared = [Sampler(p, 300, scratch) for p in kinds]
    alone = [Sampler(p, 300) for p in kinds]
    for row in rows:  # interleaved, as the engine samples its requests
        assert [s.sample(row) for s in shared] == [s.sample(row) for s in alone]
    with pytest.raises(ValueError, match="scratch buffers of 300 entries for a vocabulary of 301"):
        Sampler(kinds[0], 301, scratch)


def test_a_fork_whose_first_sample_fails_ends_alone_and_holds_no_slot(gguf_path, solo):
    from dualpath.errors import InternalError

    llm = make_llm(gguf_path, **{"runtime.max_num_seqs": 3})
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    errors = []
    sink = lambda d, e: e and errors.append(e)  # noqa: E731
    parent = engine.add_request(llm.tokenize(PROMPTS[2]), params, sink=sink, fork_sinks=[sink, sink])

    def broken(*args):  # fault injection: the first fork cannot sample
        raise ValueError("injected sampler failure")

    parent.forks[0].sampler.sample = broken
    engine.run_until_done()
    assert len(errors) == 1 and isinstance(errors[0], InternalError)
    assert parent.forks[0].status is Status.FINISHED and parent.forks[0].completion is None
    assert parent.completion.token_ids == parent.forks[1].completion.token_ids == solo[PROMPTS[2]][:24]
    assert engine.scheduler.num_seqs() == 0 and not llm.runner.cache.seqs
    llm.runner.cache.check_invariants()


def test_a_request_whose_end_fails_gets_the_error_alone(gguf_path, solo):
    from dualpath.errors import InternalError

    llm, engine, errors, bad, good = bad_and_good(gguf_path, 16)

    def broken(flush):  # fault injection: the text stream cannot finish
        raise UnicodeError("injected")

    bad.stream.finish = broken
    engine.run_until_done()
    assert len(errors) == 1 and isinstance(errors[0], InternalError) and bad.completion is None
    assert good.completion.token_ids == solo[PROMPTS[1]][:16]
    assert engine.scheduler.preemptions == 0 and not llm.runner.cache.seqs


def test_the_runner_never_holds_the_cache_and_no_sequence_outlives_its_work(gguf_path):
    """The engine builds the cache and the scheduler; the runner gets the arena's memory
    and the step's arrays. One-sequence work (warm-up, forward) opens and closes its own
    sequence through the scheduler: no phantom sequence is left in the cache."""
    from dualpath.cache.manager import KVCacheManager

    llm = make_llm(gguf_path)
    runner = llm.engine.runner
    held = [vars(runner), vars(runner.buffers)] + [vars(b) for b in runner._bindings.values()]
    assert not any(isinstance(v, KVCacheManager) for d in held for v in d.values())
    assert not llm.cache.seqs  # nothing started at load
    llm.runner.warm_up()
    assert not llm.cache.seqs
    llm.runner.forward(llm.tokenize("Once upon a time"))
    assert set(llm.cache.seqs) == {llm.runner.seq_id}
    llm.runner.reset()
    assert not llm.cache.seqs
    llm.cache.check_invariants()


def test_prompts_filling_more_than_the_context_in_one_step_run(tmp_path):
    """Three 300-token prompts on a 512-position model at the default batch budget (the prefill
    chunk, 512, plus max_num_seqs): a step never holds more tokens than the RoPE tables have
    rows (ONNX Runtime's RotaryEmbedding refuses it), so every request ends as it does alone
    instead of failing inside the engine."""
    from dualpath.models.synth import synth_gguf

    llm = dualpath.LLM(synth_gguf(tmp_path / "qwen3-tiny.gguf", "qwen3-tiny", "F32"))
    assert llm.spec.config.context_length == 512
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, llm.spec.config.vocab_size, 300)] for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=6)
    alone = [llm.generate(p, params).token_ids for p in prompts]
    engine = llm.engine
    reqs = [engine.add_request(p, params) for p in prompts]
    engine.run_until_done()
    assert [r.completion.finish_reason for r in reqs] == ["length"] * 3
    assert [r.completion.token_ids for r in reqs] == alone
    assert engine.metrics.retried_requests == 0  # no step failed and was recomputed
    vectors = asyncio.run(engine.embed(prompts, "mean"))  # an embedding is not retried
    assert all(v is not None and v.shape == (llm.spec.config.dim,) for v in vectors)
