"""Structured output: a JSON schema or a forced tool call as a token mask per step.

The only module that imports the constrained-decoding library, llguidance (Rust, no Python
dependencies; ``pip install "dualpath[structured]"``). It turns a checked
``GrammarRequest`` (a JSON object, a JSON schema, or one ``{"name", "arguments"}`` object
valid for one of some tools' parameters; server/structured.py parses OpenAI's
``response_format``/``tools``/``tool_choice`` into one) into a ``Grammar``, and each
sequence's walk through it into a ``Matcher`` that fills a preallocated mask over the
vocabulary. No Python loop over the vocabulary runs per token: llguidance writes one bit
per token, and one ``np.take`` over a 256-entry table expands those bits into the caller's
mask. ``fill_bias`` (0 or -inf, added with ``np.add``) is the form to apply; ``fill_mask``
writes booleans (True = allowed), whose ``np.copyto(..., where=~allowed)``
branches per element and is several times slower.

Lifecycle (one facade per subsystem, paired lifetimes)::

    compiler = GrammarCompiler(tokenizer, vocab_size)        # once per model; cheap until used
    grammar = compiler.compile(request)                      # a GrammarRequest; None: unconstrained
    matcher = grammar.new_matcher()                          # one per sequence (n > 1: several)
    bias = np.empty(vocab_size, np.float32)                  # (vocab_size,) 0 or -inf, per sequence
    while not matcher.is_finished():
        matcher.fill_bias(bias)
        np.add(logits, bias, out=logits)                     # the one numpy call in the sampler
        token = sample(logits)
        if not matcher.accept(token): ...                    # cannot happen if the mask was applied

Invariants

* Masks cover the model's ``vocab_size`` logits. Ids the tokenizer does not have (a padded
  embedding) are never allowed; tokenizer ids at or above ``vocab_size`` cannot be sampled.
* When the grammar is complete, every id of ``tokenizer.stop_ids`` (EOS, EOT, BOS: the ids the
  engine stops on) is allowed; once nothing can follow, only they are, and ``is_finished()`` is
  True. Accepting one of them also finishes the matcher.
* Control tokens (BOS, ``<|im_start|>`` ...) and unused ids are never allowed inside the grammar.
* Whitespace: one optional run before the value, and at each place JSON allows whitespace, a
  single space or one or two newlines plus up to 20 spaces/tabs (llama.cpp's ``space`` rule), so a
  model cannot loop on whitespace. A SentencePiece model's first token may be ``▁{``.
* Object properties come in the order the schema lists them (llguidance's rule); the schema
  text, in the request's key order, is the cache key.
* Unsupported schema keywords (``not``, ``uniqueItems``, ``dependentRequired``, lookaround in a
  ``pattern``, an unknown ``format``) are refused with ``StructuredOutputError`` naming the field,
  never silently ignored.

Why llguidance: no Python dependency and one abi3 wheel per platform (a Rust sdist elsewhere,
e.g. Termux); context-free (recursive ``$ref``, any JSON), several EOS ids, schema errors we can
report, and no per-schema precomputation over the vocabulary, so a new schema compiles quickly
even at 128k tokens. xgrammar is faster per token but imports torch and transformers;
outlines-core is regex-only with one EOS id and indexes each schema over the vocabulary;
formatron/kbnf pins an old pydantic and needs more Rust builds on Termux. The per-token cost
against a decode step is in docs/performance.md.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dualpath.errors import DualPathError
from dualpath.tokenizer import Tokenizer
from dualpath.tokenizer.spec import TOKEN_USER_DEFINED
from dualpath.tokenizer.tool_formats import ToolFormat, in_json, trigger_pattern

from .lazy_grammar import LazyMatcher, LazySpec

logger = logging.getLogger(__name__)

PIP_REQUIREMENT = "llguidance>=1.9,<2"
"""What ``pip install "dualpath[structured]"`` installs. llguidance 0.0.1 is an empty placeholder
wheel (py3-none-any) that pip would pick on Android with ``--only-binary``: the lower bound
keeps it out."""

_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})"
"""One place of JSON whitespace: llama.cpp's json-schema-to-grammar ``space`` rule, bounded so a
model cannot emit whitespace forever."""

_JSON_OPTIONS = {"whitespace_pattern": _WHITESPACE, "lenient": False}
"""llguidance's JSON compiler options ("x-guidance"); a client's own "x-guidance" is replaced."""

_MAX_CACHED_GRAMMARS = 32

# (256, 8): for each byte value, its 8 bits, least significant first, as the mask of 8 token
# ids (llguidance's bit i of 32-bit word w is token 32*w + i, and words are little-endian).
_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
_BOOL_TABLE = _BITS.astype(np.bool_)
_BIAS_TABLE = np.where(_BOOL_TABLE, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


class StructuredOutputError(DualPathError, ValueError):
    """A ``response_format``, ``tools`` or ``tool_choice`` that cannot be honoured.

    ``param`` is the request field at fault (``"response_format.json_schema.schema"``,
    ``"tools[1].function.parameters"`` ...), for an OpenAI error object's ``param``.
    """

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _import_llguidance():
    """The llguidance module, or an ImportError that says what to install."""
    try:
        import llguidance
    except ImportError as e:
        raise ImportError("structured output (response_format json_object/json_schema, forced tool calls) "
                          f"needs the Python package llguidance: pip install \"dualpath[structured]\" "
                          f"(or pip install \"{PIP_REQUIREMENT}\")") from e
    if not hasattr(llguidance, "LLMatcher"):
        raise ImportError(f"the installed llguidance ({getattr(llguidance, '__version__', 'a placeholder')}) "
                          f"lacks LLMatcher: pip install \"{PIP_REQUIREMENT}\"")
    return llguidance


# ---------------------------------------------------------------------------- what to constrain


@dataclass(frozen=True)
class GrammarRequest:
    """What a request asks for, checked: the grammar's kind and what it is built from."""

    kind: str
    """``"json_object"``, ``"json_schema"`` or ``"tool_call"``."""
    schema: object = None
    """The JSON schema (json_object, json_schema)."""
    tools: tuple = ()
    """``(name, parameters schema, field path)`` per allowed tool (tool_call, lazy_tool_call)."""
    tool_format: ToolFormat | None = None
    """lazy_tool_call: the family's call format (tokenizer/tool_formats.py)."""
    parallel: bool = True
    """lazy_tool_call: several calls in one turn (``parallel_tool_calls``)."""

    def key(self) -> str:
        """Cache key: the schema text in the request's key order (property order matters)."""
        fmt = self.tool_format.name if self.tool_format is not None else None
        return json.dumps([self.kind, self.schema, [t[:2] for t in self.tools], fmt, self.parallel],
                          separators=(",", ":"))


