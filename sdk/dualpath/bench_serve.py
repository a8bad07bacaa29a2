"""``dualpath bench serve``: latency under load, the cache's path modes side by side.

The ``mixed`` workload, fixed by ``--seed``: short chats that share one system
prompt (each with its own user turn), and long documents, arriving on a Poisson
schedule. Every path mode (``dual``, ``sequential``, ``random``) serves the same
schedule through the engine's async API (``engine.submit``; no HTTP, so the
figures are the engine's), each run in a fresh process, modes interleaved run by
run. Reported per mode, as medians over runs: P50/P99 time to first token, P50/P99
time per output token, peak KV memory held by requests (after every step),
and what the router decided (requests per path, migrations, prefix hits).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def workload(seed: int, requests: int, rate: float, vocab: int, system_tokens: int, doc_tokens: int,
             doc_share: float) -> list[dict]:
    """The seeded schedule: [{"at": seconds, "kind", "prompt": ids, "max_tokens"}]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    system = [1] + rng.integers(3, vocab, system_tokens).tolist()
    out, t = [], 0.0
    for _ in range(requests):
        t += float(rng.exponential(1.0 / rate))
        if rng.random() < doc_share:
            n = int(doc_tokens * rng.uniform(0.7, 1.0))
            out.append({"at": t, "kind": "document", "prompt": [1] + rng.integers(3, vocab, n).tolist(),
                        "max_tokens": 32})
        else:
            user = rng.integers(3, vocab, int(rng.integers(16, 48))).tolist()
            out.append({"at": t, "kind": "chat", "prompt": system + user, "max_tokens": int(rng.integers(16, 64))})
    return out


def worker(model: str, mode: str, args: dict) -> dict:
    import asyncio

    import numpy as np

    from .config import load_config
    from .llm import LLM
    from .runtime.sampler import SamplingParams

    cfg = load_config(None, {
        "runtime.num_threads": args["threads"], "runtime.max_context_tokens": args["ctx"],
        "runtime.max_num_seqs": args["max_num_seqs"], "runtime.kv_cache_tokens": args["kv_cache_tokens"],
        "dualpath_config.path_mode": mode, "server.max_queued_requests": 100000, **args.get("overrides", {})})
    llm = LLM(model, cfg)
    engine = llm.engine
    schedule = workload(args["seed"], args["requests"], args["rate"], llm.spec.config.vocab_size,
                        args["system_tokens"], args["doc_tokens"], args["doc_share"])
    results: list[dict] = []
    paths: dict[str, int] = {}

    async def one(item, t0):
        await asyncio.sleep(max(0.0, t0 + item["at"] - time.perf_counter()))
        start = time.perf_counter()
        params = SamplingParams(temperature=0, max_tokens=item["max_tokens"], ignore_eos=True)
        handle = await engine.submit(item["prompt"], params)
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
    stats = llm.runner.cache.stats()
    steps = np.array([t for t, _ in engine.metrics.step_log])
    ttft = np.array([r["ttft"] for r in results])
    tpot = np.array([r["tpot"] for r in results if r["tpot"] is not None])
    chat_ttft = np.array([r["ttft"] for r in results if r["kind"] == "chat"])
    doc_ttft = np.array([r["ttft"] for r in results if r["kind"] == "document"])
    chat_tpot = np.array([r["tpot"] for r in results if r["kind"] == "chat" and r["tpot"] is not None])
    return {
        "mode": mode, "wall_s": wall, "requests": len(results),
        "ttft_p50_ms": float(np.percentile(ttft, 50) * 1e3), "ttft_p99_ms": float(np.percentile(ttft, 99) * 1e3),
        "tpot_p50_ms": float(np.percentile(tpot, 50) * 1e3), "tpot_p99_ms": float(np.percentile(tpot, 99) * 1e3),
        "chat_ttft_p50_ms": float(np.percentile(chat_ttft, 50) * 1e3) if len(chat_ttft) else 0.0,
        "chat_ttft_p99_ms": float(np.percentile(chat_ttft, 99) * 1e3) if len(chat_ttft) else 0.0,
        "chat_tpot_p99_ms": float(np.percentile(chat_tpot, 99) * 1e3) if len(chat_tpot) else 0.0,
        "doc_ttft_p50_ms": float(np.percentile(doc_ttft, 50) * 1e3) if len(doc_ttft) else 0.0,
        "doc_ttft_p99_ms": float(np.percentile(doc_ttft, 99) * 1e3) if len(doc_ttft) else 0.0,
        "documents": int(len(doc_ttft)),
        "peak_kv_mb": engine.metrics.peak_kv_bytes_held / 2**20,
        "step_p50_ms": float(np.percentile(steps, 50) * 1e3), "step_p99_ms": float(np.percentile(steps, 99) * 1e3),
        "steps": len(steps),
        "kv_capacity_mb": stats.bytes_total / 2**20,
        "paths": paths, "migrations": stats.migrations, "prefix_hit_rate": stats.prefix_hit_rate,
        "cached_prompt_tokens": sum(r["cached"] for r in results),
        "preemptions": engine.scheduler.preemptions,
        "generated_tokens": sum(r["tokens"] for r in results),
    }


