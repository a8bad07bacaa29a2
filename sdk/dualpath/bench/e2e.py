"""``dualpath bench e2e``: DualPath beside llama.cpp and onnxruntime-genai, one process per measurement.

It measures prefill and decode tokens/s of DualPath, of llama.cpp
(llama-cpp-python) and of onnxruntime-genai on the same file, with the same
prompt ids, thread count and chunk, interleaving the engines run by run (never
two at once) and quoting medians (this machine is noisy). Each run is a fresh
process (``harness.run_worker``; onnxruntime-genai's in its own environment,
``ortgenai.py``), so its peak resident memory (ru_maxrss) is that engine's alone.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from ..config import ORT_THREAD_POOLS
from . import ortgenai
from .common import interleaved, medians, peak_rss_mb, random_prompt, write_json
from .harness import run_worker

ENGINES = ("dualpath", "llama.cpp")
TIMEOUT_S = 1800.0
"""Wall-clock limit of one measurement."""


WARM_TOKENS, WARM_STEPS = 64, 4
"""Every engine's warm-up before it is timed: up to this many prompt tokens (no more
than the run's), then decode steps (no more than the run's decode + 1: it fits the
run's context)."""


def worker(engine: str, model: str, ctx: int, decode: int, threads: int, chunk: int) -> dict:
    """One measurement: prefill ``ctx`` tokens, then decode ``decode`` tokens greedily."""
    if engine == "dualpath" or engine.startswith("dualpath "):
        from ..config import load_config
        from ..llm import LLM
        from ..runtime.sampler import SamplingParams

        overrides = {"runtime.num_threads": threads, "runtime.max_context_tokens": ctx + decode + 1,
                     "runtime.prefill_chunk_tokens": chunk}
        store = None
        for word in engine.split()[1:]:  # "dualpath q8 per_part disk": that KV type, those ORT pools, a store
            if word == "disk":  # prompt pages written to an empty prefix store as the run goes
                store = tempfile.mkdtemp(prefix="dualpath-e2e-prefix-")
                overrides["prefix_cache.use"], overrides["prefix_cache.dir"] = "always", store
                continue
            key = "runtime.ort_thread_pools" if word in ORT_THREAD_POOLS else "dualpath_config.kv_dtype"
            overrides[key] = word
        cfg = load_config(None, overrides)
        llm = LLM(model, cfg)
        rss_loaded = peak_rss_mb()
        prompt = random_prompt(llm.spec.config.vocab_size, ctx)
        # The warm-up every engine gets (onnxruntime-genai's worker too): 64 prompt tokens
        # and 4 decoded, discarded; another seed, so that no prefix of it is reused.
        llm.generate(random_prompt(llm.spec.config.vocab_size, min(WARM_TOKENS, ctx), seed=99),
                     SamplingParams(temperature=0, max_tokens=min(WARM_STEPS, decode + 1), ignore_eos=True))
        c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True))
        if store:
            llm.prefix_store.close()
            shutil.rmtree(store, ignore_errors=True)
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

        llm.eval(random_prompt(n_vocab, min(WARM_TOKENS, ctx), seed=99))  # every engine's warm-up
        token = int(np.argmax(last_logits()))
        for _ in range(min(WARM_STEPS, decode + 1)):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        llm.reset()  # positions from 0 again: the prompt overwrites the warm-up's cache cells
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
            chunk: int, ortgenai_peer: ortgenai.OrtGenaiPeer | None = None,
            ortgenai_models: dict[str, ortgenai.OrtGenaiModel] | None = None) -> list[dict]:
    """One row per model and engine: medians of ``repeats`` interleaved runs. ``engines``
    are ``worker``'s; onnxruntime-genai is measured too on the models that have a built
    model in ``ortgenai_models`` (``OrtGenaiPeer.prepare``)."""
    rows = []
    for model in models:
        ort_model = (ortgenai_models or {}).get(model)
        model_engines = list(engines) + ([ortgenai.ENGINE] if ort_model is not None else [])

        def measure(engine: str) -> dict:
            if engine == ortgenai.ENGINE:
                return ortgenai_peer.measure(ort_model, random_prompt(ort_model.vocab_size, ctx), decode, threads,
                                             chunk)
            return run_worker(worker, {"engine": engine, "model": model, "ctx": ctx, "decode": decode,
                                       "threads": threads, "chunk": chunk}, timeout_s=TIMEOUT_S)

        for engine, s in interleaved(model_engines, repeats, measure).items():
            row = {"model": os.path.basename(model), "engine": engine, "ctx": ctx, "threads": threads,
                   **medians(s, ("prefill_tps", "decode_tps", "peak_rss_mb")), "runs": len(s)}
            if engine == ortgenai.ENGINE:
                row["precision"] = ort_model.precision
            rows.append(row)
    return rows


def _prepare_ortgenai(args) -> tuple[ortgenai.OrtGenaiPeer | None, dict]:
    """onnxruntime-genai's built model of each ``--model`` it can run; a one-line notice on
    stderr for what it cannot (the environment, or one file)."""
    peer = ortgenai.OrtGenaiPeer(args.ortgenai_python or ortgenai.default_python(),
                                 args.ortgenai_cache or ortgenai.default_cache_dir(), args.ortgenai_precision)
    try:
        peer.check()
    except ortgenai.Unavailable as e:
        print(f"dualpath bench: onnxruntime-genai skipped: {e}", file=sys.stderr)
        return None, {}
    built = {}
    for model in args.model:
        try:
            m = peer.prepare(model, args.ctx, args.decode)
        except ortgenai.Unavailable as e:
            print(f"dualpath bench: onnxruntime-genai skipped for {os.path.basename(model)}: {e}", file=sys.stderr)
            continue
        print(f"dualpath bench: onnxruntime-genai {peer.og_version}: {'built' if m.built else 'reusing'} its "
              f"{m.precision} model of {os.path.basename(model)} in {os.path.dirname(m.model_dir)}",
              file=sys.stderr, flush=True)
        built[model] = m
    return peer, built


