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

from ..config import CHAT_TEMPLATES
from .common import free_port, live_server, metric, model_or_default, percentile_ms, process_peak_rss_mb, write_json

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


MIX = ("stream", "cut", "cancel", "chat_n", "chat_n_stream", "embed", "json_schema", "bad_json", "too_long",
       "plain")
"""What a mixed client sends, one at random per request: completions streamed to the end or
cut after a few chunks (the client closes the connection), a chat given up before its whole
answer came (cancelled), chats with ``n`` = 2 (whole or streamed), embeddings, a chat held
to a JSON schema, malformed JSON, a prompt longer than the context, a plain completion."""
CANCELLED = 499
"""The status counted for a request the client gave up (nginx's "client closed request")."""
_EXPECTED = {"bad_json": (400,), "too_long": (400,), "cancel": (CANCELLED, 200)}
"""The statuses each kind may get (200 where not listed; a cancelled request may finish first)."""
_SCHEMA = {"type": "json_schema", "json_schema": {"name": "pet", "schema": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"], "additionalProperties": False}}}
GREEDY_PROBE = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}
"""Sent alone before and after a mixed load: the load must not change greedy output."""


def _mapping_rss_mb(pid: int, min_bytes: int, max_bytes: int) -> float | None:
    """Resident MiB of the smallest mapping of the process whose size is within
    [min_bytes, max_bytes] (the KV arena: one mapping of its capacity plus alignment),
    from /proc/PID/smaps; None where there is none."""
    found, size = [], 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if "-" in line.split(" ", 1)[0]:  # a mapping's header: start-end perms ...
                    lo, hi = line.split(" ", 1)[0].split("-")
                    size = int(hi, 16) - int(lo, 16)
                elif line.startswith("Rss:") and min_bytes <= size <= max_bytes:
                    found.append((size, int(line.split()[1])))
    except (OSError, ValueError, IndexError):
        return None
    return min(found)[1] / 1024.0 if found else None


async def _mixed_stream(kind: str, http, path: str, body: dict) -> tuple[int, str | None]:
    """A streamed request of the mix, read to the end or cut after three chunks (``cut``:
    the client goes away mid-stream); (status, what was wrong or None)."""
    finished, chunks = set(), 0
    async with http.stream("POST", path, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, None
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return 500, f"error event: {event['error']}"
            chunks += 1
            for c in event["choices"]:
                if c["finish_reason"] is not None:
                    finished.add(c["index"])
            if kind == "cut" and chunks >= 3:
                return 200, None  # leaving the block closes the connection mid-stream
    want = 2 if kind == "chat_n_stream" else 1
    return 200, None if len(finished) == want else f"{len(finished)} of {want} choices finished"


async def _mixed_request(kind: str, rng, http, max_tokens: int, context_tokens: int) -> tuple[int, str | None]:
    """Send one request of the ``MIX``: (status, what was wrong with a 2xx answer or None);
    ``CANCELLED`` for a request the client gave up before its answer came."""
    import asyncio

    words = " ".join(rng.choice(WORDS, int(rng.integers(3, 24))))
    n_tok = int(rng.integers(max_tokens // 2, max_tokens + 1))
    sampling = {"max_tokens": n_tok, "temperature": 0.8, "seed": int(rng.integers(1 << 30))}
    chat = {"messages": [{"role": "user", "content": words}], **sampling}
    if kind == "bad_json":
        r = await http.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": ',
                            headers={"content-type": "application/json"})
        return r.status_code, None if "error" in r.json() else "no error object"
    if kind == "too_long":
        ids = [int(t) for t in rng.integers(5, 200, context_tokens + 8)]  # past the context
        r = await http.post("/v1/completions", json={"prompt": ids, "max_tokens": 4})
        return r.status_code, None if r.json()["error"]["code"] == "context_length_exceeded" else r.text[:200]
    if kind == "embed":
        r = await http.post("/v1/embeddings", json={"input": [words, words[::-1] or "a"]})
        return r.status_code, None if r.status_code != 200 or len(r.json()["data"]) == 2 else "not 2 vectors"
    if kind == "cancel":  # a whole answer awaited, then given up: the connection closes before it comes
        post = http.post("/v1/chat/completions", json={**chat, "max_tokens": max_tokens, "ignore_eos": True})
        try:
            r = await asyncio.wait_for(post, timeout=float(rng.uniform(0.01, 0.2)))
        except asyncio.TimeoutError:
            return CANCELLED, None
        return r.status_code, None
    if kind in ("plain", "chat_n", "json_schema"):
        path, body = {"plain": ("/v1/completions", {"prompt": words, **sampling}),
                      "chat_n": ("/v1/chat/completions", {**chat, "n": 2}),
                      "json_schema": ("/v1/chat/completions", {**chat, "response_format": _SCHEMA})}[kind]
        r = await http.post(path, json=body)
        if r.status_code != 200:
            return r.status_code, None
        got = r.json()["choices"]
        return 200, None if len(got) == (2 if kind == "chat_n" else 1) else f"{len(got)} choices"
    path, body = (("/v1/chat/completions", {**chat, "n": 2}) if kind == "chat_n_stream"
                  else ("/v1/completions", {"prompt": words, **sampling}))
    return await _mixed_stream(kind, http, path, body)


def _mixed_clients(base: str, clients: int, duration_s: float, max_tokens: int, seed: int, pid: int) -> dict:
    """Run ``clients`` clients sending the ``MIX`` at random for ``duration_s``; every answer's
    status checked against what its kind must get, every stream read for an error event.
    The server's RSS is sampled each second."""
    import asyncio
    import collections

    import httpx
    import numpy as np

    sent: collections.Counter[str] = collections.Counter()
    statuses: collections.Counter[int] = collections.Counter()
    failures, rss = [], []
    context = [0]

    async def client(i: int, http: httpx.AsyncClient, stop_at: float):
        rng = np.random.default_rng(seed * 1000 + i)
        while time.perf_counter() < stop_at:
            kind = MIX[int(rng.integers(len(MIX)))]
            sent[kind] += 1
            try:
                status, wrong = await _mixed_request(kind, rng, http, max_tokens, context[0])
            except (httpx.HTTPError, ValueError, KeyError) as e:
                status, wrong = 0, f"{type(e).__name__}: {e}"
            statuses[status] += 1
            if status == 429:  # overload, refused with Retry-After: a right answer, counted apart
                await asyncio.sleep(0.1)
                continue
            if status not in _EXPECTED.get(kind, (200,)) or wrong:
                failures.append(f"{kind}: HTTP {status}{': ' + wrong if wrong else ''}")

    arena = [0]

    def sample(t0: float):  # (seconds, RSS, of which the KV arena) in MiB
        rss.append((time.perf_counter() - t0, process_peak_rss_mb(pid, "VmRSS"),
                    _mapping_rss_mb(pid, arena[0], arena[0] + arena[0] // 32 + (8 << 20))))

    async def watch_rss(stop_at: float, t0: float):
        while time.perf_counter() < stop_at:
            sample(t0)
            await asyncio.sleep(1.0)

    async def main():
        limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
        async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(600.0), limits=limits) as http:
            context[0] = (await http.get("/v1/models")).json()["data"][0]["context_length"]
            arena[0] = int(metric((await http.get("/metrics")).text, "dualpath_kv_cache_capacity_bytes"))
            t0 = time.perf_counter()
            stop_at = t0 + duration_s
            await asyncio.gather(watch_rss(stop_at, t0), *(client(i, http, stop_at) for i in range(clients)))
            sample(t0)
            return time.perf_counter() - t0

    wall = asyncio.run(main())
    return {"wall_s": wall, "sent": dict(sent), "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "failures": failures, "rss_mb": rss}


def _serve_command(model: str, server_args: tuple[str, ...]) -> tuple[list[str], str]:
    """``dualpath serve`` of ``model`` on a free loopback port: its argv and base URL."""
    port = free_port()
    return ([sys.executable, "-m", "dualpath.cli", "serve", "--model", model, "--port", str(port), *server_args],
            f"http://127.0.0.1:{port}")


def _greedy(base: str) -> str:
    import httpx

    r = httpx.post(base + "/v1/completions", json=GREEDY_PROBE, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def mixed_load_test(model: str, *, clients: int, duration_s: float, max_tokens: int, seed: int = 0,
                    server_args: tuple[str, ...] = ()) -> dict:
    """Start ``dualpath serve`` on loopback and run ``clients`` clients sending the ``MIX``
    for ``duration_s``; a greedy probe before and after. Afterwards: no request held, no
    KV byte held, and (from the server's stderr once it stopped) the cache's invariants.
    Returns the figures; RSS in MiB."""
    import httpx

    # The mix embeds with the chat model's own states: asked for, as llama-server's --embeddings.
    cmd, base = _serve_command(model, ("--embeddings", *server_args))
    with live_server("dualpath serve", cmd, base, startup_s=STARTUP_S) as server:
        before = _greedy(base)
        c = _mixed_clients(base, clients, duration_s, max_tokens, seed, server.proc.pid)
        time.sleep(0.5)  # the engine ends the requests whose clients went away
        after = _greedy(base)
        metrics = httpx.get(base + "/metrics", timeout=10).text
        stderr = server.stop()
    # RSS without the KV arena too: its pages are touched as the prefix cache first uses
    # them, which is growth up to its capacity, not a leak.
    warm_at = min(60.0, duration_s / 3)
    warm = [m for t, m, _ in c["rss_mb"] if t >= warm_at and m is not None]
    rest = [m - a for t, m, a in c["rss_mb"] if t >= warm_at and m is not None and a is not None]
    invariants = [line for line in stderr.splitlines() if "KV cache invariants" in line]
    held = sum(metric(metrics, "dualpath_kv_cache_bytes", f'use="{use}"') for use in ("sequential", "random"))
    return {
        "clients": clients, "wall_s": c["wall_s"], "sent": c["sent"], "statuses": c["statuses"],
        "requests": sum(c["sent"].values()), "failures": len(c["failures"]),
        "failure_examples": c["failures"][:8],
        "server_errors": sum(v for k, v in c["statuses"].items() if k.startswith("5")),
        "greedy_unchanged": before == after, "greedy_before": before, "greedy_after": after,
        "rss_warm_mb": warm[0] if warm else None, "rss_end_mb": warm[-1] if warm else None,
        "rss_growth_after_warmup": (warm[-1] / warm[0] - 1.0) if len(warm) > 1 else None,
        "rss_mb": c["rss_mb"],
        "rss_growth_after_warmup_without_kv": (rest[-1] / rest[0] - 1.0) if len(rest) > 1 else None,
        "kv_arena_mb": metric(metrics, "dualpath_kv_cache_capacity_bytes") / 2**20,
        "kv_arena_resident_mb": c["rss_mb"][-1][2],
        "running_after": metric(metrics, "dualpath_running_requests"),
        "waiting_after": metric(metrics, "dualpath_queue_depth"),
        "kv_bytes_held_after": held,
        "invariants": invariants[-1] if invariants else "(no invariant line: the server did not stop cleanly)",
        "invariants_ok": bool(invariants) and "hold" in invariants[-1],
        "tracebacks_in_log": stderr.count("Traceback"),
        "step_retries": metric(metrics, "dualpath_step_retries_total"),
    }


def load_test(model: str, *, clients: int, duration_s: float, max_tokens: int, seed: int = 0,
              server_args: tuple[str, ...] = ()) -> dict:
    """Start ``dualpath serve`` on loopback, run ``clients`` streaming clients that send
    completions back to back for ``duration_s``, then check that the server holds no
    request and no KV cache block. Returns the figures (latencies in ms)."""
    import httpx

    cmd, base = _serve_command(model, server_args)
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
    queued = 4 * args.clients if args.mix else args.clients  # --mix: an embedding queues one per input
    server_args = ["--set", f"runtime.max_num_seqs={args.max_num_seqs}",
                   "--set", f"server.max_queued_requests={queued}", "-t", str(args.threads)]
    for item in args.set or ():
        server_args += ["--set", item]
    if args.mix:
        return _cmd_mixed(args, model, server_args)
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


def _cmd_mixed(args, model: str, server_args: list[str]) -> int:
    if args.chat_template:
        server_args += ["--chat-template", args.chat_template]
    print(f"{args.clients} clients sending a mix ({', '.join(MIX)}) for {args.duration:g}s against "
          f"dualpath serve ({model}, {args.max_num_seqs} sequences at once)", flush=True)
    r = mixed_load_test(model, clients=args.clients, duration_s=args.duration, max_tokens=args.max_tokens,
                        seed=args.seed, server_args=tuple(server_args))
    sent = ", ".join(f"{k} {v}" for k, v in sorted(r["sent"].items()))
    print(f"requests: {r['requests']} in {r['wall_s']:.1f}s ({sent})")
    print(f"statuses: {', '.join(f'{k}: {v}' for k, v in r['statuses'].items())}; 5xx {r['server_errors']}; "
          f"unexpected answers {r['failures']}")
    for e in r["failure_examples"]:
        print(f"  {e}")
    growth = r["rss_growth_after_warmup"]
    print(f"server RSS {r['rss_warm_mb'] or 0:.0f} MiB after warm-up, {r['rss_end_mb'] or 0:.0f} MiB at the end "
          f"({'-' if growth is None else f'{growth * 100:+.1f}%'}); tracebacks in its log: {r['tracebacks_in_log']}")
    marks = [(m, a) for t, m, a in r["rss_mb"] if m is not None][::max(1, len(r["rss_mb"]) // 6)]
    over = ", ".join(f"{m:.0f} ({a or 0:.0f})" for m, a in marks)
    print(f"server RSS over the run (MiB, of which KV arena): {over}; "
          f"KV arena {r['kv_arena_mb']:.0f} MiB, resident at the end {r['kv_arena_resident_mb'] or 0:.0f}")
    rest = r["rss_growth_after_warmup_without_kv"]
    print(f"RSS growth after warm-up without the KV arena: {'-' if rest is None else f'{rest * 100:+.1f}%'}")
    print(f"greedy output {'unchanged' if r['greedy_unchanged'] else 'CHANGED'} by the load; after: running "
          f"{r['running_after']:.0f}, waiting {r['waiting_after']:.0f}, KV bytes held {r['kv_bytes_held_after']:.0f}")
    print(f"server at shutdown: {r['invariants']}")
    write_json(args.json, r)
    ok = (r["failures"] == 0 and r["server_errors"] == 0 and r["greedy_unchanged"] and r["invariants_ok"]
          and r["kv_bytes_held_after"] == 0 and r["running_after"] == 0)
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
    lo.add_argument("--mix", action="store_true", help="clients send a mix instead of streamed completions: "
                    + ", ".join(MIX) + "; every status checked, greedy output compared before and after, "
                    "the cache's invariants read from the server's shutdown")
    lo.add_argument("--chat-template", default="chatml", choices=CHAT_TEMPLATES,
                    help="the server's chat template with --mix (default chatml: the default model has none)")
    lo.add_argument("--json")
    lo.set_defaults(func=cmd_bench_load)
