"""``dualpath bench kernels``: decode attention against this machine's read bandwidth.

Decode attention streams every K and V row of the context once per step, so its
ceiling is memory read bandwidth. Both are measured in the same run, on the same
thread pool: the bandwidth probe reads a large buffer with each thread; the
kernel reads the KV of one layer (K + V: context x num_kv_heads x head_dim x 2
bytes x 2 in f16; in q8, context x num_kv_heads x (head_dim + 4) x 2: int8 values
and an f32 scale per token and KV head, the bytes the kernel actually reads, which
the GB/s are computed from). ``--kv-dtype f16,q8`` (the default) measures both
element types side by side, each row after its own bandwidth probe. Layers rotate through an arena
larger than the last-level cache so
every step comes from DRAM, as in a real model. Every kernel repeat follows its
own bandwidth probe, and a row's share of the bandwidth is the median of the
per-pair ratios: a shared machine's speed drifts within a run, and a ratio
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
pays for widening f16 to f32. q8 reads 2 * (head_dim + 4) bytes for the same flops,
nearly twice the flops per byte (15 at head_dim 64): its ceiling is half as high,
and it halves the bytes only where the kernel has arithmetic to spare.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..kernels import KV_DTYPES, KVArena, ThreadPool, available_kernels, default_kernel, kv_tile_bytes
from .common import write_json

PAGE_TOKENS = 16
BLOCK = 1 << 17


@dataclass(frozen=True)
class Shape:
    """One attention shape: query heads, KV heads, head_dim (``32/4x64``)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def __str__(self) -> str:
        return f"{self.num_heads}/{self.num_kv_heads}x{self.head_dim}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        heads, _, hd = text.partition("x")
        q, _, kv = heads.partition("/")
        shape = cls(int(q), int(kv), int(hd))
        if min(shape.num_heads, shape.num_kv_heads, shape.head_dim) < 1 or shape.num_heads % shape.num_kv_heads:
            raise ValueError(f"{text!r}: query heads must be a multiple of KV heads, all positive")
        return shape


GQA = Shape(32, 4, 64)
"""TinyLlama-1.1B, Llama 3.2: 8 query heads per KV head, head_dim 64."""
MHA = Shape(6, 6, 48)
"""stories15M: one query head per KV head, head_dim 48."""
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = GQA.num_heads, GQA.num_kv_heads, GQA.head_dim


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


def _kv_bytes(ctx: int, kv_dtype: str = "f16", shape: Shape = GQA) -> int:
    """Bytes of one layer's K and V for ctx positions (q8: values and scales)."""
    return ctx * kv_tile_bytes(kv_dtype, shape.num_kv_heads, shape.head_dim, 1)


def flops_per_kv_byte(kv_dtype: str, shape: Shape = GQA) -> float:
    """Decode attention's f32 flops per KV byte read: 4 * group * head_dim per KV head and
    position, over that position's K and V bytes."""
    return 4 * shape.group * shape.head_dim * shape.num_kv_heads / kv_tile_bytes(
        kv_dtype, shape.num_kv_heads, shape.head_dim, 1)


