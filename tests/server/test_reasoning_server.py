"""Reasoning through the OpenAI-compatible server, read by the real ``openai`` client:
``reasoning_content`` beside the content, whole and streamed (the markers arrive cut
across tokens), the thinking budget from ``reasoning_budget``, ``reasoning_effort`` and
the config, ``chat_template_kwargs``, and a 400 naming the field for each bad value."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from test_server import KEY, LiveServer  # noqa: E402

import dualpath  # noqa: E402
from dualpath import SamplingParams  # noqa: E402
from dualpath.tokenizer.reasoning import FORCED_CLOSE  # noqa: E402
from tests_shared import THINK_PROMPT, THINK_TEMPLATE, write_thinking_gguf  # noqa: E402

MODEL = "thinker"


@pytest.fixture(scope="module")
def live(gguf_path, tmp_path_factory):
    path = write_thinking_gguf(gguf_path, tmp_path_factory.mktemp("think") / "think.gguf", THINK_TEMPLATE)
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 256, "runtime.max_num_seqs": 4,
                                      "server.api_key": KEY, "server.model_name": MODEL,
                                      "reasoning.budget_tokens": 12, "reasoning.low_tokens": 3,
                                      "reasoning.medium_tokens": 7})
    srv = LiveServer(dualpath.LLM(path, cfg))
    yield srv
    srv.stop()


def _ask(live, stream=False, **extra):
    return live.client().chat.completions.create(model=MODEL, messages=THINK_PROMPT, max_tokens=48,
                                                 temperature=0, stream=stream, extra_body=extra or None)


def _thought_tokens(live, budget: int) -> None:
    """The library's reply under ``budget``: its first ``budget`` tokens think, then the close."""
    c = live.llm.chat(THINK_PROMPT, SamplingParams(temperature=0, max_tokens=48, reasoning_budget=budget))
    close = live.llm.tokenizer.encode(FORCED_CLOSE, add_bos=False, parse_special=True)
    assert list(c.token_ids[budget:budget + len(close)]) == close
    return c


@pytest.mark.parametrize("fields,budget", [({}, 12), ({"reasoning_budget": 5}, 5),
                                           ({"reasoning_effort": "low"}, 3), ({"reasoning_effort": "medium"}, 7),
                                           ({"reasoning_effort": "low", "reasoning_budget": 9}, 9)])
def test_the_thinking_comes_back_apart_within_its_budget(live, fields, budget):
    ref = _thought_tokens(live, budget)
    c = _ask(live, **fields)
    message = c.choices[0].message
    assert message.reasoning_content == ref.reasoning_content and message.reasoning_content
    assert message.content == ref.text and message.content  # the answer follows the forced close
    assert "<think>" not in message.content and "</think>" not in message.content
    assert c.usage.completion_tokens == len(ref.token_ids)


def test_streamed_deltas_add_up_to_the_whole_with_the_markers_cut_across_tokens(live):
    whole = _ask(live, reasoning_budget=6).choices[0].message
    close = live.llm.tokenizer.encode(FORCED_CLOSE, add_bos=False, parse_special=True)
    assert len(close) > 5  # "</think>" is several tokens of this vocabulary: each arrives in its own chunk
    chunks = list(_ask(live, stream=True, reasoning_budget=6))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    thinking = [d.reasoning_content for d in deltas if getattr(d, "reasoning_content", None)]
    answer = [d.content for d in deltas if d.content]
    assert "".join(thinking) == whole.reasoning_content and len(thinking) > 1
    assert "".join(answer) == whole.content
    assert not any("<" in piece for piece in thinking + answer)  # no piece of a marker slipped out
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_answer:])
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_budget_of_zero_or_enable_thinking_false_gives_no_thinking(live):
    for extra in ({"reasoning_budget": 0}, {"chat_template_kwargs": {"enable_thinking": False}}):
        message = _ask(live, **extra).choices[0].message
        assert getattr(message, "reasoning_content", None) is None and message.content, extra
    # the template opens the thinking anyway: a budget of 0 closes it before its first token
    message = _ask(live, reasoning_budget=0, chat_template_kwargs={"enable_thinking": True}).choices[0].message
    assert message.reasoning_content == "" and message.content


def test_reasoning_format_none_leaves_the_thinking_in_the_content(live):
    message = _ask(live, reasoning_format="none", reasoning_budget=4).choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    thought, answer = message.content.split("</think>")
    ref = _thought_tokens(live, 4)
    assert thought.strip() == ref.reasoning_content and answer.lstrip() == ref.text
    streamed = list(_ask(live, stream=True, reasoning_format="none", reasoning_budget=4))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == message.content


def test_several_choices_each_split_their_own_reply(live):
    c = live.client().chat.completions.create(model=MODEL, messages=THINK_PROMPT, max_tokens=24, n=2, seed=3,
                                              extra_body={"reasoning_budget": 4})
    for choice in c.choices:
        assert choice.message.reasoning_content and "</think>" not in choice.message.content


@pytest.mark.parametrize("field,value", [("reasoning_budget", "many"), ("reasoning_budget", -2),
                                         ("reasoning_budget", True), ("reasoning_budget", 1 << 30),
                                         ("reasoning_effort", "extreme"), ("reasoning_effort", 3),
                                         ("reasoning_format", "html"), ("chat_template_kwargs", "on"),
                                         ("chat_template_kwargs", {"enable_thinking": "no"})])
def test_a_bad_reasoning_value_is_a_400_naming_its_field(live, field, value):
    r = httpx.post(live.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "messages": THINK_PROMPT, "max_tokens": 4, field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"], error


def test_an_earlier_replys_thinking_reaches_the_template(live):
    from dualpath.server.parsing import chat_ids

    messages = THINK_PROMPT + [{"role": "assistant", "content": "Hi.", "reasoning_content": "greet"},
                               {"role": "user", "content": "Again"}]
    ids, _ = chat_ids(live.llm, messages)
    assert "<think>greet</think>Hi." in live.llm.detokenize(ids)
    r = httpx.post(live.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": messages})
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["usage"]["prompt_tokens"] == len(ids)


def test_a_reply_held_to_a_grammar_is_not_thinking_and_no_budget_forces_a_marker_into_it(live):
    pytest.importorskip("llguidance")
    fmt = {"type": "json_object"}
    bounded = _ask(live, response_format=fmt, reasoning_budget=2).choices[0].message
    free = _ask(live, response_format=fmt).choices[0].message
    assert getattr(bounded, "reasoning_content", None) is None and bounded.content.lstrip().startswith("{")
    assert bounded.content == free.content and "</think>" not in bounded.content