def _default_model(ctx: int) -> str:
    from .models.synth import synth_gguf

    folder = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dualpath")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"stories15M-F32-ctx{ctx}-seed0.gguf")
    if not os.path.exists(path):
        print(f"synthesizing {path} (stories15M shape, random weights)", file=sys.stderr)
        synth_gguf(path + ".tmp", "stories15M", "F32", seed=0, context_length=ctx)
        os.replace(path + ".tmp", path)
    return path


def _overrides(items) -> dict:
    import yaml

    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def cmd_bench_serve(args) -> int:
    if args.workload != "mixed":
        raise SystemExit(f"unknown workload {args.workload!r} (available: mixed)")
    model = args.model or _default_model(max(args.ctx, 2048))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("dual", "sequential", "random"):
            raise SystemExit(f"unknown path mode {m!r}: dual, sequential or random")
    params = {"threads": args.threads, "ctx": args.ctx, "max_num_seqs": args.max_num_seqs,
              "kv_cache_tokens": args.kv_cache_tokens or 4 * args.ctx, "seed": args.seed,
              "requests": args.requests, "rate": args.rate, "system_tokens": args.system_tokens,
              "doc_tokens": args.doc_tokens, "doc_share": args.doc_share, "overrides": _overrides(args.set)}
    print(f"model {model}; workload mixed: {args.requests} requests at {args.rate:g}/s (seed {args.seed}), "
          f"{1 - args.doc_share:.0%} chats sharing a {args.system_tokens}-token system prompt, "
          f"{args.doc_share:.0%} documents of {int(args.doc_tokens * 0.7)}-{args.doc_tokens} tokens; "
          f"{args.threads} threads, {args.max_num_seqs} requests at once, "
          f"KV cache {params['kv_cache_tokens']} tokens", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for m in modes:  # interleaved: drift hits every mode alike
            cmd = [sys.executable, "-m", "dualpath.bench_serve", "_worker", model, m, json.dumps(params)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"bench serve worker ({m}) failed")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            runs[m].append(row)
            print(f"  run {r + 1}/{args.repeats} {m:>10}: TTFT p50 {row['ttft_p50_ms']:.0f} ms "
                  f"p99 {row['ttft_p99_ms']:.0f} ms, TPOT p50 {row['tpot_p50_ms']:.1f} ms "
                  f"p99 {row['tpot_p99_ms']:.1f} ms, wall {row['wall_s']:.1f}s", flush=True)

    def med(m, key):
        return statistics.median(row[key] for row in runs[m])

    print(f"\nmedians of {args.repeats} run(s):")
    head = (f"{'mode':>10} | {'TTFT p50':>9} | {'TTFT p99':>9} | {'TPOT p50':>9} | {'TPOT p99':>9} | "
            f"{'chat TTFT p50/p99':>17} | {'doc TTFT p50/p99':>16} | {'step p50/p99':>14} | {'peak KV':>8} | "
            f"router (requests per path; migrations; prefix hits; preemptions)")
    print(head)
    print("-" * len(head))
    for m in modes:
        last = runs[m][-1]
        paths = ", ".join(f"{k} {v}" for k, v in sorted(last["paths"].items()))
        print(f"{m:>10} | {med(m, 'ttft_p50_ms'):7.0f}ms | {med(m, 'ttft_p99_ms'):7.0f}ms | "
              f"{med(m, 'tpot_p50_ms'):7.1f}ms | {med(m, 'tpot_p99_ms'):7.1f}ms | "
              f"{med(m, 'chat_ttft_p50_ms'):6.0f} / {med(m, 'chat_ttft_p99_ms'):6.0f}ms | "
              f"{med(m, 'doc_ttft_p50_ms'):5.0f} / {med(m, 'doc_ttft_p99_ms'):6.0f}ms | "
              f"{med(m, 'step_p50_ms'):4.0f} / {med(m, 'step_p99_ms'):5.0f}ms | {med(m, 'peak_kv_mb'):6.1f}MB | {paths}; "
              f"{last['migrations']}; {last['prefix_hit_rate']:.0%}; {last['preemptions']}")
    if "dual" in runs and len(modes) > 1:
        for m in modes:
            if m != "dual":
                print(f"dual vs {m}: TTFT p99 {1 - med('dual', 'ttft_p99_ms') / med(m, 'ttft_p99_ms'):+.0%} lower, "
                      f"TPOT p99 {1 - med('dual', 'tpot_p99_ms') / med(m, 'tpot_p99_ms'):+.0%} lower")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": params, "model": model, "runs": runs}, f, indent=1)
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("serve", help="latency under a mixed load, path modes dual/sequential/random side by side")
    s.add_argument("--workload", default="mixed", help="the request mix (mixed)")
    s.add_argument("-m", "--model", help="GGUF file (default: a stories15M-shaped synth model, random weights)")
    s.add_argument("--modes", default="dual,sequential,random", help="path modes to compare")
    s.add_argument("--requests", type=int, default=40)
    s.add_argument("--rate", type=float, default=0.5, help="mean arrivals per second (Poisson)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--ctx", type=int, default=16384, help="context window (runtime.max_context_tokens)")
    s.add_argument("--system-tokens", type=int, default=384, help="shared system prompt length")
    s.add_argument("--doc-tokens", type=int, default=12288,
                   help="longest document (documents are 70-100%%: past the default seq_path_threshold)")
    s.add_argument("--doc-share", type=float, default=0.1, help="share of requests that are documents")
    s.add_argument("--max-num-seqs", type=int, default=8)
    s.add_argument("--kv-cache-tokens", type=int, default=0, help="KV cache size (default 4 x ctx)")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-r", "--repeats", type=int, default=1)
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override for every mode")
    s.add_argument("--json", help="also write every run as JSON here")
    s.set_defaults(func=cmd_bench_serve)

    lo = bs.add_parser("load", help="N concurrent streaming clients against a live dualpath serve")
    lo.add_argument("-m", "--model", help="GGUF file (default: a stories15M-shaped synth model, random weights)")
    lo.add_argument("--clients", type=int, default=64)
    lo.add_argument("--duration", type=float, default=60.0, help="seconds of sending (requests in flight finish)")
    lo.add_argument("--max-tokens", type=int, default=64)
    lo.add_argument("--max-num-seqs", type=int, default=16)
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("-t", "--threads", type=int, default=2)
    lo.add_argument("--set", action="append", metavar="KEY=VALUE", help="server config override")
    lo.add_argument("--json")
    lo.set_defaults(func=cmd_bench_load)


# -- bench load: many streaming clients against a live server -----------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def load_test(model: str, *, clients: int, duration_s: float, max_tokens: int, seed: int = 0,
              server_args: tuple[str, ...] = (), log=print) -> dict:
    """Start ``dualpath serve`` on loopback, run ``clients`` streaming clients that send
    completions back to back for ``duration_s``, then check that the server holds no
    request and no KV cache block. Returns the figures (latencies in ms)."""
    import asyncio

    import httpx
    import numpy as np

    port = _free_port()
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", model, "--port", str(port), *server_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dualpath serve exited: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("dualpath serve did not come up in 120 s")
            time.sleep(0.2)
        words = ["Once", "upon", "a", "time", "there", "was", "a", "little", "girl", "dog", "named", "Lily",
                 "Tom", "who", "loved", "to", "play", "in", "the", "park", "sun", "big", "red", "ball"]
        ttft, tpot, failures, done = [], [], [], [0]

        async def client(i: int, http: httpx.AsyncClient, stop_at: float):
            rng = np.random.default_rng(seed * 1000 + i)
            while time.perf_counter() < stop_at:
                prompt = " ".join(rng.choice(words, int(rng.integers(3, 24))))
                body = {"prompt": prompt, "max_tokens": int(rng.integers(max_tokens // 2, max_tokens + 1)),
                        "temperature": 0.8, "seed": int(rng.integers(1 << 30)), "stream": True}
                t0 = time.perf_counter()
                times = []
                try:
                    async with http.stream("POST", "/v1/completions", json=body) as r:
                        if r.status_code != 200:
                            failures.append(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                            continue
                        finished = False
                        async for line in r.aiter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            choice = json.loads(line[6:])["choices"][0]
                            times.append(time.perf_counter())
                            finished = finished or choice["finish_reason"] is not None
                        if not finished:
                            failures.append("stream ended without a finish_reason")
                            continue
                except httpx.HTTPError as e:
                    failures.append(f"{type(e).__name__}: {e}")
                    continue
                done[0] += 1
                ttft.append(times[0] - t0)
                if len(times) > 2:
                    tpot.append((times[-1] - times[0]) / (len(times) - 1))

        async def main():
            limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
            async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(600.0), limits=limits) as http:
                stop_at = time.perf_counter() + duration_s
                t0 = time.perf_counter()
                await asyncio.gather(*(client(i, http, stop_at) for i in range(clients)))
                return time.perf_counter() - t0

        wall = asyncio.run(main())
        time.sleep(0.2)
        metrics = httpx.get(base + "/metrics", timeout=10).text
        held = {use: _metric_labeled(metrics, "dualpath_kv_cache_bytes", f'use="{use}"')
                for use in ("sequential", "random", "cached", "free")}
        out = {
            "clients": clients, "wall_s": wall, "requests": done[0], "failures": len(failures),
            "failure_examples": failures[:5],
            "ttft_p50_ms": float(np.percentile(ttft, 50) * 1e3) if ttft else None,
            "ttft_p99_ms": float(np.percentile(ttft, 99) * 1e3) if ttft else None,
            "tpot_p50_ms": float(np.percentile(tpot, 50) * 1e3) if tpot else None,
            "tpot_p99_ms": float(np.percentile(tpot, 99) * 1e3) if tpot else None,
            "running_after": _metric(metrics, "dualpath_running_requests"),
            "waiting_after": _metric(metrics, "dualpath_queue_depth"),
            "kv_bytes_held_after": held["sequential"] + held["random"],
            # Every block free, or holding only prefix pages nobody references (evictable).
            "kv_bytes_free_or_cached_after": held["free"] + held["cached"],
            "kv_capacity_bytes": _metric(metrics, "dualpath_kv_cache_capacity_bytes"),
            "generated_tokens": _metric(metrics, "dualpath_generation_tokens_total"),
            "preemptions": _metric(metrics, "dualpath_preemptions_total"),
        }
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _metric_labeled(text: str, name: str, label: str) -> float:
    prefix = f"{name}{{{label}}} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    raise KeyError(prefix)


def cmd_bench_load(args) -> int:
    model = args.model or _default_model(2048)
    server_args = ["--set", f"runtime.max_num_seqs={args.max_num_seqs}",
                   "--set", f"server.max_queued_requests={args.clients}", "-t", str(args.threads)]
    for item in args.set or ():
        server_args += ["--set", item]
    print(f"{args.clients} streaming clients for {args.duration:g}s against dualpath serve ({model}, "
          f"{args.max_num_seqs} requests at once)", flush=True)
    r = load_test(model, clients=args.clients, duration_s=args.duration, max_tokens=args.max_tokens,
                  seed=args.seed, server_args=tuple(server_args))
    print(f"requests completed: {r['requests']} in {r['wall_s']:.1f}s, failed: {r['failures']}")
    for e in r["failure_examples"]:
        print(f"  failure: {e}")
    print(f"TTFT p50 {r['ttft_p50_ms']:.0f} ms, p99 {r['ttft_p99_ms']:.0f} ms; "
          f"TPOT p50 {r['tpot_p50_ms']:.1f} ms, p99 {r['tpot_p99_ms']:.1f} ms")
    print(f"after: running {r['running_after']:.0f}, waiting {r['waiting_after']:.0f}, "
          f"KV bytes held {r['kv_bytes_held_after']:.0f}; preemptions {r['preemptions']:.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    ok = r["failures"] == 0 and r["kv_bytes_held_after"] == 0 and r["running_after"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "_worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
