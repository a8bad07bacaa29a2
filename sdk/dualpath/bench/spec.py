"""``dualpath bench spec``: decode speed with speculative decoding (prompt lookup) against
plain decoding, on two workloads, beside llama.cpp's own prompt lookup.

* **grounded**: a passage of ``--passage-tokens`` tokens, then a request to copy it
  with one small edit (the text repeats the prompt: proposals are mostly right);
* **free**: a story continuation (proposals are rare and mostly wrong: it must not slow).

Every engine gets the same prompt ids and generates ``--tokens`` greedy tokens; decode
tokens/s counts from the first generated token to the last. Side by side, per repeat:
DualPath plain and ``ngram`` (one process: the engine's setting switched between
requests), and with ``--draft-model`` its draft-model drafting; with ``--peer llama-server=PATH``,
llama-server plain and with
``--spec-type ngram-simple``; with llama-cpp-python installed, ``Llama`` plain and with
``LlamaPromptLookupDecoding(num_pred_tokens=10)``. Medians of ``--repeats``; the text of
each speculative run is compared with its plain run's.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from .common import free_port, live_server, stream_completion, write_json

PASSAGE = ("The lighthouse on the northern cape was built in 1871 from granite quarried on the island itself. "
           "Its lamp burned whale oil for the first twenty years, then paraffin, and from 1934 electricity "
           "brought by a cable laid across the strait. Three keepers lived there with their families, and "
           "each kept a log of the weather, the ships that passed and the state of the lamp. ")
GROUNDED = "\n\nThe same text again, word for word, with 'lighthouse' written as 'light tower':\n\n"
FREE = "Once upon a time, in a small village at the edge of a great forest, there lived"


def prompts(tokenizer, passage_tokens: int) -> dict[str, list[int]]:
    text = PASSAGE
    while len(tokenizer.encode(text, add_bos=True)) < passage_tokens:
        text += PASSAGE.replace("1871", str(1871 + len(text) % 97))  # not one exact repeat after another
    return {"grounded": tokenizer.encode(text + GROUNDED, add_bos=True), "free": tokenizer.encode(FREE, add_bos=True)}


def _dualpath_run(llm, ids: list[int], tokens: int, spec_tokens: int, draft=None) -> dict:
    from ..sampling_params import SamplingParams

    llm.engine.speculative_tokens = spec_tokens  # both read when a request is added
    llm.engine.draft = draft
    m = llm.engine.metrics
    p0, a0 = m.proposed_tokens, m.accepted_tokens
    c = llm.generate(ids, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    return {"decode_tps": c.timings.decode_tokens_per_s, "text": c.text,
            "proposed": m.proposed_tokens - p0, "accepted": m.accepted_tokens - a0}


def _stream_decode(base: str, ids: list[int], tokens: int) -> dict:
    """A streamed greedy completion; decode tokens/s as the server's timings say, else
    from the first token to the last."""
    out = stream_completion(base, ids, tokens, ignore_eos=True)
    timings = out["timings"] or {}
    tps = timings.get("predicted_per_second")
    return {"decode_tps": out["decode_tps"] if tps is None else tps, "text": out["text"],
            "draft_n": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted")}


def _llama_cpp_run(llm, ids: list[int], tokens: int) -> dict:
    first: float | None = None
    last = 0.0
    n, text = 0, ""
    for chunk in llm.create_completion(ids, max_tokens=tokens, temperature=0.0, top_k=1, stream=True):
        now = time.perf_counter()
        first = first or now
        last = now
        n += 1
        text += chunk["choices"][0]["text"]
    return {"decode_tps": (n - 1) / (last - first) if first is not None and last > first else None, "text": text}


def cmd_bench_spec(args) -> int:
    from ..config import load_config
    from ..llm import LLM
    from .serve import parse_peer

    peer = parse_peer(args.peer) if args.peer else None
    overrides = {"runtime.num_threads": args.threads, "runtime.max_context_tokens": args.ctx,
                 "runtime.speculative": "ngram", "runtime.speculative_tokens": args.spec_tokens}
    if args.draft_model:
        overrides.update({"runtime.speculative": "draft", "runtime.draft_model": args.draft_model})
    llm = LLM(args.model, load_config(None, overrides))
    draft = llm.engine.draft
    work = prompts(llm.tokenizer, args.passage_tokens)
    for name, ids in work.items():
        if len(ids) + args.tokens > args.ctx:
            raise SystemExit(f"dualpath bench spec: --ctx {args.ctx} cannot hold the {name} prompt ({len(ids)} "
                             f"tokens) and {args.tokens} generated")
    print(f"{os.path.basename(args.model)}: grounded prompt {len(work['grounded'])} tokens, free {len(work['free'])}; "
          f"{args.tokens} greedy tokens, {args.threads} threads, {args.repeats} repeats", flush=True)
    _dualpath_run(llm, work["free"], 8, 0)  # warm-up
    rows: dict[tuple[str, str], list[dict]] = {}

    def add(engine, workload, row):
        rows.setdefault((engine, workload), []).append(row)
        print(f"  {engine:<28} {workload:<9} {row['decode_tps']:8.1f} tok/s", flush=True)

    lcpp = None
    if not args.no_llama_cpp:
        try:
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            def make(draft):  # its lookup checks the proposals with every position's logits: logits_all
                return llama_cpp.Llama(args.model, n_ctx=args.ctx, n_threads=args.threads,
                                       n_threads_batch=args.threads, verbose=False, draft_model=draft,
                                       logits_all=draft is not None)
            lcpp = {"llama-cpp-python": make(None),
                    "llama-cpp-python lookup": make(LlamaPromptLookupDecoding(num_pred_tokens=10))}
        except ImportError:
            print("llama-cpp-python is not installed: its rows are left out", file=sys.stderr)
    for _ in range(args.repeats):
        for workload, ids in work.items():
            add("dualpath", workload, _dualpath_run(llm, ids, args.tokens, 0))
            add("dualpath ngram", workload, _dualpath_run(llm, ids, args.tokens, args.spec_tokens))
            if draft is not None:
                add("dualpath draft", workload, _dualpath_run(llm, ids, args.tokens, args.spec_tokens, draft))
            for name, model in (lcpp or {}).items():
                add(name, workload, _llama_cpp_run(model, ids, args.tokens))
    if peer:
        for spec_args, name in (([], "llama-server"), (["--spec-type", "ngram-simple"], "llama-server ngram-simple")):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            argv = [peer[1], "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
                    "-tb", str(args.threads), "-c", str(args.ctx), "--parallel", "1", *spec_args]
            with live_server(name, argv, base, 600):
                _stream_decode(base, work["free"], 8)
                for _ in range(args.repeats):
                    for workload, ids in work.items():
                        add(name, workload, _stream_decode(base, ids, args.tokens))
    plain_of = {"dualpath ngram": "dualpath", "dualpath draft": "dualpath",
                "llama-cpp-python lookup": "llama-cpp-python",
                "llama-server ngram-simple": "llama-server"}
    print("\n| engine | workload | decode tok/s | speed-up over its plain decoding | same text as plain |")
    print("|---|---|---:|---:|---|")
    summary = []
    for (engine, workload), rs in rows.items():
        tps = statistics.median(x["decode_tps"] for x in rs)
        base_rows = rows.get((plain_of.get(engine, engine), workload), rs)
        base = statistics.median(x["decode_tps"] for x in base_rows)
        same = all(a["text"] == b["text"] for a, b in zip(rs, base_rows))
        extra = ""
        if "proposed" in rs[0] and rs[0]["proposed"]:
            kept = sum(x['accepted'] for x in rs) / max(1, sum(x['proposed'] for x in rs))
            extra = f" (kept {kept:.0%} of proposals)"
        summary.append({"engine": engine, "workload": workload, "decode_tps": tps, "speedup": tps / base,
                        "same_text": same})
        print(f"| {engine} | {workload} | {tps:.1f} | {tps / base:.2f}x{extra} | {'yes' if same else 'no'} |")
    write_json(args.json, {"model": args.model, "summary": summary,
                           "runs": {f"{e}/{w}": rs for (e, w), rs in rows.items()}})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("spec", help="speculative decoding (prompt lookup) against plain decoding, grounded and "
                                   "free text, beside llama.cpp's prompt lookup")
    s.add_argument("-m", "--model", required=True, help="GGUF file")
    s.add_argument("--passage-tokens", type=int, default=400, help="tokens of the passage the grounded prompt holds")
    s.add_argument("--tokens", type=int, default=256, help="greedy tokens generated per request")
    s.add_argument("--ctx", type=int, default=2048)
    s.add_argument("--spec-tokens", type=int, default=16,
                   help="most tokens proposed per step (runtime.speculative_tokens)")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-r", "--repeats", type=int, default=3)
    s.add_argument("--peer", metavar="llama-server=PATH", help="also run llama.cpp's llama-server at PATH")
    s.add_argument("--no-llama-cpp", action="store_true", help="leave llama-cpp-python out")
    s.add_argument("--draft-model", help="also DualPath with this draft model (same vocabulary): 'dualpath draft'")
    s.add_argument("--json", help="also write every run as JSON here")
    s.set_defaults(func=cmd_bench_spec)
