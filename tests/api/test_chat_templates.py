"""Built-in chat templates (``--chat-template``) for model files without one."""

from __future__ import annotations

import pytest

import dualpath
from dualpath.config import CHAT_TEMPLATES, RuntimeConfig
from dualpath.errors import ConfigError
from dualpath.tokenizer.chat_templates import BUILTIN

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell a story"}]
EXPECTED = {
    "chatml": ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
               "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n"
               "<|im_start|>assistant\n"),
    "llama3": ("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nTell a story<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "gemma": ("<s><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nTell a story<end_of_turn>\n<start_of_turn>model\n"),
    "vicuna": "Be brief.\n\nUSER: Hi there\nASSISTANT: Hello!</s>\nUSER: Tell a story\nASSISTANT:",
    "phi3": ("<|system|>\nBe brief.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello!<|end|>\n"
             "<|user|>\nTell a story<|end|>\n<|assistant|>\n"),
}


def test_the_config_names_exactly_the_built_in_templates():
    assert tuple(BUILTIN) == CHAT_TEMPLATES  # the one list of names, in the same order
    for name in BUILTIN:
        assert RuntimeConfig(chat_template=name).chat_template == name
    with pytest.raises(ConfigError, match="chatml, llama3, gemma, vicuna, phi3"):
        RuntimeConfig(chat_template="alpaca")
    assert set(EXPECTED) == set(BUILTIN)


def test_the_cli_offers_exactly_the_built_in_templates(capsys):
    from dualpath.cli import build_parser

    for name in CHAT_TEMPLATES:
        assert build_parser().parse_args(["run", "--chat-template", name]).chat_template == name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--chat-template", "alpaca"])
    err = capsys.readouterr().err
    assert "invalid choice" in err and all(name in err for name in CHAT_TEMPLATES)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_each_built_in_renders_its_familys_format(name, gguf_path):
    """stories260K has no template of its own; its BOS text is <s>."""
    llm = dualpath.LLM(gguf_path, dualpath.load_config(None, {"runtime.chat_template": name,
                                                               "runtime.max_context_tokens": 256}))
    assert llm.apply_chat_template(MESSAGES) == EXPECTED[name]
    c = llm.chat(MESSAGES, dualpath.SamplingParams(temperature=0, max_tokens=4))
    assert c.usage.prompt_tokens == len(llm.chat_prompt_ids(MESSAGES)) and c.usage.completion_tokens >= 1


def test_without_a_template_the_error_names_the_built_ins(gguf_path):
    llm = dualpath.LLM(gguf_path, dualpath.load_config(None, {"runtime.max_context_tokens": 128}))
    with pytest.raises(dualpath.errors.ChatTemplateError, match="--chat-template"):
        llm.apply_chat_template(MESSAGES)