# ---------------------------------------------------------------------------- grammar text


def _lark_string(text: str) -> str:
    """A Lark string literal matching ``text`` exactly."""
    return json.dumps(text)


def _json_rule(schema) -> str:
    """``%json {...}`` for a schema, with our whitespace options in place of any client's."""
    return "%json " + json.dumps(_with_options(schema))


def _with_options(schema: dict) -> dict:
    return {**{k: v for k, v in schema.items() if k != "x-guidance"}, "x-guidance": _JSON_OPTIONS}


def _call_rules(lines: list[str], tools, args_key: str) -> str:
    """Add the rules of one ``{"name": "<tool>", "<args_key>": {...}}`` object; its rule name.
    Each tool's parameters stay a schema document of their own, so their
    ``"$ref": "#/$defs/..."`` resolve as the client wrote them."""
    q = _lark_string
    alts = []
    for i, (name, params, _) in enumerate(tools):
        lines.append(f"call_{i}: {q(json.dumps(name))} WS? {q(',')} WS? {q(json.dumps(args_key))} "
                     f"WS? {q(':')} WS? args_{i}")
        lines.append(f"args_{i}: {_json_rule(params)}")
        alts.append(f"call_{i}")
    lines.append(f"call: {q('{')} WS? {q(json.dumps('name'))} WS? {q(':')} WS? ({' | '.join(alts)}) WS? {q('}')}")
    return "call"


