"""``dualpath bench e2e``: DualPath beside llama.cpp and onnxruntime-genai, one process per measurement.

It measures prefill and decode tokens/s of DualPath, of llama.cpp
(llama-cpp-python) and of onnxruntime-genai on the same file, with the same
prompt ids, thread count and chunk, interleaving the engines run by run (never
two at once) and quoting medians (this machine is noisy). Each run is a fresh
process (``harness.run_worker``; llama.cpp's and onnxruntime-genai's in their own
environments, ``llamacpp.py`` and ``ortgenai.py``), so its peak resident memory
(VmHWM, not ru_maxrss, which carries the parent's peak over fork and exec) is that
engine's alone.

llama.cpp runs at its best (``llamacpp.py``): flash attention off and on, the faster
quoted for each figure, and its build printed beside the figures. ``--isa laptop``
runs both engines as on a laptop without AVX-512: DualPath with
``DUALPATH_DISABLE_CPU_FEATURES=avx512`` (its AVX2 or AVX-VNNI kernels), beside a llama.cpp built for AVX2 (+ AVX-VNNI),
which it requires. ONNX Runtime has no such switch: the parts of DualPath it runs keep
its own choice of ISA (AVX-512 where the CPU has it), and the bench says so.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
from typing import Any

from ..config import ORT_THREAD_POOLS
from ..errors import DualPathError
from . import llamacpp, ortgenai
from .common import best_of, interleaved, medians, peak_rss_mb, random_prompt, write_json
from .harness import run_worker

TIMEOUT_S = 1800.0
"""Wall-clock limit of one measurement."""
DISABLE_ENV = "DUALPATH_DISABLE_CPU_FEATURES"
LAPTOP_DISABLED = "avx512"
"""What ``--isa laptop`` turns off in DualPath's kernels (``DUALPATH_DISABLE_CPU_FEATURES``)."""
FIGURES = ("prefill_tps", "decode_tps", "peak_rss_mb")
LABELS = {"prefill_tps": "prefill", "decode_tps": "decode", "peak_rss_mb": "peak RSS"}


WARM_TOKENS, WARM_STEPS = 64, 4
"""Every engine's warm-up before it is timed: up to this many prompt tokens (no more
than the run's), then decode steps (no more than the run's decode + 1: it fits the
run's context)."""


def worker(engine: str, model: str, ctx: int, decode: int, threads: int, chunk: int) -> dict:
    """One DualPath measurement: prefill ``ctx`` tokens, then decode ``decode`` tokens greedily.
    ``engine``: ``dualpath`` and words of ``dualpath_engines`` (llama.cpp's runs are
    ``llamacpp.py``'s)."""
    if engine != "dualpath" and not engine.startswith("dualpath "):
        raise ValueError(f"unknown engine {engine!r}: dualpath, with words of dualpath_engines")
    from ..config import load_config
    from ..kernels import default_kernel
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    overrides: dict[str, Any] = {"runtime.num_threads": threads, "runtime.max_context_tokens": ctx + decode + 1,
                                 "runtime.prefill_chunk_tokens": chunk}
    store = None
    for word in engine.split()[1:]:  # "dualpath q8 per_part disk": that KV type, those ORT pools, a store
        if word == "disk":  # prompt pages written to an empty prefix store as the run goes
            store = tempfile.mkdtemp(prefix="dualpath-e2e-prefix-")
            overrides["prefix_cache.use"], overrides["prefix_cache.dir"] = "always", store
            continue
        key = "runtime.ort_thread_pools" if word in ORT_THREAD_POOLS else "kv_cache.kv_dtype"
        overrides[key] = word
    cfg = load_config(None, overrides)
    llm = LLM(model, cfg)
    rss_loaded = peak_rss_mb()
    prompt = random_prompt(llm.spec.config.vocab_size, ctx)
    # The warm-up every engine gets (llama.cpp's and onnxruntime-genai's workers too): 64
    # prompt tokens and 4 decoded, discarded; another seed, so that no prefix of it is reused.
    llm.generate(random_prompt(llm.spec.config.vocab_size, min(WARM_TOKENS, ctx), seed=99),
                 SamplingParams(temperature=0, max_tokens=min(WARM_STEPS, decode + 1), ignore_eos=True))
    c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True))
    if store:
        llm.prefix_store.close()
        shutil.rmtree(store, ignore_errors=True)
    return {"prefill_tps": c.timings.prefill_tokens_per_s, "decode_tps": c.timings.decode_tokens_per_s,
            "peak_rss_mb": peak_rss_mb(), "loaded_rss_mb": rss_loaded, "kernel": default_kernel()}


