"""Structured output (sampling/grammar.py) on the real stories260K vocabulary: random walks through
the allowed tokens always give JSON that validates, and malformed requests name their field."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from dualpath.sampling.grammar import GrammarCompiler as _GrammarCompiler
from dualpath.sampling.grammar import StructuredOutputError
from dualpath.server.structured import OpenAIGrammars

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 3},
        "mood": {"enum": ["happy", "sad", "sleepy"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "mood", "tags"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"$ref": "#/$defs/unit"}},
    "required": ["city", "unit"],
    "additionalProperties": False,
    "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
}}}
ALARM = {"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object",
    "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
    "required": ["hour"],
    "additionalProperties": False,
}}}
MAX_STEPS = 3000


@pytest.fixture(scope="module")
def compiler(tok):
    pytest.importorskip("llguidance", reason="structured output needs llguidance (the [structured] extra)")
    return GrammarCompiler(tok)


def GrammarCompiler(tok, **kwargs) -> OpenAIGrammars:
    """The compiler with OpenAI's request shapes parsed first (server/structured.py)."""
    return OpenAIGrammars(_GrammarCompiler(tok, **kwargs))


def validate(instance, schema):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(instance, schema)


def random_walk(grammar, tok, seed: int, vocab_size: int | None = None) -> list[int]:
    """Token ids chosen uniformly among the allowed ones until the matcher finishes."""
    rng = np.random.default_rng(seed)
    matcher = grammar.new_matcher()
    allowed = np.empty(vocab_size or tok.vocab_size, np.bool_)  # (vocab_size,)
    ids: list[int] = []
    for _ in range(MAX_STEPS):
        matcher.fill_mask(allowed)
        token = int(rng.choice(np.flatnonzero(allowed)))
        assert matcher.accept(token), matcher.error
        if token in tok.stop_ids:
            assert matcher.is_finished()
            return ids
        ids.append(token)
        if matcher.is_finished():
            return ids
    raise AssertionError(f"no end after {MAX_STEPS} tokens: {tok.decode(ids)[:200]!r}")


def feed_text(matcher, tok, text: str) -> bool:
    """Feed the tokens of ``text`` (as the model's SentencePiece encoding, with its leading "▁"),
    checking each against the mask first; False at the first token the mask refuses."""
    allowed = np.empty(tok.vocab_size, np.bool_)
    for token in tok.encode(text, add_bos=False):
        matcher.fill_mask(allowed)
        if not allowed[token]:
            return False
        assert matcher.accept(token), matcher.error
    return True


@pytest.mark.parametrize("seed", range(6))
def test_random_walk_through_json_schema_parses_and_validates(compiler, tok, seed):
    grammar = compiler.compile(JSON_SCHEMA)
    text = tok.decode(random_walk(grammar, tok, seed))
    value = json.loads(text)
    validate(value, SCHEMA)
    assert list(value) == ["name", "age", "mood", "tags"]  # properties come in schema order


def test_finished_matcher_allows_only_the_stop_ids(compiler, tok):
    matcher = compiler.compile(JSON_SCHEMA).new_matcher()
    assert feed_text(matcher, tok, '{"name": "Lily", "age": 3, "mood": "happy", "tags": ["cat"]}')
    assert matcher.is_finished() and matcher.is_accepting()
    allowed = np.empty(tok.vocab_size, np.bool_)
    matcher.fill_mask(allowed)
    assert set(np.flatnonzero(allowed).tolist()) == set(tok.stop_ids) == {tok.bos_id, tok.eos_id}
    assert matcher.accept(tok.eos_id) and matcher.is_finished()


def test_bias_is_zero_exactly_where_the_mask_allows(compiler, tok):
    matcher = compiler.compile(JSON_SCHEMA).new_matcher()
    allowed = np.empty(tok.vocab_size, np.bool_)
    bias = np.empty(tok.vocab_size, np.float32)
    for text in ('', '{"name": "Li'):
        assert feed_text(matcher, tok, text)
        matcher.fill_mask(allowed)
        matcher.fill_bias(bias)
        assert np.array_equal(bias == 0.0, allowed)
        assert np.all(np.isneginf(bias[~allowed]))
    logits = np.zeros(tok.vocab_size, np.float32)
    np.add(logits, bias, out=logits)  # what the sampler does
    assert int(np.argmax(logits)) in np.flatnonzero(allowed)