def _lark_grammar(req: GrammarRequest, close_rule: str = "") -> str:
    """The Lark text of a request: optional leading whitespace, then the JSON value. For
    a lazy call, the text from its trigger on: the call (or list of calls), then
    ``close_rule`` (its closing marker, as text or a token)."""
    lines = [f"WS: /{_WHITESPACE}/"]
    if req.kind in ("json_object", "json_schema"):
        lines += ["start: WS? value", f"value: {_json_rule(req.schema)}"]
        return "\n".join(lines) + "\n"
    fmt = req.tool_format
    call = _call_rules(lines, req.tools, fmt.args_key if fmt is not None else "arguments")
    if fmt is None:  # a forced call: the bare object
        lines.append(f"start: WS? {call}")
    elif fmt.is_list:
        more = f" (WS? {_lark_string(',')} WS? {call})*" if req.parallel else ""
        lines.append(f"start: WS? {_lark_string('[')} WS? {call}{more} WS? {_lark_string(']')}"
                     + (f" WS? {close_rule}" if close_rule else ""))
    else:
        lines.append(f"start: WS? {call}" + (f" WS? {close_rule}" if close_rule else ""))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the facade


class Matcher:
    """One sequence's position in a grammar. Not thread-safe; one per sequence.

    ``fill_bias`` / ``fill_mask`` do not change the state; ``accept`` does.
    """

    __slots__ = ("_m", "_bits", "_vocab_size", "_num_full_bytes", "_bytes", "_num_tokens")

    def __init__(self, llg_matcher, num_llg_tokens: int, vocab_size: int):
        self._m = llg_matcher
        self._bits = np.zeros((num_llg_tokens + 31) // 32, np.int32)  # (words,) bit t%32 of word t//32: token t
        self._bytes = self._bits.view(np.uint8)                          # (4 * words,) the same, bytewise
        self._vocab_size = vocab_size
        self._num_full_bytes = vocab_size // 8
        self._num_tokens = num_llg_tokens

    def _compute(self, out: np.ndarray, dtype, name: str) -> None:
        if out.dtype != dtype or out.shape != (self._vocab_size,) or not out.flags.c_contiguous:
            raise ValueError(f"{name}: needs a contiguous {np.dtype(dtype).name} array of shape "
                             f"({self._vocab_size},), got {out.dtype} {out.shape}")
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)

    def _expand(self, out: np.ndarray, table: np.ndarray) -> None:
        n8 = self._num_full_bytes
        np.take(table, self._bytes[:n8], axis=0, out=out[:8 * n8].reshape(n8, 8))
        tail = self._vocab_size - 8 * n8
        if tail:
            out[8 * n8:] = table[self._bytes[n8], :tail]

    def fill_bias(self, bias: np.ndarray) -> bool:
        """Write 0.0 for each allowed token and -inf for the others into ``bias`` (vocab_size,)
        float32; the sampler adds it to the logits with ``np.add(logits, bias, out=logits)``.
        True: the mask applies (a ``LazyMatcher`` returns False while the text is free)."""
        self._compute(bias, np.float32, "fill_bias")
        self._expand(bias, _BIAS_TABLE)
        return True

    def fill_mask(self, allowed: np.ndarray) -> None:
        """Write True for each allowed token into ``allowed`` (vocab_size,) bool."""
        self._compute(allowed, np.bool_, "fill_mask")
        self._expand(allowed, _BOOL_TABLE)

    def accept(self, token_id: int) -> bool:
        """Advance by ``token_id``. False if the grammar does not allow it: the matcher then stays
        in an error state (``error`` says why) and allows nothing more. An id outside the
        vocabulary raises ValueError."""
        token_id = int(token_id)
        if not 0 <= token_id < self._num_tokens:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self._num_tokens})")
        return bool(self._m.consume_token(token_id))

    def allows(self, token_id: int) -> bool:
        """True when ``accept(token_id)`` would succeed; the state does not change (one token
        is checked without computing the whole mask)."""
        return 0 <= token_id < self._num_tokens and self._m.validate_tokens([int(token_id)]) == 1

    def is_finished(self) -> bool:
        """True when nothing but an end-of-sequence token may follow, or one was accepted."""
        return self._m.is_stopped() and not self._m.is_error()

    def is_accepting(self) -> bool:
        """True when the text so far is a complete value (an end-of-sequence token is allowed)."""
        return self._m.is_accepting()

    @property
    def error(self) -> str | None:
        """Why the matcher stopped accepting tokens, or None."""
        if not self._m.is_error():
            return None
        return _one_line([self._m.get_error() or "rejected"])


