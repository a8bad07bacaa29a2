"""``dualpath bench embed``: texts/s of an embedding model (an encoder), DualPath beside llama.cpp.

Workloads, the same strings for both engines: batches of short texts (``--sizes``, default
1, 16 and 256 sentences of about 8 to 24 tokens), and ``--passages`` passages of the
model's positions, at most 512 tokens each (fitted once with DualPath's tokenizer, which
agrees with llama.cpp's: tests/tokenizer). Each engine runs in a fresh process per repeat
(``harness.run_worker``; llama.cpp in its own environment, ``_llamacpp_worker.embed``),
loads the file, embeds every workload once to warm, then times ``--inner`` calls of each;
its figure is the median call. The engines take turns repeat by repeat
(``common.interleaved``), and the table quotes medians of the repeats.

llama.cpp runs at its best (``llamacpp.py``): built for this CPU (its build line is printed
beside the figures), flash attention off and on as two variants, the faster quoted for each
workload. Its batch (``n_batch`` = ``n_ubatch`` = ``n_ctx``) is the passage length: every
text of a call shares one encoder pass up to that many tokens (llama-cpp-python's ``embed``
packs texts as sequences of one batch), and a passage fits one pass. Larger batches were
slower for it on short texts (its attention mask spans the whole batch).

A reranker's file (pooling type rank) is measured instead by the latency of one query against
``RERANK_DOCUMENTS`` short documents: ``LLM.rerank`` beside llama.cpp scoring the same pairs'
token ids (ours, which equal llama-server's: tests/graph/test_rerank_parity.py) as
llama-server's rerank task does, packed as sequences of passes of ``RERANK_BATCH`` tokens.
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import llamacpp
from .common import best_of, interleaved, median_of, write_json
from .harness import run_worker

TIMEOUT_S = 1800.0
SIZES = "1,16,256"
PASSAGE_TOKENS = 512
"""Tokens of a passage, or the model's positions where it has fewer."""
RERANK_DOCUMENTS = 20
RERANK_BATCH = 2048
"""llama.cpp's batch for rerank pairs (llama-server's default ``n_batch``)."""
WORDS = ("the of and to in is was for on that with as by at from his he it an were are which this be or had not but "
         "first one their its new after who they have her she two been other when there all during into school time "
         "may years more most only over city some world would where later up such used many can state about "
         "national out known university united then made these three water house north south east west day night "
         "river music film game team war play life people family work part number group area book high small large "
         "long great little old right left good best last next early late year home word name line end point case "
         "fact hand place week company system program question government light sound power story study child learn "
         "model text search note file answer read write open close data").split()
"""Common English words (whole tokens of a BERT vocabulary, and of the synthetic one)."""


