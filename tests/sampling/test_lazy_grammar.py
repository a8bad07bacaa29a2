"""The lazy tool-call grammar (sampling/lazy_grammar.py) on the real stories260K vocabulary: free
text until a format's trigger, then every call a random walk through the allowed tokens writes
is valid JSON for its tool's schema (a property test over random schemas), read back by the
format's parser."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualpath.sampling.grammar import GrammarCompiler, GrammarRequest
from dualpath.tokenizer.tool_formats import FORMATS, parse_tool_calls

jsonschema = pytest.importorskip("jsonschema")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAX_STEPS = 2000


@pytest.fixture(scope="module")
def compiler(tok):
    pytest.importorskip("llguidance", reason="structured output needs llguidance (the [structured] extra)")
    return GrammarCompiler(tok)


_LEAF = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 1000)),
    st.just({"type": "boolean"}),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(["red", "green", "blue", "x y"]), min_size=1,
                                                max_size=3, unique=True)),
    st.builds(lambda n: {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                         "maxItems": n}, st.integers(0, 3)),
)
_KEYS = st.text("abcdefghij_", min_size=1, max_size=6)


def _object(values):
    def build(props, data):
        names = list(props)
        required = data.draw(st.lists(st.sampled_from(names), unique=True)) if names else []
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return st.builds(build, st.dictionaries(_KEYS, values, max_size=3), st.data())


SCHEMAS = _object(st.one_of(_LEAF, _object(_LEAF)))


def walk_call(matcher, tok, rng) -> list[int]:
    """Tokens chosen uniformly among those the call grammar allows, until the call ends."""
    allowed = np.empty(tok.vocab_size, np.bool_)  # (vocab_size,)
    ids: list[int] = []
    for _ in range(MAX_STEPS):
        matcher.fill_mask(allowed)
        token = int(rng.choice(np.flatnonzero(allowed)))
        assert matcher.accept(token), matcher.error
        if token in tok.stop_ids:
            return ids
        ids.append(token)
        if not matcher.in_call:
            return ids
    raise AssertionError(f"no end after {MAX_STEPS} tokens: {tok.decode(ids)[:200]!r}")


def write(matcher, tok, text: str) -> list[int]:
    """The model writing ``text``: nothing is masked until a trigger, then the call's grammar
    must allow every token."""
    bias = np.empty(tok.vocab_size, np.float32)
    allowed = np.empty(tok.vocab_size, np.bool_)
    ids = tok.encode(text, add_bos=False)
    for t in ids:
        if matcher.in_call:
            matcher.fill_mask(allowed)
            assert allowed[t]
        else:
            assert matcher.fill_bias(bias) is False  # free text: no mask at all
        assert matcher.accept(t)
    return ids


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, seed=st.integers(0, 2**31 - 1))
def test_a_call_under_the_lazy_grammar_is_valid_json_for_its_schema(tok, compiler, fmt, schema, seed):
    f = FORMATS[fmt]
    tools = (("lookup", schema, "tools[0].function.parameters"),
             ("other", {"type": "object", "properties": {}, "additionalProperties": False}, "tools[1]"))
    grammar = compiler.compile(GrammarRequest("lazy_tool_call", tools=tools, tool_format=f, parallel=False))
    matcher = grammar.new_matcher()
    rng = np.random.default_rng(seed)
    ids = write(matcher, tok, "Let me see. " + f.triggers[0])
    assert matcher.in_call
    ids += walk_call(matcher, tok, rng)
    assert matcher.is_finished() and matcher.num_calls == 1
    out = parse_tool_calls(tok.decode(ids), f, ("lookup", "other"))
    assert len(out.calls) == 1, tok.decode(ids)
    name, args = out.calls[0]
    jsonschema.validate(json.loads(args), {"lookup": schema, "other": tools[1][1]}[name])


def test_parallel_calls_return_to_free_text_between_calls(tok, compiler):
    f = FORMATS["hermes"]
    schema = {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
              "required": ["hour"], "additionalProperties": False}
    grammar = compiler.compile(GrammarRequest("lazy_tool_call", tools=(("set_alarm", schema, "tools[0]"),),
                                              tool_format=f, parallel=True))
    matcher = grammar.new_matcher()
    rng = np.random.default_rng(3)
    ids = write(matcher, tok, "Two alarms. <tool_call>")
    ids += walk_call(matcher, tok, rng)
    assert not matcher.in_call and not matcher.is_finished() and matcher.num_calls == 1
    ids += write(matcher, tok, " and <tool_call>")
    ids += walk_call(matcher, tok, rng)
    assert matcher.num_calls == 2
    out = parse_tool_calls(tok.decode(ids), f, ("set_alarm",))
    assert len(out.calls) == 2
    for _, args in out.calls:
        jsonschema.validate(json.loads(args), schema)


def test_a_trigger_that_starts_the_json_is_read_by_the_call_grammar(tok, compiler):
    # Llama 3's trigger is the call's own start: the grammar reads it, then holds what follows.
    f = FORMATS["llama3"]
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 4}}, "required": ["q"],
              "additionalProperties": False}
    grammar = compiler.compile(GrammarRequest("lazy_tool_call", tools=(("search", schema, "tools[0]"),),
                                              tool_format=f, parallel=False))
    matcher = grammar.new_matcher()
    ids = write(matcher, tok, '{"name": ')
    assert matcher.in_call
    ids += walk_call(matcher, tok, np.random.default_rng(5))
    out = parse_tool_calls(tok.decode(ids), f, ("search",))
    assert [n for n, _ in out.calls] == ["search"]
    jsonschema.validate(json.loads(out.calls[0][1]), schema)

