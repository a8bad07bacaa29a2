"""How a model family writes a tool call: the formats table, which format a chat template
uses, and the calls parsed back out of a model's text.

One ``ToolFormat`` per family. A format names the text that opens a call (its trigger:
where the lazy grammar takes over, sampling/grammar.py), the text that closes it (if any),
the key its arguments go under, and whether one opening holds a JSON list of calls or one
call. Which format a model writes follows from its chat template's source, the way
llama.cpp's ``common/chat.cpp`` tells them apart: the markers a template writes when it
renders an earlier call are the ones its model was trained to write.

Parsing never raises: what cannot be read as calls (malformed JSON, a call cut off by
``max_tokens``, an unknown function) comes back as plain text content.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

__all__ = ["FORMATS", "ParsedOutput", "ToolFormat", "detect_format", "held_back", "in_json", "parse_tool_calls",
           "trigger_pattern"]


@dataclass(frozen=True)
class ToolFormat:
    """One family's way of writing tool calls."""

    name: str
    """Short name: ``hermes``, ``llama3``, ``mistral``, ``phi4``, ``generic``."""
    triggers: tuple[str, ...]
    """Texts that open a call. One that starts with ``{"`` or ``[{`` is the start of the call's
    JSON itself; the others are markers before it. Where a marker is a control token that
    the answer's text leaves out, the JSON's own start is a trigger too."""
    close: str = ""
    """Text after a call's JSON ("" where the JSON's end closes it)."""
    args_key: str = "arguments"
    """The key of the arguments object in a call."""
    is_list: bool = False
    """One opening holds a JSON list of calls (``[TOOL_CALLS][{...}, {...}]``)."""
    markers: tuple[str, ...] = ()
    """Template source substrings that select this format (any one)."""


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (
    # Hermes 2 Pro, Qwen 2.5 / 3, SmolLM3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    ToolFormat("hermes", ("<tool_call>",), close="</tool_call>", markers=("<tool_call>",)),
    # Mistral Nemo / Small / v0.3: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    ToolFormat("mistral", ("[TOOL_CALLS]", '[{"name"'), is_list=True, markers=("[TOOL_CALLS]", "[AVAILABLE_TOOLS]")),
    # Phi-4-mini: <|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>
    ToolFormat("phi4", ("<|tool_call|>", '[{"name"'), close="<|/tool_call|>", is_list=True,
               markers=("<|tool_call|>", "<|tool|>")),
    # Llama 3.1 / 3.2 / 3.3: {"name": ..., "parameters": {...}}, or after <|python_tag|>
    ToolFormat("llama3", ('{"name"', "<|python_tag|>"), args_key="parameters",
               markers=("<|python_tag|>", "<|start_header_id|>ipython")),
    # Anything else that renders tools: a bare {"name": ..., "arguments": {...}} object
    ToolFormat("generic", ('{"name"',)),
)}


def detect_format(template: str | None) -> ToolFormat:
    """The format a chat template's model writes calls in; ``generic`` when none matches.
    Llama 3's markers are checked after the others: a Hermes-style template may mention
    ``<|start_header_id|>`` too, never the reverse."""
    source = template or ""
    for name in ("hermes", "mistral", "phi4", "llama3"):
        if any(m in source for m in FORMATS[name].markers):
            return FORMATS[name]
    if "<|start_header_id|>" in source and "tools" in source:
        return FORMATS["llama3"]
    return FORMATS["generic"]


@dataclass
class ParsedOutput:
    """A model's text split into what it says and the calls it makes."""

    content: str | None
    """The text outside the calls (None when there is none but calls)."""
    calls: list[tuple[str, str]]
    """``(function name, arguments as a JSON string)`` per call, in order."""


def in_json(trigger: str) -> bool:
    """True for a trigger that is the start of the call's JSON (``{"name"``), which the call
    grammar reads too."""
    return trigger.startswith(("{\"", "[{"))


@functools.cache
def trigger_pattern(fmt: ToolFormat) -> re.Pattern[str]:
    """One regex for a format's triggers, group ``t<i>`` for ``fmt.triggers[i]``: a JSON
    trigger matches with JSON whitespace between its characters (``{ "name"``), as the
    call grammar allows it."""
    parts = []
    for i, t in enumerate(fmt.triggers):
        body = r"\s*".join(re.escape(c) for c in t) if in_json(t) else re.escape(t)
        parts.append(f"(?P<t{i}>{body})")
    return re.compile("|".join(parts))


def _find_trigger(fmt: ToolFormat, text: str, start: int) -> tuple[int, str]:
    """(position, trigger) of the first trigger at or after ``start``; (-1, "") if none."""
    m = trigger_pattern(fmt).search(text, start)
    if m is None:
        return -1, ""
    return m.start(), fmt.triggers[int((m.lastgroup or "t0")[1:])]


def _call_of(obj, fmt: ToolFormat, names) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of one decoded call object, or None if it is not one."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get(fmt.args_key, obj.get("arguments", obj.get("parameters")))
    if not isinstance(name, str) or (names is not None and name not in names):
        return None
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    return name, json.dumps(args, ensure_ascii=False)


def _read_segment(fmt: ToolFormat, text: str, at: int, trigger: str, names):
    """The calls of the segment opened at ``at`` and where it ends, or None if it is not
    well formed."""
    pos = at if in_json(trigger) else at + len(trigger)
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        value, end = json.JSONDecoder().raw_decode(text, pos)
    except (json.JSONDecodeError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    if not items or (isinstance(value, list) and not fmt.is_list and trigger != "<|python_tag|>"):
        return None
    calls = [_call_of(v, fmt, names) for v in items]
    if any(c is None for c in calls):
        return None
    if fmt.close:
        rest = text[end:]
        stripped = rest.lstrip()
        if stripped.startswith(fmt.close):
            end = len(text) - len(stripped) + len(fmt.close)
        elif stripped and fmt.close.startswith(stripped):  # the closer cut off by max_tokens
            end = len(text)
    return calls, end


def parse_tool_calls(text: str, fmt: ToolFormat, names=None) -> ParsedOutput:
    """``text`` split into content and calls of the functions ``names`` (None: any).

    Every opening must hold well-formed calls; if one does not (malformed or cut off), the
    whole text is returned as content and no call is made, so a client never runs half a
    call."""
    calls: list[tuple[str, str]] = []
    content: list[str] = []
    pos = 0
    while True:
        at, trigger = _find_trigger(fmt, text, pos)
        if at < 0:
            content.append(text[pos:])
            break
        read = _read_segment(fmt, text, at, trigger, names)
        if read is None:
            if in_json(trigger):  # a brace in prose, not a call
                content.append(text[pos:at + 1])
                pos = at + 1
                continue
            return ParsedOutput(text, [])
        content.append(text[pos:at])
        found, pos = read
        calls.extend(found)
    rest = "".join(content)
    if not calls:
        return ParsedOutput(text, [])
    return ParsedOutput(rest if rest.strip() else None, calls)


def held_back(text: str, fmt: ToolFormat) -> int:
    """How many characters at the end of ``text`` may be the start of a trigger, so a
    stream holds them until the next text tells."""
    for n in range(min(len(text), 4 * max(len(t) for t in fmt.triggers)), 0, -1):
        tail = text[-n:]
        for t in fmt.triggers:
            if in_json(t):
                squeezed = "".join(tail.split())
                if tail[0] == t[0] and t.startswith(squeezed) and len(squeezed) < len(t):
                    return n
            elif n < len(t) and t.startswith(tail):
                return n
    return 0
