"""``dualpath bench load``: many streaming clients against a live ``dualpath serve``.

The server is a long-running process of its own (``python -m dualpath.cli serve``
on a free loopback port), not a worker call: it is started here, polled until
``/health`` answers, loaded by ``clients`` streaming HTTP clients sending
completions back to back, then read through ``/metrics``: afterwards it must hold
no request and no KV cache block. Its stderr goes to a file; when it dies, the
error quotes the tail, as the harness does for a worker.
"""

from __future__ import annotations

import json
import sys
import time

from .common import free_port, live_server, metric, model_or_default, percentile_ms, write_json

STARTUP_S = 120.0
"""How long the server may take to answer /health."""
WORDS = ["Once", "upon", "a", "time", "there", "was", "a", "little", "girl", "dog", "named", "Lily",
         "Tom", "who", "loved", "to", "play", "in", "the", "park", "sun", "big", "red", "ball"]
"""The clients' prompts are drawn from these."""


def _clients(base: str, clients: int, duration_s: float, max_tokens: int, seed: int) -> dict:
    """Run the clients; their latencies (seconds), failures and completed count."""
    import asyncio

    import httpx
    import numpy as np

    ttft, tpot, failures, done = [], [], [], [0]

    async def client(i: int, http: httpx.AsyncClient, stop_at: float):
        rng = np.random.default_rng(seed * 1000 + i)
        while time.perf_counter() < stop_at:
            prompt = " ".join(rng.choice(WORDS, int(rng.integers(3, 24))))
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
    return {"wall_s": wall, "requests": done[0], "failures": failures, "ttft": ttft, "tpot": tpot}


def load_test(model: str, *, clients: int, duration_s: float, max_tokens: int, seed: int = 0,
              server_args: tuple[str, ...] = ()) -> dict:
    """Start ``dualpath serve`` on loopback, run ``clients`` streaming clients that send
    completions back to back for ``duration_s``, then check that the server holds no
    request and no KV cache block. Returns the figures (latencies in ms)."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", model, "--port", str(port), *server_args]
    base = f"http://127.0.0.1:{port}"
    with live_server("dualpath serve", cmd, base, startup_s=STARTUP_S):
        c = _clients(base, clients, duration_s, max_tokens, seed)
        time.sleep(0.2)
        metrics = httpx.get(base + "/metrics", timeout=10).text
    held = {use: metric(metrics, "dualpath_kv_cache_bytes", f'use="{use}"')
            for use in ("sequential", "random", "cached", "free")}
    ttft, tpot = c["ttft"], c["tpot"]
    return {
        "clients": clients, "wall_s": c["wall_s"], "requests": c["requests"], "failures": len(c["failures"]),
        "failure_examples": c["failures"][:5],
        "ttft_p50_ms": percentile_ms(ttft, 50), "ttft_p99_ms": percentile_ms(ttft, 99),
        "tpot_p50_ms": percentile_ms(tpot, 50), "tpot_p99_ms": percentile_ms(tpot, 99),
        "running_after": metric(metrics, "dualpath_running_requests"),
        "waiting_after": metric(metrics, "dualpath_queue_depth"),
        "kv_bytes_held_after": held["sequential"] + held["random"],
        # Every block free, or holding only prefix pages nobody references (evictable).
        "kv_bytes_free_or_cached_after": held["free"] + held["cached"],
        "kv_capacity_bytes": metric(metrics, "dualpath_kv_cache_capacity_bytes"),
        "generated_tokens": metric(metrics, "dualpath_generation_tokens_total"),
        "preemptions": metric(metrics, "dualpath_preemptions_total"),
    }


def _ms(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f} ms"


def cmd_bench_load(args) -> int:
    from ..config import load_config, parse_overrides

    load_config(None, parse_overrides(args.set))  # a bad --set fails here, not in the server
    model = model_or_default(args.model)
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
    print(f"TTFT p50 {_ms(r['ttft_p50_ms'], 0)}, p99 {_ms(r['ttft_p99_ms'], 0)}; "
          f"TPOT p50 {_ms(r['tpot_p50_ms'], 1)}, p99 {_ms(r['tpot_p99_ms'], 1)}")
    print(f"after: running {r['running_after']:.0f}, waiting {r['waiting_after']:.0f}, "
          f"KV bytes held {r['kv_bytes_held_after']:.0f}; preemptions {r['preemptions']:.0f}")
    write_json(args.json, r)
    ok = r["failures"] == 0 and r["kv_bytes_held_after"] == 0 and r["running_after"] == 0
    return 0 if ok else 1


def add_parser(bs) -> None:
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