def test_start_allows_whitespace_and_brace_but_no_control_token(compiler, tok):
    matcher = compiler.compile(JSON_SCHEMA).new_matcher()
    allowed = np.empty(tok.vocab_size, np.bool_)
    matcher.fill_mask(allowed)
    pieces = {tok.token_bytes(i) for i in np.flatnonzero(allowed)}
    assert pieces == {b"{", b" ", b"\n"}  # stories260K has "▁" and <0x20>, both a space: both allowed
    assert not allowed[[tok.bos_id, tok.eos_id, tok.spec.unk_id]].any()


def test_json_object_takes_any_object_and_nothing_else(compiler, tok):
    grammar = compiler.compile({"type": "json_object"})
    text = '{"a": [1, 2.5, {"b": null}], "c": "x y", "d": true}'
    matcher = grammar.new_matcher()
    assert feed_text(matcher, tok, text)
    assert matcher.is_finished()
    assert json.loads(text)  # the text the tokens decode to is the JSON we fed
    for other in ('[1, 2]', '"a string"', '42', '{"a" 1}'):
        assert not feed_text(grammar.new_matcher(), tok, other), other


def test_rejected_token_returns_false_and_keeps_an_error(compiler, tok):
    matcher = compiler.compile({"type": "json_object"}).new_matcher()
    allowed = np.empty(tok.vocab_size, np.bool_)
    matcher.fill_mask(allowed)
    refused = int(np.flatnonzero(~allowed)[10])
    assert not matcher.accept(refused)
    assert matcher.error and not matcher.is_finished()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        matcher.accept(tok.vocab_size)


@pytest.mark.parametrize("seed", range(4))
def test_required_tool_call_names_a_tool_with_valid_arguments(compiler, tok, seed):
    grammar = compiler.compile(None, [WEATHER, ALARM], "required")
    assert grammar.kind == "tool_call" and grammar.tool_names == ("get_weather", "set_alarm")
    call = json.loads(tok.decode(random_walk(grammar, tok, seed)))
    assert list(call) == ["name", "arguments"]
    tool = {"get_weather": WEATHER, "set_alarm": ALARM}[call["name"]]
    validate(call["arguments"], tool["function"]["parameters"])  # "$ref": "#/$defs/unit" resolved in place


def test_named_tool_choice_calls_that_tool(compiler, tok):
    grammar = compiler.compile(None, [WEATHER, ALARM], {"type": "function", "function": {"name": "set_alarm"}})
    assert grammar.tool_names == ("set_alarm",)
    for seed in range(3):
        call = json.loads(tok.decode(random_walk(grammar, tok, seed)))
        assert call["name"] == "set_alarm" and 0 <= call["arguments"]["hour"] <= 23


def test_function_without_parameters_takes_empty_arguments(compiler, tok):
    grammar = compiler.compile(None, [{"type": "function", "function": {"name": "ping"}}], "required")
    assert feed_text(grammar.new_matcher(), tok, '{"name": "ping", "arguments": {}}')
    assert not feed_text(grammar.new_matcher(), tok, '{"name": "ping", "arguments": {"a": 1}}')


@pytest.mark.parametrize("response_format, tools, tool_choice", [
    (None, None, None),
    ({"type": "text"}, None, None),
    (None, [WEATHER], "auto"),
    (None, [WEATHER], "none"),
    (None, [WEATHER], None),
])
def test_unconstrained_requests_give_no_grammar(compiler, response_format, tools, tool_choice):
    assert compiler.compile(response_format, tools, tool_choice) is None


