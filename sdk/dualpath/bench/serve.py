"""``dualpath bench serve``: latency under load, the cache's path modes side by side.

The ``mixed`` workload, fixed by ``--seed``: short chats that share one system
prompt (each with its own user turn), and long documents, arriving on a Poisson
schedule. Every path mode (``dual``, ``sequential``, ``random``) serves the same
schedule through the engine's async API (``engine.submit``; no HTTP, so the
figures are the engine's), each run in a fresh process (``harness.run_worker``),
modes interleaved run by run. Reported per mode, as medians over runs: P50/P99
time to first token, P50/P99 time per output token, peak KV memory held by
requests (after every step), and what the router decided (requests per path,
migrations, prefix hits).

Over HTTP (``--http``, implied by ``--peer llama-server=PATH``): the same schedule
(same seeded arrivals, token-id prompts and max tokens) goes to real servers, each
started as a subprocess on a free loopback port for each run, from ONE asyncio
client (httpx, streaming ``/v1/completions`` with the prompt as a list of token
ids, which both servers take as given: no BOS added, no tokenizer involved;
``temperature`` 0 and ``ignore_eos``, so every request generates exactly its
``max_tokens``, which is checked against the ``usage`` each server reports). The
servers get the same model file, threads and slots: ``dualpath serve`` with
``runtime.max_num_seqs`` = slots, llama.cpp's ``llama-server`` with ``--parallel``
slots, continuous batching (``-cb``) and one KV cache shared by the slots
(``--kv-unified``, where the binary has it); both hold ``--kv-cache-tokens``
tokens of KV cache (default slots x ``--ctx``: llama-server's ``-c``). Per request:
TTFT, from sending to the first streamed text, and TPOT, (last chunk - first
chunk) / (tokens - 1), tokens as the server's usage counts them (a chunk can carry
more than one token where a UTF-8 character spans tokens). Each server gets one
short unmeasured request first (warm-up). Servers take turns run by run.
llama-server caps every slot at the context the GGUF records; where that is shorter
than ``--ctx`` it gets ``--override-kv ARCH.context_length=int:CTX`` (said on the
console), as ``dualpath serve`` takes ``runtime.max_context_tokens`` as given.
``--peer-args`` appends arguments of your own to its command line.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from typing import Any

from ..errors import DualPathError
from .common import (
    free_port,
    interleaved,
    live_server,
    median_of,
    model_or_default,
    percentile_ms,
    process_peak_rss_mb,
    random_ids,
    random_prompt,
    write_json,
)
from .harness import run_worker

WORKLOADS = ("mixed",)
MODES = ("dual", "sequential", "random")
PEERS = ("llama-server",)
"""Servers ``--peer NAME=PATH`` can start beside ``dualpath serve``."""
TIMEOUT_S = 4 * 3600.0
"""Wall-clock limit of one mode's run: generous, the workload sets the length."""


