"""``dualpath bench startup``: process start to the first and the 8th generated token.

What an app on a phone pays every time it starts: a fresh Python process imports the
engine, loads the model and generates greedily from a short text prompt. Measured
for DualPath's first load (an empty converted-model cache: conversion included) and
cached load (the entry the first load wrote), beside llama.cpp (llama-cpp-python) and,
when ``onnxruntime_genai`` is installed and ``--ortgenai-dir`` names a model folder
its builder made from the same file, onnxruntime-genai. The variants are interleaved
run by run and medians quoted (this machine is noisy).

The clock is the wall clock (``time.time``) shared by parent and child: the parent
reads it just before it starts the worker process. Each worker also reports its
peak resident memory at the end of the load (VmHWM, before generating) and its
resident memory after generating (VmRSS), so that the load's peak can be compared
with what generation holds.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from .common import interleaved, medians, write_json
from .harness import run_worker

PROMPT = "Once upon a time"
TIMEOUT_S = 600.0
VARIANTS = ("dualpath first load", "dualpath cached", "llama.cpp", "onnxruntime-genai")


def _vm(name: str) -> float:
    """A VmXXX line of /proc/self/status in MiB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def worker(engine: str, model: str, threads: int, tokens: int, spawned_at: float, cache_dir: str = "",
           ortgenai_dir: str = "") -> dict:
    """Load ``model`` and generate ``tokens`` greedily; seconds from ``spawned_at``."""
    if engine == "dualpath":
        os.environ["DUALPATH_CACHE_DIR"] = cache_dir
        from ..config import load_config
        from ..llm import LLM
        from ..runtime.sampler import SamplingParams

        llm = LLM(model, load_config(None, {"runtime.num_threads": threads}))
        loaded_at, load_peak = time.time(), _vm("VmHWM")
        ids = llm.tokenize(PROMPT)
        t0 = time.time()
        c = llm.generate(ids, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        last_at = time.time()
        first_at = t0 + c.timings.prefill_ms / 1e3
        generated = len(c.token_ids)
        extra = {"cache": llm.load_stats.get("cache")}
    elif engine == "llama.cpp":
        import llama_cpp
        import numpy as np

        llm = llama_cpp.Llama(model, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
        loaded_at, load_peak = time.time(), _vm("VmHWM")
        n_vocab = llm.n_vocab()
        ids = llm.tokenize(PROMPT.encode(), add_bos=True)
        llm.eval(ids)
        token = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))
        first_at = time.time()
        for _ in range(tokens - 1):
            llm.eval([token])
            token = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                                        shape=(n_vocab,))))
        last_at = time.time()
        generated, extra = tokens, {}
    elif engine == "onnxruntime-genai":
        import json

        import onnxruntime_genai as og

        cfg = og.Config(ortgenai_dir)
        cfg.clear_providers()
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        m = og.Model(cfg)
        tok = og.Tokenizer(m)
        loaded_at, load_peak = time.time(), _vm("VmHWM")
        ids = tok.encode(PROMPT)
        p = og.GeneratorParams(m)
        p.set_search_options(max_length=len(ids) + tokens + 1, do_sample=False, min_length=0)
        g = og.Generator(m, p)
        g.append_tokens(ids)
        g.generate_next_token()
        first_at = time.time()
        for _ in range(tokens - 1):
            g.generate_next_token()
        last_at = time.time()
        generated, extra = tokens, {}
    else:
        raise ValueError(f"unknown engine {engine!r}")
    return {"load_s": loaded_at - spawned_at, "first_token_s": first_at - spawned_at,
            "last_token_s": last_at - spawned_at, "tokens": generated,
            "load_peak_rss_mb": load_peak, "generation_rss_mb": _vm("VmRSS"), **extra}