class _LLMatcherProto(Protocol):
    """The part of llguidance's ``LLMatcher`` a ``Grammar`` uses (llguidance is imported lazily)."""

    def deep_copy(self) -> Any: ...


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled constraint; shared by every request that asks for the same one."""

    kind: str
    """``"json_object"``, ``"json_schema"`` or ``"tool_call"``."""
    tool_names: tuple[str, ...]
    """The tools a ``tool_call`` grammar lets the model call, in the request's order."""
    _proto: _LLMatcherProto = field(repr=False)
    """An llguidance matcher at the start; every new matcher is a copy, not a rebuild."""
    _num_llg_tokens: int = field(repr=False)
    _vocab_size: int = field(repr=False)
    _lazy: LazySpec | None = field(default=None, repr=False)
    """lazy_tool_call: the triggers that start the call grammar (``_proto``)."""

    def new_matcher(self) -> Matcher | LazyMatcher:
        """A matcher at the start of the grammar, for one sequence (a ``LazyMatcher``, free
        until a call opens, for a lazy_tool_call grammar)."""
        if self._lazy is not None:
            return LazyMatcher(self._lazy)
        return self._new_call()

    def _new_call(self) -> Matcher:
        return Matcher(self._proto.deep_copy(), self._num_llg_tokens, self._vocab_size)


class GrammarCompiler:
    """Compiles requests into ``Grammar``s for one model's vocabulary, and caches them.

    ``vocab_size`` is the width of the model's logits (default: the tokenizer's). The
    llguidance vocabulary (token byte strings) is built on the first ``compile`` that needs a
    grammar, so a server that never sees one never pays for it.
    Thread-safe.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None,
                 *, max_cached: int = _MAX_CACHED_GRAMMARS):
        self._tokenizer = tokenizer
        self._vocab_size = tokenizer.vocab_size if vocab_size is None else int(vocab_size)
        if self._vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 1")
        if tokenizer.vocab_size > self._vocab_size:
            logger.warning("tokenizer has %d tokens but the model's logits only %d: tokens %d.. cannot be "
                           "sampled under a grammar", tokenizer.vocab_size, self._vocab_size, self._vocab_size)
        self._max_cached = max_cached
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()
        self._llg = None
        self._llg_tokenizer = None
        self._llg_vocab: _LlgVocabulary | None = None
        self._limits = None
        self._num_llg_tokens = max(self._vocab_size, tokenizer.vocab_size)

    @property
    def vocab_size(self) -> int:
        """Length of the masks that matchers fill."""
        return self._vocab_size

    def compile(self, req: GrammarRequest | None) -> Grammar | None:
        """The grammar of a checked request (server/structured.py parses OpenAI's
        ``response_format``/``tools``/``tool_choice`` into one), or None when ``req`` is None
        (the output is unconstrained).

        Raises ``StructuredOutputError`` (a ValueError) naming the field for a schema feature
        that is not supported, and ImportError naming the pip package when llguidance is
        missing.
        """
        if req is None:
            return None
        key = req.key()
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                return grammar
            grammar = self._build(req)
            self._cache[key] = grammar
            if len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
            return grammar

    # ------------------------------------------------------------------ internals (under the lock)

    def _build(self, req: GrammarRequest) -> Grammar:
        llg, ltok = self._llguidance()
        # Each schema alone first, so that an error names the request field it comes from.
        if req.kind in ("tool_call", "lazy_tool_call"):
            schemas = [(params, where) for _, params, where in req.tools]
        else:
            schemas = [(req.schema, "response_format.json_schema.schema")]
        for schema, where in schemas:
            text = llg.LLMatcher.grammar_from_json_schema(_with_options(schema))
            is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(text, ltok, limits=self._limits)
            if is_error:
                raise StructuredOutputError(where, f"unsupported or invalid JSON schema: {_one_line(messages)}")
        close = self._close_rule(req.tool_format) if req.kind == "lazy_tool_call" else ""
        text = llg.LLMatcher.grammar_from_lark(_lark_grammar(req, close))
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(text, ltok, limits=self._limits)
        if is_error:  # our wrapper around schemas that passed alone: a bug here, not in the request
            raise RuntimeError(f"structured output grammar failed to build: {_one_line(messages)}")
        for message in messages:
            logger.info("structured output grammar (%s): %s", req.kind, message)
        proto = llg.LLMatcher(ltok, text, log_level=0, limits=self._limits)
        if proto.is_error():
            raise StructuredOutputError("response_format" if "tool_call" not in req.kind else "tools",
                                        f"grammar cannot start: {_one_line([proto.get_error()])}")
        grammar = Grammar(req.kind, tuple(t[0] for t in req.tools), proto, self._num_llg_tokens, self._vocab_size)
        if req.kind != "lazy_tool_call":
            return grammar
        assert req.tool_format is not None  # structured.py sets it for every lazy call
        fmt = req.tool_format
        special, _ = self._tokenizer.decode_tables(skip_special=False)
        pattern = re.compile(trigger_pattern(fmt).pattern.encode())
        tok = self._tokenizer
        spec = LazySpec(fmt, req.parallel, pattern, tuple(in_json(t) for t in fmt.triggers), special,
                        lambda text: tok._encode_fragment(text, False), grammar._new_call,
                        4 * max(len(t) for t in fmt.triggers) + 64)
        return Grammar(req.kind, grammar.tool_names, proto, self._num_llg_tokens, self._vocab_size, spec)

    def _close_rule(self, fmt: ToolFormat | None) -> str:
        """The Lark of a format's closing marker: the one token it is where the vocabulary has
        it as a special token (which no text can spell), else the text."""
        if fmt is None or not fmt.close:
            return ""
        ids = self._tokenizer.encode(fmt.close, add_bos=False, parse_special=True)
        if len(ids) == 1 and self._llg_vocab is not None and self._llg_vocab.tokens[ids[0]][:1] == b"\xff":
            return f"<[{ids[0]}]>"
        return _lark_string(fmt.close)

    def _llguidance(self):
        """(llguidance module, its tokenizer of our vocabulary), built once."""
        if self._llg_tokenizer is None:
            llg = _import_llguidance()
            vocab = _LlgVocabulary(self._tokenizer, self._num_llg_tokens)
            self._llg_vocab = vocab
            self._llg_tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(vocab), n_vocab=self._num_llg_tokens,
                                                  eos_token=vocab.stop_ids)
            # Errors without the parser state and grammar dump (a matcher's error is one line).
            self._limits = llg.LLParserLimits(verbose_errors=False)
            self._llg = llg
        return self._llg, self._llg_tokenizer


def _one_line(messages: Sequence[str]) -> str:
    """llguidance's messages on one line (its regex errors span three), at most 500 characters."""
    text = " ".join(line.strip() for m in messages for line in m.splitlines() if line.strip())
    return (text or "no detail given")[:500]


