"""``dualpath bench cache``: what the dual-path KV cache costs in time and in memory.

Two measurements, both on the ``KVCacheManager`` facade alone (no model runs):

* **Append throughput**: allocations/s and appended tokens/s, decode-style (one
  token per ``allocate`` + ``commit``) and prefill-style (512 tokens per call), per
  path mode; median of several repeats, timed with ``time.perf_counter``.
* **Mixed workload**: 32 requests of 64..16384 tokens (log-uniform, seeded), half of
  them opening with the same 1024-token system prompt, all live at once at full
  length. Each request arrives in turn: ``start()``, its prompt in 512-token prefill
  chunks (``allocate`` + ``commit``), then 32 decode steps over all requests (one
  token each). Every ``allocate`` leaves the path to the cache's path policy, as the
  runner does: the request's prefill path within the prompt, then routing (and, in
  dual mode, migration of a long scattered sequence) per decode step.
  The KV bytes held are set against the bytes the tokens need, for the dual,
  random-only and sequential-only modes and for a contiguous max-length
  preallocation (computed).

Definitions (all from the facade's page tables, not from ``stats()``, which is
only cross-checked; see ``_stats_discrepancies``):

* *needed*: distinct tokens of the workload x bytes per token. A shared system
  prompt needs storing once, so it counts once; the same in every mode.
* *held*: pages referenced by live sequences (extent pages handed out and random
  pages in use; not free or evictable cached pages) x page bytes.
* *reserved*: whole blocks owned by extents (also their pages not handed out yet,
  which only the owner can use) plus random pages in use.
* *waste*: held / needed - 1 (and reserved / needed - 1).

The bookkeeping does not depend on the layer count, so the manager is built with
one layer and every byte figure is scaled by the model's layer count.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ..cache.manager import KVCacheManager, NoRoom
from ..config import KVCacheConfig
from .common import random_ids, write_json

log = logging.getLogger(__name__)

MODES = ("dual", "random", "sequential")
CONTIGUOUS = "contiguous"
MiB = 1 << 20


@dataclass(frozen=True)
class KVShape:
    """The model whose KV cache is measured."""

    name: str = "TinyLlama-1.1B"
    num_layers: int = 22
    """Layers whose KV is stored; bytes are scaled by this (the manager gets one layer)."""
    num_kv_heads: int = 4
    head_dim: int = 64
    kv_dtype: str = "f16"


@dataclass(frozen=True)
class MixedWorkload:
    """Requests that live in the cache at once."""

    num_requests: int = 32
    num_shared: int = 16
    """Requests that open with the same system prompt (chosen at random)."""
    min_tokens: int = 64
    max_tokens: int = 16384
    """Full length (prompt + decode) of a request, log-uniform in [min_tokens, max_tokens]."""
    system_prompt_tokens: int = 1024
    min_user_tokens: int = 64
    """A sharing request has at least this many own prompt tokens after the system
    prompt, so its length is drawn from [system + min_user + decode, max_tokens]."""
    prefill_chunk_tokens: int = 512
    decode_tokens: int = 32
    """Tokens appended one by one to every request after all prompts are in."""
    vocab_size: int = 32000
    seed: int = 0


@dataclass(frozen=True)
class ThroughputWorkload:
    """Sequences grown round-robin while the appends are timed."""

    num_seqs: int = 4
    decode_prompt_tokens: int = 512
    """Prompt written (untimed) before the timed decode appends, so the router sees a
    sequence with a history, as in real decoding."""
    decode_tokens: int = 2048
    """Timed 1-token appends per sequence."""
    prefill_tokens: int = 8192
    """Timed prompt tokens per sequence, in prefill_chunk_tokens chunks."""
    prefill_chunk_tokens: int = 512
    repeats: int = 5
    vocab_size: int = 32000
    seed: int = 1


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    decode_ids: list[int]
    shared: bool

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.decode_ids)


def make_requests(w: MixedWorkload) -> tuple[list[Request], list[int]]:
    """The workload's requests (in arrival order) and the shared system prompt."""
    if not 0 <= w.num_shared <= w.num_requests:
        raise ValueError(f"num_shared={w.num_shared} must be between 0 and num_requests={w.num_requests}")
    shared_min = w.system_prompt_tokens + w.min_user_tokens + w.decode_tokens
    if w.num_shared and shared_min > w.max_tokens:
        raise ValueError(f"max_tokens={w.max_tokens} cannot hold a {w.system_prompt_tokens}-token system "
                         f"prompt, {w.min_user_tokens} own tokens and {w.decode_tokens} decoded tokens")
    if w.min_tokens <= w.decode_tokens:
        raise ValueError(f"min_tokens={w.min_tokens} must exceed decode_tokens={w.decode_tokens}")
    rng = np.random.default_rng(w.seed)
    system = random_ids(rng, w.vocab_size, w.system_prompt_tokens)
    shared = np.zeros(w.num_requests, bool)
    shared[rng.permutation(w.num_requests)[: w.num_shared]] = True
    requests = []
    for is_shared in shared:
        lo = shared_min if is_shared else w.min_tokens
        n = int(round(float(np.exp(rng.uniform(np.log(lo), np.log(w.max_tokens))))))
        n = min(max(n, lo), w.max_tokens)
        head = system if is_shared else []
        own = random_ids(rng, w.vocab_size, n - w.decode_tokens - len(head))
        requests.append(Request(head + own, random_ids(rng, w.vocab_size, w.decode_tokens), bool(is_shared)))
    return requests, system


