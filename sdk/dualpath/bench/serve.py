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
"""

from __future__ import annotations

import time

from .common import interleaved, median_of, model_or_default, percentile_ms, random_ids, write_json
from .harness import run_worker

WORKLOADS = ("mixed",)
MODES = ("dual", "sequential", "random")
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


def worker(model: str, mode: str, params: dict) -> dict:
    """One mode's run of the whole schedule; ``params`` as ``cmd_bench_serve`` builds them."""
    import asyncio

    import numpy as np

    from ..config import load_config
    from ..llm import LLM
    from ..runtime.sampler import SamplingParams

    cfg = load_config(None, {
        "runtime.num_threads": params["threads"], "runtime.max_context_tokens": params["ctx"],
        "runtime.max_num_seqs": params["max_num_seqs"], "runtime.kv_cache_tokens": params["kv_cache_tokens"],
        "dualpath_config.path_mode": mode, "server.max_queued_requests": 100000, **params.get("overrides", {})})
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
    stats = llm.runner.cache.stats()
    steps = np.array([t for t, _ in engine.metrics.step_log])

    def of(kind: str | None, key: str) -> list[float]:
        return [r[key] for r in results if (kind is None or r["kind"] == kind) and r[key] is not None]

    doc_ttft = of("document", "ttft")
    return {
        "mode": mode, "wall_s": wall, "requests": len(results),
        "ttft_p50_ms": percentile_ms(of(None, "ttft"), 50), "ttft_p99_ms": percentile_ms(of(None, "ttft"), 99),
        "tpot_p50_ms": percentile_ms(of(None, "tpot"), 50), "tpot_p99_ms": percentile_ms(of(None, "tpot"), 99),
        "chat_ttft_p50_ms": percentile_ms(of("chat", "ttft"), 50, empty=0.0),
        "chat_ttft_p99_ms": percentile_ms(of("chat", "ttft"), 99, empty=0.0),
        "chat_tpot_p99_ms": percentile_ms(of("chat", "tpot"), 99, empty=0.0),
        "doc_ttft_p50_ms": percentile_ms(doc_ttft, 50, empty=0.0),
        "doc_ttft_p99_ms": percentile_ms(doc_ttft, 99, empty=0.0),
        "documents": len(doc_ttft),
        "peak_kv_mb": engine.metrics.peak_kv_bytes_held / 2**20,
        "step_p50_ms": percentile_ms(steps, 50), "step_p99_ms": percentile_ms(steps, 99),
        "steps": len(steps),
        "kv_capacity_mb": stats.bytes_total / 2**20,
        "paths": paths, "migrations": stats.migrations, "prefix_hit_rate": stats.prefix_hit_rate,
        "cached_prompt_tokens": sum(r["cached"] for r in results),
        "preemptions": engine.scheduler.preemptions,
        "generated_tokens": sum(r["tokens"] for r in results),
    }


def cmd_bench_serve(args) -> int:
    from ..config import load_config, parse_overrides

    if args.workload not in WORKLOADS:
        raise SystemExit(f"unknown workload {args.workload!r} (available: {', '.join(WORKLOADS)})")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown path mode {m!r}: dual, sequential or random")
    overrides = parse_overrides(args.set)
    load_config(None, overrides)  # a bad key fails here, before any run
    model = model_or_default(args.model, max(args.ctx, 2048))
    params = {"threads": args.threads, "ctx": args.ctx, "max_num_seqs": args.max_num_seqs,
              "kv_cache_tokens": args.kv_cache_tokens or 4 * args.ctx, "seed": args.seed,
              "requests": args.requests, "rate": args.rate, "system_tokens": args.system_tokens,
              "doc_tokens": args.doc_tokens, "doc_share": args.doc_share, "overrides": overrides}
    print(f"model {model}; workload mixed: {args.requests} requests at {args.rate:g}/s (seed {args.seed}), "
          f"{1 - args.doc_share:.0%} chats sharing a {args.system_tokens}-token system prompt, "
          f"{args.doc_share:.0%} documents of {int(args.doc_tokens * 0.7)}-{args.doc_tokens} tokens; "
          f"{args.threads} threads, {args.max_num_seqs} requests at once, "
          f"KV cache {params['kv_cache_tokens']} tokens", flush=True)

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
    write_json(args.json, {"params": params, "model": model, "runs": runs})
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
