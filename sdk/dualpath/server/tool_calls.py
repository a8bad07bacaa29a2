"""Tool calls in a chat request: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` checked,
the calls read back out of the model's text (tokenizer/tool_formats.py), and OpenAI's
``message.tool_calls`` / streamed ``delta.tool_calls`` made of them.

``tool_choice``:

* ``"auto"`` (the default with tools): the model writes text or calls in its own format
  (from its chat template); a lazy grammar holds each call to its tool's schema.
* ``"none"``: no tools in the prompt, no calls read.
* ``"required"`` / ``{"type": "function", "function": {"name"}}``: the grammar forces one
  bare ``{"name", "arguments"}`` object from the first token.

A call the model opens but does not finish, or writes malformed, comes back as text: the
client never gets half a call, and never a 500.
"""

from __future__ import annotations

import uuid

from ..tokenizer.tool_formats import FORMATS, ToolFormat, held_back, parse_tool_calls, trigger_pattern
from .parsing import get_field
from .structured import parse_tools

__all__ = ["ToolCalls", "ToolStream"]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCalls:
    """One chat request's tool settings, checked before anything is queued."""

    def __init__(self, body: dict, model_format: ToolFormat):
        tools = body.get("tools")
        self.names = tuple(parse_tools(tools)) if tools is not None else ()  # StructuredOutputError: a 400
        choice = body.get("tool_choice")
        if choice is None:
            choice = "auto" if self.names else "none"
        if isinstance(choice, dict):
            self.mode = "named"
        elif choice in ("auto", "none", "required"):
            self.mode = choice
        else:  # structured.py names the allowed shapes
            self.mode = "invalid"
        if not self.names and self.mode == "auto":
            self.mode = "none"
        self.parallel = get_field(body, "parallel_tool_calls", (bool,), True)
        self.tools = tools if self.names and self.mode != "none" else None
        """What the chat template is given (no tools with ``tool_choice`` "none")."""
        self.forced = self.mode in ("required", "named")
        self.format = FORMATS["generic"] if self.forced else model_format
        """The format the calls are read in: the model's own, or the bare object a forced call is."""

    @property
    def active(self) -> bool:
        """True when the model's text is read for calls."""
        return self.tools is not None

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, OpenAI tool_calls) of a finished choice's text."""
        if not self.active:
            return text, []
        parsed = parse_tool_calls(text, self.format, self.names)
        calls = parsed.calls if self.parallel or self.forced else parsed.calls[:1]
        out = [{"id": _call_id(), "type": "function", "function": {"name": name, "arguments": args}}
               for name, args in calls]
        return (parsed.content if out else text), out

    def message(self, text: str, finish: str) -> tuple[dict, str]:
        """(the assistant message, finish_reason) of a whole answer."""
        content, calls = self.parse(text)
        if not calls:
            return {"role": "assistant", "content": content}, finish
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


class ToolStream:
    """One choice's stream: content deltas until a call may have opened, then the calls
    (each as its id and name, then its arguments) once the choice ends."""

    def __init__(self, tools: ToolCalls):
        self.tools = tools
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.in_call = False

    def push(self, delta: str) -> list[dict]:
        """The deltas to send for ``delta`` of the model's text."""
        self.text += delta
        if not self.tools.active:
            self.sent = len(self.text)
            return [{"content": delta}] if delta else []
        if self.in_call or self.tools.forced:
            return []
        fmt = self.tools.format
        found = trigger_pattern(fmt).search(self.text, self.sent)
        first = found.start() if found is not None else -1
        if first >= 0:
            self.in_call = True
            end = first
        else:
            end = len(self.text) - held_back(self.text, fmt)
        if end <= self.sent:
            return []
        piece, self.sent = self.text[self.sent:end], end
        return [{"content": piece}]

    def finish(self, finish: str) -> tuple[list[dict], str]:
        """(the last deltas, finish_reason) when the choice ends."""
        content, calls = self.tools.parse(self.text)
        if not calls:
            rest = self.text[self.sent:]
            return ([{"content": rest}] if rest else []), finish
        out: list[dict] = []
        rest = (content or "")[self.sent:]
        if rest.strip():
            out.append({"content": rest})
        for i, call in enumerate(calls):
            fn = call["function"]
            out.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                        "function": {"name": fn["name"], "arguments": ""}}]})
            out.append({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})
        return out, "tool_calls"