def llama_cpp_inputs(peer: llamacpp.LlamaCppPeer, model: str, ctx: int, decode: int) -> dict:
    """The prompt and warm-up of llama.cpp's runs on ``model``: DualPath's ids (the same seeds
    over llama.cpp's vocabulary of the file)."""
    vocab = peer.vocab_size(model)
    return {"prompt": random_prompt(vocab, ctx), "warm_prompt": random_prompt(vocab, min(WARM_TOKENS, ctx), seed=99),
            "warm_steps": min(WARM_STEPS, decode + 1)}


def run_e2e(models: list[str], ctx: int, decode: int, threads: int, repeats: int, engines: list[str],
            chunk: int, llama_peer: llamacpp.LlamaCppPeer | None = None,
            ortgenai_peer: ortgenai.OrtGenaiPeer | None = None,
            ortgenai_models: dict[str, ortgenai.OrtGenaiModel] | None = None,
            dualpath_env: dict[str, str] | None = None) -> list[dict]:
    """One row per model and engine: medians of ``repeats`` interleaved runs. ``engines``
    are ``worker``'s (DualPath's), run with ``dualpath_env`` set; llama.cpp is measured
    when ``llama_peer`` is given, each flash attention setting a variant of the
    interleave, in one row (``llama_cpp_row``); onnxruntime-genai on the models that have
    a built model in ``ortgenai_models`` (``OrtGenaiPeer.prepare``)."""
    rows = []
    for model in models:
        ort_model = (ortgenai_models or {}).get(model)
        llama_in = llama_cpp_inputs(llama_peer, model, ctx, decode) if llama_peer is not None else None
        variants = list(engines) + (llamacpp.variants() if llama_in else []) + \
            ([ortgenai.ENGINE] if ort_model is not None else [])

        def measure(variant: str, model=model, llama_in=llama_in, ort_model=ort_model) -> dict:
            setting = llamacpp.setting_of(variant)
            if setting is not None:
                assert llama_peer is not None and llama_in is not None  # its variants exist only with a peer
                return llama_peer.measure(model, **llama_in, decode=decode, threads=threads, chunk=chunk,
                                          setting=setting)
            if variant == ortgenai.ENGINE:
                assert ortgenai_peer is not None and ort_model is not None
                return ortgenai_peer.measure(ort_model, random_prompt(ort_model.vocab_size, ctx), decode, threads,
                                             chunk)
            return run_worker(worker, {"engine": variant, "model": model, "ctx": ctx, "decode": decode,
                                       "threads": threads, "chunk": chunk}, env=dualpath_env, timeout_s=TIMEOUT_S)

        runs = interleaved(variants, repeats, measure)
        base = {"model": os.path.basename(model), "ctx": ctx, "threads": threads}
        for engine in engines:
            rows.append({**base, "engine": engine, **medians(runs[engine], FIGURES), "runs": len(runs[engine]),
                         "kernel": runs[engine][0]["kernel"]})
        if llama_in and llama_peer is not None:
            rows.append(llama_cpp_row(base, runs, llama_peer))
        if ort_model is not None:
            s = runs[ortgenai.ENGINE]
            rows.append({**base, "engine": ortgenai.ENGINE, **medians(s, FIGURES), "runs": len(s),
                         "precision": ort_model.precision})
    return rows


def llama_cpp_row(base: dict, runs: dict[str, list[dict]], peer: llamacpp.LlamaCppPeer) -> dict:
    """llama.cpp's row: the faster flash attention setting for each figure (the smaller peak
    RSS), ``flash_attn`` naming the setting each came from, ``settings`` the medians of each,
    and the peer's build."""
    settings = {str(llamacpp.setting_of(v)): medians(runs[v], FIGURES) for v in llamacpp.variants()}
    best = best_of(settings, higher=("prefill_tps", "decode_tps"), lower=("peak_rss_mb",))
    return {**base, "engine": llamacpp.ENGINE, **{k: best[k] for k in FIGURES},
            "runs": len(runs[llamacpp.variants()[0]]), "flash_attn": best["best"], "settings": settings,
            "llama_cpp_python": peer.version, "python": peer.python, "build": peer.system_info}


def laptop_env(disabled: str) -> dict[str, str]:
    """DualPath's environment under ``--isa laptop``: ``disabled`` (the value of
    DUALPATH_DISABLE_CPU_FEATURES already set, may be empty) with avx512 added."""
    names = [n for n in disabled.replace(" ", ",").split(",") if n]
    return {DISABLE_ENV: ",".join(names + ([] if LAPTOP_DISABLED in names else [LAPTOP_DISABLED]))}