class _LlgVocabulary:
    """Our vocabulary in the shape ``llguidance.TokenizerWrapper`` reads.

    ``tokens``: the bytes each id contributes to decoded text. Control, unknown and unused ids,
    and user-defined ones that look like ``<...>`` (as llguidance's llama.cpp bridge does), become
    special: ``b"\\xff" + text``, which llguidance never allows inside a grammar. Ids past the
    tokenizer's vocabulary (a padded embedding) are ``b""``: never allowed.
    """

    def __init__(self, tokenizer: Tokenizer, num_tokens: int):
        plain, _ = tokenizer.decode_tables(skip_special=True)
        special, _ = tokenizer.decode_tables(skip_special=False)
        types = tokenizer.spec.token_types
        tokens: list[bytes] = []
        for token_id, text in enumerate(plain):
            if text and not (types is not None and types[token_id] == TOKEN_USER_DEFINED
                             and text[:1] == b"<" and text[-1:] == b">"):
                tokens.append(text)
            else:
                tokens.append(b"\xff" + (special[token_id] or tokenizer.spec.tokens[token_id].encode("utf-8")))
        tokens.extend(b"" for _ in range(num_tokens - len(tokens)))
        self.tokens = tokens
        stops = sorted(tokenizer.stop_ids)
        if not stops:
            raise StructuredOutputError("model", "the vocabulary has no end-of-sequence token, so a grammar "
                                                 "could never end")
        self.stop_ids = stops
        self.eos_token_id = stops[0] if tokenizer.eos_id is None else tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i, t in enumerate(tokens) if t[:1] == b"\xff"]
        self._encode = tokenizer._encode_fragment

    def __call__(self, text):
        """Token ids of ``text`` continuing earlier text (no BOS, no SentencePiece dummy prefix).
        llguidance calls this on bytes a grammar forces; str only (bytes raise, so it passes str)."""
        if not isinstance(text, str):
            raise TypeError("str expected")
        return self._encode(text, False) if text else []
