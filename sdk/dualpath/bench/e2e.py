"""``dualpath bench e2e``: DualPath beside llama.cpp, one process per measurement.

It measures prefill and decode tokens/s of DualPath and of llama.cpp
(llama-cpp-python) on the same file, with the same thread count, interleaving
the engines run by run and quoting medians (this machine is noisy). Each run is
a fresh process (``harness.run_worker``), so its peak resident memory
(ru_maxrss) is that engine's alone.
"""

from __future__ import annotations

import os
import sys
import time

from .common import interleaved, medians, peak_rss_mb, random_prompt, write_json
from .harness import run_worker

ENGINES = ("dualpath", "llama.cpp")
TIMEOUT_S = 1800.0
"""Wall-clock limit of one measurement."""


def worker(engine: str, model: str, ctx: int, decode: int, threads: int, chunk: int) -> dict:
    """One measurement: prefill ``ctx`` tokens, then decode ``decode`` tokens greedily."""
    if engine == "dualpath":
        from ..config import load_config
        from ..llm import LLM
        from ..runtime.sampler import SamplingParams

        cfg = load_config(None, {"runtime.num_threads": threads, "runtime.max_context_tokens": ctx + decode + 1,
                                 "runtime.prefill_chunk_tokens": chunk})
        llm = LLM(model, cfg)
        rss_loaded = peak_rss_mb()
        prompt = random_prompt(llm.spec.config.vocab_size, ctx)
        c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True))
        return {"prefill_tps": c.timings.prefill_tokens_per_s, "decode_tps": c.timings.decode_tokens_per_s,
                "peak_rss_mb": peak_rss_mb(), "loaded_rss_mb": rss_loaded}
    if engine == "llama.cpp":
        import llama_cpp
        import numpy as np

        llm = llama_cpp.Llama(model, n_ctx=ctx + decode + 8, n_threads=threads, n_threads_batch=threads,
                              n_batch=chunk, n_ubatch=chunk, verbose=False)
        rss_loaded = peak_rss_mb()
        prompt = random_prompt(llm.n_vocab(), ctx)
        n_vocab = llm.n_vocab()

        def last_logits():  # the raw logits of the last evaluated token, no copy
            ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,))

        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        token = int(np.argmax(last_logits()))
        for _ in range(decode):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        t2 = time.perf_counter()
        return {"prefill_tps": ctx / (t1 - t0), "decode_tps": decode / (t2 - t1),
                "peak_rss_mb": peak_rss_mb(), "loaded_rss_mb": rss_loaded}
    raise ValueError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")


def run_e2e(models: list[str], ctx: int, decode: int, threads: int, repeats: int, engines: list[str],
            chunk: int) -> list[dict]:
    """One row per model and engine: medians of ``repeats`` interleaved runs."""
    rows = []
    for model in models:
        def measure(engine: str) -> dict:
            return run_worker(worker, {"engine": engine, "model": model, "ctx": ctx, "decode": decode,
                                       "threads": threads, "chunk": chunk}, timeout_s=TIMEOUT_S)

        for engine, s in interleaved(engines, repeats, measure).items():
            rows.append({"model": os.path.basename(model), "engine": engine, "ctx": ctx, "threads": threads,
                         **medians(s, ("prefill_tps", "decode_tps", "peak_rss_mb")), "runs": len(s)})
    return rows


def cmd_bench_e2e(args) -> int:
    engines = ["dualpath"] + ([] if args.no_peer else ["llama.cpp"])
    if not args.no_peer:
        try:
            import llama_cpp  # noqa: F401  (availability check)
        except ImportError:
            print("dualpath bench: llama-cpp-python is not installed; measuring DualPath alone "
                  "(pip install llama-cpp-python, or pass --no-peer)", file=sys.stderr)
            engines = ["dualpath"]
    rows = run_e2e(args.model, args.ctx, args.decode, args.threads, args.repeats, engines, args.chunk)
    print(f"median of {args.repeats} runs, {args.threads} threads, prompt {args.ctx} tokens, "
          f"then {args.decode} decoded tokens")
    print(f"{'model':<34} {'engine':<10} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r['model']:<34} {r['engine']:<10} {r['prefill_tps']:>14.1f} {r['decode_tps']:>13.1f} "
              f"{r['peak_rss_mb']:>13.1f}")
    write_json(args.json, rows)
    return 0


def add_parser(bs) -> None:
    e = bs.add_parser("e2e", help="prefill and decode tokens/s, DualPath beside llama-cpp-python, same file")
    e.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    e.add_argument("--ctx", type=int, default=512, help="prompt tokens (default 512)")
    e.add_argument("--decode", type=int, default=128, help="tokens decoded after the prompt (default 128)")
    e.add_argument("-t", "--threads", type=int, default=2)
    e.add_argument("--chunk", type=int, default=512, help="prefill batch / chunk size for both engines")
    e.add_argument("-r", "--repeats", type=int, default=3)
    e.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    e.add_argument("--json", help="also write the rows as JSON here")
    e.set_defaults(func=cmd_bench_e2e)
