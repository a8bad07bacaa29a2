"""``dualpath bench tools``: what a tool call's lazy grammar costs in decode speed.

Three rows, the same prompt and greedy decoding (or sampled: ``--temperature``), ``--tokens`` tokens each, taking turns
(``common.interleaved``), medians of ``--repeats``:

* **free text**: no grammar;
* **lazy, free text**: the request has tools (``tool_choice`` "auto"): the lazy grammar
  watches the text for the model's call trigger and masks nothing;
* **lazy, in a call**: the same lazy grammar opened at its trigger before the first token
  (as if the model had just written it), so every token is masked to the call's arguments:
  a list of objects the schema makes longer than ``--tokens``.

Decode tokens/s counts from the first generated token to the last (the engine's timings).
The acceptance: the call path within 10% of free text.
"""

from __future__ import annotations

import os
import statistics

from .common import interleaved, write_json

PROMPT = "Here is the shopping list for the party, written out in full:\n"
ITEMS_SCHEMA = {"type": "object", "properties": {"items": {
    "type": "array", "minItems": 200,
    "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
              "required": ["name", "qty"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}
VARIANTS = ("free text", "lazy, free text", "lazy, in a call")


class _Opened:
    """A lazy grammar whose matchers start just past the trigger (a forced first token)."""

    def __init__(self, grammar, trigger_ids):
        self.grammar, self.trigger_ids = grammar, trigger_ids

    def new_matcher(self):
        m = self.grammar.new_matcher()
        for t in self.trigger_ids:
            m.accept(t)
        assert m.in_call, "the trigger did not open a call"
        return m


def _grammars(llm):
    from ..sampling.grammar import GrammarCompiler, GrammarRequest

    fmt = llm.tool_format
    compiler = GrammarCompiler(llm.tokenizer, llm.spec.config.vocab_size)
    lazy = compiler.compile(GrammarRequest("lazy_tool_call", tools=(("add_to_list", ITEMS_SCHEMA, "tools[0]"),),
                                           tool_format=fmt, parallel=False))
    trigger = llm.tokenizer.encode(fmt.triggers[0], add_bos=False, parse_special=True)
    return {"free text": None, "lazy, free text": lazy, "lazy, in a call": _Opened(lazy, trigger)}


def _run(llm, ids, tokens: int, grammar, temperature: float = 0.0) -> dict:
    from ..engine.handles import SyncStream
    from ..sampling_params import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True, seed=0)
    stream = SyncStream(llm.engine, ids, params, grammar)
    completion = None
    while (d := stream.next_delta()) is not None:
        completion = d.completion or completion
    assert completion is not None
    return {"decode_tps": completion.timings.decode_tokens_per_s, "tokens": completion.usage.completion_tokens,
            "text": completion.text}


def cmd_bench_tools(args) -> int:
    from ..config import load_config
    from ..llm import LLM

    llm = LLM(args.model, load_config(None, {"runtime.num_threads": args.threads,
                                             "runtime.max_context_tokens": args.ctx}))
    ids = llm.tokenize(PROMPT)
    grammars = _grammars(llm)
    how = "greedy" if args.temperature == 0 else f"sampled (temperature {args.temperature}, default top-k/p, min-p)"
    print(f"{os.path.basename(args.model)}: tool format {llm.tool_format.name}, {args.tokens} {how} tokens, "
          f"{args.threads} threads, {args.repeats} repeats", flush=True)
    for g in grammars.values():  # warm-up: the grammar's first masks, the sessions
        _run(llm, ids, 8, g)

    def show(r, v, row):
        print(f"  {v:<18} {row['decode_tps']:7.1f} tok/s ({row['tokens']} tokens)", flush=True)

    runs = interleaved(VARIANTS, args.repeats, lambda v: _run(llm, ids, args.tokens, grammars[v], args.temperature),
                       show)
    base = statistics.median(x["decode_tps"] for x in runs["free text"])
    print("\n| path | decode tok/s | against free text |")
    print("|---|---:|---:|")
    summary = []
    for v in VARIANTS:
        tps = statistics.median(x["decode_tps"] for x in runs[v])
        summary.append({"path": v, "decode_tps": tps, "ratio": tps / base})
        print(f"| {v} | {tps:.1f} | {tps / base - 1:+.1%} |")
    print(f"\nlast call text: {runs['lazy, in a call'][-1]['text'][:120]!r}...")
    write_json(args.json, {"model": args.model, "summary": summary, "runs": runs})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("tools", help="decode speed of a tool call under its lazy grammar against free text")
    s.add_argument("-m", "--model", required=True, help="GGUF file")
    s.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    s.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; above: sampled with SamplingParams' default top-k, top-p and min-p")
    s.add_argument("--ctx", type=int, default=1024)
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-r", "--repeats", type=int, default=5)
    s.add_argument("--json", help="also write every run as JSON here")
    s.set_defaults(func=cmd_bench_tools)
