"""ONNX Runtime sessions for the graph parts, and the per-step runner.

This module is the only place that imports onnxruntime.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort

from ..cache.manager import KVCacheManager, NoRoom
from ..cache.policy import PathPolicy
from ..config import DualPathConfig, PowerConfig
from ..errors import ConfigError, DualPathError, ModelLoadError
from ..kernels import ArenaStepper, ThreadPool, embed as _embed, kv_tile_bytes
from ..models.quants import gather_rows
from ..models.spec import ModelSpec
from ..models.store import Progress, temporary_entry
from ..graph.parts import PartFile, graph_parts
from ..scheduler.batch import SeqStep
from ..versions import declared_minimums, parse_version

log = logging.getLogger(__name__)


_global_pool_threads: int | None = None
_global_pool_workers: list[int] = []  # Linux thread ids of the global pool's workers
_env_allocator: bool | None = None


@functools.cache
def _can_unidle() -> bool:
    """Whether ORT's workers can be put under SCHED_IDLE and back (``ThreadPool.can_unidle``)."""
    ok = ThreadPool.can_unidle()
    if not ok:
        log.info("this process may not take a thread out of SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE "
                 "below 20): ONNX Runtime's spinning workers keep their cores, decode attention runs "
                 "on the calling thread")
    return ok


def _use_env_allocator() -> bool:
    """One CPU arena for every session of the process. With an arena per session, each
    of the L + 1 parts (times the session sets) keeps its own peak of activation
    buffers: on TinyLlama-1.1B that was most of the memory above the weights."""
    global _env_allocator
    if _env_allocator is None:  # tried once per process
        try:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
            _env_allocator = True
        except Exception as e:  # e.g. already registered by the application
            log.warning("cannot register a shared ONNX Runtime allocator (%s); one arena per session", e)
            _env_allocator = False
    return _env_allocator


ORT_VERSION = parse_version(ort.__version__)
NBITS8_SINCE = (1, 22)
"""ONNX Runtime's CPU MatMulNBits takes 8-bit weights from 1.22 on ("Only 4b quantization
is supported" before)."""


def _nbits8(spec: ModelSpec, ort_version: tuple[int, ...]) -> bool:
    """Whether ``spec``'s graphs for that ONNX Runtime use 8-bit MatMulNBits (the graphs of a
    model without 8-bit matrices are the same either way)."""
    return ort_version >= NBITS8_SINCE or not any(w.matmul_bits == 8 for w in spec.weights.values())


def graphs_for_runtime(spec: ModelSpec, accuracy_level: int, context_tokens: int, onnxruntime_version: str):
    """Build (or find) in ``spec``'s cache entry the graphs another ONNX Runtime version
    loads: a bundle made on a desktop for a phone whose ONNX Runtime is older than 1.22
    and that cannot build graphs itself (no onnx) needs the 8-bit fallback's graphs."""
    return graph_parts(spec, accuracy_level, context_tokens, _nbits8(spec, parse_version(onnxruntime_version)))


def _prefix_salt(spec: ModelSpec) -> bytes:
    """What the prefix hashes of this model's pages are salted with: its converted-model
    cache key (the file's identity, not its path: the same file found through another path
    still matches the pages it wrote to disk)."""
    return (spec.entry.key if spec.entry is not None else spec.path).encode()


def nbits8_graphs(spec: ModelSpec) -> bool:
    """Whether the graphs may use 8-bit MatMulNBits; says once when a model loses it."""
    if _nbits8(spec, ORT_VERSION):
        return True
    log.warning("ONNX Runtime %s has no 8-bit MatMulNBits (%s and newer have it): this model's 8-bit "
                "matrices run as f32, with 4x their memory", ort.__version__, ".".join(map(str, NBITS8_SINCE)))
    return False


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # no procfs: the workers stay unknown (and never yield)
        return set()


