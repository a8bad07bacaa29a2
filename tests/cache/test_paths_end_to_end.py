"""The dual-path cache under the real model: every path gives the same tokens, and a
shared prompt prefix is computed once."""

import json

import pytest

import dualpath
from dualpath import SamplingParams
from dualpath.cache.policy import Path
from tests_shared import assert_golden_ids, models_dir_path

MODELS = models_dir_path()
GGUF = MODELS / "stories260K.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(),
                                reason=f"test model not found in {MODELS} (set DUALPATH_TEST_MODELS)")


def _llm(**dp):
    overrides = {"runtime.max_context_tokens": 1024}
    overrides.update({f"kv_cache.{k}": v for k, v in dp.items()})
    return dualpath.LLM(GGUF, dualpath.load_config(None, overrides))


def _runs():
    return json.loads((MODELS / "reference" / "greedy_token_ids.json").read_text())["runs"]


class CountingRunner:
    """Counts the tokens that really go through the model."""

    def __init__(self, llm):
        self.tokens = 0
        run = llm.runner.run

        def counted(entries):
            self.tokens += sum(len(e.token_ids) for e in entries.seqs)
            return run(entries)

        llm.runner.run = counted


@pytest.mark.parametrize("path_mode", ["dual", "sequential", "random"])
@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_golden_ids_are_identical_on_every_path(path_mode, kv_dtype):
    llm = _llm(path_mode=path_mode, kv_dtype=kv_dtype)
    for run in _runs():
        ids = run["prompt_ids"]
        c = llm.generate(ids, SamplingParams(temperature=0, max_tokens=256 - len(ids) + 1))
        assert_golden_ids(list(c.token_ids), run["generated_ids"], ids, kv_dtype,
                          lambda: _llm(path_mode=path_mode, kv_dtype="f32").runner, run["name"])


def test_q8_ids_are_identical_on_every_path():
    """q8 KV is quantized once, on write, whatever the path: every path reads the same
    int8 rows and scales and gives the same tokens (not run.c's f32 ids: see
    tests/cache/test_q8_end_to_end.py for q8's distance from f16)."""
    seen = {}
    for path_mode in ("dual", "sequential", "random"):
        llm = _llm(path_mode=path_mode, kv_dtype="q8")
        seen[path_mode] = [list(llm.generate(r["prompt_ids"], SamplingParams(
            temperature=0, max_tokens=256 - len(r["prompt_ids"]) + 1)).token_ids) for r in _runs()]
    assert seen["dual"] == seen["sequential"] == seen["random"]


@pytest.mark.parametrize("path_mode", ["dual", "random"])
@pytest.mark.parametrize("kv_dtype", ["f16", "q8"])
def test_shared_300_token_prefix_is_computed_once(path_mode, kv_dtype):
    story = _runs()[0]["generated_ids"] + _runs()[1]["generated_ids"]
    prefix = [1] + story[:299]                         # 300 tokens
    first, second = prefix + story[300:340], prefix + story[400:430]
    llm = _llm(path_mode=path_mode, kv_dtype=kv_dtype)
    counter = CountingRunner(llm)
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm.generate(first, greedy)
    counter.tokens = 0
    gen = llm.stream(second, greedy)
    next(gen)

    page_tokens = llm.config.kv_cache.page_tokens
    shared_pages = 300 // page_tokens
    cache = llm.runner.cache
    seq = cache.seqs[gen.request.seq_id]
    # The second request holds the first request's pages for the shared prefix...
    assert all(cache.pool.page_ref[p] >= 1 and cache.prefix.page_hash[p] is not None for p in seq.pages[:shared_pages])
    list(gen)
    second_out = gen.completion
    assert second_out.usage.cached_prompt_tokens == shared_pages * page_tokens
    # ... and only the rest of its prompt went through the model (+19 decode steps).
    assert counter.tokens == len(second) - shared_pages * page_tokens + 19

    reuse_off = _llm(path_mode="sequential", kv_dtype=kv_dtype)  # the sequential path never reuses prefixes
    reuse_off.generate(first, greedy)
    baseline = reuse_off.generate(second, greedy)
    assert baseline.usage.cached_prompt_tokens == 0
    assert second_out.token_ids == baseline.token_ids


