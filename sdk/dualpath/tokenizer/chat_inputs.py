"""What a chat template is given: the whole conversation and the variables popular templates
read, as llama.cpp's server gives them.

* ``messages`` in OpenAI's shapes: an assistant turn with ``tool_calls`` (its
  ``function.arguments`` given to the template as an object, which Qwen, Llama 3.x and
  Mistral templates write with ``tojson``; a string that is not a JSON object stays a string),
  ``tool`` turns with ``tool_call_id``, and a null ``content`` as "".
* ``tools`` (OpenAI's ``[{"type": "function", "function": {...}}]``), ``add_generation_prompt``,
  ``bos_token``, ``eos_token`` and ``date_string`` (``strftime_now`` is a function of the
  sandbox, template_worker.py).
* ``chat_template_kwargs`` merged over all of those (``enable_thinking`` ...), as llama.cpp
  merges them, except ``messages`` and ``tools``, which have their own fields.

A template given tools that writes none of their names into the prompt cannot tell the
model about them: ``tools_not_rendered`` says so, for a clear error rather than a prompt
silently without them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

__all__ = ["template_variables", "tools_not_rendered"]

_RESERVED = ("messages", "tools")


def _arguments(value):
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def _message(m: dict) -> dict:
    out = dict(m)
    if out.get("content") is None:
        out["content"] = ""
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            call = dict(call) if isinstance(call, dict) else call
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                fn = dict(call["function"])
                fn["arguments"] = _arguments(fn.get("arguments"))
                call["function"] = fn
            fixed.append(call)
        out["tool_calls"] = fixed
    return out


def template_variables(messages: Sequence[dict], *, tools=None, add_generation_prompt: bool = True,
                       bos_token: str = "", eos_token: str = "", chat_template_kwargs: dict | None = None) -> dict:
    """The variables a chat template renders with (JSON-able: they go to the worker)."""
    variables = {"messages": [_message(m) for m in messages], "add_generation_prompt": add_generation_prompt,
                 "bos_token": bos_token, "eos_token": eos_token,
                 "date_string": time.strftime("%d %b %Y")}
    if tools:
        variables["tools"] = list(tools)
    for key, value in (chat_template_kwargs or {}).items():
        if not isinstance(key, str) or key in _RESERVED:
            raise ValueError(f"chat_template_kwargs may not set {key!r}: it has its own field")
        variables[key] = value
    return variables


def tools_not_rendered(prompt: str, tools) -> list[str]:
    """The names of ``tools`` the rendered ``prompt`` never mentions."""
    names = []
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name not in prompt:
            names.append(name)
    return names