def distinct_tokens(requests: list[Request], system_prompt_tokens: int) -> int:
    """Tokens the workload needs stored: a shared system prompt once."""
    total = sum(r.num_tokens for r in requests)
    num_shared = sum(r.shared for r in requests)
    return total - max(num_shared - 1, 0) * system_prompt_tokens


def _manager(mode: str, shape: KVShape, num_blocks: int, base: KVCacheConfig) -> KVCacheManager:
    cfg = dataclasses.replace(base, path_mode=mode, kv_dtype=shape.kv_dtype)
    return KVCacheManager(cfg, num_layers=1, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                          num_blocks=num_blocks)


def kv_geometry(shape: KVShape, base: KVCacheConfig) -> dict:
    """Per-layer bytes of one token, one page and one block, from a one-block manager."""
    m = _manager("dual", shape, 1, base)
    token_bytes = m.arena.tile_bytes(1)
    return {"token_bytes_per_layer": token_bytes, "page_bytes_per_layer": m.page_bytes,
            "block_bytes_per_layer": base.block_bytes, "page_tokens": m.page_tokens,
            "pages_per_block": m.pages_per_block, "tokens_per_block": m.pages_per_block * m.page_tokens}


def blocks_for(requests: list[Request], geo: dict, headroom: float = 1.25) -> int:
    """Arena blocks for the workload in the hungriest mode, with headroom.

    Sequential-only is the worst case: every request rounds up to whole blocks, and
    one more block when its decode tokens spill into a new extent; random pages
    round up per page only. Shared prefixes are not subtracted."""
    per_block = geo["tokens_per_block"]
    worst = sum(-(-r.num_tokens // per_block) + 1 for r in requests)
    return int(worst * headroom) + 4


def _ok(result, what: str):
    if isinstance(result, NoRoom):
        raise RuntimeError(f"bench cache: the arena is too small ({what}: {result.needed_pages} pages "
                           f"needed, {result.free_pages} free); raise the block count")
    return result


# ---------------------------------------------------------------------------
# Measurements from the facade's page tables
# ---------------------------------------------------------------------------

def held_pages(m: KVCacheManager) -> dict:
    """Pages and blocks held by live sequences, from their page tables.

    pages: distinct pages referenced (extent pages handed out + random pages in use);
    extent_blocks: blocks owned as extents; random_pages: held pages outside them;
    stored_tokens: tokens physically stored (a page shared by several sequences once).
    """
    P = m.page_tokens
    fill: dict[int, int] = {}
    extent_blocks: set[int] = set()
    for s in m.seqs.values():
        extent_blocks.update(s.blocks)
        for i, p in enumerate(s.pages):
            fill[p] = max(fill.get(p, 0), min(P, s.num_tokens - i * P))
    random_pages = sum(1 for p in fill if p // m.pages_per_block not in extent_blocks)
    return {"pages": len(fill), "extent_blocks": len(extent_blocks), "random_pages": random_pages,
            "stored_tokens": sum(fill.values())}


def _stats_discrepancies(m: KVCacheManager, held: dict, needed_tokens: int, token_bytes: int) -> list[str]:
    """Where ``stats()`` disagrees with the page tables (one layer, so no scaling)."""
    st = m.stats()
    pb = m.page_bytes
    out = []
    used = st.bytes_used_sequential + st.bytes_used_random
    if used != held["pages"] * pb:
        out.append(f"stats bytes_used_sequential+bytes_used_random={used} but live page tables hold "
                   f"{held['pages']} pages = {held['pages'] * pb} bytes")
    # stats() counts the tokens physically stored (a shared page once, but each private
    # copy of a prefix separately) and fragmentation against every reserved page.
    if st.token_bytes_needed != held["stored_tokens"] * token_bytes:
        out.append(f"stats token_bytes_needed={st.token_bytes_needed} but the page tables store "
                   f"{held['stored_tokens']:,} tokens = {held['stored_tokens'] * token_bytes} bytes")
    unused_extent = held["extent_blocks"] * m.pages_per_block - (held["pages"] - held["random_pages"])
    reserved_slots = (held["pages"] + unused_extent) * m.page_tokens
    frag = 1.0 - held["stored_tokens"] / reserved_slots if reserved_slots else 0.0
    if abs(st.fragmentation - frag) > 1e-9:
        out.append(f"stats fragmentation={st.fragmentation:.6f} but 1 - stored tokens / reserved page "
                   f"slots = {frag:.6f}")
    accounted = st.bytes_free + st.bytes_used_sequential + st.bytes_used_random + st.bytes_cached \
        + unused_extent * pb
    if accounted != st.bytes_total:
        out.append(f"stats bytes free+used+cached+unused extent pages = {accounted} != bytes_total="
                   f"{st.bytes_total}")
    return out


# ---------------------------------------------------------------------------
# Mixed workload
# ---------------------------------------------------------------------------

def run_mixed(mode: str, requests: list[Request], w: MixedWorkload, shape: KVShape, base: KVCacheConfig,
              num_blocks: int, geo: dict,
              on_full: Callable[[KVCacheManager], None] | None = None) -> dict:
    """All requests live at once, then all freed; one row of measurements.
    ``on_full(manager)`` is called while every request is live (for tests)."""
    t0 = time.perf_counter()
    m = _manager(mode, shape, num_blocks, base)
    scale = shape.num_layers
    peak_blocks = 0
    prefill_paths: Counter[str] = Counter()
    decode_paths: Counter[str] = Counter()
    chunk = w.prefill_chunk_tokens
    # The cache's own path policy decides every path, as for the runner: within the
    # prompt the request's prefill path, then per decode step (migrating a long
    # scattered sequence into an extent first, in dual mode).
    for sid, r in enumerate(requests):
        cached = m.start(sid, r.prompt_ids)
        prefill_paths[m.path_of(sid).name] += 1
        for i in range(cached, len(r.prompt_ids), chunk):
            _ok(m.allocate(sid, r.prompt_ids[i:i + chunk]), f"prefill of request {sid}")
            m.commit(sid)
            peak_blocks = max(peak_blocks, num_blocks - len(m.free_blocks))
    for step in range(w.decode_tokens):
        for sid, r in enumerate(requests):
            a = _ok(m.allocate(sid, r.decode_ids[step:step + 1]), f"decode of request {sid}")
            decode_paths[a.path.name] += 1
            m.commit(sid)
            peak_blocks = max(peak_blocks, num_blocks - len(m.free_blocks))
    seconds = time.perf_counter() - t0

    needed = distinct_tokens(requests, w.system_prompt_tokens)
    held = held_pages(m)
    tb, pb, bb = geo["token_bytes_per_layer"], m.page_bytes, base.block_bytes
    held_bytes = held["pages"] * pb * scale
    reserved_bytes = (held["extent_blocks"] * bb + held["random_pages"] * pb) * scale
    needed_bytes = needed * tb * scale
    num_spans = [len(m.spans(sid)) for sid in range(len(requests))]
    # The system prompt's pages: the set of pages each sharing request reads it from.
    sys_pages = {tuple(m.seqs[sid].pages[: w.system_prompt_tokens // m.page_tokens])
                 for sid, r in enumerate(requests) if r.shared}
    discrepancies = _stats_discrepancies(m, held, needed, tb)
    row = {
        "kind": "mixed", "mode": mode, "num_requests": len(requests), "num_blocks": num_blocks,
        "tokens_total": sum(r.num_tokens for r in requests), "tokens_needed": needed,
        "tokens_stored": held["stored_tokens"], "pages_held": held["pages"],
        "extent_blocks": held["extent_blocks"], "random_pages": held["random_pages"],
        "needed_bytes": needed_bytes, "held_bytes": held_bytes, "reserved_bytes": reserved_bytes,
        "waste": held_bytes / needed_bytes - 1.0, "waste_reserved": reserved_bytes / needed_bytes - 1.0,
        "peak_blocks": peak_blocks, "peak_bytes": peak_blocks * bb * scale,
        "prefix_queries": m.prefix_queries, "prefix_hit_pages": m.prefix_hit_pages,
        "system_prompt_copies": len(sys_pages),
        "spans_median": statistics.median(num_spans), "spans_max": max(num_spans),
        "prefill_paths": dict(prefill_paths), "decode_paths": dict(decode_paths),
        "migrations": m.migrations, "stats_discrepancies": discrepancies, "seconds": seconds,
    }
    if on_full is not None:
        on_full(m)
    for sid in range(len(requests)):
        m.free(sid)
    m.evict_all()
    row["leaked_blocks"] = num_blocks - len(m.free_blocks)
    return row


def contiguous_row(requests: list[Request], w: MixedWorkload, shape: KVShape, geo: dict) -> dict:
    """Every request reserves max_tokens up front, nothing shared (computed)."""
    tb, scale = geo["token_bytes_per_layer"], shape.num_layers
    needed = distinct_tokens(requests, w.system_prompt_tokens)
    held = len(requests) * w.max_tokens * tb * scale
    return {"kind": "mixed", "mode": CONTIGUOUS, "num_requests": len(requests),
            "tokens_total": sum(r.num_tokens for r in requests), "tokens_needed": needed,
            "tokens_stored": sum(r.num_tokens for r in requests),
            "needed_bytes": needed * tb * scale, "held_bytes": held, "reserved_bytes": held,
            "waste": held / (needed * tb * scale) - 1.0, "waste_reserved": held / (needed * tb * scale) - 1.0,
            "peak_bytes": held, "prefix_hit_pages": 0, "system_prompt_copies": sum(r.shared for r in requests),
            "spans_median": 1, "spans_max": 1, "prefill_paths": {}, "decode_paths": {}}


# ---------------------------------------------------------------------------
# Throughput
# ---------------------------------------------------------------------------

def _time_decode(mode: str, t: ThroughputWorkload, shape: KVShape, base: KVCacheConfig, num_blocks: int,
                 prompts: list[list[int]], decode: list[list[list[int]]]) -> float:
    m = _manager(mode, shape, num_blocks, base)
    for sid, p in enumerate(prompts):
        m.start(sid, p)
        _ok(m.allocate(sid, p), "decode warm-up prompt")
        m.commit(sid)
    allocate, commit = m.allocate, m.commit
    t0 = time.perf_counter()
    for step in range(t.decode_tokens):
        for sid in range(t.num_seqs):
            if isinstance(allocate(sid, decode[sid][step]), NoRoom):
                raise RuntimeError("bench cache: decode throughput ran out of blocks")
            commit(sid)
    return time.perf_counter() - t0


def _time_prefill(mode: str, t: ThroughputWorkload, shape: KVShape, base: KVCacheConfig, num_blocks: int,
                  prompts: list[list[int]]) -> float:
    m = _manager(mode, shape, num_blocks, base)
    for sid, p in enumerate(prompts):
        m.start(sid, p)
    chunks = [[p[i:i + t.prefill_chunk_tokens] for i in range(0, len(p), t.prefill_chunk_tokens)]
              for p in prompts]
    allocate, commit = m.allocate, m.commit
    t0 = time.perf_counter()
    for i in range(len(chunks[0])):
        for sid in range(t.num_seqs):
            if isinstance(allocate(sid, chunks[sid][i]), NoRoom):
                raise RuntimeError("bench cache: prefill throughput ran out of blocks")
            commit(sid)
    return time.perf_counter() - t0


def run_throughput(t: ThroughputWorkload, shape: KVShape, base: KVCacheConfig, geo: dict,
                   modes=MODES) -> list[dict]:
    """Appends per second, decode-style and prefill-style, per mode (allocate + commit timed)."""
    rng = np.random.default_rng(t.seed)
    dec_prompts = [random_ids(rng, t.vocab_size, t.decode_prompt_tokens) for _ in range(t.num_seqs)]
    decode = [[[x] for x in random_ids(rng, t.vocab_size, t.decode_tokens)] for _ in range(t.num_seqs)]
    pre_prompts = [random_ids(rng, t.vocab_size, t.prefill_tokens) for _ in range(t.num_seqs)]
    per_block = geo["tokens_per_block"]
    longest = max(t.decode_prompt_tokens + t.decode_tokens, t.prefill_tokens)
    num_blocks = int(t.num_seqs * (-(-longest // per_block) + 2) * 1.25) + 4
    rows = []
    for mode in modes:
        for style in ("decode", "prefill"):
            if style == "decode":
                calls, tokens = t.num_seqs * t.decode_tokens, t.num_seqs * t.decode_tokens
                times = [_time_decode(mode, t, shape, base, num_blocks, dec_prompts, decode)
                         for _ in range(t.repeats)]
            else:
                num_chunks = -(-t.prefill_tokens // t.prefill_chunk_tokens)
                calls, tokens = t.num_seqs * num_chunks, t.num_seqs * t.prefill_tokens
                times = [_time_prefill(mode, t, shape, base, num_blocks, pre_prompts) for _ in range(t.repeats)]
            sec = statistics.median(times)
            rows.append({"kind": "throughput", "mode": mode, "style": style,
                         "tokens_per_call": tokens // calls, "calls": calls, "tokens": tokens,
                         "repeats": t.repeats, "seconds_median": sec, "allocations_per_s": calls / sec,
                         "tokens_per_s": tokens / sec, "us_per_call": sec / calls * 1e6})
    return rows


# ---------------------------------------------------------------------------
# The whole benchmark
# ---------------------------------------------------------------------------

def run_cache_bench(workload: MixedWorkload = MixedWorkload(), throughput: ThroughputWorkload | None = None,
                    shape: KVShape = KVShape(), base: KVCacheConfig = KVCacheConfig(),
                    modes=MODES, on_full: Callable[[KVCacheManager], None] | None = None) -> dict:
    """Run both measurements. ``throughput=None`` skips the timed part; ``on_full`` as in run_mixed."""
    geo = kv_geometry(shape, base)
    requests, _ = make_requests(workload)
    num_blocks = blocks_for(requests, geo)
    rows = [run_mixed(mode, requests, workload, shape, base, num_blocks, geo, on_full) for mode in modes]
    rows.append(contiguous_row(requests, workload, shape, geo))
    for r in rows:
        for d in r.get("stats_discrepancies", []):
            log.info("bench cache (%s): %s", r["mode"], d)
    tp = run_throughput(throughput, shape, base, geo, modes) if throughput else []
    return {"shape": asdict(shape), "workload": asdict(workload),
            "throughput_workload": asdict(throughput) if throughput else None, "geometry": geo,
            "num_blocks": num_blocks, "arena_bytes_per_layer": num_blocks * base.block_bytes,
            "lengths": [r.num_tokens for r in requests], "shared": [r.shared for r in requests],
            "mixed": rows, "throughput": tp}


def _mib(n: float) -> str:
    return f"{n / MiB:,.1f}"


def format_report(res: dict) -> str:
    s, w, g = res["shape"], res["workload"], res["geometry"]
    per_token = g["token_bytes_per_layer"] * s["num_layers"]
    lines = [
        f"KV of {s['name']}: {s['num_layers']} layers x {s['num_kv_heads']} KV heads x head_dim {s['head_dim']}, "
        f"{s['kv_dtype']} = {g['token_bytes_per_layer']} B/token/layer, {per_token // 1024} KiB/token",
        f"The manager is built with num_layers=1 (its bookkeeping does not depend on the layer count); "
        f"every byte figure below is x{s['num_layers']}.",
        f"block_bytes {g['block_bytes_per_layer']} B = {g['tokens_per_block']} tokens/layer, page_tokens "
        f"{g['page_tokens']} ({g['pages_per_block']} pages/block); arena {res['num_blocks']} blocks "
        f"= {_mib(res['arena_bytes_per_layer'])} MiB at one layer (lazily committed)",
    ]
    if res["throughput"]:
        t = res["throughput_workload"]
        lines += ["", f"Append throughput: allocate + commit per call, {t['num_seqs']} sequences grown round-robin, "
                      f"median of {t['repeats']} runs (decode after a {t['decode_prompt_tokens']}-token prompt: "
                      f"{t['decode_tokens']} calls/seq; prefill: {t['prefill_tokens']} tokens/seq)",
                  f"{'mode':<11} {'style':<8} {'tok/call':>8} {'allocs/s':>10} {'tokens/s':>11} {'us/call':>9}"]
        for r in res["throughput"]:
            lines.append(f"{r['mode']:<11} {r['style']:<8} {r['tokens_per_call']:>8} {r['allocations_per_s']:>10,.0f} "
                         f"{r['tokens_per_s']:>11,.0f} {r['us_per_call']:>9.1f}")
    rows = res["mixed"]
    shared = sum(res["shared"])
    needed = rows[0]
    lines += ["", f"Mixed workload: {w['num_requests']} requests, {w['min_tokens']}..{w['max_tokens']} tokens "
                  f"log-uniform (seed {w['seed']}), {shared} open with the same {w['system_prompt_tokens']}-token "
                  f"system prompt; prompts in {w['prefill_chunk_tokens']}-token prefill chunks, then "
                  f"{w['decode_tokens']} decode steps; all live at once",
              f"tokens: {needed['tokens_total']:,} in requests, {needed['tokens_needed']:,} distinct "
              f"(system prompt once) -> needed {_mib(needed['needed_bytes'])} MiB",
              "held = pages in use x page bytes; reserved = extent blocks whole + random pages in use; "
              "waste = bytes / needed - 1",
              f"{'mode':<11} {'held MiB':>9} {'waste':>7} {'reserved MiB':>12} {'waste':>7} {'peak MiB':>9} "
              f"{'prefix hits':>11} {'sys copies':>10} {'spans med/max':>13}  {'prefill paths':<24} "
              f"{'decode paths':<26} {'leak':>4}"]
    for r in rows:
        pre = " ".join(f"{k}={v}" for k, v in sorted(r["prefill_paths"].items())) or "-"
        dec = " ".join(f"{k}={v}" for k, v in sorted(r["decode_paths"].items())) or "-"
        leak = str(r["leaked_blocks"]) if "leaked_blocks" in r else "-"
        spans = f"{r['spans_median']:g}/{r['spans_max']}"
        lines.append(f"{r['mode']:<11} {_mib(r['held_bytes']):>9} {r['waste']:>7.1%} {_mib(r['reserved_bytes']):>12} "
                     f"{r['waste_reserved']:>7.1%} {_mib(r['peak_bytes']):>9} {r['prefix_hit_pages']:>11} "
                     f"{r['system_prompt_copies']:>10} {spans:>13}  {pre:<24} {dec:<26} {leak:>4}")
    lines.append("peak = most arena blocks in use at once (any page live or cached); sys copies = distinct "
                 "page runs the sharing requests read the system prompt from; leak = blocks not free after "
                 "freeing every request and evict_all()")
    notes = [(r["mode"], d) for r in rows for d in r.get("stats_discrepancies", [])]
    if notes:
        lines += ["", "KVCacheManager.stats() disagrees with the page tables (the figures above use the page tables):"]
        lines += [f"  {mode}: {d}" for mode, d in notes]
    return "\n".join(lines)


def cmd_bench_cache(args) -> int:
    t0 = time.perf_counter()
    base = KVCacheConfig(block_bytes=args.block_bytes, page_tokens=args.page_tokens)
    workload = MixedWorkload(num_requests=args.requests, num_shared=args.requests // 2, seed=args.seed)
    throughput = None if args.no_throughput else ThroughputWorkload(repeats=args.repeats)
    res = run_cache_bench(workload, throughput, KVShape(kv_dtype=args.kv_dtype), base)
    res["seconds"] = time.perf_counter() - t0
    print(format_report(res))
    print(f"\n{res['seconds']:.1f} s")
    write_json(args.json, res["throughput"] + res["mixed"])
    return 0


def add_parser(bs) -> None:
    c = bs.add_parser("cache", help="KV cache: append throughput, and bytes held against bytes needed for a "
                                    "mixed workload, per path mode")
    c.add_argument("--requests", type=int, default=32, help="requests in the mixed workload (half share a prompt)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--block-bytes", "--block-size", type=int, dest="block_bytes", default=KVCacheConfig.block_bytes,
                   help="bytes per arena block (--block-size is its old name)")
    c.add_argument("--page-tokens", type=int, default=KVCacheConfig.page_tokens)
    c.add_argument("--kv-dtype", default="f16", choices=["f16", "f32", "q8"],
                   help="KV element type (bytes per token: q8 is int8 + an f32 scale per token and KV head)")
    c.add_argument("-r", "--repeats", type=int, default=5, help="timed runs per throughput figure (median)")
    c.add_argument("--no-throughput", action="store_true", help="skip the timed part")
    c.add_argument("--json", help="also write the rows as JSON here")
    c.set_defaults(func=cmd_bench_cache)
