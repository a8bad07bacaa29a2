"""A thinking model through ``LLM.chat`` and ``Chat``, on the real engine: the thinking
comes back apart, and a budget of N closes it after N tokens (the closing marker
written for the model), with the answer after it.

stories260K stands in for a model that thinks: under ``THINK_TEMPLATE`` its generation
prompt opens ``<think>`` (as Qwen3's does), and with ``marker_tokens`` the model writes a
single ``<think>`` token itself (tests_shared.THINK_TOKEN)."""

from __future__ import annotations

import pytest

import dualpath
from dualpath import SamplingParams
from dualpath.chat import Chat, Thinking
from dualpath.tokenizer.reasoning import FORCED_CLOSE
from tests_shared import PLAIN_TEMPLATE, THINK_PROMPT, THINK_TEMPLATE, THINK_TOKEN, write_thinking_gguf

CONFIG = {"runtime.max_context_tokens": 256}


@pytest.fixture(scope="module")
def thinking_llm(gguf_path, tmp_path_factory):
    path = write_thinking_gguf(gguf_path, tmp_path_factory.mktemp("think") / "think.gguf", THINK_TEMPLATE)
    return dualpath.LLM(path, dualpath.load_config(None, CONFIG))


@pytest.fixture(scope="module")
def marker_llm(gguf_path, tmp_path_factory):
    path = write_thinking_gguf(gguf_path, tmp_path_factory.mktemp("mark") / "mark.gguf", PLAIN_TEMPLATE,
                               marker_tokens=True)
    return dualpath.LLM(path, dualpath.load_config(None, CONFIG))


def _greedy(max_tokens=40, budget=None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, reasoning_budget=budget)


def _close(llm) -> list[int]:
    return llm.tokenizer.encode(FORCED_CLOSE, add_bos=False, parse_special=True)


def test_a_reply_inside_an_opened_thinking_comes_back_as_reasoning(thinking_llm):
    raw = thinking_llm.chat(THINK_PROMPT, _greedy(), reasoning_format="none")
    c = thinking_llm.chat(THINK_PROMPT, _greedy())
    assert raw.reasoning_content is None and raw.text.strip()
    assert c.reasoning_content == raw.text.strip()  # never closed within 40 tokens: all of it is thinking
    assert c.text == "" and c.token_ids == raw.token_ids


@pytest.mark.parametrize("budget", [1, 5, 17])
def test_with_a_budget_of_n_the_thinking_ends_after_n_tokens_and_an_answer_follows(thinking_llm, budget):
    close = _close(thinking_llm)
    c = thinking_llm.chat(THINK_PROMPT, _greedy(60, budget))
    ids = list(c.token_ids)
    assert ids[budget:budget + len(close)] == close  # written for the model once N tokens were thought
    assert c.reasoning_content == thinking_llm.detokenize(ids[:budget]).strip()
    assert c.text.strip() and "</think>" not in c.text
    free = thinking_llm.chat(THINK_PROMPT, _greedy(60))
    assert list(free.token_ids[:budget]) == ids[:budget]  # the thinking itself is the model's own
    raw = thinking_llm.chat(THINK_PROMPT, _greedy(60, budget), reasoning_format="none")
    assert raw.text.count("</think>") == 1 and raw.text.split("</think>")[1].lstrip() == c.text


def test_a_budget_of_zero_turns_thinking_off_through_the_template(thinking_llm):
    c = thinking_llm.chat(THINK_PROMPT, _greedy(20, 0))
    assert c.reasoning_content is None and c.text  # enable_thinking false: the template closed it empty
    off = thinking_llm.chat(THINK_PROMPT, _greedy(20), chat_template_kwargs={"enable_thinking": False})
    assert off.text == c.text
    # the caller keeps the thinking open: the budget closes it before any token of it
    forced = thinking_llm.chat(THINK_PROMPT, _greedy(20, 0), chat_template_kwargs={"enable_thinking": True})
    assert list(forced.token_ids[:len(_close(thinking_llm))]) == _close(thinking_llm)
    assert forced.reasoning_content == "" and forced.text


def test_a_model_that_opens_its_thinking_with_a_token_of_its_own_is_held_to_the_budget(marker_llm):
    free = marker_llm.chat(THINK_PROMPT, _greedy())
    assert free.token_ids[0] == THINK_TOKEN and free.text == ""
    assert free.reasoning_content == marker_llm.detokenize(free.token_ids[1:]).strip()
    c = marker_llm.chat(THINK_PROMPT, _greedy(40, 3))
    close = _close(marker_llm)
    assert len(close) < len(FORCED_CLOSE)  # the marker is one token of this vocabulary
    assert list(c.token_ids[4:4 + len(close)]) == close  # <think>, three tokens of thinking, the close
    assert c.reasoning_content == marker_llm.detokenize(c.token_ids[1:4]).strip() and c.text.strip()


