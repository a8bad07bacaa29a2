"""``dualpath bench``: side-by-side measurements, one process per measurement.

``bench e2e`` measures prefill and decode tokens/s of DualPath and of llama.cpp
(llama-cpp-python) on the same file, with the same thread count, interleaving
the engines run by run and quoting medians (this machine is noisy). Each run is
a fresh process, so its peak resident memory (ru_maxrss) is that engine's alone.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def _prompt(vocab_size: int, n: int, bos: int = 1) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(1234)
    return [bos] + [int(x) for x in rng.integers(3, vocab_size, n - 1)]


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker(engine: str, model: str, ctx: int, decode: int, threads: int, chunk: int) -> dict:
    """One measurement: prefill ``ctx`` tokens, then decode ``decode`` tokens greedily."""
    if engine == "dualpath":
        from .config import load_config
        from .llm import LLM
        from .runtime.sampler import SamplingParams

        cfg = load_config(None, {"runtime.num_threads": threads, "runtime.max_context_tokens": ctx + decode + 1,
                                 "runtime.prefill_chunk_tokens": chunk})
        llm = LLM(model, cfg)
        rss_loaded = _peak_rss_mb()
        prompt = _prompt(llm.spec.config.vocab_size, ctx)
        c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True))
        return {"prefill_tps": c.timings.prefill_tokens_per_s, "decode_tps": c.timings.decode_tokens_per_s,
                "peak_rss_mb": _peak_rss_mb(), "loaded_rss_mb": rss_loaded}
    if engine == "llama.cpp":
        import numpy as np
        import llama_cpp

        llm = llama_cpp.Llama(model, n_ctx=ctx + decode + 8, n_threads=threads, n_threads_batch=threads,
                              n_batch=chunk, n_ubatch=chunk, verbose=False)
        rss_loaded = _peak_rss_mb()
        prompt = _prompt(llm.n_vocab(), ctx)
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
                "peak_rss_mb": _peak_rss_mb(), "loaded_rss_mb": rss_loaded}
    raise ValueError(f"unknown engine {engine!r}")


def run_e2e(models: list[str], ctx: int, decode: int, threads: int, repeats: int, engines: list[str],
            chunk: int) -> list[dict]:
    rows = []
    for model in models:
        samples: dict[str, list[dict]] = {e: [] for e in engines}
        for _ in range(repeats):
            for engine in engines:  # interleaved: drift in machine load hits both engines alike
                cmd = [sys.executable, "-m", "dualpath.bench", "_worker", engine, model, str(ctx), str(decode),
                       str(threads), str(chunk)]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                if out.returncode != 0:
                    raise RuntimeError(f"{engine} on {model} failed:\n{out.stderr[-2000:]}")
                samples[engine].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for engine, s in samples.items():
            rows.append({"model": os.path.basename(model), "engine": engine, "ctx": ctx, "threads": threads,
                         "prefill_tps": statistics.median(x["prefill_tps"] for x in s),
                         "decode_tps": statistics.median(x["decode_tps"] for x in s),
                         "peak_rss_mb": statistics.median(x["peak_rss_mb"] for x in s),
                         "runs": len(s)})
    return rows


def cmd_bench(args) -> int:
    if args.bench == "e2e":
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
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    raise SystemExit(f"unknown benchmark {args.bench!r}")


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks (side by side with llama.cpp where it applies)")
    bs = b.add_subparsers(dest="bench", required=True)
    e = bs.add_parser("e2e", help="prefill and decode tokens/s, DualPath beside llama-cpp-python, same file")
    e.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    e.add_argument("--ctx", type=int, default=512, help="prompt tokens (default 512)")
    e.add_argument("--decode", type=int, default=128, help="tokens decoded after the prompt (default 128)")
    e.add_argument("-t", "--threads", type=int, default=2)
    e.add_argument("--chunk", type=int, default=512, help="prefill batch / chunk size for both engines")
    e.add_argument("-r", "--repeats", type=int, default=3)
    e.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    e.add_argument("--json", help="also write the rows as JSON here")
    e.set_defaults(func=cmd_bench)
    from .bench_kernels import add_parser as add_kernels_parser

    add_kernels_parser(bs)
    from .bench_power import add_parser as add_power_parser

    add_power_parser(bs)
    from .bench_cache import add_cache_parser

    add_cache_parser(bs)
    from .bench_serve import add_parser as add_serve_parser

    add_serve_parser(bs)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "_worker":
        engine, model, ctx, decode, threads, chunk = sys.argv[2:8]
        print(json.dumps(worker(engine, model, int(ctx), int(decode), int(threads), int(chunk))))
