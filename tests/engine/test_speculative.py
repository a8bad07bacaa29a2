"""Speculative decoding (prompt lookup): the output is the output without it, token for
token, greedy or sampled, alone or batched; rolled-back proposals leave the cache whole."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import dualpath
from dualpath import SamplingParams
from dualpath.engine.speculative import NgramProposer
from tests_shared import models_dir_path

GGUF = models_dir_path() / "stories260K.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(), reason="test model not found (set DUALPATH_TEST_MODELS)")

# Text that repeats itself, so that proposals are made (and some are right).
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside. "
          "Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time")


def _llm(speculative="ngram", **more):
    overrides = {"runtime.max_context_tokens": 512, "runtime.speculative": speculative, **more}
    return dualpath.LLM(GGUF, dualpath.load_config(None, overrides))


PATHS = {"random": {"kv_cache.path_mode": "random"},
         "sequential": {"kv_cache.seq_path_threshold": 16}}


@pytest.mark.parametrize("kv_dtype", ["f16", "q8", "f32"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_greedy_output_is_plain_greedy_output(kv_dtype, path):
    more = {"kv_cache.kv_dtype": kv_dtype, **PATHS[path]}
    plain, spec = _llm("off", **more), _llm(**more)
    prompts = [PROMPT, "One day, Tom went to the park. One day, Tom went to the", "The cat sat on the mat."]
    for p in prompts:
        params = SamplingParams(temperature=0, max_tokens=120)
        assert spec.generate(p, params).token_ids == plain.generate(p, params).token_ids
    m = spec.engine.metrics
    assert m.proposed_tokens > 0 and 0 < m.accepted_tokens < m.proposed_tokens  # both outcomes ran
    spec.runner.cache.check_invariants()


def test_sampled_output_with_a_seed_is_the_plain_output():
    """A proposal is kept exactly when the sample equals it: the random stream is used as
    plain decoding uses it, so a seed gives the same text."""
    plain, spec = _llm("off"), _llm()
    for seed in range(6):
        params = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, max_tokens=80, seed=seed,
                                repetition_penalty=1.1)
        assert spec.generate(PROMPT, params).token_ids == plain.generate(PROMPT, params).token_ids
    assert spec.engine.metrics.accepted_tokens > 0


def test_samples_keep_the_target_distribution():
    """Chi-square: the third token, sampled from the row after a kept proposal (the second
    token's proposal is checked on the first row of that step), follows the model's
    distribution there."""
    spec = _llm()
    free = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    thirds: dict[tuple, list[int]] = {}
    for seed in range(700):
        c = spec.generate(PROMPT, SamplingParams(max_tokens=3, seed=seed, **free))
        thirds.setdefault(c.token_ids[:2], []).append(c.token_ids[2])
    assert spec.engine.metrics.accepted_tokens > 100  # most thirds came from verified rows
    head = max(thirds, key=lambda k: len(thirds[k]))
    got = thirds[head]
    top = spec.generate(spec.tokenize(PROMPT) + list(head),
                        SamplingParams(max_tokens=1, logprobs=20, **free)).logprobs[0][2]
    expected = {tok: math.exp(lp) * len(got) for tok, lp in top}
    bins = [t for t, e in expected.items() if e >= 5]
    obs = [sum(1 for x in got if x == t) for t in bins] + [sum(1 for x in got if x not in bins)]
    exp = [expected[t] for t in bins] + [len(got) - sum(expected[t] for t in bins)]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    dof = len(obs) - 1
    # About the 0.999 quantile of chi-square: a fair sampler fails this once in a thousand runs.
    limit = dof + 3.09 * math.sqrt(2 * dof) + 3 if dof else 10.8
    assert len(got) >= 100 and chi2 < limit, (chi2, dof, obs, exp)


def test_batched_requests_with_and_without_proposals_match_their_lone_runs():
    alone_spec, alone_plain = _llm(), _llm("off")
    prompts = [PROMPT, "Tom had a red ball. Tom had a red", "The sun was hot.", PROMPT + " there was"]
    params = SamplingParams(temperature=0, max_tokens=60)
    want = [alone_plain.generate(p, params).token_ids for p in prompts]
    assert [alone_spec.generate(p, params).token_ids for p in prompts] == want
    llm = _llm()
    gens = [llm.stream(p, params) for p in prompts]
    llm.engine.speculative_tokens = 0  # this one is added without proposals
    gens.append(llm.stream(prompts[0], params))
    llm.engine.run_until_done()
    outs = []
    for g in gens:
        for _ in g:
            pass
        outs.append(g.completion.token_ids)
    assert outs == want + [want[0]]
    llm.runner.cache.check_invariants()


def test_n_samples_stop_strings_and_max_tokens_hold():
    spec, plain = _llm(), _llm("off")
    params = SamplingParams(temperature=0, max_tokens=37, stop=("Lily. She",))
    a, b = spec.generate(PROMPT, params), plain.generate(PROMPT, params)
    assert (a.text, a.finish_reason, a.token_ids) == (b.text, b.finish_reason, b.token_ids)
    params = SamplingParams(temperature=0, max_tokens=37)
    a = spec.generate(PROMPT, params)
    assert len(a.token_ids) == 37 and a.finish_reason == "length"


def test_rollback_frees_every_rejected_page():
    llm = _llm(**{"kv_cache.page_tokens": 4, "runtime.speculative_tokens": 16})
    cache = llm.runner.cache
    free0, seqs0 = cache.free_page_count(), cache.num_sequences
    for p in (PROMPT, "A dog ran. A dog ran. A cat"):
        llm.generate(p, SamplingParams(temperature=0, max_tokens=90))
        cache.check_invariants()
    assert llm.engine.metrics.proposed_tokens > llm.engine.metrics.accepted_tokens
    assert cache.num_sequences == seqs0  # the runner's own scratch sequence, if any
    cache.evict_all()
    assert cache.free_page_count() == free0


def test_the_proposer_finds_the_latest_longest_match_and_backs_off():
    ids = np.array([5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 6, 7], np.int64)
    p = NgramProposer(4)
    # Suffix [6, 7]: latest earlier occurrence ends at 9 (then 2, 3); [5, 6, 7] would need 5 before.
    assert p.propose(ids, len(ids), 4) == [2, 3, 6, 7]
    assert NgramProposer(4).propose(ids, 9, 4) == [8, 9, 1, 5]  # suffix [5, 6, 7] seen at 0..3
    assert NgramProposer(4).propose(ids, 9, 2) == [8, 9]
    assert NgramProposer(4).propose(np.array([1, 2, 3], np.int64), 3, 4) == []
    p.update(4, 0)
    p.update(1, 0)  # two misses in a row: a rest from proposing
    assert p.cooldown > 0 and p.propose(ids, len(ids), 4) == []
    p.cooldown = 0
    p.update(1, 1)
    assert p.k == 2  # kept everything: it doubles


def test_a_grammar_cuts_proposals_it_refuses():
    """Structured output: the mask makes the sample refuse a proposal the grammar does not
    allow, so the step's output stops there; the text is the plain run's and it parses."""
    pytest.importorskip("llguidance", reason="structured output needs llguidance (the [structured] extra)")
    import json

    from dualpath.sampling.grammar import GrammarCompiler, GrammarRequest

    outs = []
    for mode in ("off", "ngram"):
        llm = _llm(mode)
        grammar = GrammarCompiler(llm.tokenizer).compile(GrammarRequest("json_object", {"type": "object"}))
        # The prompt repeats text a JSON object cannot hold: proposals from it are refused.
        gen = llm.engine.add_request(llm.tokenize(PROMPT + ' {"name": "Lily", "age": 3} ' + PROMPT),
                                     SamplingParams(temperature=0, max_tokens=60), grammar=grammar)
        llm.engine.run_until_done()
        outs.append(gen.completion)
    assert outs[1].token_ids == outs[0].token_ids
    if outs[1].finish_reason == "stop":
        json.loads(outs[1].text)


@pytest.mark.parametrize("kv_dtype", ["f16", "q8"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_draft_model_output_is_plain_output(kv_dtype, path):
    """A draft model (here the target itself: every greedy proposal right, sampled ones
    often wrong) changes nothing in the output, and gives its sequences back."""
    more = {"kv_cache.kv_dtype": kv_dtype, **PATHS[path]}
    plain = _llm("off", **more)
    spec = _llm("draft", **{"runtime.draft_model": str(GGUF), **more})
    for temp in (0, 0.9):
        for p in (PROMPT, "The cat sat on the mat."):
            params = SamplingParams(temperature=temp, max_tokens=80, seed=5)
            assert spec.generate(p, params).token_ids == plain.generate(p, params).token_ids
    m = spec.engine.metrics
    assert m.accepted_tokens > 0.5 * m.proposed_tokens > 0
    draft_cache = spec.engine.draft.driver.cache
    draft_cache.check_invariants()
    assert draft_cache.num_sequences == 0  # the requests' sequences are freed


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path):
    from dualpath.errors import ConfigError
    from dualpath.models.synth import synth_gguf

    other = synth_gguf(tmp_path / "other.gguf", "llama3-tiny")
    with pytest.raises(ConfigError, match=r"runtime.draft_model=.*its vocabulary \(2048 tokens\) is not this "
                                          r"model's \(512 tokens"):
        _llm("draft", **{"runtime.draft_model": other})
    with pytest.raises(ConfigError, match="runtime.speculative=draft needs runtime.draft_model"):
        _llm("draft")


GEMMA = os.environ.get("DUALPATH_GEMMA3_270M") or os.path.expanduser(
    "~/.cache/dualpath-test-models/gemma-3-270m-q4_k_m.gguf")


@pytest.mark.skipif(not os.path.isfile(GEMMA), reason="Gemma 3 270M not found: fetch it with "
                    "../shared/models/get_gemma3_270m.sh (or set DUALPATH_GEMMA3_270M)")
def test_greedy_output_is_plain_on_a_quantized_file():
    """Int8 activations turn a last-bit difference into a visible one: each proposal row
    must attend as a one-row decode step does (with the prefill kernel this story parted
    from plain decoding at token 60)."""
    from dualpath.bench.spec import prompts

    cfg = {"runtime.max_context_tokens": 1024, "runtime.num_threads": 2}
    plain = dualpath.LLM(GEMMA, dualpath.load_config(None, cfg))
    ids = prompts(plain.tokenizer, 400)["free"]
    params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    want = plain.generate(ids, params).token_ids
    del plain
    spec = dualpath.LLM(GEMMA, dualpath.load_config(None, {**cfg, "runtime.speculative": "ngram"}))
    assert spec.generate(ids, params).token_ids == want
    assert spec.engine.metrics.accepted_tokens > 0