def test_a_reply_that_does_not_think_is_untouched_by_a_budget(gguf_path, tmp_path):
    path = write_thinking_gguf(gguf_path, tmp_path / "plain.gguf", PLAIN_TEMPLATE)
    llm = dualpath.LLM(path, dualpath.load_config(None, CONFIG))
    free, bounded = llm.chat(THINK_PROMPT, _greedy()), llm.chat(THINK_PROMPT, _greedy(40, 2))
    assert bounded.token_ids == free.token_ids and bounded.reasoning_content is None and bounded.text
    assert llm.stream(llm.chat_prompt_ids(THINK_PROMPT), _greedy()).request.sampler.budget is None


def test_the_config_default_budget_applies_when_the_params_set_none(gguf_path, tmp_path):
    path = write_thinking_gguf(gguf_path, tmp_path / "think.gguf", THINK_TEMPLATE)
    llm = dualpath.LLM(path, dualpath.load_config(None, {**CONFIG, "reasoning.budget_tokens": 4}))
    c = llm.chat(THINK_PROMPT, _greedy())
    assert list(c.token_ids[4:4 + len(_close(llm))]) == _close(llm)
    with pytest.raises(ValueError, match="reasoning_format='html' must be one of none, deepseek, auto"):
        llm.chat(THINK_PROMPT, _greedy(), reasoning_format="html")


def test_chat_yields_the_thinking_apart_and_keeps_only_the_answer(thinking_llm):
    chat = Chat(thinking_llm, params=_greedy(40, 6))
    pieces = list(chat.send("Once upon a time"))
    ref = thinking_llm.chat(THINK_PROMPT, _greedy(40, 6))
    assert "".join(p for p in pieces if isinstance(p, Thinking)) == ref.reasoning_content
    assert "".join(p for p in pieces if not isinstance(p, Thinking)) == ref.text
    assert chat.messages[-1] == {"role": "assistant", "content": ref.text}
    chat.think(False)
    pieces = list(chat.send("The end"))
    assert pieces and not any(isinstance(p, Thinking) for p in pieces)
    assert chat.messages[-1]["content"] == "".join(pieces)


def _chat_argv(llm, *extra):
    import sys

    return [sys.executable, "-m", "dualpath.cli", "chat", "-m", str(llm.spec.path), "-n", "30", "--temperature",
            "0", "--ctx-size", "256", "--reasoning-budget", "4", *extra]


def test_dualpath_chat_in_a_terminal_dims_the_thinking_and_think_off_stops_it(thinking_llm):
    from dualpath.cli.generate import DIM, PLAIN

    from .test_chat import Terminal

    term = Terminal(_chat_argv(thinking_llm))
    try:
        at = term.expect(">>> ")
        term.send("Once upon a time\r")
        end = term.expect(">>> ", start=at)
        reply = term.out[at:end]
        assert DIM in reply and PLAIN in reply, reply
        thought = reply[reply.index(DIM) + len(DIM):reply.index(PLAIN)]
        answer = reply[reply.index(PLAIN) + len(PLAIN):]
        assert thought.strip() and answer.strip() and "think>" not in reply
        term.send("/think off\r")
        at = term.expect("(thinking off)", 30, end)
        term.send("Once upon a time\r")
        end = term.expect(">>> ", start=at)
        assert DIM not in term.out[at:end] and term.out[at:end].strip()
    finally:
        term.close()


def test_dualpath_chat_piped_prints_the_answers_alone(thinking_llm):
    import subprocess

    r = subprocess.run(_chat_argv(thinking_llm), input="Once upon a time\nThe end\n", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) >= 2 and "\x1b[" not in r.stdout and "think>" not in r.stdout
    ref = thinking_llm.chat(THINK_PROMPT, _greedy(30, 4))
    assert ref.reasoning_content not in r.stdout


def test_dualpath_chat_with_reasoning_format_none_prints_the_thinking_as_text(thinking_llm):
    import subprocess

    r = subprocess.run(_chat_argv(thinking_llm, "--reasoning-format", "none"), input="Once upon a time\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "</think>" in r.stdout and "\x1b[" not in r.stdout


def test_a_bad_budget_on_the_command_line_names_the_key(thinking_llm):
    import subprocess

    r = subprocess.run(_chat_argv(thinking_llm, "--reasoning-budget", "-5"), input="Hi\n", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "reasoning.budget_tokens=-5" in r.stderr, r.stderr


def test_speculative_decoding_keeps_the_budgets_tokens(gguf_path, tmp_path):
    path = write_thinking_gguf(gguf_path, tmp_path / "think.gguf", THINK_TEMPLATE)
    spec = dualpath.LLM(path, dualpath.load_config(None, {**CONFIG, "runtime.speculative": "ngram"}))
    plain = dualpath.LLM(path, dualpath.load_config(None, CONFIG))
    for budget in (2, 9):
        a, b = spec.chat(THINK_PROMPT, _greedy(60, budget)), plain.chat(THINK_PROMPT, _greedy(60, budget))
        assert a.token_ids == b.token_ids and a.reasoning_content == b.reasoning_content and a.text == b.text
    assert spec.engine.metrics.proposed_tokens > 0  # proposals were checked, forced tokens among the rows
