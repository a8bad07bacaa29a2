"""Templates get the whole conversation: for each family's format, a prompt rendered with
``tools`` and a prior tool round trip (``LLM.apply_chat_template`` in its sandbox, from
OpenAI's shapes) equals the template's own rendering by plain Jinja of the same
conversation as template callers hand it over; the format follows from the template."""

from __future__ import annotations

import time

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tool_templates import ROUND_TRIP, ROUND_TRIP_AS_TEMPLATES_READ_IT, TEMPLATES, TOOLS

import dualpath
from dualpath.errors import ChatTemplateError, ToolsNotRenderedError
from tests_shared import write_gguf_with_chat_template

MARKER = {"hermes": "<tool_call>\n{\"name\": \"get_weather\"", "llama3": "<|python_tag|>{\"name\": \"get_weather\"",
          "mistral": "[TOOL_CALLS][{\"name\": \"get_weather\"", "phi4": "<|tool_call|>[{\"arguments\"",
          "generic": "assistant: {\"arguments\""}
"""How each template writes the earlier call (jinja's tojson sorts keys)."""


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def family(request, gguf_path, tmp_path_factory):
    name = request.param
    path = write_gguf_with_chat_template(gguf_path, tmp_path_factory.mktemp(name) / f"{name}.gguf", TEMPLATES[name])
    return name, dualpath.LLM(path, dualpath.load_config(None, {"runtime.max_context_tokens": 256}))


def plain_jinja(source: str, llm, **variables) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
    env.globals["strftime_now"] = time.strftime
    tok = llm.tokenizer
    return env.from_string(source).render(bos_token=tok.spec.tokens[tok.bos_id], eos_token=tok.spec.tokens[tok.eos_id],
                                          date_string=time.strftime("%d %b %Y"), **variables)


def test_a_round_trip_with_tools_renders_as_the_template_itself_does(family):
    name, llm = family
    got = llm.apply_chat_template(ROUND_TRIP, tools=TOOLS)
    want = plain_jinja(TEMPLATES[name], llm, messages=ROUND_TRIP_AS_TEMPLATES_READ_IT, tools=TOOLS,
                       add_generation_prompt=True)
    assert got == want
    assert MARKER[name] in got and "18C and sunny" in got and "set_alarm" in got
    assert llm.tool_format.name == name


def test_without_tools_the_template_renders_no_tools(family):
    name, llm = family
    messages = ROUND_TRIP[:2]
    got = llm.apply_chat_template(messages, add_generation_prompt=False)
    assert got == plain_jinja(TEMPLATES[name], llm, messages=messages, add_generation_prompt=False)
    assert "get_weather" not in got


def test_chat_template_kwargs_reach_the_template(gguf_path, tmp_path):
    source = ("{% for m in messages %}{{ m.content }}{% endfor %}"
              "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}")
    llm = dualpath.LLM(write_gguf_with_chat_template(gguf_path, tmp_path / "k.gguf", source),
                       dualpath.load_config(None, {"runtime.max_context_tokens": 128}))
    msgs = [{"role": "user", "content": "Hi"}]
    assert llm.apply_chat_template(msgs) == "Hi"
    assert llm.apply_chat_template(msgs, chat_template_kwargs={"enable_thinking": False}) == "Hi/no_think"
    with pytest.raises(ChatTemplateError, match="'messages'"):
        llm.apply_chat_template(msgs, chat_template_kwargs={"messages": []})
    with pytest.raises(ToolsNotRenderedError, match="'get_weather', 'set_alarm'"):
        llm.apply_chat_template(msgs, tools=TOOLS)


def test_the_builtin_chatml_template_writes_tools_for_models_without_them(gguf_path):
    """``--chat-template chatml`` gives any model a template that renders tools (Hermes's
    format, as Qwen 2.5 writes it), and without tools the plain ChatML it always was."""
    from dualpath.tokenizer.chat_templates import BUILTIN

    llm = dualpath.LLM(gguf_path, dualpath.load_config(None, {"runtime.chat_template": "chatml",
                                                              "runtime.max_context_tokens": 256}))
    got = llm.apply_chat_template(ROUND_TRIP, tools=TOOLS)
    assert got == plain_jinja(BUILTIN["chatml"], llm, messages=ROUND_TRIP_AS_TEMPLATES_READ_IT, tools=TOOLS,
                              add_generation_prompt=True)
    assert MARKER["hermes"] in got and "</tools>\n" in got and "<tool_response>\n18C and sunny" in got
    assert got.count("You are brief.") == 1 and llm.tool_format.name == "hermes"
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert llm.apply_chat_template(plain) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
