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

import json
from dataclasses import dataclass

__all__ = ["FORMATS", "ParsedOutput", "ToolFormat", "detect_format", "held_back", "in_json", "parse_tool_calls"]


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


def _find_trigger(fmt: ToolFormat, text: str, start: int) -> tuple[int, str]:
    """(position, trigger) of the first trigger at or after ``start``; (-1, "") if none."""
    best, which = -1, ""
    for t in fmt.triggers:
        at = text.find(t, start)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, t
    return best, which


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
    for n in range(min(len(text), max(len(t) for t in fmt.triggers) - 1), 0, -1):
        tail = text[-n:]
        if any(t.startswith(tail) for t in fmt.triggers):
            return n
    return 0