def _prepare_llama_cpp(args) -> llamacpp.LlamaCppPeer | None:
    """The llama.cpp peer of ``--peer-python`` (else the default), its build printed (stderr,
    before the runs start) with a warning per problem. A peer named explicitly that cannot
    run, and under ``--isa laptop`` a build with AVX-512 or AMX, are errors; a default
    environment without llama-cpp-python is a notice and no llama.cpp row."""
    python = args.peer_python or llamacpp.default_python(args.isa)
    try:
        peer = llamacpp.probe(python, args.isa)
    except llamacpp.Unavailable as e:
        if args.peer_python or args.isa == "laptop":
            raise llamacpp.PeerError(f"the llama.cpp peer: {e}") from None
        print(f"dualpath bench: llama.cpp skipped: {e}", file=sys.stderr)
        return None
    llamacpp.print_build(peer, sys.stderr)
    if args.isa == "laptop":
        llamacpp.require_laptop_build(peer)
    return peer


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
    from ..config import KVCacheConfig, RuntimeConfig

    kv0, pools0 = KVCacheConfig().kv_dtype, RuntimeConfig().ort_thread_pools
    return [" ".join(["dualpath"] + [w for w, w0 in ((d, kv0), (p, pools0)) if w != w0] + ["disk"] * (c == "on"))
            for c in prefix_cache.split(",") for p in ort_pools.split(",") for d in kv_dtypes.split(",")]


def cmd_bench_e2e(args) -> int:
    engines = dualpath_engines(args.kv_dtype, args.ort_pools, args.prefix_cache)
    env = None
    if args.isa == "laptop":
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise DualPathError(f"--isa laptop models an x86-64 laptop (AVX2, no AVX-512); this machine is "
                                f"{platform.machine()}")
        env = laptop_env(os.environ.get(DISABLE_ENV, ""))
    llama_peer = None if args.no_peer else _prepare_llama_cpp(args)
    peer, ort_models = (None, {}) if args.no_peer or args.no_ortgenai else _prepare_ortgenai(args)
    rows = run_e2e(args.model, args.ctx, args.decode, args.threads, args.repeats, engines, args.chunk,
                   llama_peer, peer, ort_models, env)
    print(f"median of {args.repeats} runs, {args.threads} threads, prompt {args.ctx} tokens, "
          f"then {args.decode} decoded tokens; ISA: {args.isa}")
    w = max([10] + [len(r["engine"]) for r in rows])
    print(f"{'model':<34} {'engine':<{w}} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r['model']:<34} {r['engine']:<{w}} {r['prefill_tps']:>14.1f} {r['decode_tps']:>13.1f} "
              f"{r['peak_rss_mb']:>13.1f}")
    _print_notes(rows, env, llama_peer, ort_models)
    write_json(args.json, rows)
    return 0


def _print_notes(rows: list[dict], env: dict | None, llama_peer, ort_models: dict) -> None:
    """What the table's figures came from: DualPath's kernels, llama.cpp's settings and build."""
    kernels = sorted({r["kernel"] for r in rows if "kernel" in r})
    disabled = f" ({DISABLE_ENV}={env[DISABLE_ENV]}; ONNX Runtime keeps its own ISA choice, AVX-512 " \
               f"where the CPU has it: it has no switch)" if env else ""
    print(f"dualpath: {', '.join(kernels)} kernels{disabled}")
    for r in rows:
        if r["engine"] == llamacpp.ENGINE:
            each = "; ".join(f"{setting} {m['prefill_tps']:.1f} / {m['decode_tps']:.1f} / {m['peak_rss_mb']:.1f}"
                             for setting, m in r["settings"].items())
            print(f"llama.cpp on {r['model']}: the better of flash attention off and on for each figure: "
                  f"{llamacpp.best_line(r['flash_attn'], LABELS)} ({each})")
    if llama_peer is not None:
        llamacpp.print_build(llama_peer)
    for m in ort_models.values():
        print(f"{ortgenai.ENGINE} ran its {m.precision} model of {os.path.basename(m.gguf_path)}, made by its own "
              f"model builder")


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
    e.add_argument("--peer-python", metavar="PATH",
                   help="interpreter of an environment whose llama-cpp-python is the llama.cpp to compare with "
                        f"(default: ${llamacpp.PYTHON_ENV}, for --isa laptop ${llamacpp.LAPTOP_PYTHON_ENV}, else "
                        f"this one); {llamacpp.SETUP_SCRIPT} full|laptop builds one")
    e.add_argument("--isa", choices=llamacpp.ISAS, default="full",
                   help="full: every ISA of this CPU for both engines (never AMX); laptop: as on a laptop "
                        "without AVX-512 (DualPath with DUALPATH_DISABLE_CPU_FEATURES=avx512, llama.cpp built "
                        "for AVX2 + AVX-VNNI, which it requires)")
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
