"""LLM.generate / stream / chat on stories260K: seeds, stops, limits, streaming, prefix reuse, errors."""

from __future__ import annotations

import pytest

import dualpath
from dualpath import ChatTemplateError, PromptTooLongError, SamplingParams, SamplingParamsError
from tests_shared import write_gguf_with_chat_template

ONCE = "Once upon a time"
ZOE = "Zoë saw a café 🐶"
KV_F32 = {"kv_cache.kv_dtype": "f32"}
GREEDY_40 = SamplingParams(temperature=0, max_tokens=40)
# ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
# ('outside' is 5 tokens: ▁ out s id e; 'girl' is 3: ▁g ir l)


@pytest.fixture(scope="module")
def llm(gguf_path) -> dualpath.LLM:
    """One LLM for the module, default config (f16 KV)."""
    return dualpath.LLM(gguf_path)


@pytest.fixture(scope="module")
def greedy_once(llm):
    """The greedy 40-token continuation of ONCE, without stop strings."""
    return llm.generate(ONCE, GREEDY_40)


def stream_all(llm, prompt, params):
    gen = llm.stream(prompt, params)
    deltas = list(gen)
    return deltas, gen.completion


# -- seeds ----------------------------------------------------------------------

def test_same_seed_gives_same_tokens(llm):
    params = SamplingParams(temperature=1.0, max_tokens=48, seed=1234)
    first = llm.generate(ONCE, params)
    llm.generate("An unrelated prompt in between", SamplingParams(temperature=1.0, max_tokens=5, seed=9))
    second = llm.generate(ONCE, params)
    assert first.token_ids == second.token_ids and first.text == second.text
    assert len(first.token_ids) > 0


def test_different_seeds_give_different_tokens(llm):
    runs = {llm.generate(ONCE, SamplingParams(temperature=1.0, max_tokens=48, seed=s)).token_ids for s in range(4)}
    assert len(runs) == 4


# -- stop strings -----------------------------------------------------------------

def test_stop_string_truncates_before_it_and_reports_it(llm, greedy_once):
    full = greedy_once.text
    c = llm.generate(ONCE, SamplingParams(temperature=0, max_tokens=40, stop=["outside"]))
    assert c.text == full[:full.index("outside")] == ", there was a little girl named Lily. She loved to play "
    assert (c.finish_reason, c.stop_reason) == ("stop", "outside")


def test_earliest_of_several_stop_strings_wins(llm, greedy_once):
    c = llm.generate(ONCE, SamplingParams(temperature=0, max_tokens=40, stop=("park", "girl", "zebra")))
    assert (c.text, c.finish_reason, c.stop_reason) == (", there was a little ", "stop", "girl")


@pytest.mark.parametrize("stop", ["outside", "girl", "Lily.", "."])
def test_streamed_deltas_never_contain_the_stop_string_or_a_part_of_it(llm, greedy_once, stop):
    deltas, c = stream_all(llm, ONCE, SamplingParams(temperature=0, max_tokens=40, stop=[stop]))
    expected = greedy_once.text[:greedy_once.text.index(stop)]
    assert "".join(deltas) == c.text == expected  # nothing of the stop string was emitted, even held back
    assert all(stop not in d for d in deltas)
    assert all(deltas)  # no empty deltas
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)


def test_held_back_text_is_flushed_when_a_stop_string_never_matches(llm, greedy_once):
    deltas, c = stream_all(llm, ONCE, SamplingParams(temperature=0, max_tokens=40, stop=["a long stop string"]))
    assert "".join(deltas) == c.text == greedy_once.text
    assert c.token_ids == greedy_once.token_ids
    assert (c.finish_reason, c.stop_reason) == ("length", None)


# -- limits ----------------------------------------------------------------------

def test_max_tokens_ends_with_length(llm):
    c = llm.generate(ONCE, SamplingParams(temperature=0, max_tokens=7))
    assert (len(c.token_ids), c.finish_reason, c.stop_reason) == (7, "length", None)