def _arena_for(ctx: int, layers: int, layout: str, seed: int = 0, kv_dtype: str = "f16", shape: Shape = GQA):
    """An arena of `kv_dtype` holding `ctx` tokens in each of `layers` layers, and their spans."""
    nkv, hd = shape.num_kv_heads, shape.head_dim
    page_bytes = kv_tile_bytes(kv_dtype, nkv, hd, PAGE_TOKENS)
    ppb = BLOCK // page_bytes
    pages = -(-ctx // PAGE_TOKENS)
    blocks = -(-pages // ppb) + 1
    arena = KVArena(BLOCK, blocks, layers, nkv, hd, kv_dtype)
    order = np.arange(pages) if layout == "sequential" else np.random.default_rng(seed).permutation(pages)
    offs = np.array([(p // ppb) * BLOCK + (p % ppb) * page_bytes for p in order], np.int64)
    pos = np.arange(ctx)
    slots = np.stack([offs[pos // PAGE_TOKENS], pos % PAGE_TOKENS, np.full(ctx, PAGE_TOKENS)], 1).astype(np.int64)
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((ctx, nkv * hd)).astype(np.float32)
    for layer in range(layers):
        arena.write(layer, k, k, slots)
    if layout == "sequential":
        spans = np.array([[offs[0], ctx, PAGE_TOKENS]], np.int64)
    else:
        n = np.minimum(PAGE_TOKENS, ctx - np.arange(pages) * PAGE_TOKENS)
        spans = np.stack([offs, n, np.full(pages, PAGE_TOKENS)], 1).astype(np.int64)
    return arena, spans


def _layer_step(arena, spans, ctx: int, layers: int, num_heads: int, kernel: str, pool, passes: int = 1,
                head_dim: int = HEAD_DIM):
    """One step: every layer once per pass, in rotation (each read once from DRAM when
    the layers together exceed the last-level cache). Returns (step, layer calls)."""
    q = np.random.default_rng(1).standard_normal((1, num_heads, head_dim)).astype(np.float32)
    state = {"layer": 0}

    def step():
        for _ in range(layers * passes):
            arena.attention(state["layer"], q, spans, ctx - 1, prefetch_degree=4, kernel=kernel, pool=pool)
            state["layer"] = (state["layer"] + 1) % layers

    return step, layers * passes


def run_kernel_bench(contexts=(1024, 8192, 32768), threads=(1, 2), layouts=("sequential", "random"),
                     kernel: str | None = None, repeats: int = 7, llc_bytes: int = 64 << 20,
                     ceilings: bool = True, cached_context: int = 4096, bandwidth_bytes: int = 512 << 20,
                     kv_dtypes=("f16",), shapes=(GQA,)) -> dict:
    """Rows for every (threads, shape, context, layout, kv_dtype); a row's GB/s counts the
    bytes of its KV type (q8: int8 values and their f32 scales)."""
    kernel = kernel or default_kernel()
    rows = []
    bandwidth: dict = {}
    fma_gflops = {}
    buf = np.ones(bandwidth_bytes // 8, np.uint64)

    def row(pool, shape, ctx, layout, heads, arena, spans, layers, kv_dtype, passes=1):
        step, calls = _layer_step(arena, spans, ctx, layers, heads, kernel, pool, passes, shape.head_dim)
        tk, tp = _paired(step, lambda: pool.read(buf), repeats)
        rates = [_kv_bytes(ctx, kv_dtype, shape) * calls / t / 1e9 for t in tk]
        bws = [bandwidth_bytes / t / 1e9 for t in tp]
        shares = [r / b for r, b in zip(rates, bws)]
        bandwidth.setdefault(pool.num_threads, []).extend(bws)
        rows.append({"kernel": kernel, "threads": pool.num_threads, "shape": str(shape), "context": ctx,
                     "layout": layout, "kv_dtype": kv_dtype, "kv_bytes_per_layer": _kv_bytes(ctx, kv_dtype, shape),
                     "query_heads": heads, "head_dim": shape.head_dim, "kv_heads": shape.num_kv_heads,
                     "us_per_layer": statistics.median(tk) / calls * 1e6,
                     "gb_per_s": statistics.median(rates), "bandwidth_gb_per_s": statistics.median(bws),
                     "share_of_bandwidth": statistics.median(shares), "shares": shares,
                     "spans": int(len(spans)), "layers_rotated": layers})

    for n_threads in threads:
        pool = ThreadPool(n_threads)
        fma_gflops[n_threads] = measure_fma_peak(pool, kernel)
        for shape in shapes:
            for ctx in contexts:
                for layout in layouts:
                    for kv_dtype in kv_dtypes:
                        # > LLC in total: DRAM reads
                        layers = max(1, min(64, -(-2 * llc_bytes // _kv_bytes(ctx, kv_dtype, shape))))
                        arena, spans = _arena_for(ctx, layers, layout, kv_dtype=kv_dtype, shape=shape)
                        row(pool, shape, ctx, layout, shape.num_heads, arena, spans, layers, kv_dtype)
                        if ceilings and layout == "sequential" and ctx == max(contexts) and shape.group > 1:
                            row(pool, shape, ctx, "1 head/kv", shape.num_kv_heads, arena, spans, layers, kv_dtype)
                        del arena
            if ceilings:  # one small layer, read over and over: it stays in the caches
                for kv_dtype in kv_dtypes:
                    arena, spans = _arena_for(cached_context, 1, "sequential", kv_dtype=kv_dtype, shape=shape)
                    row(pool, shape, cached_context, "cached", shape.num_heads, arena, spans, 1, kv_dtype, passes=32)
    bandwidth = {n: statistics.median(v) for n, v in bandwidth.items()}
    first = shapes[0]
    return {"kernel": kernel, "rows": rows, "bandwidth": bandwidth, "fma_gflops": fma_gflops,
            "arithmetic_ceiling_gb_per_s": {n: g / first.group for n, g in fma_gflops.items()},
            "flops_per_kv_byte": {dt: flops_per_kv_byte(dt, first) for dt in kv_dtypes},
            "flops_per_kv_byte_by_shape": {str(sh): {dt: flops_per_kv_byte(dt, sh) for dt in kv_dtypes}
                                           for sh in shapes},
            "shape": {"num_heads": first.num_heads, "num_kv_heads": first.num_kv_heads, "head_dim": first.head_dim,
                      "kv_dtype": ",".join(kv_dtypes), "page_tokens": PAGE_TOKENS},
            "shapes": [str(sh) for sh in shapes]}


def _kv_dtypes(text: str) -> str:
    import argparse

    if not text or any(d not in KV_DTYPES for d in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated KV types from {', '.join(KV_DTYPES)}")
    return text


def _shapes(text: str) -> tuple[Shape, ...]:
    import argparse

    try:
        return tuple(Shape.parse(t) for t in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; shapes look like 32/4x64 (query heads/KV heads x head_dim)") from None


def cmd_bench_kernels(args) -> int:
    contexts = tuple(int(c) for c in args.contexts.split(","))
    threads = tuple(int(t) for t in args.threads.split(","))
    kv_dtypes = tuple(args.kv_dtype.split(","))
    res = run_kernel_bench(contexts, threads, kernel=args.kernel, repeats=args.repeats,
                           ceilings=not args.no_ceilings, kv_dtypes=kv_dtypes, shapes=args.shapes)
    print(f"decode attention, 1 query token; shapes (query heads/KV heads x head_dim): {', '.join(res['shapes'])}; "
          f"{', '.join(kv_dtypes)} KV, pages of {PAGE_TOKENS} tokens; median of {args.repeats}; kernels "
          f"available: {', '.join(available_kernels())}")
    for n, bw in res["bandwidth"].items():
        print(f"read bandwidth, {n} thread{'s' if n > 1 else ''}: {bw:.1f} GB/s (median of the probes, one "
              f"before every kernel repeat)")
    for n, g in res["fma_gflops"].items():
        for sh, by_dt in res["flops_per_kv_byte_by_shape"].items():
            caps = ", ".join(f"{g / fpb:.1f} GB/s at {fpb:.1f} flops per {dt} KV byte" for dt, fpb in by_dt.items())
            print(f"f32 FMA peak ({res['kernel']}), {n} thread{'s' if n > 1 else ''}: {g:.0f} GFLOP/s; for {sh} "
                  f"arithmetic alone caps decode attention at {caps} (before widening to f32)")
    print(f"{'kernel':<8} {'thr':>3} {'shape':>8} {'context':>8} {'layout':<10} {'kv':>3} {'heads':>5} {'spans':>6} "
          f"{'us/layer':>9} {'GB/s':>7} {'bw':>6} {'of bw':>6}")
    for r in res["rows"]:
        print(f"{r['kernel']:<8} {r['threads']:>3} {r['shape']:>8} {r['context']:>8} {r['layout']:<10} "
              f"{r['kv_dtype']:>3} {r['query_heads']:>5} {r['spans']:>6} {r['us_per_layer']:>9.1f} "
              f"{r['gb_per_s']:>7.1f} {r['bandwidth_gb_per_s']:>6.1f} {r['share_of_bandwidth']:>6.0%}")
    print("ceilings: 'cached' = the same kernel on a context that stays in the caches (compute rate, "
          "no DRAM); '1 head/kv' = the longest context from DRAM with one query head per KV head (a "
          "group's worth less arithmetic; GQA shapes only). GB/s count the bytes of the row's KV type: "
          "f16 values, or q8 int8 values and their f32 scales")
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    k = bs.add_parser("kernels", help="decode attention GB/s beside the machine's read bandwidth")
    k.add_argument("--contexts", default="1024,8192,32768")
    k.add_argument("--threads", default="1,2")
    k.add_argument("--kernel", help="force a kernel ISA (default: the dispatched one)")
    k.add_argument("-r", "--repeats", type=int, default=7)
    k.add_argument("--no-ceilings", action="store_true", help="skip the cached and 1 head/kv ceiling rows")
    k.add_argument("--kv-dtype", default="f16,q8", type=_kv_dtypes,
                   help="KV element types, comma-separated (default f16,q8: the two side by side)")
    k.add_argument("--shapes", default=f"{GQA},{MHA}", type=_shapes,
                   help=f"attention shapes, comma-separated, as query heads/KV heads x head_dim (default {GQA},{MHA}: "
                        "8 query heads per KV head at head_dim 64, and MHA at head_dim 48)")
    k.add_argument("--json")
    k.set_defaults(func=cmd_bench_kernels)
