"""``dualpath bench kernels``: decode attention against this machine's read bandwidth.

Decode attention streams every K and V row of the context once per step, so its
ceiling is memory read bandwidth. Both are measured in the same run, on the same
thread pool: the bandwidth probe reads a large buffer with each thread; the
kernel reads the KV of one layer (K + V: context x num_kv_heads x head_dim x 2
bytes x 2). Layers rotate through an arena larger than the last-level cache so
every step comes from DRAM, as in a real model. Every kernel repeat follows its
own bandwidth probe, and a row's share of the bandwidth is the median of the
per-pair ratios: this machine's speed drifts by up to 2x within a run, and a ratio
of two medians taken minutes apart would measure the drift.

Layouts: ``sequential`` = the sequence's pages back to back (one extent, one
span); ``random`` = the same pages scattered in shuffled order (one span per page,
software prefetch on).

Two ceilings frame the figures, measured in the same run: ``cached`` runs the
kernel over a context small enough to stay in the caches (its compute rate, with
no DRAM traffic), and ``1 head/kv`` reads the longest context from DRAM with one
query head per KV head (an eighth of the arithmetic: how close the kernel's access
pattern gets to the bandwidth when compute is nearly free). Decode can beat
neither.

A third line frames the arithmetic: the kernel ISA's f32 FMA peak on the same
threads, measured in the same run. Decode attention does 4 * group * head_dim flops
per KV head and position (scores and accumulation, f32: the f16 tolerance rules out
f16 arithmetic) over 2 * head_dim * 2 bytes of f16 K and V, so `group` flops per KV
byte: the FMA peak divided by `group` is a rate no f16 kernel can pass, before it
pays for widening f16 to f32.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..kernels import KVArena, ThreadPool, available_kernels, default_kernel
from .common import write_json

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_TOKENS = 32, 4, 64, 16
BLOCK = 1 << 17


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _paired(kernel_step, probe, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of each kernel step and of the bandwidth probe taken right before it:
    a ratio within a pair holds even when this machine's speed drifts during a run."""
    kernel_step()
    probe()
    tk, tp = [], []
    for _ in range(repeats):
        tp.append(_timed(probe))
        tk.append(_timed(kernel_step))
    return tk, tp


def measure_fma_peak(pool: ThreadPool, kernel: str | None = None, iters: int = 1 << 22,
                     repeats: int = 5) -> float:
    """GFLOP/s of f32 FMAs at the kernel ISA's widest vectors, every pool thread at once."""
    flops = pool.fma(iters, kernel)  # also the warm-up
    return flops / statistics.median(_timed(lambda: pool.fma(iters, kernel)) for _ in range(repeats)) / 1e9


def _kv_bytes(ctx: int) -> int:
    """Bytes of one layer's f16 K and V for ctx positions."""
    return ctx * NUM_KV_HEADS * HEAD_DIM * 2 * 2


