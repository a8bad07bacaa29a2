"""The ``openai`` SDK's agent loop against a live server: the model calls a tool, gets its
result, and answers; whole and streamed; ``tool_choice`` auto, none, required and named.

The model is stories260K with a Hermes-format template and ``<tool_call>`` as one token: a
``logit_bias`` on that token makes the story model open a call, and from there the real
engine runs the lazy grammar, the parser and the OpenAI shapes end to end."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from test_server import KEY, LiveServer  # noqa: E402
from tool_templates import HERMES, TOOL_CALL_ID, TOOLS, write_tool_gguf  # noqa: E402

import dualpath  # noqa: E402

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
OPEN_A_CALL = {str(TOOL_CALL_ID): 100}
"""The logit_bias that makes the story model write ``<tool_call>``."""


@pytest.fixture(scope="module")
def live(gguf_path, tmp_path_factory):
    path = write_tool_gguf(gguf_path, tmp_path_factory.mktemp("tools") / "hermes-tools.gguf", HERMES)
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 1024, "runtime.max_num_seqs": 2,
                                      "server.api_key": KEY})
    srv = LiveServer(dualpath.LLM(path, cfg))
    yield srv
    srv.stop()


def ask(live, messages=ASK, **kw):
    kw = {"model": "x", "messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 80, **kw}
    return live.client().chat.completions.create(**kw)


def streamed(live, **kw) -> tuple[str, list[dict], str]:
    """(content, tool calls put together from their pieces, finish_reason) of a streamed answer."""
    content, calls, finish = "", {}, None
    for ev in ask(live, stream=True, **kw):
        for ch in ev.choices:
            content += ch.delta.content or ""
            for piece in ch.delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                if piece.id:
                    assert call["id"] is None and piece.type == "function"  # the id and name come first, once
                    call["id"], call["name"] = piece.id, piece.function.name
                call["arguments"] += piece.function.arguments or ""
            finish = ch.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def check_call(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_the_agent_loop_calls_a_tool_then_answers_with_its_result(live):
    c = ask(live, tool_choice="auto", parallel_tool_calls=False, logit_bias=OPEN_A_CALL)
    choice = c.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    check_call(call.function.name, call.function.arguments)
    result = {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"}
    history = ASK + [choice.message.model_dump(exclude_none=True), result]
    final = ask(live, messages=history, max_tokens=8)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
    # the model saw the call and its result, rendered by the template
    prompt = live.llm.apply_chat_template(history, tools=TOOLS)
    assert "<tool_call>" in prompt and "18C and sunny" in prompt and call.function.arguments[:4] in prompt
    assert final.usage.prompt_tokens == len(live.llm.chat_prompt_ids(history, tools=TOOLS))


def test_a_streamed_call_comes_in_pieces_that_add_up_to_the_whole(live):
    kw = {"tool_choice": "auto", "parallel_tool_calls": False, "logit_bias": OPEN_A_CALL}
    whole = ask(live, **kw).choices[0].message.tool_calls[0]
    content, calls, finish = streamed(live, **kw)
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    assert (calls[0]["name"], calls[0]["arguments"]) == (whole.function.name, whole.function.arguments)
    check_call(calls[0]["name"], calls[0]["arguments"])


def test_tool_choice_none_leaves_the_text_as_text(live):
    c = ask(live, tool_choice="none", logit_bias=OPEN_A_CALL, max_tokens=6)
    assert c.choices[0].message.tool_calls is None and c.choices[0].finish_reason == "length"
    assert c.choices[0].message.content.startswith("<tool_call>")
    content, calls, finish = streamed(live, tool_choice="none", logit_bias=OPEN_A_CALL, max_tokens=6)
    assert (content, calls, finish) == (c.choices[0].message.content, [], "length")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "set_alarm"}}])
def test_a_forced_call_whole_and_streamed(live, choice):
    c = ask(live, tool_choice=choice, max_tokens=120)
    assert c.choices[0].finish_reason == "tool_calls"
    (call,) = c.choices[0].message.tool_calls
    check_call(call.function.name, call.function.arguments)
    if isinstance(choice, dict):
        assert call.function.name == "set_alarm"
    content, calls, finish = streamed(live, tool_choice=choice, max_tokens=120)
    assert finish == "tool_calls" and not content
    assert [(x["name"], x["arguments"]) for x in calls] == [(call.function.name, call.function.arguments)]


def test_a_call_cut_off_by_max_tokens_comes_back_as_text(live):
    c = ask(live, tool_choice="auto", logit_bias=OPEN_A_CALL, max_tokens=4)
    assert c.choices[0].finish_reason == "length" and c.choices[0].message.tool_calls is None
    assert c.choices[0].message.content.startswith("<tool_call>")
    content, calls, finish = streamed(live, tool_choice="auto", logit_bias=OPEN_A_CALL, max_tokens=4)
    assert (content, calls, finish) == (c.choices[0].message.content, [], "length")


@pytest.mark.parametrize(("messages", "says"), [
    ([{"role": "tool", "content": "18C"}], "tool_call_id"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"x": 1}}]}],
     "tool_calls[0]"),
    ([{"role": "user", "content": "Hi", "tool_calls": []}], "only an assistant"),
])
def test_malformed_tool_messages_are_400_naming_them(live, messages, says):
    with pytest.raises(openai.BadRequestError) as info:
        ask(live, messages=messages, max_tokens=2)
    assert info.value.body["param"] == "messages" and says in info.value.body["message"]


def test_chat_template_kwargs_must_be_an_object(live):
    with pytest.raises(openai.BadRequestError) as info:
        ask(live, max_tokens=2, extra_body={"chat_template_kwargs": ["enable_thinking"]})
    assert info.value.body["param"] == "chat_template_kwargs"
    ok = ask(live, max_tokens=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert ok.choices[0].finish_reason in ("length", "stop")


def _stream_pieces(text: str, fmt: str, step: int = 3):
    from dualpath.server.tool_calls import ToolCalls, ToolStream
    from dualpath.tokenizer.tool_formats import FORMATS

    stream = ToolStream(ToolCalls({"tools": TOOLS}, FORMATS[fmt]))
    pieces = [p for i in range(0, len(text), step) for p in stream.push(text[i:i + step])]
    last, finish = stream.finish("stop")
    return pieces + last, finish


def test_a_stream_sends_the_text_before_a_call_then_the_call_in_pieces():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            '<tool_call>{"name": "set_alarm", "arguments": {"hour": 7}}</tool_call>')
    pieces, finish = _stream_pieces(text, "hermes")
    assert finish == "tool_calls"
    assert "".join(p.get("content", "") for p in pieces) == "Let me look.\n"  # no part of a marker leaks
    calls = [p["tool_calls"][0] for p in pieces if "tool_calls" in p]
    assert [c["index"] for c in calls] == [0, 0, 1, 1]
    assert [calls[0]["function"]["name"], calls[2]["function"]["name"]] == ["get_weather", "set_alarm"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Paris"} and calls[0]["id"] != calls[2]["id"]


@pytest.mark.parametrize("text", ['Sure <tool_call>{"name": "get_weather", "arguments": {"city": "Pa',
                                  'Sure <tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                                  "Plain text with a < and a <tool but no call"])
def test_a_stream_without_a_well_formed_call_sends_all_its_text(text):
    pieces, finish = _stream_pieces(text, "hermes")
    assert finish == "stop" and "".join(p["content"] for p in pieces) == text


@pytest.fixture(scope="module")
def thinking_live(gguf_path, tmp_path_factory):
    """The Hermes template whose generation prompt opens ``<think>`` (as Qwen3's does)."""
    template = HERMES.replace("{%- if add_generation_prompt %}<|im_start|>assistant\n",
                              "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n")
    assert template != HERMES
    path = write_tool_gguf(gguf_path, tmp_path_factory.mktemp("think-tools") / "hermes-think.gguf", template)
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 1024, "runtime.max_num_seqs": 2,
                                      "server.api_key": KEY})
    srv = LiveServer(dualpath.LLM(path, cfg))
    yield srv
    srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_thinking_model_closes_its_thinking_then_calls_a_tool(thinking_live, stream):
    """Thinking closed by the budget (0: the closing marker written at once), then the call:
    the thinking is split off first and the answer after it is read for the call."""
    kw = {"tool_choice": "auto", "parallel_tool_calls": False, "logit_bias": OPEN_A_CALL,
          "extra_body": {"reasoning_budget": 0}}
    if stream:
        content, calls, finish = streamed(thinking_live, **kw)
        assert finish == "tool_calls" and not content.strip() and len(calls) == 1
        name, arguments = calls[0]["name"], calls[0]["arguments"]
    else:
        choice = ask(thinking_live, **kw).choices[0]
        assert choice.finish_reason == "tool_calls" and not (choice.message.content or "").strip()
        (call,) = choice.message.tool_calls
        name, arguments = call.function.name, call.function.arguments
        assert "</think>" not in (getattr(choice.message, "reasoning_content", None) or "")
    check_call(name, arguments)