def run_startup(model: str, threads: int, tokens: int, repeats: int, variants: list[str],
                ortgenai_dir: str = "") -> dict[str, list[dict]]:
    """Runs per variant, interleaved. The first-load variant starts from an empty cache
    each time; the cached variant reuses one that a warm-up load filled."""
    work = tempfile.mkdtemp(prefix="dualpath-bench-startup-")
    cached_dir = os.path.join(work, "cached")
    try:
        if "dualpath cached" in variants:  # fill the cache the cached runs read
            run_worker(worker, {"engine": "dualpath", "model": model, "threads": threads, "tokens": 1,
                                "spawned_at": time.time(), "cache_dir": cached_dir}, timeout_s=TIMEOUT_S)

        def measure(variant: str) -> dict:
            kwargs = {"model": model, "threads": threads, "tokens": tokens, "ortgenai_dir": ortgenai_dir}
            if variant == "dualpath first load":
                fresh = os.path.join(work, "fresh")
                shutil.rmtree(fresh, ignore_errors=True)
                kwargs.update(engine="dualpath", cache_dir=fresh)
            elif variant == "dualpath cached":
                kwargs.update(engine="dualpath", cache_dir=cached_dir)
            else:
                kwargs["engine"] = variant
            kwargs["spawned_at"] = time.time()
            return run_worker(worker, kwargs, timeout_s=TIMEOUT_S)

        return interleaved(variants, repeats, measure)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cmd_bench_startup(args) -> int:
    variants = ["dualpath first load", "dualpath cached"]
    if not args.no_peer:
        try:
            import llama_cpp  # noqa: F401  (availability check)
            variants.append("llama.cpp")
        except ImportError:
            print("dualpath bench: llama-cpp-python is not installed; no llama.cpp row", file=sys.stderr)
        if args.ortgenai_dir:
            try:
                import onnxruntime_genai  # noqa: F401
                variants.append("onnxruntime-genai")
            except ImportError:
                print("dualpath bench: onnxruntime-genai is not installed; no onnxruntime-genai row",
                      file=sys.stderr)
        else:
            print("dualpath bench: no --ortgenai-dir (a folder onnxruntime-genai's builder made from this "
                  "file, see ../shared/peers/README.md); no onnxruntime-genai row", file=sys.stderr)
    runs = run_startup(args.model, args.threads, args.tokens, args.repeats, variants, args.ortgenai_dir or "")
    keys = ("load_s", "first_token_s", "last_token_s", "load_peak_rss_mb", "generation_rss_mb")
    rows = [{"variant": v, **medians(r, keys), "runs": len(r)} for v, r in runs.items()]
    print(f"{os.path.basename(args.model)}: process start to token, median of {args.repeats} runs, "
          f"{args.threads} threads, greedy from {PROMPT!r}")
    print(f"{'variant':<22} {'loaded s':>9} {'1st token s':>12} {f'{args.tokens}th token s':>12} "
          f"{'load peak MiB':>14} {'generating MiB':>15}")
    for r in rows:
        print(f"{r['variant']:<22} {r['load_s']:>9.2f} {r['first_token_s']:>12.2f} {r['last_token_s']:>12.2f} "
              f"{r['load_peak_rss_mb']:>14.0f} {r['generation_rss_mb']:>15.0f}")
    base = next((r for r in rows if r["variant"] == "llama.cpp"), None)
    if base:
        for r in rows:
            if r["variant"].startswith("dualpath"):
                print(f"{r['variant']}: {r['last_token_s'] / base['last_token_s']:.2f}x llama.cpp's time to the "
                      f"{args.tokens}th token")
    write_json(args.json, {"model": args.model, "threads": args.threads, "tokens": args.tokens, "rows": rows,
                           "runs": runs})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("startup", help="process start to the first and 8th token: first and cached load, "
                                      "beside llama.cpp (and onnxruntime-genai)")
    s.add_argument("-m", "--model", required=True, help="GGUF file")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-n", "--tokens", type=int, default=8, help="tokens to generate (default 8)")
    s.add_argument("-r", "--repeats", type=int, default=3)
    s.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    s.add_argument("--ortgenai-dir", help="an onnxruntime-genai model folder built from the same file")
    s.add_argument("--json", help="also write the rows and every run as JSON here")
    s.set_defaults(func=cmd_bench_startup)