def _use_global_pool(num_threads: int) -> bool:
    """Share one ONNX Runtime thread pool between all parts of a model (``create_sessions``
    says when).

    The global pool is created once per process, and once it exists ONNX Runtime
    refuses sessions with pools of their own: a later model that asks for another
    thread count shares it anyway (with a log line saying so).
    """
    global _global_pool_threads
    if _global_pool_threads is None:
        try:
            from onnxruntime.capi import _pybind_state

            if not hasattr(_pybind_state, "set_global_thread_pool_sizes"):  # before ONNX Runtime 1.23
                log.warning("ONNX Runtime %s has no shared thread pool (1.23 and newer have one): each graph "
                            "part runs a pool of its own, which costs decode speed at short context",
                            ort.__version__)
                _global_pool_threads = 0
                return False
            before = _thread_ids()
            _pybind_state.set_global_thread_pool_sizes(num_threads, 1)  # starts its workers
            _global_pool_workers[:] = sorted(_thread_ids() - before)
            _global_pool_threads = num_threads
        except Exception as e:  # an environment already exists (created outside DualPath)
            log.warning("cannot create ONNX Runtime's global thread pool (%s); using per-session pools", e)
            _global_pool_threads = 0
    if not _global_pool_threads:
        return False
    if _global_pool_threads != num_threads:
        log.warning("ONNX Runtime's global thread pool has %d threads; this model asked for %d and "
                    "shares it (ORT fixes the pool size once per process)", _global_pool_threads, num_threads)
    return True


class SessionSet(list):
    """The InferenceSessions of one set (one per graph part), and the OrtValues handed to
    them with ``add_initializer``: ONNX Runtime reads those in place and requires them
    to outlive the sessions, so they live exactly as long as this list."""

    def __init__(self, sessions: list[ort.InferenceSession], initializers: list[ort.OrtValue],
                 idle_between_runs: bool = True, spinning_workers: list[int] | None = None):
        super().__init__(sessions)
        self.initializers = initializers
        self.idle_between_runs = idle_between_runs
        """ONNX Runtime's workers leave the cores when a part's Run returns (they do not
        spin into our attention between the parts)."""
        self.spinning_workers = spinning_workers or []
        """Otherwise, where known, the Linux thread ids of those workers (the global
        pool's): they spin on for tens of milliseconds after a Run, and our pool's jobs
        can make them yield their cores (``ThreadPool.set_yielders``)."""


