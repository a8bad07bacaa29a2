"""A chat request's reasoning fields, as llama-server takes them, and its replies split
into ``reasoning_content`` and ``content`` (tokenizer/reasoning.py does the splitting).

Fields: ``reasoning_format`` (``none``, ``deepseek``, ``auto``; default
``reasoning.format``), ``reasoning_budget`` (tokens of thinking; -1 no limit, 0 none;
default ``reasoning.budget_tokens``), OpenAI's ``reasoning_effort`` (``low``, ``medium``,
``high``: the budgets ``reasoning.<effort>_tokens``; ``reasoning_budget`` wins when both
are given) and ``chat_template_kwargs`` (extra template variables, e.g.
``{"enable_thinking": false}``). Each bad value is a 400 naming its field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import REASONING_EFFORTS, REASONING_FORMATS, ReasoningConfig
from ..errors import ChatTemplateError
from ..tokenizer.reasoning import ReasoningSplitter, budget_tokens_of, prompt_opens_thinking, thinking_kwargs
from .errors import bad_request
from .parsing import get_field

REASONING_FIELDS = {"reasoning_format", "reasoning_budget", "reasoning_effort", "chat_template_kwargs"}
"""The chat request fields read here."""
_MAX_BUDGET = 1 << 24


@dataclass(frozen=True)
class ReasoningRequest:
    """What a chat request asks of a model that thinks."""

    format: str
    """``none`` or ``deepseek`` (``auto`` is read as ``deepseek``)."""
    budget_tokens: int | None
    """``SamplingParams.reasoning_budget``: None for no limit."""
    template_kwargs: dict
    """The chat template's extra variables."""

    def under(self, grammar) -> ReasoningRequest:
        """This request under its structured-output grammar (None: free text). A grammar
        that holds the reply to its shape from the first token leaves no room for thinking:
        nothing is split off and no budget forces a marker into it. A lazy tool-call grammar
        waits for a call's opening marker, so the model may think before it calls."""
        if grammar is None or grammar.kind == "lazy_tool_call":
            return self
        return dataclasses.replace(self, format="none", budget_tokens=None)

    def splitters(self, n: int, tokenizer, prompt_ids: list[int]) -> list[ChoiceSplit]:
        """One reply splitter per choice of a request whose prompt is ``prompt_ids``."""
        opened = self.format != "none" and prompt_opens_thinking(tokenizer, prompt_ids)
        return [ChoiceSplit(self.format, opened) for _ in range(n)]


def reasoning_request(body: dict, cfg: ReasoningConfig, llm) -> ReasoningRequest:
    """The checked reasoning fields of a chat request body (defaults from ``cfg``)."""
    fmt = get_field(body, "reasoning_format", (str,), cfg.format, check=lambda v: v in REASONING_FORMATS,
                    allowed=f"one of {', '.join(map(repr, REASONING_FORMATS))}")
    budget = get_field(body, "reasoning_budget", (int,), None, check=lambda v: -1 <= v <= _MAX_BUDGET,
                       allowed=f"an integer: -1 (no limit), 0 (no thinking) or up to {_MAX_BUDGET} tokens")
    effort = get_field(body, "reasoning_effort", (str,), None, check=lambda v: v in REASONING_EFFORTS,
                       allowed=f"one of {', '.join(map(repr, REASONING_EFFORTS))}")
    kwargs = get_field(body, "chat_template_kwargs", (dict,), {}, allowed="an object of template variables")
    if not isinstance(kwargs.get("enable_thinking", False), bool):
        raise bad_request(f"'chat_template_kwargs.enable_thinking' must be true or false, got "
                          f"{kwargs['enable_thinking']!r}", "chat_template_kwargs")
    tokens = budget_tokens_of(cfg.budget_tokens, budget, cfg.effort_tokens(effort) if effort else None)
    try:
        template = llm.chat_template()
    except ChatTemplateError:  # refused with its message once the messages are rendered
        template = ""
    return ReasoningRequest("none" if fmt == "none" else "deepseek", tokens, thinking_kwargs(template, kwargs, tokens))


class ChoiceSplit:
    """One choice's reply as OpenAI message fields: ``content``, and ``reasoning_content``
    when the reply thought and the format is not ``none``."""

    def __init__(self, fmt: str, opened: bool):
        self._splitter = ReasoningSplitter(opened) if fmt != "none" else None

    def delta(self, text: str, last: bool) -> dict:
        """The stream delta of ``text`` (``last``: the reply's final piece); {} when nothing
        can be sent yet (a marker may be starting)."""
        if self._splitter is None:
            return {"content": text} if text else {}
        reasoning, content = self._splitter.feed(text)
        if last:
            more_reasoning, more_content = self._splitter.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        out = {}
        if reasoning:
            out["reasoning_content"] = reasoning
        if content:
            out["content"] = content
        return out

    def message(self, text: str) -> dict:
        """The whole reply's message (``delta`` must not have been used)."""
        if self._splitter is None:
            return {"role": "assistant", "content": text}
        reasoning, content = self._splitter.feed(text)
        more_reasoning, more_content = self._splitter.finish()
        out = {"role": "assistant", "content": content + more_content}
        if self._splitter.saw_thinking:
            out["reasoning_content"] = reasoning + more_reasoning
        return out