def _arena_for(ctx: int, layers: int, layout: str, seed: int = 0):
    """An f16 arena holding `ctx` tokens in each of `layers` layers, and their spans."""
    token_bytes = 2 * NUM_KV_HEADS * HEAD_DIM * 2
    page_bytes = token_bytes * PAGE_TOKENS
    ppb = BLOCK // page_bytes
    pages = -(-ctx // PAGE_TOKENS)
    blocks = -(-pages // ppb) + 1
    arena = KVArena(BLOCK, blocks, layers, NUM_KV_HEADS, HEAD_DIM, "f16")
    order = np.arange(pages) if layout == "sequential" else np.random.default_rng(seed).permutation(pages)
    offs = np.array([(p // ppb) * BLOCK + (p % ppb) * page_bytes for p in order], np.int64)
    pos = np.arange(ctx)
    slots = np.stack([offs[pos // PAGE_TOKENS], pos % PAGE_TOKENS, np.full(ctx, PAGE_TOKENS)], 1).astype(np.int64)
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((ctx, NUM_KV_HEADS * HEAD_DIM)).astype(np.float32)
    for layer in range(layers):
        arena.write(layer, k, k, slots)
    if layout == "sequential":
        spans = np.array([[offs[0], ctx, PAGE_TOKENS]], np.int64)
    else:
        n = np.minimum(PAGE_TOKENS, ctx - np.arange(pages) * PAGE_TOKENS)
        spans = np.stack([offs, n, np.full(pages, PAGE_TOKENS)], 1).astype(np.int64)
    return arena, spans


def _layer_step(arena, spans, ctx: int, layers: int, num_heads: int, kernel: str, pool, passes: int = 1):
    """One step: every layer once per pass, in rotation (each read once from DRAM when
    the layers together exceed the last-level cache). Returns (step, layer calls)."""
    q = np.random.default_rng(1).standard_normal((1, num_heads, HEAD_DIM)).astype(np.float32)
    state = {"layer": 0}

    def step():
        for _ in range(layers * passes):
            arena.attention(state["layer"], q, spans, ctx - 1, prefetch_degree=4, kernel=kernel, pool=pool)
            state["layer"] = (state["layer"] + 1) % layers

    return step, layers * passes


def run_kernel_bench(contexts=(1024, 8192, 32768), threads=(1, 2), layouts=("sequential", "random"),
                     kernel: str | None = None, repeats: int = 7, llc_bytes: int = 64 << 20,
                     ceilings: bool = True, cached_context: int = 4096, bandwidth_bytes: int = 512 << 20) -> dict:
    kernel = kernel or default_kernel()
    rows = []
    bandwidth = {}
    fma_gflops = {}
    buf = np.ones(bandwidth_bytes // 8, np.uint64)

    def row(pool, ctx, layout, heads, arena, spans, layers, passes=1):
        step, calls = _layer_step(arena, spans, ctx, layers, heads, kernel, pool, passes)
        tk, tp = _paired(step, lambda: pool.read(buf), repeats)
        rates = [_kv_bytes(ctx) * calls / t / 1e9 for t in tk]
        bws = [bandwidth_bytes / t / 1e9 for t in tp]
        shares = [r / b for r, b in zip(rates, bws)]
        bandwidth.setdefault(pool.num_threads, []).extend(bws)
        rows.append({"kernel": kernel, "threads": pool.num_threads, "context": ctx, "layout": layout,
                     "query_heads": heads, "us_per_layer": statistics.median(tk) / calls * 1e6,
                     "gb_per_s": statistics.median(rates), "bandwidth_gb_per_s": statistics.median(bws),
                     "share_of_bandwidth": statistics.median(shares), "shares": shares,
                     "spans": int(len(spans)), "layers_rotated": layers})

    for n_threads in threads:
        pool = ThreadPool(n_threads)
        fma_gflops[n_threads] = measure_fma_peak(pool, kernel)
        for ctx in contexts:
            layers = max(1, min(64, -(-2 * llc_bytes // _kv_bytes(ctx))))  # > LLC in total: DRAM reads
            for layout in layouts:
                arena, spans = _arena_for(ctx, layers, layout)
                row(pool, ctx, layout, NUM_HEADS, arena, spans, layers)
                if ceilings and layout == "sequential" and ctx == max(contexts):
                    row(pool, ctx, "1 head/kv", NUM_KV_HEADS, arena, spans, layers)
                del arena
        if ceilings:  # one small layer, read over and over: it stays in the caches
            arena, spans = _arena_for(cached_context, 1, "sequential")
            row(pool, cached_context, "cached", NUM_HEADS, arena, spans, 1, passes=32)
    bandwidth = {n: statistics.median(v) for n, v in bandwidth.items()}
    group = NUM_HEADS // NUM_KV_HEADS
    return {"kernel": kernel, "rows": rows, "bandwidth": bandwidth, "fma_gflops": fma_gflops,
            "arithmetic_ceiling_gb_per_s": {n: g / group for n, g in fma_gflops.items()},
            "shape": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                      "kv_dtype": "f16", "page_tokens": PAGE_TOKENS}}


def cmd_bench_kernels(args) -> int:
    contexts = tuple(int(c) for c in args.contexts.split(","))
    threads = tuple(int(t) for t in args.threads.split(","))
    res = run_kernel_bench(contexts, threads, kernel=args.kernel, repeats=args.repeats,
                           ceilings=not args.no_ceilings)
    s = res["shape"]
    print(f"decode attention, 1 query token: {s['num_heads']} query heads, {s['num_kv_heads']} KV heads, "
          f"head_dim {s['head_dim']}, {s['kv_dtype']} KV, pages of {s['page_tokens']} tokens; median of "
          f"{args.repeats}; kernels available: {', '.join(available_kernels())}")
    for n, bw in res["bandwidth"].items():
        print(f"read bandwidth, {n} thread{'s' if n > 1 else ''}: {bw:.1f} GB/s (median of the probes, one "
              f"before every kernel repeat)")
    group = s["num_heads"] // s["num_kv_heads"]
    for n, g in res["fma_gflops"].items():
        print(f"f32 FMA peak ({res['kernel']}), {n} "
              f"thread{'s' if n > 1 else ''}: {g:.0f} GFLOP/s; at {group} flops per f16 KV byte, arithmetic "
              f"alone caps decode attention at {res['arithmetic_ceiling_gb_per_s'][n]:.1f} GB/s "
              f"(before widening f16)")
    print(f"{'kernel':<8} {'thr':>3} {'context':>8} {'layout':<10} {'heads':>5} {'spans':>6} {'us/layer':>9} "
          f"{'GB/s':>7} {'bw':>6} {'of bw':>6}")
    for r in res["rows"]:
        print(f"{r['kernel']:<8} {r['threads']:>3} {r['context']:>8} {r['layout']:<10} {r['query_heads']:>5} "
              f"{r['spans']:>6} {r['us_per_layer']:>9.1f} {r['gb_per_s']:>7.1f} "
              f"{r['bandwidth_gb_per_s']:>6.1f} {r['share_of_bandwidth']:>6.0%}")
    print("ceilings: 'cached' = the same kernel on a context that stays in the caches (compute rate, "
          "no DRAM); '1 head/kv' = the longest context from DRAM with 4 query heads (an eighth of the "
          "arithmetic)")
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    k = bs.add_parser("kernels", help="decode attention GB/s beside the machine's read bandwidth")
    k.add_argument("--contexts", default="1024,8192,32768")
    k.add_argument("--threads", default="1,2")
    k.add_argument("--kernel", help="force a kernel ISA (default: the dispatched one)")
    k.add_argument("-r", "--repeats", type=int, default=7)
    k.add_argument("--no-ceilings", action="store_true", help="skip the cached and 1 head/kv ceiling rows")
    k.add_argument("--json")
    k.set_defaults(func=cmd_bench_kernels)