def create_sessions(parts: list[PartFile], num_threads: int, spinning: bool = True,
                    affinities: str | None = None, per_session_pools: bool = False,
                    progress: Progress | None = None, entry=None, prepack_float: bool = False,
                    ort_pools: str = "shared") -> SessionSet:
    """One InferenceSession per part (graph files of a converted-model cache entry).

    Every weight is handed over as an OrtValue over the entry's memory-mapped arrays
    (``add_initializer``). Parts with MatMulNBits need ONNX Runtime's prepacked layout
    to be fast (measured ~100x): each session packs its own copy. Float weights are
    packed too with ``prepack_float`` (one session set: the packed copy replaces the
    mapped pages, so it costs no memory; a stories15M-shape F32 decode step went from
    0.28 to 0.21 ms per layer part), else read in place, once in memory whatever the
    number of session sets (a governor's per-phase sets: packing would keep a copy per
    set). With the ``entry`` the arrays live in, a part's arrays are verified (checksums)
    just before its session reads them, and the mapped pages a session packed from are
    dropped once it exists (``Entry.drop_pages``): the load's peak memory is the packed
    copies plus one part's pages per thread.

    Thread pools (``ort_pools``, ``runtime.ort_thread_pools``): ``shared``, the parts share
    ORT's global pool, whose workers stay hot from one part's Run to the next (and spin
    on for 38-40 ms after it, into our attention: the set names them in
    ``spinning_workers``, for our pool to make them yield); ``per_part`` with ``spinning``, each part has a
    pool of its own whose workers spin while its Run lasts and stop the moment it
    returns (``session.force_spinning_stop``), so that between the parts every core is
    free for our attention, but every Run starts with its worker asleep. Measured (2
    threads, fresh processes): stories15M shape F32, 16k prompt, prefill 1.4-1.5k ->
    2.1-2.2k tokens/s with ``per_part``; TinyLlama shape Q4_0 at 512, decode 40.2 ->
    34.4 tokens/s (medians of 4; 23 Runs a token). Pinned sets always have their own
    pools (ORT pins per pool), with spinning off.

    ONNX Runtime releases the GIL while it creates a session and packs on one thread:
    the parts are created ``num_threads`` at a time.
    """
    if per_session_pools and _global_pool_threads:
        raise DualPathError("pinned sessions need per-session ONNX Runtime thread pools, but this process "
                            "already created ORT's global pool (an earlier unpinned LLM); create pinned "
                            "LLMs first or set power.pin_threads: false")
    # Once the global pool exists ORT refuses pools of a session's own: share it then.
    own_pools = per_session_pools or affinities is not None or (
        spinning and ort_pools == "per_part" and not _global_pool_threads)
    shared_pool = not own_pools and _use_global_pool(num_threads)
    env_allocator = _use_env_allocator()
    done = [0]
    lock = threading.Lock()

    def create(part: PartFile):
        so = ort.SessionOptions()
        if shared_pool:
            so.use_per_session_threads = False
        else:
            so.intra_op_num_threads = num_threads
            so.inter_op_num_threads = 1
        if env_allocator:
            so.add_session_config_entry("session.use_env_allocators", "1")
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        if spinning and not shared_pool:  # applies to a session's own pool only
            so.add_session_config_entry("session.force_spinning_stop", "1")
        pack = part.prepack or prepack_float
        so.add_session_config_entry("session.disable_prepacking", "0" if pack else "1")
        if affinities:
            so.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        if entry is not None:
            entry.verify(part.weights.values())
        values = []
        for name, array in part.weights.items():
            value = ort.OrtValue.ortvalue_from_numpy(array)
            values.append(value)
            so.add_initializer(name, value)
        try:
            session = ort.InferenceSession(part.path, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # e.g. a graph from a newer DualPath in a shared cache
            raise ModelLoadError(part.path, f"ONNX Runtime {ort.__version__} cannot load this graph "
                                 f"({str(e).strip().splitlines()[0][:300]}); DualPath needs onnxruntime "
                                 f"{declared_minimums().get('onnxruntime', '1.20.1')} or newer: "
                                 f"pip install -U onnxruntime") from e
        if entry is not None and pack:
            entry.drop_pages(part.weights.values())
        if progress is not None:
            with lock:
                done[0] += 1
                progress("sessions", done[0], len(parts))
        return session, values

    workers = max(1, min(num_threads, os.cpu_count() or 1, len(parts)))
    if workers == 1:
        made = [create(p) for p in parts]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="dualpath-load") as ex:
            made = list(ex.map(create, parts))
    # every add_initializer OrtValue is kept alive with the sessions
    spins = spinning and shared_pool
    return SessionSet([m[0] for m in made], [v for m in made for v in m[1]], idle_between_runs=not spins,
                      spinning_workers=list(_global_pool_workers) if spins else [])


class _Binding:
    """IOBindings of every part of one session set, over the runner's buffers.

    One per session set, reused by every step: a step of another size (T tokens, R
    rows wanted) rebinds only the names whose first dimension changed (ONNX Runtime
    replaces a name bound again on the same IOBinding), so steps that mix decodes and
    prefill chunks of any size create no binding objects. The buffers never move, so
    nothing else is ever rebound."""

    def __init__(self, runner: "ModelRunner", sessions):
        r = runner
        self.sessions = sessions
        self.bindings = [sess.io_binding() for sess in sessions]
        f32, i64 = np.float32, np.int64
        # (bind method, name, element type, shape after the first dimension, data pointer)
        self._per_token: list[tuple] = []  # names with T rows
        self._per_row: list[tuple] = []    # names with R rows (the lm_head part's)
        h_src, h_dst = r.h_a, r.h_b

        def bound(b, output, key, arr, elem=f32, lead=()):
            # (bind, name, element type, dims before T, dims after T, data pointer)
            return (b.bind_output if output else b.bind_input, key, elem, list(lead), list(arr.shape[1:]),
                    arr.ctypes.data)

        for i, b in enumerate(self.bindings):
            if i == r.num_layers:
                self._per_token += [bound(b, False, "h", h_src), bound(b, False, "attn", r.attn)]
                self._per_row += [bound(b, False, "rows", r.rows, i64), bound(b, True, "logits", r.logits),
                                  bound(b, True, "hidden", r.hidden)]
            else:
                # positions (1, T), q and k (1, T, ...): see builder.rope
                self._per_token += [bound(b, False, "h", h_src), bound(b, False, "positions", r.positions, i64, (1,))]
                if i > 0:
                    self._per_token += [bound(b, False, "attn", r.attn), bound(b, True, "h_out", h_dst)]
                    h_src, h_dst = h_dst, h_src
                self._per_token += [bound(b, True, "q", r.q, lead=(1,)), bound(b, True, "k", r.k, lead=(1,)),
                                    bound(b, True, "v", r.v)]
        self._ids, self._h0 = r.ids, r.h_a
        self.num_tokens = self.num_rows = 0  # nothing bound yet
        self.ids = self.h0 = None
        # (run, binding, layer) per part, built once: a step creates no objects per layer.
        L = r.num_layers
        self.plan = [(sess.run_with_iobinding, b, layer if layer < L else -1)
                     for layer, (sess, b) in enumerate(zip(sessions, self.bindings))]

    def resize(self, num_tokens: int, num_rows: int) -> None:
        """Bind for a step of ``num_tokens`` tokens and ``num_rows`` logits rows: only the
        names whose size changed since the last step."""
        if num_tokens != self.num_tokens:
            for bind, key, elem, lead, tail, ptr in self._per_token:
                bind(key, "cpu", 0, elem, lead + [num_tokens] + tail, ptr)
            self.num_tokens = num_tokens
            self.ids = self._ids[:num_tokens]  # (T,)
            self.h0 = self._h0[:num_tokens]    # (T, dim)
        if num_rows != self.num_rows:
            for bind, key, elem, lead, tail, ptr in self._per_row:
                bind(key, "cpu", 0, elem, lead + [num_rows] + tail, ptr)
            self.num_rows = num_rows