def dualpath_engines(kv_dtypes: str, ort_pools: str = "shared", prefix_cache: str = "off") -> list[str]:
    """Engine names for DualPath with each KV type of ``--kv-dtype``, each ORT pool
    arrangement of ``--ort-pools`` and each ``--prefix-cache`` setting: the configured
    defaults are plain ``dualpath``, others are named (``dualpath q8``, ``dualpath
    per_part``, ``dualpath q8 per_part``, ``dualpath disk``)."""
    from ..config import DualPathConfig, RuntimeConfig

    kv0, pools0 = DualPathConfig().kv_dtype, RuntimeConfig().ort_thread_pools
    return [" ".join(["dualpath"] + [w for w, w0 in ((d, kv0), (p, pools0)) if w != w0] + ["disk"] * (c == "on"))
            for c in prefix_cache.split(",") for p in ort_pools.split(",") for d in kv_dtypes.split(",")]


def cmd_bench_e2e(args) -> int:
    ours = dualpath_engines(args.kv_dtype, args.ort_pools, args.prefix_cache)
    engines = ours + ([] if args.no_peer else ["llama.cpp"])
    if not args.no_peer:
        try:
            import llama_cpp  # noqa: F401  (availability check)
        except ImportError:
            print("dualpath bench: llama-cpp-python is not installed; measuring without llama.cpp "
                  "(pip install llama-cpp-python, or pass --no-peer)", file=sys.stderr)
            engines = ours
    peer, ort_models = (None, {}) if args.no_peer or args.no_ortgenai else _prepare_ortgenai(args)
    rows = run_e2e(args.model, args.ctx, args.decode, args.threads, args.repeats, engines, args.chunk,
                   peer, ort_models)
    print(f"median of {args.repeats} runs, {args.threads} threads, prompt {args.ctx} tokens, "
          f"then {args.decode} decoded tokens")
    w = max([10] + [len(r["engine"]) for r in rows])
    print(f"{'model':<34} {'engine':<{w}} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r['model']:<34} {r['engine']:<{w}} {r['prefill_tps']:>14.1f} {r['decode_tps']:>13.1f} "
              f"{r['peak_rss_mb']:>13.1f}")
    for m in ort_models.values():
        print(f"{ortgenai.ENGINE} ran its {m.precision} model of {os.path.basename(m.gguf_path)}, made by its own "
              f"model builder")
    write_json(args.json, rows)
    return 0


def _comma_choices(text: str, choices, what: str) -> str:
    """``text`` if it is a comma-separated list of ``choices``, else argparse's error."""
    import argparse

    if not text or any(w not in choices for w in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated {what} from {', '.join(choices)}")
    return text


def _kv_dtypes(text: str) -> str:
    from ..kernels import KV_DTYPES

    return _comma_choices(text, KV_DTYPES, "KV types")


def _ort_pools(text: str) -> str:
    return _comma_choices(text, ORT_THREAD_POOLS, "ORT pool arrangements")


def add_parser(bs) -> None:
    e = bs.add_parser("e2e", help="prefill and decode tokens/s, DualPath beside llama-cpp-python and "
                                  "onnxruntime-genai, same file")
    e.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    e.add_argument("--ctx", type=int, default=512, help="prompt tokens (default 512)")
    e.add_argument("--decode", type=int, default=128, help="tokens decoded after the prompt (default 128)")
    e.add_argument("-t", "--threads", type=int, default=2)
    e.add_argument("--chunk", type=int, default=512, help="prefill batch / chunk size for every engine")
    e.add_argument("-r", "--repeats", type=int, default=3)
    e.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    e.add_argument("--kv-dtype", default="f16", type=_kv_dtypes,
                   help="DualPath's KV cache types, comma-separated: one DualPath row each (default f16; "
                        "f16,q8 puts the int8 cache beside it)")
    e.add_argument("--ort-pools", default="shared", type=_ort_pools,
                   help="runtime.ort_thread_pools, comma-separated: one DualPath row each (default shared; "
                        "shared,per_part puts the per-part pools beside it)")
    e.add_argument("--ortgenai-python", metavar="PATH",
                   help="interpreter of an environment with onnxruntime-genai and its model builder's "
                        f"dependencies (default: ${ortgenai.PYTHON_ENV}, else this one); made by "
                        f"{ortgenai.SETUP_SCRIPT}. Without one, onnxruntime-genai is skipped with a notice")
    e.add_argument("--ortgenai-precision", choices=ortgenai.PRECISIONS, default="auto",
                   help="its builder's -p (auto: fp32 for a float file, int8 for Q8_0, else int4)")
    e.add_argument("--ortgenai-cache", metavar="DIR",
                   help="where its built models are kept (default ~/.cache/dualpath/ortgenai)")
    e.add_argument("--no-ortgenai", action="store_true", help="leave onnxruntime-genai out")
    e.add_argument("--prefix-cache", default="off", type=lambda t: _comma_choices(t, ("off", "on"), "settings"),
                   help="off, on or off,on: DualPath with its prompt pages written to an empty prefix store "
                        "on disk as it runs ('dualpath disk')")
    e.add_argument("--json", help="also write the rows as JSON here")
    e.set_defaults(func=cmd_bench_e2e)