def test_router_sends_long_prefills_to_extents_and_short_ones_to_the_hybrid_path():
    llm = _llm(seq_path_threshold=64, page_tokens=4)
    story = _runs()[0]["generated_ids"]
    gen = llm.stream([1] + story[:40], SamplingParams(temperature=0, max_tokens=2))
    next(gen)
    assert llm.runner.cache.seqs[gen.request.seq_id].path is Path.HYBRID
    list(gen)
    gen = llm.stream([1] + story[100:200], SamplingParams(temperature=0, max_tokens=2))  # no shared prefix
    next(gen)
    seq = llm.runner.cache.seqs[gen.request.seq_id]
    assert seq.path is Path.SEQUENTIAL
    assert len(llm.runner.cache.spans(gen.request.seq_id)) == 1  # one contiguous extent
    list(gen)


def test_low_power_keeps_a_document_below_its_threshold_on_pages():
    # seq_path_threshold 64, low_power's 256: a 101-token prompt is a document for the
    # balanced profile (its own extent) and stays on pages under low_power, with the
    # same greedy output.
    story = _runs()[0]["generated_ids"]
    seen = {}
    for profile in ("balanced", "low_power"):
        overrides = {"runtime.max_context_tokens": 1024, "kv_cache.seq_path_threshold": 64,
                     "kv_cache.page_tokens": 4, "power.profile": profile,
                     "power.low_power_seq_path_threshold": 256}
        llm = dualpath.LLM(GGUF, dualpath.load_config(None, overrides))
        gen = llm.stream([1] + story[100:200], SamplingParams(temperature=0, max_tokens=8))
        next(gen)
        assert llm.runner.cache.path_of(gen.request.seq_id) is gen.request.path
        list(gen)
        seen[profile] = (gen.request.path, gen.completion.token_ids)
    assert seen["balanced"][0] is Path.SEQUENTIAL
    assert seen["low_power"][0] is Path.HYBRID
    assert seen["balanced"][1] == seen["low_power"][1] and len(seen["low_power"][1]) == 8


@pytest.mark.parametrize("kv_dtype", ["f32", "q8"])
def test_migrating_mid_generation_between_paths_does_not_change_the_output(kv_dtype):
    story = _runs()[0]["generated_ids"]
    prompt = [1] + story[:30]
    greedy = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    ref = _llm(kv_dtype=kv_dtype).generate(prompt, greedy)

    llm = _llm(kv_dtype=kv_dtype, page_tokens=4)
    cache = llm.runner.cache
    gen = llm.stream(prompt, greedy)
    for i, _ in enumerate(gen):
        sid = gen.request.seq_id
        if i == 10:
            assert cache.migrate(sid, Path.RANDOM) is True
        if i == 30:
            assert cache.migrate(sid, Path.SEQUENTIAL) is True
            assert len(cache.spans(sid)) == 1
    assert cache.migrations == 2
    assert gen.completion.token_ids == ref.token_ids


def test_long_decode_on_scattered_pages_moves_into_an_extent_past_the_threshold():
    story = _runs()[0]["generated_ids"]
    llm = _llm(kv_dtype="f32", page_tokens=4, seq_path_threshold=40, locality_window=16)
    cache = llm.runner.cache
    # Interleave two sequences page by page so the second one's pages are scattered.
    other = 10_000
    cache.start(other, [])
    gen = llm.stream([1] + story[:8], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    seen = None
    for i, _ in enumerate(gen):
        if i < 30:
            alloc = cache.allocate(other, [5] * 4, Path.RANDOM)  # steal the next pages
            assert alloc
        if gen.request.seq_id is not None:  # still running: how its cache looks now
            seen = (cache.seqs[gen.request.seq_id].path, cache.locality_score(gen.request.seq_id))
    assert cache.migrations >= 1 and seen == (Path.SEQUENTIAL, 1.0)
