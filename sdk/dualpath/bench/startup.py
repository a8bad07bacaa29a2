"""``dualpath bench startup``: process start to the first and the 8th generated token.

What an app on a phone pays every time it starts: a fresh Python process imports the
engine, loads the model and generates greedily from a short text prompt. Measured
for DualPath's first load (an empty converted-model cache: conversion included) and
cached load (the entry the first load wrote), beside llama.cpp (llama-cpp-python) and,
when ``onnxruntime_genai`` is installed and ``--ortgenai-dir`` names a model folder
its builder made from the same file, onnxruntime-genai. The variants are interleaved
run by run and medians quoted (this machine is noisy).

llama.cpp runs at its best (``llamacpp.py``): flash attention off and on, two variants
of the interleave, the faster quoted for each figure (and named), in the environment of
``--peer-python`` (``_startup_worker.py`` imports only llama_cpp and numpy there), its
build printed beside the figures.

The clock is the wall clock (``time.time``) shared by parent and child: the parent
reads it just before it starts the worker process. Each worker also reports its
peak resident memory at the end of the load (VmHWM, before generating) and its
resident memory after generating (VmRSS), so that the load's peak can be compared
with what generation holds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import llamacpp
from .common import best_of, interleaved, medians, write_json
from .harness import BenchProcessError, stderr_tail

PROMPT = "Once upon a time"
"""The prompt every engine starts from (as in _startup_worker.py)."""
TIMEOUT_S = 600.0
VARIANTS = ("dualpath first load", "dualpath cached", *llamacpp.variants(), "onnxruntime-genai")
KEYS = ("load_s", "first_token_s", "last_token_s", "load_peak_rss_mb", "generation_rss_mb")
LABELS = {"load_s": "loaded", "first_token_s": "1st token", "last_token_s": "last token",
          "load_peak_rss_mb": "load peak", "generation_rss_mb": "generating"}


def _spawn(kwargs: dict, python: str | None = None) -> dict:
    """Run the worker script in a fresh ``python`` (default this one; another environment's
    runs without our PYTHONPATH/PYTHONHOME); the clock starts just before."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_startup_worker.py")
    env = None if python is None else {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    kwargs = dict(kwargs, spawned_at=time.time())
    try:
        out = subprocess.run([python or sys.executable, script, json.dumps(kwargs)], capture_output=True,
                             text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise BenchProcessError(f"{kwargs['engine']} did not load and generate in {TIMEOUT_S:g} s") from None
    if out.returncode != 0:
        raise BenchProcessError(f"{kwargs['engine']} worker exited with status {out.returncode}; its stderr "
                                f"ends:\n{stderr_tail(out.stderr)}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_startup(model: str, threads: int, tokens: int, repeats: int, variants: list[str],
                ortgenai_dir: str = "", peer_python: str | None = None) -> dict[str, list[dict]]:
    """Runs per variant, interleaved. The first-load variant starts from an empty cache
    each time; the cached variant reuses one that a warm-up load filled; llama.cpp's run
    in ``peer_python`` (default this interpreter)."""
    work = tempfile.mkdtemp(prefix="dualpath-bench-startup-")
    cached_dir = os.path.join(work, "cached")
    try:
        if "dualpath cached" in variants:  # fill the cache the cached runs read
            _spawn({"engine": "dualpath", "model": model, "threads": threads, "tokens": 1, "cache_dir": cached_dir})

        def measure(variant: str) -> dict:
            kwargs = {"model": model, "threads": threads, "tokens": tokens, "ortgenai_dir": ortgenai_dir}
            if variant == "dualpath first load":
                fresh = os.path.join(work, "fresh")
                shutil.rmtree(fresh, ignore_errors=True)
                kwargs.update(engine="dualpath", cache_dir=fresh)
            elif variant == "dualpath cached":
                kwargs.update(engine="dualpath", cache_dir=cached_dir)
            elif (setting := llamacpp.setting_of(variant)) is not None:
                kwargs.update(engine=llamacpp.ENGINE, flash_attn=llamacpp.FLASH_ATTN[setting])
                return _spawn(kwargs, peer_python)
            else:
                kwargs["engine"] = variant
            return _spawn(kwargs)

        return interleaved(variants, repeats, measure)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def startup_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Medians per variant; llama.cpp's two variants in one row, the faster (and smaller) of
    its flash attention settings for each figure, ``flash_attn`` naming where each came from."""
    rows, llama = [], {}
    for variant, r in runs.items():
        setting = llamacpp.setting_of(variant)
        if setting:
            llama[setting] = medians(r, KEYS)
            if len(llama) == len(llamacpp.FLASH_ATTN):
                best = best_of(llama, lower=KEYS)
                rows.append({"variant": llamacpp.ENGINE, **{k: best[k] for k in KEYS}, "runs": len(r),
                             "flash_attn": best["best"], "settings": llama})
        else:
            rows.append({"variant": variant, **medians(r, KEYS), "runs": len(r)})
    return rows


def _llama_cpp_peer(args) -> llamacpp.LlamaCppPeer | None:
    """The peer of ``--peer-python`` (an error when it cannot run), else of the default
    environment (a notice and no llama.cpp row when it cannot)."""
    try:
        return llamacpp.probe(args.peer_python or llamacpp.default_python())
    except llamacpp.Unavailable as e:
        if args.peer_python:
            raise llamacpp.PeerError(f"the llama.cpp peer: {e}") from None
        print(f"dualpath bench: no llama.cpp row: {e}", file=sys.stderr)
        return None


def cmd_bench_startup(args) -> int:
    variants = ["dualpath first load", "dualpath cached"]
    peer = None if args.no_peer else _llama_cpp_peer(args)
    if peer is not None:
        llamacpp.print_build(peer, sys.stderr)
        variants += llamacpp.variants()
    if not args.no_peer:
        if args.ortgenai_dir:
            try:
                import onnxruntime_genai  # noqa: F401
                variants.append("onnxruntime-genai")
            except ImportError:
                print("dualpath bench: onnxruntime-genai is not installed; no onnxruntime-genai row",
                      file=sys.stderr)
        else:
            print("dualpath bench: no --ortgenai-dir (a folder onnxruntime-genai's builder made from this "
                  "file: examples/peers/); no onnxruntime-genai row", file=sys.stderr)
    runs = run_startup(args.model, args.threads, args.tokens, args.repeats, variants, args.ortgenai_dir or "",
                       peer.python if peer else None)
    rows = startup_rows(runs)
    print(f"{os.path.basename(args.model)}: process start to token, median of {args.repeats} runs, "
          f"{args.threads} threads, greedy from {PROMPT!r}")
    print(f"{'variant':<22} {'loaded s':>9} {'1st token s':>12} {f'{args.tokens}th token s':>12} "
          f"{'load peak MiB':>14} {'generating MiB':>15}")
    for r in rows:
        print(f"{r['variant']:<22} {r['load_s']:>9.2f} {r['first_token_s']:>12.2f} {r['last_token_s']:>12.2f} "
              f"{r['load_peak_rss_mb']:>14.0f} {r['generation_rss_mb']:>15.0f}")
    base = next((r for r in rows if r["variant"] == llamacpp.ENGINE), None)
    if base and peer is not None:
        for r in rows:
            if r["variant"].startswith("dualpath"):
                print(f"{r['variant']}: {r['last_token_s'] / base['last_token_s']:.2f}x llama.cpp's time to the "
                      f"{args.tokens}th token")
        print(f"llama.cpp: the better of flash attention off and on for each figure: "
              f"{llamacpp.best_line(base['flash_attn'], {**LABELS, 'last_token_s': f'{args.tokens}th token'})}")
        llamacpp.print_build(peer)
    write_json(args.json, {"model": args.model, "threads": args.threads, "tokens": args.tokens, "rows": rows,
                           "runs": runs, "llama_cpp_build": peer.system_info if peer else None})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("startup", help="process start to the first and 8th token: first and cached load, "
                                      "beside llama.cpp (and onnxruntime-genai)")
    s.add_argument("-m", "--model", required=True, help="GGUF file")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-n", "--tokens", type=int, default=8, help="tokens to generate (default 8)")
    s.add_argument("-r", "--repeats", type=int, default=3)
    s.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    s.add_argument("--peer-python", metavar="PATH",
                   help="interpreter of an environment whose llama-cpp-python is the llama.cpp to compare with "
                        f"(default: ${llamacpp.PYTHON_ENV}, else this one); {llamacpp.SETUP_SCRIPT} builds one")
    s.add_argument("--ortgenai-dir", help="an onnxruntime-genai model folder built from the same file")
    s.add_argument("--json", help="also write the rows and every run as JSON here")
    s.set_defaults(func=cmd_bench_startup)