def test_forced_tool_call_wins_over_response_format(compiler):
    assert compiler.compile(JSON_SCHEMA, [WEATHER], "required").kind == "tool_call"
    assert compiler.compile(JSON_SCHEMA, [WEATHER], "auto").kind == "json_schema"


@pytest.mark.parametrize("response_format, param", [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format.type"),
    ({}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "pet", "schema": "{}"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": "yes"}},
     "response_format.json_schema.strict"),
])
def test_malformed_response_format_names_the_field(compiler, response_format, param):
    with pytest.raises(StructuredOutputError) as info:
        compiler.compile(response_format)
    assert info.value.param == param and str(info.value).startswith(f"{param}: ")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("schema, words", [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
    ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
    ({"type": "wood"}, "wood"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
])
def test_unsupported_schema_feature_is_refused_naming_the_field(compiler, schema, words):
    with pytest.raises(StructuredOutputError, match=words) as info:
        compiler.compile({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert info.value.param == "response_format.json_schema.schema"


@pytest.mark.parametrize("tools, tool_choice, param", [
    ("get_weather", "required", "tools"),
    ([WEATHER, {"type": "custom", "custom": {"name": "x"}}], "required", "tools[1].type"),
    ([{"type": "function"}], "required", "tools[0].function"),
    ([{"type": "function", "function": {"name": "bad name"}}], "required", "tools[0].function.name"),
    ([WEATHER, WEATHER], "required", "tools[1].function.name"),
    ([WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
     "required", "tools[1].function.parameters"),
    (None, "required", "tool_choice"),
    ([WEATHER], "always", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "set_alarm"}}, "tool_choice.function.name"),
    ([WEATHER], {"type": "function"}, "tool_choice"),
])
def test_malformed_tools_or_tool_choice_names_the_field(compiler, tools, tool_choice, param):
    with pytest.raises(StructuredOutputError) as info:
        compiler.compile(None, tools, tool_choice)
    assert info.value.param == param


def test_grammars_are_cached_by_schema_text_in_request_order(compiler):
    first = compiler.compile(JSON_SCHEMA)
    assert compiler.compile(json.loads(json.dumps(JSON_SCHEMA))) is first
    reordered = dict(SCHEMA, properties=dict(reversed(list(SCHEMA["properties"].items()))))
    other = compiler.compile({"type": "json_schema", "json_schema": {"name": "pet", "schema": reordered}})
    assert other is not first  # property order is part of the grammar


def test_matchers_of_one_grammar_are_independent(compiler, tok):
    grammar = compiler.compile(JSON_SCHEMA)
    ahead, fresh = grammar.new_matcher(), grammar.new_matcher()
    assert feed_text(ahead, tok, '{"name": "Tom"')
    a = np.empty(tok.vocab_size, np.bool_)
    b = np.empty(tok.vocab_size, np.bool_)
    fresh.fill_mask(a)
    grammar.new_matcher().fill_mask(b)
    assert np.array_equal(a, b)
    ahead.fill_mask(b)
    assert not np.array_equal(a, b)


def test_mask_is_padded_to_a_larger_model_vocabulary(tok):
    pytest.importorskip("llguidance")
    compiler = GrammarCompiler(tok, vocab_size=tok.vocab_size + 13)
    grammar = compiler.compile(JSON_SCHEMA)
    allowed = np.empty(tok.vocab_size + 13, np.bool_)
    bias = np.empty(tok.vocab_size + 13, np.float32)
    for seed in range(2):
        json.loads(tok.decode(random_walk(grammar, tok, seed, vocab_size=tok.vocab_size + 13)))
    matcher = grammar.new_matcher()
    matcher.fill_mask(allowed)
    matcher.fill_bias(bias)
    assert not allowed[tok.vocab_size:].any() and np.isneginf(bias[tok.vocab_size:]).all()
    with pytest.raises(ValueError, match=rf"\({tok.vocab_size + 13},\)"):
        matcher.fill_mask(np.empty(tok.vocab_size, np.bool_))
    with pytest.raises(ValueError, match="float32"):
        matcher.fill_bias(np.empty(tok.vocab_size + 13, np.float64))


def test_missing_llguidance_names_the_pip_package(tok, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
    compiler = GrammarCompiler(tok)
    assert compiler.compile({"type": "text"}) is None  # unconstrained requests never import it
    with pytest.raises(StructuredOutputError):  # nor does checking the request shape
        compiler.compile({"type": "json_schema"})
    with pytest.raises(ImportError, match=r'pip install "dualpath\[structured\]"'):
        compiler.compile({"type": "json_object"})


def _masked_walk(grammar, tok, params, seed: int, fast: bool, steps: int = 40) -> list[int]:
    """Tokens a seeded sampler picks under ``grammar`` from random logits: with ``fast`` the
    sampler gets the matcher (it checks a draw before computing the mask), otherwise the
    mask computed first, as before."""
    from dualpath.sampling.sampler import Sampler

    rng = np.random.default_rng(seed)
    matcher, sampler = grammar.new_matcher(), Sampler(params, tok.vocab_size)
    bias = np.empty(tok.vocab_size, np.float32)
    ids: list[int] = []
    for _ in range(steps):
        logits = rng.standard_normal(tok.vocab_size).astype(np.float32) * 4
        if fast:
            token = sampler.sample(logits, ids, bias, matcher)
        else:
            matcher.fill_bias(bias)
            token = sampler.sample(logits, ids, bias)
        assert matcher.accept(token), matcher.error
        if matcher.is_finished():
            break
        ids.append(token)
    return ids


@pytest.mark.parametrize("seed", range(4))
def test_greedy_draw_checked_against_the_grammar_is_the_masked_argmax(compiler, tok, seed):
    from dualpath.sampling_params import SamplingParams

    grammar = compiler.compile(JSON_SCHEMA)
    params = SamplingParams(temperature=0.0)
    fast, full = (_masked_walk(grammar, tok, params, seed, f) for f in (True, False))
    assert fast == full and len(fast) > 5


def test_untruncated_sampling_with_rejection_keeps_the_masked_distribution(compiler, tok):
    """Rejection sampling draws each allowed token with its masked probability: over many
    first tokens of a JSON object, the frequencies match those of the full mask."""
    from dualpath.sampling.sampler import Sampler
    from dualpath.sampling_params import SamplingParams

    grammar = compiler.compile({"type": "json_object"})
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(tok.vocab_size).astype(np.float32) * 3
    allowed = np.empty(tok.vocab_size, np.bool_)
    grammar.new_matcher().fill_mask(allowed)
    p = np.where(allowed, np.exp(logits - logits.max()), 0.0)
    p /= p.sum()
    sampler, bias, n = Sampler(params, tok.vocab_size), np.empty(tok.vocab_size, np.float32), 4000
    counts = np.zeros(tok.vocab_size)
    for _ in range(n):
        counts[sampler.sample(logits, (), bias, grammar.new_matcher())] += 1
    assert counts[~allowed].sum() == 0  # never a refused token
    top = np.argsort(-p)[:5]  # the likeliest allowed tokens: each within 5 standard errors
    assert np.all(np.abs(counts[top] / n - p[top]) <= 5 * np.sqrt(p[top] * (1 - p[top]) / n) + 1e-9)


@pytest.mark.parametrize("top_k, top_p, min_p", [(40, 0.95, 0.05), (5, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.1)])
def test_truncated_sampling_gives_the_draws_of_the_full_mask(compiler, tok, top_k, top_p, min_p):
    """Top-k first: the grammar is asked about the k candidates, and when it allows them all
    the draw is the one under the mask; top-p or min-p over the whole vocabulary take the
    mask first. Either way the same tokens as the sampler given the mask."""
    from dualpath.sampling_params import SamplingParams

    grammar = compiler.compile(JSON_SCHEMA)
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p, seed=11)
    for seed in range(3):
        fast = _masked_walk(grammar, tok, params, seed, True)
        assert fast == _masked_walk(grammar, tok, params, seed, False) and len(fast) > 5