def test_full_context_ends_with_context_full_and_matches_the_unbounded_run(make_llm, reference_runs_by_name):
    reference_run = reference_runs_by_name["greedy_once_upon_a_time"]
    small = make_llm("gguf", {"runtime.max_context_tokens": 24, **KV_F32})
    assert small.context_tokens == 24
    prompt = reference_run["prompt_ids"]
    c = small.generate(prompt, SamplingParams(temperature=0, max_tokens=500))
    assert c.finish_reason == "context_full"
    assert len(prompt) + len(c.token_ids) == 24
    assert list(c.token_ids) == reference_run["generated_ids"][:24 - len(prompt)]
    # the LLM is still usable, and a prompt that leaves one free position generates exactly one token
    again = small.generate(prompt + list(c.token_ids[:18]), SamplingParams(temperature=0, max_tokens=500))
    assert (again.token_ids, again.finish_reason) == (c.token_ids[18:19], "context_full")


def test_prompt_longer_than_context_raises_naming_both_numbers(make_llm):
    small = make_llm("gguf", {"runtime.max_context_tokens": 24})
    prompt = small.tokenize("One day, a little dog named Max went to the park with his mom. "
                            "They saw a big box with a big box.")
    assert len(prompt) == 37
    with pytest.raises(PromptTooLongError, match=r"37 tokens.*24") as info:
        small.generate(prompt, GREEDY_40)
    assert isinstance(info.value, dualpath.DualPathError)
    with pytest.raises(PromptTooLongError, match=r"24 tokens.*24"):
        small.generate(prompt[:24], GREEDY_40)  # a full context leaves no position to generate into
    assert small.generate(prompt[:23], GREEDY_40).finish_reason == "context_full"


def test_empty_prompt_ids_raise_a_clear_error(llm):
    with pytest.raises(ValueError, match="no tokens"):
        llm.generate([], GREEDY_40)


def test_out_of_vocabulary_prompt_id_raises_naming_it(llm, greedy_once):
    with pytest.raises(ValueError, match=r"512.*0\.\.511"):
        llm.generate([1, 403, 512], GREEDY_40)
    assert llm.generate(ONCE, GREEDY_40).token_ids == greedy_once.token_ids  # state is intact


# -- streaming -------------------------------------------------------------------

@pytest.mark.parametrize("params", [GREEDY_40, SamplingParams(temperature=1.0, max_tokens=64, seed=7)],
                         ids=["greedy", "sampled"])
def test_concatenated_stream_deltas_equal_completion_text(llm, params):
    deltas, c = stream_all(llm, ONCE, params)
    assert "".join(deltas) == c.text and c.text
    assert llm.detokenize(list(c.prompt_token_ids) + list(c.token_ids)) == ONCE + c.text


def test_streaming_after_a_byte_fallback_prompt_never_yields_a_broken_character(llm):
    prompt = llm.tokenize(ZOE)
    assert any(3 <= t < 259 for t in prompt)  # ë and the emoji are spelled with byte tokens
    deltas, c = stream_all(llm, prompt, SamplingParams(temperature=0, max_tokens=64))
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == c.text
    assert llm.detokenize(prompt) + c.text == llm.detokenize(list(prompt) + list(c.token_ids))
    assert c.text.startswith(". Zoom was very small")


def test_abandoned_stream_leaves_the_llm_consistent(llm, greedy_once):
    gen = llm.stream(ONCE, GREEDY_40)
    deltas = iter(gen)
    for _ in range(5):
        next(deltas)
    deltas.close()  # what a consumer breaking out of its loop does
    assert gen.completion.finish_reason == "abort" and len(gen.completion.token_ids) == 5
    assert not llm.engine.has_work()
    assert llm.generate(ONCE, GREEDY_40).token_ids == greedy_once.token_ids


def test_a_dropped_stream_is_aborted(llm, greedy_once):
    gen = llm.stream(ONCE, GREEDY_40)
    next(gen)
    del gen  # never closed, never finished: the engine must not keep running it
    assert not llm.engine.has_work()
    assert llm.generate(ONCE, GREEDY_40).token_ids == greedy_once.token_ids


# -- prefix reuse ----------------------------------------------------------------

def test_shared_prefix_is_reused_and_gives_the_same_ids_as_a_fresh_llm(make_llm):
    # Reuse works a page at a time: page_tokens=4 so these short prompts share pages.
    first, second = "Once upon a time, there was a little girl", "Once upon a time, there was a big dog"
    small_pages = {"kv_cache.page_tokens": 4}
    warm = make_llm("gguf", small_pages)
    warm.generate(first, SamplingParams(temperature=0, max_tokens=20))
    reused = warm.generate(second, SamplingParams(temperature=0, max_tokens=40))
    fresh = make_llm("gguf", small_pages).generate(second, SamplingParams(temperature=0, max_tokens=40))

    common = 0
    a, b = warm.tokenize(first), warm.tokenize(second)
    while a[common] == b[common]:
        common += 1
    assert reused.usage.cached_prompt_tokens == common // 4 * 4 > 0
    assert reused.timings.prefill_tokens == len(b) - common // 4 * 4
    assert fresh.usage.cached_prompt_tokens == 0
    assert reused.token_ids == fresh.token_ids and reused.text == fresh.text