def workload(seed: int, requests: int, rate: float, vocab: int, system_tokens: int, doc_tokens: int,
             doc_share: float) -> list[dict]:
    """The seeded schedule: [{"at": seconds, "kind", "prompt": ids, "max_tokens"}]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    system = [1] + random_ids(rng, vocab, system_tokens)
    out, t = [], 0.0
    for _ in range(requests):
        t += float(rng.exponential(1.0 / rate))
        if rng.random() < doc_share:
            n = int(doc_tokens * rng.uniform(0.7, 1.0))
            out.append({"at": t, "kind": "document", "prompt": [1] + random_ids(rng, vocab, n), "max_tokens": 32})
        else:
            user = random_ids(rng, vocab, int(rng.integers(16, 48)))
            out.append({"at": t, "kind": "chat", "prompt": system + user, "max_tokens": int(rng.integers(16, 64))})
    return out


def latency_summary(results: list[dict]) -> dict:
    """P50/P99 of TTFT and TPOT (ms) over ``results`` ([{"kind", "ttft", "tpot"}], seconds;
    ``tpot`` None for a one-token answer), overall and per kind of request."""

    def of(kind: str | None, key: str) -> list[float]:
        return [r[key] for r in results if (kind is None or r["kind"] == kind) and r[key] is not None]

    doc_ttft = of("document", "ttft")
    return {
        "ttft_p50_ms": percentile_ms(of(None, "ttft"), 50), "ttft_p99_ms": percentile_ms(of(None, "ttft"), 99),
        "tpot_p50_ms": percentile_ms(of(None, "tpot"), 50), "tpot_p99_ms": percentile_ms(of(None, "tpot"), 99),
        "chat_ttft_p50_ms": percentile_ms(of("chat", "ttft"), 50, empty=0.0),
        "chat_ttft_p99_ms": percentile_ms(of("chat", "ttft"), 99, empty=0.0),
        "chat_tpot_p99_ms": percentile_ms(of("chat", "tpot"), 99, empty=0.0),
        "doc_ttft_p50_ms": percentile_ms(doc_ttft, 50, empty=0.0),
        "doc_ttft_p99_ms": percentile_ms(doc_ttft, 99, empty=0.0),
        "documents": len(doc_ttft),
    }


def worker(model: str, mode: str, params: dict) -> dict:
    """One mode's run of the whole schedule; ``params`` as ``cmd_bench_serve`` builds them."""
    import asyncio

    from ..config import load_config
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    cfg = load_config(None, {
        "runtime.num_threads": params["threads"], "runtime.max_context_tokens": params["ctx"],
        "runtime.max_num_seqs": params["max_num_seqs"], "runtime.kv_cache_tokens": params["kv_cache_tokens"],
        "kv_cache.path_mode": mode, "server.max_queued_requests": 100000, **params.get("overrides", {})})
    llm = LLM(model, cfg)
    engine = llm.engine
    schedule = workload(params["seed"], params["requests"], params["rate"], llm.spec.config.vocab_size,
                        params["system_tokens"], params["doc_tokens"], params["doc_share"])
    results: list[dict] = []
    paths: dict[str, int] = {}

    async def one(item, t0):
        await asyncio.sleep(max(0.0, t0 + item["at"] - time.perf_counter()))
        start = time.perf_counter()
        sampling = SamplingParams(temperature=0, max_tokens=item["max_tokens"], ignore_eos=True)
        handle = await engine.submit(item["prompt"], sampling)
        times = []
        async for d in handle:
            if d.token_ids:
                times.append(time.perf_counter())
        path = handle.request.path.value if handle.request.path else "?"
        paths[path] = paths.get(path, 0) + 1
        ttft = times[0] - start
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        results.append({"kind": item["kind"], "ttft": ttft, "tpot": tpot, "tokens": len(times),
                        "cached": handle.completion.usage.cached_prompt_tokens})

    async def main():
        t0 = time.perf_counter()
        await asyncio.gather(*(one(item, t0) for item in schedule))
        return time.perf_counter() - t0

    wall = asyncio.run(main())
    engine.shutdown()
    stats = llm.cache.stats()
    steps, _ = engine.metrics.step_log()

    return {
        "mode": mode, "wall_s": wall, "requests": len(results), **latency_summary(results),
        "peak_kv_mb": engine.metrics.peak_kv_bytes_held / 2**20,
        "step_p50_ms": percentile_ms(list(steps), 50), "step_p99_ms": percentile_ms(list(steps), 99),
        "steps": len(steps),
        "kv_capacity_mb": stats.bytes_total / 2**20,
        "paths": paths, "migrations": stats.migrations, "prefix_hit_rate": stats.prefix_hit_rate,
        "cached_prompt_tokens": sum(r["cached"] for r in results),
        "preemptions": engine.scheduler.preemptions,
        "generated_tokens": sum(r["tokens"] for r in results),
    }


# -- over HTTP: dualpath serve, and a peer server, fed by one client -------------

def parse_peer(spec: str) -> tuple[str, str]:
    """``--peer NAME=PATH`` -> (NAME, absolute PATH); an unknown name or a PATH that is
    not an executable file is an error naming it."""
    name, sep, path = spec.partition("=")
    if not sep or name not in PEERS or not path:
        raise DualPathError(f"--peer {spec!r}: expected NAME=PATH with NAME one of {', '.join(PEERS)} "
                            "(e.g. --peer llama-server=/path/to/llama-server)")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise DualPathError(f"--peer {spec!r}: {path} is not an executable file (llama-server builds from "
                            "llama.cpp: cmake -B build -DLLAMA_BUILD_SERVER=ON && "
                            "cmake --build build --target llama-server)")
    return name, os.path.abspath(path)


