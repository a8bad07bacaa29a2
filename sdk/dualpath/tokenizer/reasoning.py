"""A thinking model's reply, split into its thinking and its answer.

Qwen3, the DeepSeek-R1 distills, SmolLM3 and Phi-4-mini-reasoning write
``<think>...</think>`` before the answer. Some templates open the thinking themselves
(the generation prompt ends with ``<think>``), so the reply starts inside it: the caller
says so (``prompt_opens_thinking``). As in llama-server's ``deepseek`` format, only
thinking at the very start of a reply counts (a ``<think>`` later on is answer text),
and whitespace around either part is trimmed.

``ReasoningSplitter`` splits text as it streams: a marker cut across deltas is held back
until it is whole, so the pieces add up to what ``split_reasoning`` gives for the whole
text, whatever the cuts. Shared by the server, ``LLM.chat`` and ``dualpath chat``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
FORCED_CLOSE = "\n" + THINK_CLOSE + "\n\n"
"""What a budget that runs out writes for the model (sampling/reasoning_budget.py): the
closing marker in the layout the templates that think use."""
_TAIL_TOKENS = 16
"""Prompt tokens read back to see whether the template opened the thinking."""

__all__ = ["FORCED_CLOSE", "THINK_CLOSE", "THINK_OPEN", "ReasoningSplitter", "budget_tokens_of",
           "prompt_opens_thinking", "split_reasoning", "thinking_kwargs"]


def prompt_opens_thinking(tokenizer, prompt_ids: Sequence[int]) -> bool:
    """Whether the prompt ends inside an open ``<think>`` (the template opened it for the
    model): its last tokens' text, special tokens included, ends with the marker."""
    tail = tokenizer.decode(prompt_ids[-_TAIL_TOKENS:], skip_special=False)
    return tail.rstrip().endswith(THINK_OPEN)


def thinking_kwargs(template: str, kwargs: Mapping | None, budget_tokens: int | None) -> dict:
    """The chat template's extra variables for a thinking budget: with a budget of 0, and a
    template that reads ``enable_thinking`` (Qwen3, SmolLM3), ``enable_thinking`` false
    unless the caller set it; the budget still closes any thinking that starts."""
    out = dict(kwargs or {})
    if budget_tokens == 0 and "enable_thinking" in template:
        out.setdefault("enable_thinking", False)
    return out


def budget_tokens_of(default_tokens: int, budget: int | None = None, effort_tokens: int | None = None) -> int | None:
    """The thinking budget of a reply: ``budget`` where given, else the budget of its
    ``reasoning_effort`` (``effort_tokens``), else ``default_tokens`` (reasoning.budget_tokens);
    None for no limit (-1)."""
    for tokens in (budget, effort_tokens, default_tokens):
        if tokens is not None:
            return None if tokens < 0 else tokens
    return None


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Text deltas of one reply -> ``(reasoning, content)`` pieces (see module doc).

    ``opened``: the prompt opened the thinking. Each ``feed`` returns what can be told
    apart so far; ``finish`` the rest (a reply that ends while thinking is all reasoning).
    ``saw_thinking`` says whether the reply had a thinking part at all."""

    _START, _THINK, _AFTER, _CONTENT = range(4)

    def __init__(self, opened: bool = False):
        self._state = self._THINK if opened else self._START
        self._held = ""        # text not yet told apart: a possible marker, or whitespace
        self._reasoning_started = False
        self.saw_thinking = opened

    def feed(self, text: str) -> tuple[str, str]:
        held = self._held + text
        self._held = ""
        if self._state == self._START:
            body = held.lstrip()
            if body.startswith(THINK_OPEN):
                self._state, self.saw_thinking = self._THINK, True
                held = body[len(THINK_OPEN):]
            elif THINK_OPEN.startswith(body):  # empty, or a start of the marker: wait for more
                self._held = held
                return "", ""
            else:
                self._state = self._CONTENT
                return "", held
        reasoning = ""
        if self._state == self._THINK:
            cut = held.find(THINK_CLOSE)
            if cut < 0:
                return self._reasoning(held), ""
            reasoning = self._reasoning(held[:cut], closing=True)
            self._state, held = self._AFTER, held[cut + len(THINK_CLOSE):]
        if self._state == self._AFTER:  # the answer starts at its first non-blank character
            held = held.lstrip()
            if not held:
                return reasoning, ""
            self._state = self._CONTENT
        return reasoning, held

    def _reasoning(self, text: str, closing: bool = False) -> str:
        """The part of ``text`` (inside the thinking) that can go out now: the leading
        whitespace of the thinking is dropped, and its trailing whitespace and a possible
        start of the closing marker are held back."""
        if not self._reasoning_started:
            text = text.lstrip()
        if closing:
            out = text.rstrip()
        else:
            keep = _partial_suffix(text, THINK_CLOSE)
            body = text[:len(text) - keep]
            out = body.rstrip()
            self._held = body[len(out):] + text[len(text) - keep:]
        self._reasoning_started = self._reasoning_started or bool(out)
        return out

    def finish(self) -> tuple[str, str]:
        """The rest, once the reply has ended."""
        held, self._held = self._held, ""
        if self._state == self._START:
            return "", held
        if self._state == self._THINK:
            return (held.strip() if not self._reasoning_started else held.rstrip()), ""
        return "", held


def split_reasoning(text: str, opened: bool = False) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a whole reply; reasoning is None when the reply has no
    thinking part."""
    splitter = ReasoningSplitter(opened)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return (r1 + r2 if splitter.saw_thinking else None), c1 + c2