class CacheFullError(DualPathError, MemoryError):
    """The KV cache has no room for the step (single-sequence runner: it is sized
    for twice the context, so this means a misconfigured cache size)."""


class ModelRunner:
    """Runs steps over many sequences at once: our embedding kernel, the ONNX parts,
    and our attention over the dual-path KV cache between them. A step's rows are
    the sequences' new tokens back to back; one attention call per layer covers
    every sequence. Buffers are allocated once; a step allocates no Python objects
    per layer.

    The single-sequence API (``begin`` / ``forward``) is the same machinery with
    one sequence, for benchmarks and tests; the engine calls ``plan_step`` and then
    ``run`` with the scheduler's ``StepPlan``.
    """

    def __init__(self, spec: ModelSpec, *, num_threads: int, max_context_tokens: int,
                 max_step_tokens: int, cache_config: DualPathConfig | None = None,
                 accuracy_level: int = 4, spinning: bool = True, ort_pools: str = "shared",
                 kernel: str | None = None,
                 governor=None, max_num_seqs: int = 1, kv_cache_tokens: int = 0,
                 power_config: PowerConfig | None = None, progress: Progress | None = None):
        cfg = spec.config
        self.spec = spec
        self.num_layers = cfg.num_layers
        self.max_context_tokens = max_context_tokens
        self.max_step_tokens = T = max_step_tokens
        self.max_num_seqs = max(1, max_num_seqs)
        t0 = time.perf_counter()
        self.load_stats: dict = {}
        """Seconds of each stage of building this runner (``graphs``, ``sessions``)."""
        temporary = spec.entry is None
        if temporary:  # converted in memory: a private entry in a temporary folder, removed below
            spec = self.spec = temporary_entry(spec)
        try:
            parts = graph_parts(spec, accuracy_level, max_context_tokens, nbits8_graphs(spec))
            t1 = time.perf_counter()
            self.governor = governor
            if governor is None:
                self.sessions = create_sessions(parts, num_threads, spinning, progress=progress, entry=spec.entry,
                                                prepack_float=True, ort_pools=ort_pools)
                self.session_sets = {}
            else:
                # One session set per distinct (cores, threads) of every reachable profile:
                # ORT pins its workers per session. All sets share the float weights. Spinning
                # is off in these per-session pools whatever the profile says: each of the
                # L + 1 parts has its own pool, and idle pools spinning against the active
                # one halved decode speed (measured: 169 vs 340 tok/s, stories15M, 2 cores).
                self.session_sets, ort_tids = {}, {}
                for sp in governor.session_specs():
                    before = governor.placer.tids()
                    self.session_sets[sp] = create_sessions(parts, sp.num_threads, False, sp.affinities,
                                                            per_session_pools=True, progress=progress,
                                                            entry=spec.entry)
                    ort_tids[sp] = governor.placer.tids() - before  # ORT starts a session's workers with it
                self.sessions = next(iter(self.session_sets.values()))
            spec.entry.verify()  # what no part reads (an untied embedding: our kernel reads it)
        finally:
            if temporary:  # the mappings keep the files alive; nothing else needs the folder
                # (but a placement fallback may build another session set from the parts: then
                # it goes after the placement check, or with this runner if that never comes)
                remove = weakref.finalize(self, shutil.rmtree, spec.entry.store.root, ignore_errors=True)
                if governor is None:
                    remove()
        self.load_stats.update(graphs_s=t1 - t0, sessions_s=time.perf_counter() - t1)
        self.load_seconds = time.perf_counter() - t0
        emb = spec.weights["token_embd"]
        self._emb_table, self._emb_scales, self._emb_dtype = emb.data, emb.scales, emb.dtype
        self._emb_nbits = None if emb.dtype in ("f32", "q8_0", "q4_0") else emb  # other types: NumPy gather
        self._emb_scale = np.float32(cfg.embed_scale)  # Gemma: sqrt(dim), in f32 as llama.cpp
        self.ids = np.zeros(T, np.int64)                        # (T,)
        self.positions = np.zeros(T, np.int64)                  # (T,)
        self.rows = np.zeros(T, np.int64)                       # (R,) rows whose logits are wanted
        self.h_a = np.zeros((T, cfg.dim), np.float32)           # (T, dim) residual, ping
        self.h_b = np.zeros((T, cfg.dim), np.float32)           # (T, dim) residual, pong
        self.q = np.zeros((T, cfg.q_dim), np.float32)           # (T, num_heads * head_dim)
        self.k = np.zeros((T, cfg.kv_dim), np.float32)          # (T, num_kv_heads * head_dim)
        self.v = np.zeros((T, cfg.kv_dim), np.float32)          # (T, num_kv_heads * head_dim)
        self.attn = np.zeros((T, cfg.q_dim), np.float32)        # (T, num_heads * head_dim)
        self.logits = np.zeros((T, cfg.vocab_size), np.float32)  # (R, vocab)
        self.hidden = np.zeros((T, cfg.dim), np.float32)        # (R, dim) final-normed hidden state of the rows
        self._steps = np.arange(T, dtype=np.int64)
        dp = cache_config or DualPathConfig()
        self.cache_config = dp
        P = dp.page_tokens
        if dp.kv_dtype == "q8" and cfg.head_dim % 2:
            raise ConfigError(f"dualpath_config.kv_dtype=q8 needs an even head_dim; this model's is "
                              f"{cfg.head_dim}: use f16 or f32")
        page_bytes = kv_tile_bytes(dp.kv_dtype, cfg.num_kv_heads, cfg.head_dim, P)
        if page_bytes > dp.block_size:
            raise ConfigError(f"dualpath_config.block_size={dp.block_size} cannot hold one page of "
                              f"page_tokens={P} tokens of this model ({page_bytes} bytes); raise block_size")
        pages_per_block = dp.block_size // page_bytes
        # Default room: the context twice over (the live sequence plus cached prefixes).
        cache_tokens = kv_cache_tokens or 2 * max_context_tokens
        num_blocks = max(1, -(-cache_tokens // (P * pages_per_block)))
        if not kv_cache_tokens:
            num_blocks += 2
        self.cache = KVCacheManager(dp, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                                    head_dim=cfg.head_dim, num_blocks=num_blocks, salt=_prefix_salt(spec))
        self.kv_cache_tokens = self.cache.capacity_tokens
        """Tokens the KV cache holds (all sequences together)."""
        # The path policy of every profile the governor can choose, built once: a step
        # only swaps which one the cache applies. Without a governor the configured
        # profile holds for good ("auto" then has nothing to choose and overrides nothing).
        names = governor.plans if governor is not None else (power_config.profile if power_config else "",)
        self._policies = {name: PathPolicy.from_config(dp, power_config, name) for name in names}
        self.cache.policy = next(iter(self._policies.values()))
        self.slots = np.zeros((T, 3), np.int64)                 # (T, 3) where new tokens go
        # Kernel view of every sequence of a step, back to back: a sequence has at most
        # one span per page (shared prefix pages appear in every sequence that reads
        # them), 24 bytes per page_tokens of context: nothing beside the KV itself.
        max_spans = self.max_num_seqs * (-(-max_context_tokens // P) + 1)
        self.spans = np.zeros((max_spans, 3), np.int64)         # (max_spans, 3)
        # (S, 5) row0, n, pos0, span0, num_spans: an entry per sequence, or per row of a
        # sequence with proposals (speculative decoding), hence room for a row each.
        self.seqs = np.zeros((self.max_num_seqs + T, 5), np.int64)
        # Our kernels' own pool (ONNX Runtime has its own): same thread count and cores.
        # How each layer attends: the family's scale and soft-cap, sliding windows per layer.
        windows = np.array([cfg.layer_window(i) for i in range(cfg.num_layers)], np.int64)

        def stepper(pool, sessions):
            # Decode attention is split over our pool when ONNX Runtime's workers leave the
            # cores between the parts (per-part pools, or no spinning), or yield them to our
            # workers (the shared pool's, which spin on for 38-40 ms after a Run: under
            # SCHED_IDLE while our pool's jobs run, where the process may take them out of
            # it again). Where they spin on and cannot yield, our workers would only contend
            # with them, and a decode runs on the calling thread (stories15M shape F32, 16k
            # context, 2 threads: 9.2 ms a step on the caller against 13 ms split; yielding,
            # 7.9-8.1 ms split against 8.9-9.8 on the caller, and 16k prefill 1.5k -> 1.95k
            # tokens/s; README, Kernels). Prefill always uses the pool.
            yields = bool(sessions.spinning_workers) and _can_unidle()
            if yields:
                pool.set_yielders(sessions.spinning_workers)
            return ArenaStepper(self.cache.arena, self.q, self.k, self.v, self.attn, self.slots, self.spans,
                                cfg.attention_scale, dp.prefetch_degree, pool, kernel, self.seqs,
                                softcap=cfg.attn_softcap, windows=windows,
                                decode_on_caller=not sessions.idle_between_runs and not yields)

        self._sets = {}  # SessionSpec -> (sessions, kernel stepper)
        self.pool = None if governor is not None else ThreadPool(num_threads)
        home = frozenset(os.sched_getaffinity(0)) if governor is not None else frozenset()
        for sp, sessions in self.session_sets.items():
            pool = ThreadPool(sp.num_threads)  # our kernels' workers, on the same cores as ORT's
            if sp.pinned:
                governor.placer.pin_pool(pool, sp.cpus)
            self._sets[sp] = (sessions, stepper(pool, sessions))
        # What a step of each set pins the calling thread to: its first CPU, or back where
        # this runner was built for a set that runs unpinned (a placement fallback).
        self._caller_cpus = {sp: frozenset(sp.cpus[:1]) if sp.pinned else home for sp in self._sets}
        self._pin_caller = governor.placer.pin_caller if governor is not None else None
        self.kv = next(iter(self._sets.values()))[1] if self._sets else stepper(self.pool, self.sessions)
        self._bindings: dict[int, _Binding] = {}  # id(session set) -> its bindings
        self.last_plan = None
        """The governor's plan of the last ``plan_step`` (None without a governor)."""
        self.seq_id = self.cache.new_seq_id()
        self.cache.start(self.seq_id, [])
        if governor is not None:
            try:
                self._check_placement(parts, ort_tids, home, stepper, progress)
            finally:
                if temporary:
                    remove()

    def _check_placement(self, parts, ort_tids: dict, home: frozenset, stepper, progress) -> None:
        """Once, when built: a warm-up step on every session set, then read back where its
        threads run (platform/placement.py) and hand that to the governor, which falls back
        (unpinned, no more threads than cores granted) for every phase the OS did not
        honour; the session sets those fallbacks need are built here. Steps pay nothing."""
        gov = self.governor
        placer = gov.placer
        seen = {}
        self._pin_caller = functools.partial(placer.pin_caller, warn=False)  # the report says it all
        try:
            for sp, (sessions, kv) in self._sets.items():
                self.warm_up(sp)
                read = placer.check_set(sp, ort_tids=ort_tids.get(sp, ()), num_sessions=len(sessions),
                                        pool_tids=kv.pool.worker_tids()[1:])
                if read is not None:  # None: /proc unreadable (logged), the plan stands unverified
                    seen[sp] = read
        finally:
            self._pin_caller = placer.pin_caller
            placer.pin_caller(home, warn=False)  # new threads inherit the creator's mask
        gov.verify_placement(seen)
        specs = gov.session_specs()
        if set(specs) == set(self._sets):
            return
        self._bindings.clear()  # keyed by id(sessions): no binding may outlive its set
        for sp in [sp for sp in self._sets if sp not in specs]:  # no plan runs on it any more
            del self.session_sets[sp], self._sets[sp], self._caller_cpus[sp]
        for sp in specs:
            if sp not in self._sets:  # a fallback: unpinned, its own thread count
                sessions = create_sessions(parts, sp.num_threads, False, None, per_session_pools=True,
                                           progress=progress, entry=self.spec.entry)
                self.session_sets[sp] = sessions
                self._sets[sp] = (sessions, stepper(ThreadPool(sp.num_threads), sessions))
                self._caller_cpus[sp] = home
        self.sessions, self.kv = next(iter(self._sets.values()))

    def warm_up(self, sp=None) -> None:
        """One one-token step on session set ``sp`` (None: the default one) for a scratch
        sequence (freed after: a partial page is never cached), its caller pinned as that
        set's steps pin it; then one job on our pool, whose workers apply their affinity at
        their next job. The weights are paged in and ONNX Runtime's first-run allocations
        made here, not in the first request (a server calls it before it listens)."""
        cache = self.cache
        seq_id = cache.new_seq_id()
        cache.start(seq_id, [])
        try:
            alloc = cache.allocate(seq_id, [0])
            if not isinstance(alloc, NoRoom):
                self.run([SeqStep(None, seq_id, [0], alloc, True)], session_spec=sp)
        finally:
            cache.free(seq_id)
        pool = self._sets[sp][1].pool if sp is not None else self.kv.pool
        pool.read(np.zeros(64 * pool.num_threads, np.uint64))  # (64 * threads,) one job for every worker

    # -- batched steps (the engine) ---------------------------------------------
    def plan_step(self) -> int:
        """Before each step: consult the governor once (it may switch profile between
        steps, never within one), hand its path policy to the cache, and return the
        prompt tokens a prefill chunk may have (the plan's chunk, smaller in low_power)."""
        if self.governor is None:
            return self.max_step_tokens
        plan = self.last_plan = self.governor.choose()
        self.cache.policy = self._policies[plan.profile]
        return max(1, min(self.max_step_tokens, plan.prefill_chunk_tokens))

    def run(self, steps: list[SeqStep], all_rows: bool = False, *, session_spec=None) -> np.ndarray:
        """One step over ``steps`` (allocated, at most max_num_seqs, at most
        max_step_tokens tokens together). Returns logits (R, vocab): ``SeqStep.num_rows``
        rows per step (one with ``logits``, plus one per proposal it carries; one per token
        with ``hidden``), in step order, or with
        ``all_rows`` one per token of the step; ``self.hidden[:R]`` holds the same rows'
        final hidden states. The cache commits every sequence after. ``session_spec``: run on that session
        set instead of the plan's (the warm-up of each set)."""
        S = len(steps)
        if not 1 <= S <= self.max_num_seqs:
            raise ValueError(f"a step takes 1..{self.max_num_seqs} sequences, got {S}")
        row = R = span = E = 0
        prefill = False
        cache = self.cache
        for i, e in enumerate(steps):
            n = len(e.token_ids)
            alloc = e.alloc
            pos0 = alloc.pos0
            if row + n > self.max_step_tokens:
                raise ValueError(f"a step takes at most {self.max_step_tokens} tokens")
            if pos0 + n > self.max_context_tokens:
                raise ValueError(f"positions {pos0}..{pos0 + n - 1} exceed the context of {self.max_context_tokens}")
            self.ids[row:row + n] = e.token_ids
            self.slots[row:row + n] = alloc.slots
            np.add(self._steps[:n], pos0, out=self.positions[row:row + n])
            ns = len(cache.spans(e.seq_id, out=self.spans[span:]))
            if e.draft:
                # Each row attends as a one-row decode step at its position would (the same
                # context split, so the same bits): its proposals are checked against exactly
                # the logits plain decoding computes.
                self.seqs[E:E + n, 0] = self._steps[:n] + row
                self.seqs[E:E + n, 1] = 1
                self.seqs[E:E + n, 2] = self._steps[:n] + pos0
                self.seqs[E:E + n, 3:] = (span, ns)
                E += n
            else:
                self.seqs[E] = (row, n, pos0, span, ns)
                E += 1
            if e.hidden:  # an embedding: every token's row
                self.rows[R:R + n] = self._steps[:n] + row
                R += n
            elif e.logits:  # the last known token's row, and one per proposal after it
                k = 1 + e.draft
                self.rows[R:R + k] = self._steps[:k] + (row + n - k)
                R += k
            prefill = prefill or alloc.prefill
            row += n
            span += ns
        if all_rows:
            R = row
            self.rows[:R] = self._steps[:R]
        elif R == 0:  # no entry samples: lm_head still runs on one row, make it a valid one
            self.rows[0] = 0
        logits = self._execute(row, max(R, 1), prefill, E, span, session_spec)
        for e in steps:
            cache.commit(e.seq_id)
        return logits[:R]

    def _binding(self, T: int, R: int, sessions) -> _Binding:
        """The session set's bindings, sized for a step of T tokens and R rows."""
        b = self._bindings.get(id(sessions))
        if b is None or b.sessions is not sessions:  # first use (a stored binding keeps its set alive)
            b = self._bindings[id(sessions)] = _Binding(self, sessions)
        b.resize(T, R)
        return b

    def _execute(self, T: int, R: int, prefill: bool, num_seqs: int, num_spans: int, sp=None) -> np.ndarray:
        kv_stepper, sessions = self.kv, self.sessions
        plan = self.last_plan
        if sp is None and plan is not None:
            # The plan_step() plan: a step never changes session set midway.
            sp = plan.prefill_spec if prefill else plan.decode_spec
        if sp is not None:
            # One system call; a refused pin is logged once and the step runs where the thread is.
            self._pin_caller(self._caller_cpus[sp])
            sessions, kv_stepper = self._sets[sp]
        binding = self._binding(T, R, sessions)
        e = self._emb_nbits
        if e is None:
            _embed(binding.ids, self._emb_table, self._emb_scales, self._emb_dtype, binding.h0)
        else:
            gather_rows(e.data, e.scales, e.zero_points, e.mins, e.bits, e.block_size, binding.ids, binding.h0)
        if self._emb_scale != 1.0:
            np.multiply(binding.h0, self._emb_scale, out=binding.h0)
        kv_step = kv_stepper.step_batch
        for run, b, layer in binding.plan:
            run(b)
            if layer >= 0:
                kv_step(layer, T, num_seqs, num_spans)
        return self.logits

    # -- one sequence (benchmarks, tests) -----------------------------------------
    @property
    def num_tokens(self) -> int:
        """Positions of the current sequence held in the cache."""
        return self.cache.num_tokens(self.seq_id)

    def begin(self, prompt_ids) -> int:
        """Start a new sequence for ``prompt_ids``; the previous one is freed (its full
        pages stay cached). Returns how many leading prompt tokens are reused from
        the cache: the caller runs only the rest."""
        self.cache.free(self.seq_id)
        self.seq_id = self.cache.new_seq_id()
        return self.cache.start(self.seq_id, prompt_ids)

    def forward(self, token_ids, all_logits: bool = False) -> np.ndarray:
        """Append ``token_ids`` (at most max_step_tokens) at the end of the sequence and
        return logits (R, vocab): the last position only, or every position."""
        n = len(token_ids)
        if not 1 <= n <= self.max_step_tokens:
            raise ValueError(f"a step takes 1..{self.max_step_tokens} tokens, got {n}")
        if self.num_tokens + n > self.max_context_tokens:
            raise ValueError(f"positions {self.num_tokens}..{self.num_tokens + n - 1} exceed the context "
                             f"of {self.max_context_tokens}")
        self.plan_step()
        alloc = self.cache.allocate(self.seq_id, token_ids)
        if isinstance(alloc, NoRoom):
            raise CacheFullError(f"KV cache full: {alloc.needed_pages} more pages needed, {alloc.free_pages} free")
        return self.run([SeqStep(None, self.seq_id, token_ids, alloc, True)], all_rows=all_logits)

    def reset(self) -> None:
        """Forget the current sequence (cached pages stay reusable)."""
        self.begin([])