def llama_server_has_kv_unified(path: str) -> bool:
    """Whether this ``llama-server`` lists ``--kv-unified`` in its help (builds before
    the flag existed refuse it)."""
    import subprocess

    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DualPathError(f"{path} --help failed: {e}") from None
    return "--kv-unified" in out.stdout + out.stderr


def _setting(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def dualpath_serve_argv(model: str, port: int, mode: str, params: dict) -> list[str]:
    """The ``dualpath serve`` command line of one run (``params`` as ``cmd_bench_serve`` builds them)."""
    sets = {"runtime.max_num_seqs": params["max_num_seqs"], "runtime.max_context_tokens": params["ctx"],
            "runtime.kv_cache_tokens": params["kv_cache_tokens"], "kv_cache.path_mode": mode,
            "server.max_queued_requests": 100000, **params.get("overrides", {})}
    argv = [sys.executable, "-m", "dualpath.cli", "serve", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "-t", str(params["threads"])]
    for key, value in sets.items():
        argv += ["--set", f"{key}={_setting(value)}"]
    return argv


def llama_server_argv(path: str, model: str, port: int, params: dict, kv_unified: bool,
                      context_override: str | None = None) -> list[str]:
    """The ``llama-server`` command line of one run: the same model, threads (prompt and
    generation), slots with continuous batching, and KV cache tokens (``-c``) as
    ``dualpath serve`` gets; ``context_override`` (``ARCH.context_length=int:N``, see
    ``_run_over_http``) as ``--override-kv``; then ``params["peer_args"]``."""
    t = str(params["threads"])
    argv = [path, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", t, "-tb", t,
            "--parallel", str(params["max_num_seqs"]), "-cb", "-c", str(params["kv_cache_tokens"])]
    if kv_unified:
        argv.append("--kv-unified")
    if context_override:
        argv += ["--override-kv", context_override]
    return argv + list(params.get("peer_args", ()))


async def _stream_one(http, prompt: list[int], max_tokens: int) -> dict:
    """One streamed completion: when it was sent, when its first and last text arrived,
    what the server's usage said (perf_counter seconds), and an error or None."""
    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    out: dict[str, Any] = {"sent": time.perf_counter(), "first": None, "last": None, "usage": None, "finish": None,
                           "error": None}
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    out["usage"] = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        out["first"] = out["first"] or now
                        out["last"] = now
                    if choice.get("finish_reason"):
                        out["finish"] = choice["finish_reason"]
    except (httpx.HTTPError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def http_run(name: str, argv: list[str], base: str, schedule: list[dict], warmup_prompt: list[int],
             log_path: str | None = None) -> dict:
    """One run of ``schedule`` against the server ``argv`` (started here, stopped after; its
    stderr to ``log_path`` when given), from one asyncio client. Returns the figures
    (latencies in ms) and every request."""
    import asyncio

    import httpx

    def row(item: dict, r: dict) -> dict:
        usage: dict[str, Any] = r["usage"] or {}
        tokens = usage.get("completion_tokens")
        error = r["error"]
        if error is None and (r["first"] is None or not tokens):
            error = f"no text or no usage streamed (finish_reason {r['finish']!r}, usage {r['usage']!r})"
        ok = error is None
        return {"kind": item["kind"], "at": item["at"], "max_tokens": item["max_tokens"],
                "prompt_len": len(item["prompt"]), "error": error,
                "ttft": r["first"] - r["sent"] if ok else None,
                "tpot": (r["last"] - r["first"]) / (tokens - 1) if ok and tokens is not None and tokens > 1 else None,
                "tokens": tokens, "prompt_tokens": usage.get("prompt_tokens"),
                "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0}

    async def main(http):
        warm = await _stream_one(http, warmup_prompt, 4)
        if warm["error"]:
            raise DualPathError(f"{name}: the warm-up request failed: {warm['error']}")

        async def one(item: dict, t0: float) -> dict:
            await asyncio.sleep(max(0.0, t0 + item["at"] - time.perf_counter()))
            return row(item, await _stream_one(http, item["prompt"], item["max_tokens"]))

        t0 = time.perf_counter()
        rows = await asyncio.wait_for(asyncio.gather(*(one(item, t0) for item in schedule)), TIMEOUT_S)
        return rows, time.perf_counter() - t0

    async def client():
        n = len(schedule) + 8
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(TIMEOUT_S), limits=limits) as http:
            return await main(http)

    with live_server(name, argv, base, log_path=log_path) as server:
        rows, wall = asyncio.run(client())
        server.check_alive()
        peak_rss = process_peak_rss_mb(server.proc.pid)
    good = [r for r in rows if r["error"] is None]
    short = [r for r in good if r["tokens"] != r["max_tokens"]]
    prompt_mismatch = [r for r in good if r["prompt_tokens"] != r["prompt_len"]]
    prompt_total = sum(r["prompt_tokens"] or 0 for r in good)
    return {
        "server": name, "command": shlex.join(argv), "wall_s": wall, "requests": len(good),
        "failures": len(rows) - len(good), "failure_examples": [r["error"] for r in rows if r["error"]][:5],
        "short_outputs": len(short), "prompt_mismatches": len(prompt_mismatch),
        **latency_summary(good),
        "prompt_tokens": prompt_total, "cached_prompt_tokens": sum(r["cached"] for r in good),
        "generated_tokens": sum(r["tokens"] for r in good), "server_peak_rss_mb": peak_rss,
        "per_request": rows,
    }


LATENCY_HEAD = (f"{'TTFT p50':>9} | {'TTFT p99':>9} | {'TPOT p50':>9} | {'TPOT p99':>9} | "
                f"{'chat TTFT p50/p99':>17} | {'doc TTFT p50/p99':>16}")
"""The latency columns both tables of bench serve share (in process and over HTTP)."""


def _latency_cells(med, name: str) -> str:
    """``name``'s row under ``LATENCY_HEAD``; ``med(name, key)`` is a median of its runs."""
    return (f"{med(name, 'ttft_p50_ms'):7.0f}ms | {med(name, 'ttft_p99_ms'):7.0f}ms | "
            f"{med(name, 'tpot_p50_ms'):7.1f}ms | {med(name, 'tpot_p99_ms'):7.1f}ms | "
            f"{med(name, 'chat_ttft_p50_ms'):6.0f} / {med(name, 'chat_ttft_p99_ms'):6.0f}ms | "
            f"{med(name, 'doc_ttft_p50_ms'):5.0f} / {med(name, 'doc_ttft_p99_ms'):6.0f}ms")


def _print_http_medians(runs: dict, params: dict, repeats: int, peer_name: str | None) -> None:
    """The table of ``bench serve --http``: each server's medians over its runs, and each
    dualpath mode against the peer (the last server) when there is one."""
    servers = list(runs)

    def med(name: str, key: str) -> float:
        return median_of(runs[name], key) if all(row[key] is not None for row in runs[name]) else float("nan")

    print(f"\nmedians of {repeats} run(s), over HTTP from one streaming client "
          f"({params['max_num_seqs']} slots, {params['kv_cache_tokens']} KV tokens, {params['threads']} threads):")
    head = f"{'server':>16} | {LATENCY_HEAD} | {'prompt cached':>13} | {'peak RSS':>9} | {'wall':>6}"
    print(head)
    print("-" * len(head))
    for name in servers:
        cached = med(name, "cached_prompt_tokens") / max(1.0, med(name, "prompt_tokens"))
        print(f"{name:>16} | {_latency_cells(med, name)} | "
              f"{cached:13.0%} | {med(name, 'server_peak_rss_mb'):6.0f}MiB | {med(name, 'wall_s'):5.0f}s")
    if peer_name is not None:
        for name in servers[:-1]:
            ttft, tpot = (1 - med(name, key) / med(peer_name, key) for key in ("ttft_p99_ms", "tpot_p99_ms"))
            print(f"{name} vs {peer_name}: TTFT p99 {ttft:+.0%} lower, TPOT p99 {tpot:+.0%} lower")


def _run_over_http(args, model: str, params: dict, modes: list[str], peer: tuple[str, str] | None) -> int:
    """``bench serve --http`` / ``--peer``: the servers take turns run by run; the table of medians."""
    from ..models import load_model

    config = load_model(model).config
    vocab = config.vocab_size
    schedule = workload(params["seed"], params["requests"], params["rate"], vocab, params["system_tokens"],
                        params["doc_tokens"], params["doc_share"])
    warmup_prompt = random_prompt(vocab, 8, seed=params["seed"] + 99991)
    servers = [f"dualpath:{m}" for m in modes]
    kv_unified, context_override = False, None
    if peer is not None:
        kv_unified = llama_server_has_kv_unified(peer[1])
        if not kv_unified:
            print(f"note: {peer[1]} has no --kv-unified flag; started without it", flush=True)
        if config.context_length < params["ctx"]:
            # llama-server caps every slot at the trained context the file records (a longer
            # document is refused); dualpath serve takes runtime.max_context_tokens as given.
            context_override = f"{config.arch}.context_length=int:{params['ctx']}"
            print(f"note: {model} records a context of {config.context_length} tokens; llama-server gets "
                  f"--override-kv {context_override} so its slots hold --ctx {params['ctx']} tokens, "
                  "as dualpath serve's", flush=True)
        servers.append(peer[0])

    done = {name: 0 for name in servers}
    if args.server_logs:
        os.makedirs(args.server_logs, exist_ok=True)

    def measure(name: str) -> dict:
        port = free_port()
        if name.startswith("dualpath:"):
            argv = dualpath_serve_argv(model, port, name.partition(":")[2], params)
        else:
            assert peer is not None  # its server is listed only with a peer
            argv = llama_server_argv(peer[1], model, port, params, kv_unified, context_override)
        done[name] += 1
        log = os.path.join(args.server_logs, f"{name.replace(':', '-')}-run{done[name]}.log") \
            if args.server_logs else None
        return http_run(name, argv, f"http://127.0.0.1:{port}", schedule, warmup_prompt, log)

    def progress(r: int, name: str, row: dict) -> None:
        if r == 0:
            print(f"  {name} command (a new free port each run):\n    {row['command']}", flush=True)
        bad = "" if not (row["failures"] or row["short_outputs"] or row["prompt_mismatches"]) else \
            (f"; FAILED {row['failures']}, short {row['short_outputs']}, "
             f"prompt length mismatches {row['prompt_mismatches']}")
        print(f"  run {r + 1}/{args.repeats} {name:>16}: TTFT p50 {row['ttft_p50_ms'] or 0:.0f} ms "
              f"p99 {row['ttft_p99_ms'] or 0:.0f} ms, TPOT p50 {row['tpot_p50_ms'] or 0:.1f} ms "
              f"p99 {row['tpot_p99_ms'] or 0:.1f} ms, wall {row['wall_s']:.1f}s{bad}", flush=True)
        for e in row["failure_examples"]:
            print(f"    failure: {e}", flush=True)

    runs = interleaved(servers, args.repeats, measure, progress)
    ok = all(not (row["failures"] or row["short_outputs"] or row["prompt_mismatches"])
             for rows in runs.values() for row in rows)

    _print_http_medians(runs, params, args.repeats, peer[0] if peer is not None else None)
    if not ok:
        print("some requests failed, or did not generate exactly max_tokens, or their prompt length differed "
              "(see the runs above)")
    write_json(args.json, {"params": params, "model": model, "transport": "http",
                           "commands": {name: rows[0]["command"] for name, rows in runs.items()}, "runs": runs})
    return 0 if ok else 1


def cmd_bench_serve(args) -> int:
    from ..config import load_config, parse_overrides

    if args.workload not in WORKLOADS:
        raise SystemExit(f"unknown workload {args.workload!r} (available: {', '.join(WORKLOADS)})")
    peer = parse_peer(args.peer) if args.peer else None
    over_http = args.http or peer is not None
    modes = [m.strip() for m in (args.modes or ("dual" if over_http else ",".join(MODES))).split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown path mode {m!r}: dual, sequential or random")
    overrides = parse_overrides(args.set)
    load_config(None, overrides)  # a bad key fails here, before any run
    model = model_or_default(args.model, max(args.ctx, 2048))
    kv_cache_tokens = args.kv_cache_tokens or (args.max_num_seqs if over_http else 4) * args.ctx
    params = {"threads": args.threads, "ctx": args.ctx, "max_num_seqs": args.max_num_seqs,
              "kv_cache_tokens": kv_cache_tokens, "seed": args.seed,
              "requests": args.requests, "rate": args.rate, "system_tokens": args.system_tokens,
              "doc_tokens": args.doc_tokens, "doc_share": args.doc_share, "overrides": overrides,
              "peer_args": shlex.split(args.peer_args or "")}
    print(f"model {model}; workload mixed: {args.requests} requests at {args.rate:g}/s (seed {args.seed}), "
          f"{1 - args.doc_share:.0%} chats sharing a {args.system_tokens}-token system prompt, "
          f"{args.doc_share:.0%} documents of {int(args.doc_tokens * 0.7)}-{args.doc_tokens} tokens; "
          f"{args.threads} threads, {args.max_num_seqs} requests at once, "
          f"KV cache {params['kv_cache_tokens']} tokens", flush=True)
    if over_http:
        return _run_over_http(args, model, params, modes, peer)

    def measure(mode: str) -> dict:
        return run_worker(worker, {"model": model, "mode": mode, "params": params}, timeout_s=TIMEOUT_S)

    def progress(r: int, mode: str, row: dict) -> None:
        print(f"  run {r + 1}/{args.repeats} {mode:>10}: TTFT p50 {row['ttft_p50_ms']:.0f} ms "
              f"p99 {row['ttft_p99_ms']:.0f} ms, TPOT p50 {row['tpot_p50_ms']:.1f} ms "
              f"p99 {row['tpot_p99_ms']:.1f} ms, wall {row['wall_s']:.1f}s", flush=True)

    runs = interleaved(modes, args.repeats, measure, progress)

    def med(m, key):
        return median_of(runs[m], key)

    print(f"\nmedians of {args.repeats} run(s):")
    head = (f"{'mode':>10} | {LATENCY_HEAD} | {'step p50/p99':>14} | {'peak KV':>8} | "
            f"router (requests per path; migrations; prefix hits; preemptions)")
    print(head)
    print("-" * len(head))
    for m in modes:
        last = runs[m][-1]
        paths = ", ".join(f"{k} {v}" for k, v in sorted(last["paths"].items()))
        print(f"{m:>10} | {_latency_cells(med, m)} | {med(m, 'step_p50_ms'):4.0f} / "
              f"{med(m, 'step_p99_ms'):5.0f}ms | {med(m, 'peak_kv_mb'):6.1f}MB | {paths}; "
              f"{last['migrations']}; {last['prefix_hit_rate']:.0%}; {last['preemptions']}")
    if "dual" in runs and len(modes) > 1:
        for m in modes:
            if m != "dual":
                print(f"dual vs {m}: TTFT p99 {1 - med('dual', 'ttft_p99_ms') / med(m, 'ttft_p99_ms'):+.0%} lower, "
                      f"TPOT p99 {1 - med('dual', 'tpot_p99_ms') / med(m, 'tpot_p99_ms'):+.0%} lower")
    write_json(args.json, {"params": params, "model": model, "runs": runs})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("serve", help="latency under a mixed load, path modes dual/sequential/random side by side "
                                    "(in-process, or over HTTP beside llama-server)")
    s.add_argument("--workload", default="mixed", help="the request mix (mixed)")
    s.add_argument("-m", "--model", help="GGUF file (default: a stories15M-shaped synth model, random weights)")
    s.add_argument("--modes", help="path modes to compare (default dual,sequential,random in-process; "
                                   "dual over HTTP: each mode is a dualpath serve of its own)")
    s.add_argument("--requests", type=int, default=40)
    s.add_argument("--rate", type=float, default=0.5, help="mean arrivals per second (Poisson)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--ctx", type=int, default=16384, help="context window (runtime.max_context_tokens)")
    s.add_argument("--system-tokens", type=int, default=384, help="shared system prompt length")
    s.add_argument("--doc-tokens", type=int, default=12288,
                   help="longest document (documents are 70-100%%: past the default seq_path_threshold)")
    s.add_argument("--doc-share", type=float, default=0.1, help="share of requests that are documents")
    s.add_argument("--max-num-seqs", type=int, default=8)
    s.add_argument("--kv-cache-tokens", type=int, default=0,
                   help="KV cache size (default 4 x ctx; over HTTP max-num-seqs x ctx, for every server: "
                        "llama-server's -c)")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-r", "--repeats", type=int, default=1)
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override for every mode")
    s.add_argument("--http", action="store_true",
                   help="send the workload over HTTP to dualpath serve processes (one client) instead of in-process")
    s.add_argument("--peer", metavar="llama-server=PATH",
                   help="also serve it with llama.cpp's llama-server at PATH (same model, threads, slots; "
                        "implies --http)")
    s.add_argument("--peer-args", help="extra arguments for the peer server, one shell-quoted string")
    s.add_argument("--server-logs", metavar="DIR", help="over HTTP: keep each server run's stderr in DIR")
    s.add_argument("--json", help="also write every run as JSON here")
    s.set_defaults(func=cmd_bench_serve)
