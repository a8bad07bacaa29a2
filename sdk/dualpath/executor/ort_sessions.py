"""ONNX Runtime's sessions for the graph parts, and the process-wide state they share.

One InferenceSession per graph part, its weights handed over in place
(``add_initializer``). What ONNX Runtime keeps once per process lives here too: the
shared CPU allocator, the global thread pool and the Linux ids of its workers (which
can yield their cores to our kernels' pool), and which ONNX Runtime version's graphs
this process loads. No other module of the runtime imports onnxruntime.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort

from ..errors import DualPathError, ModelLoadError
from ..graph.parts import PartFile, graph_parts
from ..kernels import ThreadPool
from ..models.spec import ModelSpec
from ..models.store import Progress
from ..versions import declared_minimums, parse_version

log = logging.getLogger(__name__)


_global_pool_threads: int | None = None  # None: not tried yet; 0: no global pool in this process
_global_pool_workers: list[int] = []  # Linux thread ids of the global pool's workers
_env_allocator: bool | None = None


def global_pool_threads() -> int | None:
    """Threads of ONNX Runtime's global pool in this process: None before any model asked
    for it, 0 when the process has none (per-session pools)."""
    return _global_pool_threads


@functools.cache
def can_unidle() -> bool:
    """Whether ORT's workers can be put under SCHED_IDLE and back (``ThreadPool.can_unidle``)."""
    ok = ThreadPool.can_unidle()
    if not ok:
        log.info("this process may not take a thread out of SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE "
                 "below 20): ONNX Runtime's spinning workers keep their cores, decode attention runs "
                 "on the calling thread")
    return ok