def test_repeating_a_prompt_reuses_its_full_pages_but_recomputes_its_last_token(make_llm):
    warm = make_llm("gguf", {"kv_cache.page_tokens": 2})
    one = warm.generate(ONCE, GREEDY_40)
    two = warm.generate(ONCE, GREEDY_40)
    n = len(two.prompt_token_ids)
    assert two.usage.cached_prompt_tokens == (n - 1) // 2 * 2
    assert two.timings.prefill_tokens == n - (n - 1) // 2 * 2
    assert one.token_ids == two.token_ids


# -- parameters --------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    {"temperature": -0.1}, {"temperature": float("nan")}, {"max_tokens": 0}, {"max_tokens": True},
    {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": 1.5}, {"repetition_penalty": 0.0},
    {"seed": -1}, {"stop": [""]}, {"stop": ["ok", 3]},
], ids=lambda d: "-".join(f"{k}={v!r}" for k, v in d.items()))
def test_bad_sampling_params_raise_naming_the_parameter(bad):
    (name, _), = bad.items()
    with pytest.raises(SamplingParamsError, match=name) as info:
        SamplingParams(**bad)
    assert isinstance(info.value, dualpath.DualPathError)


# -- chat ----------------------------------------------------------------------------

def test_chat_without_a_template_raises_a_clear_error(llm, gguf_path):
    with pytest.raises(ChatTemplateError, match=r"no chat template") as info:
        llm.chat([{"role": "user", "content": "Hi"}], GREEDY_40)
    assert gguf_path.name in str(info.value) and "tokenizer.chat_template" in str(info.value)
    assert str(gguf_path.parent) not in str(info.value)  # no server paths (the server shows this text)


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def chat_llm(gguf_path, tmp_path_factory):
    path = write_gguf_with_chat_template(gguf_path, tmp_path_factory.mktemp("chat") / "stories260K-chat.gguf",
                                         CHAT_TEMPLATE)
    return dualpath.LLM(path, dualpath.load_config(None, KV_F32))


def test_rewritten_gguf_keeps_every_weight_and_adds_the_template(chat_llm, make_llm):
    original = make_llm("gguf", KV_F32)
    assert chat_llm.spec.tokenizer.chat_template == CHAT_TEMPLATE
    assert chat_llm.spec.tokenizer.tokens == original.spec.tokenizer.tokens
    assert chat_llm.generate(ONCE, GREEDY_40).token_ids == original.generate(ONCE, GREEDY_40).token_ids


def test_chat_renders_the_model_template_and_generates(chat_llm):
    messages = [{"role": "user", "content": "Once upon a time"}, {"role": "assistant", "content": "there was"}]
    rendered = chat_llm.apply_chat_template(messages)
    assert rendered == "Once upon a time\nthere was\n"
    c = chat_llm.chat(messages, SamplingParams(temperature=0, max_tokens=16))
    assert c.prompt_token_ids == tuple(chat_llm.tokenize(rendered))  # BOS added once
    assert c.prompt_token_ids[0] == 1 and c.prompt_token_ids.count(1) == 1
    assert c.token_ids == chat_llm.generate(rendered, SamplingParams(temperature=0, max_tokens=16)).token_ids
    assert c.text and c.finish_reason in ("length", "stop")


# -- usage and timings ---------------------------------------------------------------

def test_usage_and_timings_are_filled(make_llm):
    c = make_llm("gguf").generate(ONCE, SamplingParams(temperature=0, max_tokens=32))
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.cached_prompt_tokens) == (5, 32, 0)
    assert c.usage.total_tokens == 37
    t = c.timings
    assert t.prefill_tokens == 5 and t.decode_tokens == 31  # the last token is sampled, not fed back
    assert t.prefill_ms > 0 and t.decode_ms > 0
    assert t.prefill_tokens_per_s > 0 and t.decode_tokens_per_s > 0
