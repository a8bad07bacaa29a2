"""Tool calls read back out of a model's text in each family's format (tokenizer/tool_formats.py):
well-formed calls become calls, malformed and cut-off ones plain text, never an exception;
and which format a template's source selects."""

from __future__ import annotations

import json

import pytest

from dualpath.tokenizer.chat_inputs import template_variables, tools_not_rendered
from dualpath.tokenizer.tool_formats import FORMATS, detect_format, held_back, parse_tool_calls

NAMES = ("get_weather", "set_alarm")
WEATHER = {"city": "Paris", "unit": "celsius"}
ALARM = {"hour": 7}


def one(fmt: str, name: str, args: dict) -> str:
    """A call as the format writes it."""
    key = FORMATS[fmt].args_key
    return json.dumps({"name": name, key: args})


WELL_FORMED = {
    "hermes": f'Let me look.\n<tool_call>\n{one("hermes", "get_weather", WEATHER)}\n</tool_call>',
    "mistral": f'[TOOL_CALLS][{one("mistral", "get_weather", WEATHER)}]',
    "phi4": f'<|tool_call|>[{one("phi4", "get_weather", WEATHER)}]<|/tool_call|>',
    "llama3": one("llama3", "get_weather", WEATHER),
    "generic": one("generic", "get_weather", WEATHER),
}
PARALLEL = {
    "hermes": (f'<tool_call>\n{one("hermes", "get_weather", WEATHER)}\n</tool_call>\n'
               f'<tool_call>\n{one("hermes", "set_alarm", ALARM)}\n</tool_call>'),
    "mistral": f'[TOOL_CALLS][{one("mistral", "get_weather", WEATHER)}, {one("mistral", "set_alarm", ALARM)}]',
    "phi4": f'<|tool_call|>[{one("phi4", "get_weather", WEATHER)}, {one("phi4", "set_alarm", ALARM)}]<|/tool_call|>',
}


@pytest.mark.parametrize("fmt", sorted(WELL_FORMED))
def test_a_well_formed_call_is_read_with_its_arguments_as_a_json_string(fmt):
    out = parse_tool_calls(WELL_FORMED[fmt], FORMATS[fmt], NAMES)
    assert out.calls == [("get_weather", json.dumps(WEATHER))]
    assert out.content == ("Let me look.\n" if fmt == "hermes" else None)


@pytest.mark.parametrize("fmt", sorted(PARALLEL))
def test_parallel_calls_are_read_in_order(fmt):
    out = parse_tool_calls(PARALLEL[fmt], FORMATS[fmt], NAMES)
    assert out.calls == [("get_weather", json.dumps(WEATHER)), ("set_alarm", json.dumps(ALARM))]
    assert out.content is None


@pytest.mark.parametrize("fmt", sorted(WELL_FORMED))
@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9])
def test_a_truncated_call_comes_back_as_the_text_itself(fmt, cut):
    text = WELL_FORMED[fmt]
    start = text.index("{")
    truncated = text[:start + int((len(text) - start) * cut)]
    out = parse_tool_calls(truncated, FORMATS[fmt], NAMES)
    whole = one(fmt, "get_weather", WEATHER) + ("]" if FORMATS[fmt].is_list else "")
    if whole in truncated:  # only (part of) the closer is missing: the call stands, the rest is dropped
        assert out.calls == [("get_weather", json.dumps(WEATHER))]
        assert out.content == ("Let me look.\n" if fmt == "hermes" else None)
    else:
        assert out.calls == [] and out.content == truncated


@pytest.mark.parametrize("fmt", sorted(WELL_FORMED))
def test_malformed_calls_come_back_as_text(fmt):
    bad = [WELL_FORMED[fmt].replace('"Paris"', "Paris"),                       # not JSON
           WELL_FORMED[fmt].replace("get_weather", "launch_rockets"),          # not a tool of the request
           WELL_FORMED[fmt].replace(json.dumps(WEATHER), '"a string"')]        # arguments not an object
    for text in bad:
        out = parse_tool_calls(text, FORMATS[fmt], NAMES)
        assert out.calls == [] and out.content == text


def test_arguments_written_as_a_json_string_are_accepted():
    text = '<tool_call>{"name": "set_alarm", "arguments": "{\\"hour\\": 7}"}</tool_call>'
    assert parse_tool_calls(text, FORMATS["hermes"], NAMES).calls == [("set_alarm", '{"hour": 7}')]


def test_control_tokens_left_out_of_the_text_still_leave_a_readable_call():
    # Mistral's [TOOL_CALLS] and Llama's <|python_tag|> are control tokens a detokenizer may drop.
    calls = [("get_weather", json.dumps(WEATHER))]
    assert parse_tool_calls(f'[{one("mistral", "get_weather", WEATHER)}]', FORMATS["mistral"], NAMES).calls == calls
    tagged = "<|python_tag|>" + one("llama3", "get_weather", WEATHER)
    assert parse_tool_calls(tagged, FORMATS["llama3"], NAMES).calls == calls


def test_prose_with_braces_is_not_a_call():
    text = 'The JSON {"name": is how it starts, and {"name": "x"} is no call.'
    out = parse_tool_calls(text, FORMATS["generic"], NAMES)
    assert out.calls == [] and out.content == text


def test_a_stream_holds_back_only_what_may_start_a_trigger():
    hermes = FORMATS["hermes"]
    assert held_back("Hello <tool", hermes) == len("<tool")
    assert held_back("Hello <b>", hermes) == 0
    assert held_back('x {"na', FORMATS["llama3"]) == len('{"na')


@pytest.mark.parametrize(("source", "name"), [
    ("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}<tool_call>{{ tools | tojson }}</tool_call>",
     "hermes"),
    ("[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
    ("<|system|>{{ m.content }}<|tool|>{{ tools | tojson }}<|/tool|><|end|>", "phi4"),
    ("<|start_header_id|>ipython<|end_header_id|>{{ m.content }}<|python_tag|>", "llama3"),
    ("<|start_header_id|>system<|end_header_id|>{% if tools %}{{ tools | tojson }}{% endif %}", "llama3"),
    ("Tools: {{ tools | tojson }}", "generic"),
    (None, "generic"),
])
def test_the_format_follows_from_the_template_source(source, name):
    assert detect_format(source).name == name


def test_template_variables_give_templates_openai_messages_as_they_read_them():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    v = template_variables(messages, tools=[{"type": "function", "function": {"name": "get_weather"}}],
                           chat_template_kwargs={"enable_thinking": False, "add_generation_prompt": False})
    assert v["messages"][1]["content"] == ""
    assert v["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert v["messages"][2]["tool_call_id"] == "call_1"
    assert v["enable_thinking"] is False and v["add_generation_prompt"] is False  # kwargs win, as in llama.cpp
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # the caller's untouched
    with pytest.raises(ValueError, match="'messages'"):
        template_variables(messages, chat_template_kwargs={"messages": []})


def test_tools_not_rendered_names_the_missing_tools():
    tools = [{"type": "function", "function": {"name": n}} for n in NAMES]
    assert tools_not_rendered("you may call get_weather", tools) == ["set_alarm"]
    assert tools_not_rendered("get_weather set_alarm", tools) == []