@functools.cache
def _fix_mmap_threshold() -> None:
    """Keep glibc's malloc from moving its mmap threshold up (it follows the largest block
    freed, up to 32 MiB): blocks of a prefill chunk's size then come from the heap, which
    does not give them back (docs/performance-log.md has the resident memory with and
    without the threshold fixed). A threshold the user set in the
    environment (MALLOC_MMAP_THRESHOLD_) is left alone; other C libraries are too."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD, glibc's own initial value; fixes it
    except (OSError, AttributeError) as e:
        log.info("cannot fix malloc's mmap threshold (%s)", e)


def _use_env_allocator() -> bool:
    """One CPU arena for every session of the process. With an arena per session, each
    of the L + 1 parts (times the session sets) keeps its own peak of activation
    buffers, a large share of the memory above the weights."""
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


def global_pool_exists() -> bool:
    """Whether ONNX Runtime's global pool exists in this process (sessions then share it:
    none may have a pool of its own)."""
    return bool(_global_pool_threads)


def use_global_pool(num_threads: int) -> bool:
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
                 idle_between_runs: bool = True, spinning_workers: list[int] | None = None,
                 parts: list[PartFile] | None = None):
        super().__init__(sessions)
        self.parts = parts or []
        """The graphs the sessions run, in the same order (their names, our products between them)."""
        self.initializers = initializers
        self.idle_between_runs = idle_between_runs
        """ONNX Runtime's workers leave the cores when a part's Run returns (they do not
        spin into our attention between the parts)."""
        self.spinning_workers = spinning_workers or []
        """Otherwise, where known, the Linux thread ids of those workers (the global
        pool's): they spin on after a Run, and our pool's jobs can make them yield their
        cores (``ThreadPool.set_yielders``)."""


def _session_options(num_threads: int, shared_pool: bool, env_allocator: bool, spinning: bool,
                     pack: bool, affinities: str | None) -> ort.SessionOptions:
    """The options of one part's session (its weights are added by ``_load_part``)."""
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
    so.add_session_config_entry("session.disable_prepacking", "0" if pack else "1")
    if affinities:
        so.add_session_config_entry("session.intra_op_thread_affinities", affinities)
    return so


def _load_part(part: PartFile, so: ort.SessionOptions, pack: bool, entry) -> tuple[ort.InferenceSession, list]:
    """One part's session over its weights, handed over in place; returns the session and
    the OrtValues it reads (which must outlive it)."""
    if entry is not None:
        entry.verify(part.weights.values())
    values = []
    for name, array in part.weights.items():
        if array.nbytes < SMALL_ARRAY_BYTES and entry is not None and entry.holds(array):
            array = np.array(array)  # see SMALL_ARRAY_BYTES
        value = ort.OrtValue.ortvalue_from_numpy(array)
        values.append(value)
        so.add_initializer(name, value)
    # While ONNX Runtime packs, the pages it has read are dropped behind it (they are file
    # pages: a second read maps them again): else the part's mapped source and its packed
    # copy are resident at once, the load's peak (a tied classifier's part is the largest).
    dropper = _PageDropper(entry, list(part.weights.values())) if entry is not None and pack else None
    try:
        session = ort.InferenceSession(part.path, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # e.g. a graph from a newer DualPath in a shared cache
        raise ModelLoadError(part.path, f"ONNX Runtime {ort.__version__} cannot load this graph "
                             f"({str(e).strip().splitlines()[0][:300]}); DualPath needs onnxruntime "
                             f"{declared_minimums().get('onnxruntime', '1.20.1')} or newer: "
                             f"pip install -U onnxruntime") from e
    finally:
        if dropper is not None:
            dropper.stop()
    return session, values


SMALL_ARRAY_BYTES = 64 << 10
"""Arrays of weights.bin smaller than this are handed to ONNX Runtime as copies, not as
views of the entry's mapping: a read of a mapped page maps its whole fault-around window
(64 KiB), so the norms it reads in place at every step (a few KiB each, 64 KiB apart in
weights.bin) kept far more of the file resident than the copies take (docs/performance-log.md).
Views of other files stay views: the RoPE tables every part shares, an F32 source read in
place."""


class _PageDropper:
    """Drops the mapped pages of ``arrays`` every ``interval`` seconds on a thread of its
    own, and once more at ``stop``."""

    def __init__(self, entry, arrays: list, interval: float = 0.01):
        self._entry, self._arrays, self._interval = entry, arrays, interval
        self._done = threading.Event()
        self._thread = None
        if sum(a.nbytes for a in arrays) > 8 << 20:  # small parts: dropping once at stop is enough
            self._thread = threading.Thread(target=self._run, name="dualpath-drop", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            self._entry.drop_pages(self._arrays)

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._entry.drop_pages(self._arrays)


def create_sessions(parts: list[PartFile], num_threads: int, spinning: bool = True,
                    affinities: str | None = None, per_session_pools: bool = False,
                    progress: Progress | None = None, entry=None, prepack_float: bool = False,
                    ort_pools: str = "shared") -> SessionSet:
    """One InferenceSession per part (graph files of a converted-model cache entry).

    Every weight is handed over as an OrtValue over the entry's memory-mapped arrays
    (``add_initializer``). Parts with MatMulNBits need ONNX Runtime's prepacked layout
    to be fast: each session packs its own copy. Float weights are packed too with
    ``prepack_float`` (one session set: the packed copy replaces the mapped pages, so it
    costs no memory, and a float decode step is faster), else read in place, once in
    memory whatever the number of session sets (a governor's per-phase sets: packing
    would keep a copy per set). With the ``entry`` the arrays live in, a part's arrays
    are verified (checksums) just before its session reads them, and the mapped pages a
    session packed from are dropped once it exists (``Entry.drop_pages``): the load's
    peak memory is the packed copies plus one part's pages per thread.

    Thread pools (``ort_pools``, ``runtime.ort_thread_pools``): ``shared``, the parts share
    ORT's global pool, whose workers stay hot from one part's Run to the next (and spin
    on after it, into our attention: the set names them in ``spinning_workers``, for our
    pool to make them yield); ``per_part`` with ``spinning``, each part has a pool of its
    own whose workers spin while its Run lasts and stop the moment it returns
    (``session.force_spinning_stop``), so that between the parts every core is free for
    our attention, but every Run starts with its worker asleep: long prefills gain, short
    decodes lose (docs/performance.md). Pinned sets always have their own pools (ORT pins
    per pool), with spinning off.

    ONNX Runtime releases the GIL while it creates a session and packs on one thread:
    the parts are created ``num_threads`` at a time.
    """
    loaders = num_threads
    if not any(p.matmuls for p in parts) and not _global_pool_threads:
        # Our kernels multiply every matrix (graph.segments): the graphs left are norms,
        # RoPE and activations between them, and ONNX Runtime's own workers would only
        # contend with our pool's. One thread per session: the calling one (pinned by
        # its caller). Once ORT's global pool exists (an earlier LLM of this process),
        # ORT refuses pools of a session's own: the sessions share that one then.
        num_threads, per_session_pools, spinning, affinities = 1, True, False, None
    if per_session_pools and _global_pool_threads and num_threads > 1:
        raise DualPathError("pinned sessions need per-session ONNX Runtime thread pools, but this process "
                            "already created ORT's global pool (an earlier unpinned LLM); create pinned "
                            "LLMs first or set power.pin_threads: false")
    # Once the global pool exists ORT refuses pools of a session's own: share it then.
    own_pools = per_session_pools or affinities is not None or (
        spinning and ort_pools == "per_part" and not _global_pool_threads)
    shared_pool = not own_pools and use_global_pool(num_threads)
    env_allocator = _use_env_allocator()
    _fix_mmap_threshold()
    done = [0]
    lock = threading.Lock()

    def create(part: PartFile):
        pack = part.prepack or prepack_float
        so = _session_options(num_threads, shared_pool, env_allocator, spinning, pack, affinities)
        made = _load_part(part, so, pack, entry)
        if progress is not None:
            with lock:
                done[0] += 1
                progress("sessions", done[0], len(parts))
        return made

    workers = max(1, min(loaders, os.cpu_count() or 1, len(parts)))
    # Largest first: packing holds a part's mapped pages and its packed copy at once, so the
    # load's peak is lowest while few other packed copies exist yet (a tied classifier's part
    # is most of a small model's weights).
    order = sorted(range(len(parts)), key=lambda i: -sum(a.nbytes for a in parts[i].weights.values()))
    if workers == 1:
        made_in_order = [create(parts[i]) for i in order]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="dualpath-load") as ex:
            made_in_order = list(ex.map(create, [parts[i] for i in order]))
    made = list(made_in_order)  # every slot is overwritten: back in the parts' order
    for i, m in zip(order, made_in_order):
        made[i] = m
    # every add_initializer OrtValue is kept alive with the sessions
    spins = spinning and shared_pool
    return SessionSet([m[0] for m in made], [v for m in made for v in m[1]], idle_between_runs=not spins,
                      spinning_workers=list(_global_pool_workers) if spins else [], parts=parts)
