"""OpenAI's structured-output request shapes: ``response_format`` (``json_object``,
``json_schema``), ``tools`` and ``tool_choice``, checked and turned into the
``GrammarRequest`` the sampling layer compiles (sampling/grammar.py). Every malformed
field is a ``StructuredOutputError`` naming it (a 400 whose ``param`` is that field).
"""

from __future__ import annotations

import re

from ..sampling.grammar import Grammar, GrammarCompiler, GrammarRequest, StructuredOutputError
from ..tokenizer.tool_formats import ToolFormat

__all__ = ["OpenAIGrammars", "parse_response_format", "parse_structured", "parse_tools"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's rule for ``json_schema.name`` and ``function.name``."""


def _require(cond: bool, param: str, message: str) -> None:
    if not cond:
        raise StructuredOutputError(param, message)


def parse_response_format(response_format) -> GrammarRequest | None:
    if response_format is None:
        return None
    _require(isinstance(response_format, dict), "response_format",
             f"must be an object such as {{\"type\": \"json_object\"}}, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarRequest("json_object", {"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        _require(isinstance(spec, dict), "response_format.json_schema",
                 "must be an object with \"name\" and \"schema\"")
        name = spec.get("name")
        _require(isinstance(name, str) and _NAME.fullmatch(name) is not None, "response_format.json_schema.name",
                 f"is required: 1 to 64 letters, digits, '_' or '-' (got {name!r})")
        _require(spec.get("strict") is None or isinstance(spec.get("strict"), bool),
                 "response_format.json_schema.strict", f"must be true or false, got {spec.get('strict')!r}")
        _require(spec.get("description") is None or isinstance(spec.get("description"), str),
                 "response_format.json_schema.description", "must be a string")
        schema = spec.get("schema", {})
        _require(isinstance(schema, dict), "response_format.json_schema.schema",
                 f"must be a JSON schema object, got {type(schema).__name__}")
        return GrammarRequest("json_schema", schema)
    raise StructuredOutputError("response_format.type", f"{kind!r} is not one of 'text', 'json_object', "
                                                        "'json_schema'")


def parse_tools(tools) -> dict[str, tuple]:
    """name -> (name, parameters schema, field path), in the request's order."""
    _require(isinstance(tools, list), "tools", f"must be a list of tools, got {type(tools).__name__}")
    out: dict[str, tuple] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        _require(isinstance(tool, dict), where, "must be an object {\"type\": \"function\", \"function\": {...}}")
        _require(tool.get("type") == "function", f"{where}.type",
                 f"{tool.get('type')!r} is not supported (only 'function')")
        fn = tool.get("function")
        _require(isinstance(fn, dict), f"{where}.function", "must be an object with \"name\"")
        name = fn.get("name")
        _require(isinstance(name, str) and _NAME.fullmatch(name) is not None, f"{where}.function.name",
                 f"is required: 1 to 64 letters, digits, '_' or '-' (got {name!r})")
        _require(name not in out, f"{where}.function.name", f"{name!r} is given twice")
        # OpenAI: "Omitting parameters defines a function with an empty parameter list."
        params = fn.get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})
        _require(isinstance(params, dict), f"{where}.function.parameters",
                 f"must be a JSON schema object, got {type(params).__name__}")
        out[name] = (name, params, f"{where}.function.parameters")
    return out


def parse_structured(response_format, tools, tool_choice, tool_format: ToolFormat | None = None,
                     parallel: bool = True) -> GrammarRequest | None:
    """The checked request, or None when nothing constrains the output.

    A forced tool call (``tool_choice`` "required" or naming a function) wins over
    ``response_format``, which OpenAI applies to the assistant's text answer. ``tool_choice``
    "none" leaves the output free; "auto" (the default with tools) too, but for the calls the
    model opens in ``tool_format``: a lazy grammar holds each to its tool's schema.
    """
    parsed_tools = parse_tools(tools) if tools is not None else {}
    if tool_choice is None or tool_choice in ("none", "auto"):
        rf = parse_response_format(response_format)
        if rf is None and parsed_tools and tool_choice != "none" and tool_format is not None:
            return GrammarRequest("lazy_tool_call", tools=tuple(parsed_tools.values()), tool_format=tool_format,
                                  parallel=parallel)
        return rf
    if tool_choice == "required":
        _require(bool(parsed_tools), "tool_choice", "'required' needs a non-empty 'tools' list")
        return GrammarRequest("tool_call", tools=tuple(parsed_tools.values()))
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise StructuredOutputError("tool_choice", "must be 'none', 'auto', 'required' or "
                                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        _require(name in parsed_tools, "tool_choice.function.name",
                 f"{name!r} is not among the tools ({', '.join(map(repr, parsed_tools)) or 'none given'})")
        return GrammarRequest("tool_call", tools=(parsed_tools[name],))
    raise StructuredOutputError("tool_choice", f"{tool_choice!r} is not 'none', 'auto', 'required' or "
                                               "{\"type\": \"function\", \"function\": {\"name\": ...}}")


class OpenAIGrammars:
    """A model's grammars for OpenAI requests: ``parse_structured``, then the compiler."""

    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler

    @property
    def vocab_size(self) -> int:
        return self.compiler.vocab_size

    def compile(self, response_format: dict | None = None, tools=None, tool_choice=None,
                tool_format: ToolFormat | None = None, parallel: bool = True) -> Grammar | None:
        """The grammar of a request's ``response_format``/``tools``/``tool_choice``, or None when
        the output is unconstrained (no ``response_format`` or ``{"type": "text"}``, and
        ``tool_choice`` absent or "none", or "auto" without a ``tool_format``: with one, a lazy
        grammar holds the calls the model opens in that format). Raises ``StructuredOutputError`` naming the
        field, and ImportError naming the pip package when llguidance is missing."""
        return self.compiler.compile(parse_structured(response_format, tools, tool_choice, tool_format, parallel))