def short_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` seeded sentences of 6 to 20 words: about 8 to 24 tokens with [CLS], [SEP]
    and the full stop."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(6, 21)))).capitalize() + "." for _ in range(count)]


def fit_passage(tokenize, tokens: int, seed: int = 1) -> str:
    """A seeded passage of words whose tokenization (``tokenize``: text -> ids, [CLS] and
    [SEP] included) is at most ``tokens`` long and as close to it as words allow."""
    words = np.random.default_rng(seed).choice(WORDS, 2 * tokens).tolist()
    lo, hi = 1, len(words)  # the most words that fit: binary search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenize(" ".join(words[:mid]))) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def workloads(sizes: list[int], passages: list[str]) -> dict[str, list[str]]:
    """Workload name -> its texts: ``short x N`` per size, ``passage x P``."""
    out = {f"short x {n}": short_texts(n) for n in sizes}
    if passages:
        out[f"passage x {len(passages)}"] = passages
    return out


def rerank_texts() -> tuple[str, list[str]]:
    """The query and the ``RERANK_DOCUMENTS`` documents of the rerank workload."""
    return short_texts(1, seed=3)[0], short_texts(RERANK_DOCUMENTS, seed=2)


def prepare(model: str, sizes: list[int], passages: int) -> dict:
    """The model's positions, ``passages`` passages fitted to them (at most ``PASSAGE_TOKENS``;
    each its own words, as a real batch's are), and the mean tokens of a text of each
    workload; for a reranker, its pairs' token ids instead. Run in a worker: it loads the
    model."""
    from ..llm import LLM

    llm = LLM(model)
    if llm.spec.metadata.get("pooling") == "rank":
        from ..rerank import pair_ids

        pairs = pair_ids(llm, *rerank_texts(), truncate=True)
        return {"positions": llm.context_tokens, "rerank": True, "pairs": pairs,
                "pair_tokens": float(np.mean([len(p) for p in pairs]))}
    positions = llm.encoder.context_tokens if llm.encoder is not None else 0
    if not positions:
        from ..errors import ModelTaskError

        raise ModelTaskError(f"{os.path.basename(model)} is a text-generation model: bench embed needs an "
                             "embedding model (an encoder) or a reranker")
    tokens = min(positions, PASSAGE_TOKENS)
    texts = [fit_passage(llm.tokenize, tokens, seed=1 + i) for i in range(passages)]
    return {"positions": positions, "rerank": False, "passages": texts,
            "passage_tokens": max((len(llm.tokenize(t)) for t in texts), default=tokens),
            "short_tokens": {str(n): float(np.mean([len(llm.tokenize(t)) for t in short_texts(n)])) for n in sizes}}


def time_calls(fn, inner: int) -> float:
    """Seconds of the median of ``inner`` calls of ``fn`` (after one call to warm)."""
    fn()
    times = []
    for _ in range(inner):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def worker(model: str, texts: dict[str, list[str]], threads: int, inner: int, rerank: bool = False) -> dict:
    """DualPath's run: texts/s of each workload (``LLM.embed``), or a reranker's latency
    (``LLM.rerank`` of ``rerank_texts``, tokenizing included)."""
    from ..config import load_config
    from ..llm import LLM

    llm = LLM(model, load_config(None, {"runtime.num_threads": threads}))
    if rerank:
        query, docs = rerank_texts()
        return {"rerank_ms": time_calls(lambda: llm.rerank(query, docs, truncate=True), inner) * 1e3}
    return {name: len(batch) / time_calls(lambda b=batch: llm.embed(b), inner) for name, batch in texts.items()}


def run_embed(model: str, sizes: list[int], passages: int, threads: int, repeats: int, inner: int,
              peer: llamacpp.LlamaCppPeer | None) -> dict:
    """One model's figures: DualPath's and llama.cpp's medians per workload, their ratio."""
    prep = run_worker(prepare, {"model": model, "sizes": sizes, "passages": passages}, timeout_s=TIMEOUT_S)
    rank = prep["rerank"]
    texts = {} if rank else workloads(sizes, prep["passages"])
    variants = ["dualpath"] + (llamacpp.variants() if peer is not None else [])

    def measure(variant: str) -> dict:
        setting = llamacpp.setting_of(variant)
        if setting is None:
            return run_worker(worker, {"model": model, "texts": texts, "threads": threads, "inner": inner,
                                       "rerank": rank}, timeout_s=TIMEOUT_S)
        assert peer is not None
        if rank:
            return peer.rerank(model, prep["pairs"], threads, RERANK_BATCH, inner, setting)
        return peer.embed(model, texts, threads, prep["passage_tokens"], inner, setting)

    runs = interleaved(variants, repeats, measure)
    rows = []
    for name, batch in texts.items():
        ours = median_of(runs["dualpath"], name)
        passage = name.startswith("passage")
        row = {"workload": name, "texts": len(batch), "dualpath_tps": ours,
               "tokens_per_text": prep["passage_tokens"] if passage else prep["short_tokens"][str(len(batch))]}
        if peer is not None:
            settings = {str(llamacpp.setting_of(v)): {name: median_of(runs[v], name)} for v in llamacpp.variants()}
            best = best_of(settings, higher=(name,))
            row.update(llama_cpp_tps=best[name], flash_attn=best["best"][name], ratio=ours / best[name],
                       settings={s: m[name] for s, m in settings.items()})
        rows.append(row)
    rerank = None
    if rank:
        rerank = {"documents": RERANK_DOCUMENTS, "tokens_per_pair": prep["pair_tokens"],
                  "dualpath_ms": median_of(runs["dualpath"], "rerank_ms")}
        if peer is not None:
            settings = {str(llamacpp.setting_of(v)): {"ms": median_of(runs[v], "rerank_ms")}
                        for v in llamacpp.variants()}
            best = best_of(settings, lower=("ms",))
            rerank.update(llama_cpp_ms=best["ms"], flash_attn=best["best"]["ms"],
                          ratio=best["ms"] / rerank["dualpath_ms"], settings={s: m["ms"] for s, m in settings.items()})
    return {"model": os.path.basename(model), "threads": threads, "repeats": repeats, "inner": inner,
            "positions": prep["positions"], "rows": rows, "rerank": rerank,
            "peer": None if peer is None else {"llama_cpp_python": peer.version, "python": peer.python,
                                               "build": peer.system_info}}


def print_result(res: dict) -> None:
    peer = res["peer"] is not None
    print(f"{res['model']}: texts/s, {res['threads']} threads, medians of {res['repeats']} runs "
          f"({res['inner']} timed calls each)")
    peer_head = f" {'llama.cpp':>9} {'ratio':>6}  FA" if peer else ""
    print(f"{'workload':<16} {'tokens/text':>11} {'DualPath':>9}{peer_head}")
    for r in res["rows"]:
        line = f"{r['workload']:<16} {r['tokens_per_text']:>11.1f} {r['dualpath_tps']:>9.1f}"
        if peer:
            line += f" {r['llama_cpp_tps']:>9.1f} {r['ratio']:>5.2f}x  {r['flash_attn']}"
        print(line)
    rr = res["rerank"]
    if rr is not None:
        line = (f"rerank, 1 query x {rr['documents']} documents ({rr['tokens_per_pair']:.1f} tokens a pair): "
                f"DualPath {rr['dualpath_ms']:.1f} ms")
        if peer:
            line += (f", llama.cpp {rr['llama_cpp_ms']:.1f} ms (FA {rr['flash_attn']}): {rr['ratio']:.2f}x "
                     "(llama.cpp's time / ours)")
        print(line)
    if peer and res["rows"]:
        print("llama.cpp: the faster of flash attention off and on per workload (" + "; ".join(
            f"{r['workload']}: " + ", ".join(f"{s} {v:.1f}" for s, v in r["settings"].items()) for r in res["rows"])
            + ")")


def cmd_bench_embed(args) -> int:
    peer = None if args.no_peer else llamacpp.peer_from_args(args.peer_python)
    results = [run_embed(m, args.sizes, args.passages, args.threads, args.repeats, args.inner, peer)
               for m in args.model]
    for res in results:
        print_result(res)
    if peer is not None:
        llamacpp.print_build(peer)
    write_json(args.json, results)
    return 0


def _sizes(text: str) -> list[int]:
    import argparse

    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated numbers of texts, each at least 1")
    return sizes


def add_parser(bs) -> None:
    e = bs.add_parser("embed", help="texts/s of an embedding model, DualPath beside llama-cpp-python, same file")
    e.add_argument("-m", "--model", action="append", required=True, help="GGUF file of an encoder (repeatable)")
    e.add_argument("--sizes", type=_sizes, default=_sizes(SIZES),
                   help=f"numbers of short texts per call, comma-separated (default {SIZES})")
    e.add_argument("--passages", type=int, default=8,
                   help=f"passages per call, each of the model's positions up to {PASSAGE_TOKENS} tokens "
                        "(default 8; 0 leaves them out)")
    e.add_argument("-t", "--threads", type=int, default=2)
    e.add_argument("-r", "--repeats", type=int, default=3, help="processes per engine, interleaved (default 3)")
    e.add_argument("--inner", type=int, default=5, help="timed calls per workload in each process (default 5)")
    e.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    e.add_argument("--peer-python", metavar="PATH",
                   help="interpreter of an environment whose llama-cpp-python is the llama.cpp to compare with "
                        f"(default: ${llamacpp.PYTHON_ENV}, else this one); {llamacpp.SETUP_SCRIPT} full builds one")
    e.add_argument("--json", help="also write the figures as JSON here")
    e.set_defaults(func=cmd_bench_embed)
