# cython: language_level=3, boundscheck=False, wraparound=False
"""The KV arena (csrc/kv_arena.c) with its attention (csrc/kv_attn.c) as Python
objects, the per-step stepper, and the names of the C tables: KV dtypes and ISAs.

``KVArena`` owns the one allocation. Slots and spans are int64 arrays of shape
(n, 3) (see kv_arena.h). ``ArenaStepper`` binds q/k/v/out and the slot, span and
step-table buffers once; ``step_batch(layer, num_rows, num_seqs, num_spans)`` writes
the new rows and attends for every sequence of the step, with only small integers
crossing the boundary.
"""
import os

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport malloc, free
from dp_kernels cimport *

cnp.import_array()

include "dp_checks.pxi"


cdef str _bad_slot(const dp_arena *a, slots, str name):
    """" (slots[i] = (offset, row, tile_tokens))" for the first slot the arena refuses,
    or "" (an error path only: the C call already refused the batch)."""
    cdef int64_t bad = -1
    cdef const int64_t *sp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>slots)
    dp_kv_check_slots(a, sp, slots.shape[0], &bad)
    if bad < 0:
        return ""
    return f" ({name}[{bad}] = (offset {slots[bad, 0]}, row {slots[bad, 1]}, tile_tokens {slots[bad, 2]}))"


KV_DTYPES = tuple(dp_kv_types[i].name.decode() for i in range(DP_KV_NUM_DTYPES))
"""Element types of the KV arena, the default first: csrc/kv_arena.c's dp_kv_types, the
one list (csrc/kv_arena.h has the q8 format and why)."""
KV_DTYPE_DOCS = {dp_kv_types[i].name.decode(): dp_kv_types[i].doc.decode() for i in range(DP_KV_NUM_DTYPES)}
"""What an element of each KV dtype is, in a few words."""
KV_HEAD_DIM_MULTIPLE = {dp_kv_types[i].name.decode(): dp_kv_types[i].head_dim_multiple for i in range(DP_KV_NUM_DTYPES)}
"""What a model's head_dim must be a multiple of, per KV dtype (q8: 2, its scales stay
4-byte aligned): the C table's rule, which the arena enforces."""
_DTYPE_CODE = {name: i for i, name in enumerate(KV_DTYPES)}

KERNEL_ISAS = tuple(dp_isas[i].name.decode() for i in range(dp_num_isas))
"""Every ISA with kernels, in any build (csrc/cpu_features.c's dp_isas, the one list):
``generic`` first, then each architecture's from the least to the most capable."""
KERNEL_FEATURES = tuple(dp_isas[i].name.decode() for i in range(dp_num_isas) if dp_isas[i].feature)
"""The ISAs that a CPU feature names: what DUALPATH_DISABLE_CPU_FEATURES may list."""


cdef unsigned _disabled_features(str text) except? 0xffffffff:
    """The feature mask of a DUALPATH_DISABLE_CPU_FEATURES value; ValueError for a name
    that is no feature."""
    cdef unsigned mask = 0
    cdef const char *bad = NULL
    cdef size_t bad_len = 0
    raw = text.encode()
    if dp_parse_features(raw, &mask, &bad, &bad_len) != DP_OK:
        name = (<bytes>bad[:bad_len]).decode(errors="replace")
        raise ValueError(f"DUALPATH_DISABLE_CPU_FEATURES={text!r}: {name!r} is not a CPU feature; "
                         f"the features are {', '.join(KERNEL_FEATURES)}")
    return mask


# Run-time dispatch: the best kernel this CPU (and its OS) supports, minus what
# DUALPATH_DISABLE_CPU_FEATURES=avx512,avx2 turns off. Chosen once at import.
cdef const dp_attn_ops *_default_ops = dp_select_ops(
    _disabled_features(os.environ.get("DUALPATH_DISABLE_CPU_FEATURES", "")))


def _kv_dtype_code(str kv_dtype):
    if kv_dtype not in _DTYPE_CODE:
        raise ValueError(f"kv_dtype={kv_dtype!r} must be one of {', '.join(map(repr, KV_DTYPES))}")
    return _DTYPE_CODE[kv_dtype]


def kv_tile_bytes(str kv_dtype, int64_t num_kv_heads, int64_t head_dim, int64_t tile_tokens):
    """Bytes of a tile of ``tile_tokens`` tokens of one layer (K, V and, for q8, their
    scales): the formula of csrc/kv_arena.c, for sizing pages before an arena exists."""
    cdef int64_t n = dp_kv_tile_bytes(_kv_dtype_code(kv_dtype), num_kv_heads, head_dim, tile_tokens)
    if n < 0:
        raise ValueError(f"kv_tile_bytes: num_kv_heads={num_kv_heads} >= 1, head_dim={head_dim} in "
                         f"[1, {DP_MAX_HEAD_DIM}] and tile_tokens={tile_tokens} >= 1 (and not overflowing)")
    return n


def cpu_features():
    """Kernel-relevant features this CPU and OS support: a list of ISA names."""
    cdef unsigned f = dp_cpu_features()
    return [dp_isas[i].name.decode() for i in range(dp_num_isas) if dp_isas[i].feature & f]


def available_kernels():
    """Kernel ISAs usable here, best last ("generic" always)."""
    return [n for n in KERNEL_ISAS if dp_ops_by_name(n.encode()) != NULL]


def default_kernel():
    """The kernel chosen at import (after DUALPATH_DISABLE_CPU_FEATURES)."""
    return dp_ops_name(_default_ops).decode()


cdef const dp_attn_ops *_ops_for(str isa) except NULL:
    if isa is None or isa == "":
        return _default_ops
    cdef const dp_attn_ops *ops = dp_ops_by_name(isa.encode())
    if ops == NULL:
        raise ValueError(f"kernel {isa!r} is not available on this CPU/build "
                         f"(available: {', '.join(available_kernels())})")
    return ops


cdef class ThreadPool:
    """The kernels' pthread pool: num_threads including the calling thread, each
    worker on one CPU (``set_affinity``) or unpinned. A core set has a pool of its own."""
    cdef dp_pool *pool
    cdef object warm_owner  # keeps the memory of the region its workers read ahead alive

    def __cinit__(self, int num_threads):
        if num_threads < 1 or num_threads > DP_POOL_MAX_THREADS:
            raise ValueError(f"num_threads={num_threads} must be between 1 and {DP_POOL_MAX_THREADS}")
        st = dp_pool_create(num_threads, &self.pool)
        _check(st, f"kernel thread pool of {num_threads} threads ({num_threads - 1} workers)", "the pool")

    def __dealloc__(self):
        if self.pool != NULL:
            dp_pool_destroy(self.pool)

    @property
    def num_threads(self):
        return dp_pool_num_threads(self.pool)

    @property
    def active(self) -> int:
        """Threads a job runs on (the caller's included): the first ``active`` of the pool's."""
        return dp_pool_active(self.pool)

    @active.setter
    def active(self, int n):
        """From the next job on, only the first ``n`` threads take part (the others sleep): the
        pool's cores shared with other work. ValueError outside [1, num_threads]."""
        if n < 1 or n > dp_pool_num_threads(self.pool):
            raise ValueError(f"active threads must be between 1 and {dp_pool_num_threads(self.pool)}, got {n}")
        _check(dp_pool_set_active(self.pool, n), f"active = {n}", "the pool")

    def set_affinity(self, cpus):
        """cpus[i] = the CPU of thread i (0 = the caller's slot, pinned by the caller);
        an empty list unpins; -1 leaves a thread unpinned. Workers re-pin before their
        next job."""
        cpus = [int(c) for c in cpus]
        for c in cpus:
            if c < -1 or c >= DP_POOL_MAX_CPUS:
                raise ValueError(f"set_affinity: cpu {c} must be -1 (unpinned) or in [0, {DP_POOL_MAX_CPUS})")
        cdef int n = len(cpus), i, st
        cdef int *buf = <int *>malloc(max(n, 1) * sizeof(int))
        if buf == NULL:
            raise MemoryError(f"set_affinity: out of memory for {n} cpus")
        for i in range(n):
            buf[i] = cpus[i]
        st = dp_pool_set_affinity(self.pool, buf, n)
        free(buf)
        _check(st, f"set_affinity({cpus})", "the pool")

    cdef void warm(self, object owner, const void *p, int64_t nbytes):
        """Bytes the workers read ahead while they spin between jobs (csrc/dp_pool.h
        ``dp_pool_warm``), inside ``owner``'s memory; NULL clears. Skipped while another
        thread's job runs on the pool: the old region, and its owner, stay."""
        cdef int st
        with nogil:
            st = dp_pool_warm(self.pool, p, nbytes)
        if st:
            self.warm_owner = owner if p != NULL else None

    def read(self, buf):
        """Read a C-contiguous array once with every thread (a bandwidth probe)."""
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
            raise ValueError("buf must be a C-contiguous numpy array")
        cdef const void *p = cnp.PyArray_DATA(<cnp.ndarray>buf)
        cdef int64_t n = buf.nbytes
        cdef unsigned long long r
        with nogil:
            r = dp_read_buffer(self.pool, p, n)
        return r

    def fma(self, int64_t iters, str kernel=None):
        """Run ``kernel``'s f32 FMA peak probe (default: the dispatched kernel) for
        ``iters`` rounds on every thread at once; returns the flops done in all."""
        if iters < 0:
            raise ValueError(f"iters={iters} must be >= 0")
        cdef const dp_attn_ops *ops = _ops_for(kernel)
        cdef int64_t flops
        cdef int st
        with nogil:
            st = dp_run_fma_probe(self.pool, ops.fma_probe, iters, &flops)
        _check(st, f"FMA probe of {iters} rounds", "the pool")
        return flops

    def worker_tids(self):
        """Linux thread ids of the pool's threads (index 0: the last caller)."""
        cdef int64_t tids[DP_POOL_MAX_THREADS]
        cdef int n = dp_pool_worker_tids(self.pool, tids, DP_POOL_MAX_THREADS)
        return [tids[i] for i in range(n)]

    def set_yielders(self, tids):
        """Threads (Linux thread ids) that yield their cores to this pool's jobs: under
        SCHED_IDLE while a job that wakes the workers runs, back under their own policy
        after (ONNX Runtime's shared-pool workers, which spin on between Runs). Only
        threads under SCHED_OTHER or SCHED_BATCH are taken; [] clears. Needs
        ``can_unidle()``."""
        tids = [int(t) for t in tids]
        if len(tids) > DP_POOL_MAX_YIELDERS:
            raise ValueError(f"set_yielders: {len(tids)} threads, at most {DP_POOL_MAX_YIELDERS}")
        if any(t <= 0 for t in tids):
            raise ValueError(f"set_yielders: thread ids must be positive, got {tids}")
        cdef int64_t buf[DP_POOL_MAX_YIELDERS]
        cdef int i, n = len(tids)
        for i in range(n):
            buf[i] = tids[i]
        _check(dp_pool_set_yielders(self.pool, buf, n), f"set_yielders({tids})", "the pool")

    @staticmethod
    def can_unidle():
        """Whether this process may put a thread back under SCHED_OTHER after SCHED_IDLE
        (CAP_SYS_NICE, or an RLIMIT_NICE that allows nice 0); tried on a throwaway thread."""
        return bool(dp_can_unidle())

    @staticmethod
    def _fail_thread_creation_after(int64_t n):
        """Test only, process-wide: the next ``n`` worker threads that pools start
        start, and every later one fails to (pthread_create), until called again;
        n < 0 ends it."""
        dp_test_fail_thread_create_after(n)


cdef class KVArena:
    """num_layers x num_blocks x block_size bytes of KV storage (see kv_arena.h)."""
    cdef dp_arena a

    def __cinit__(self, int64_t block_size, int64_t num_blocks, int64_t num_layers, int64_t num_kv_heads,
                  int64_t head_dim, str kv_dtype="f16", int numa_node=-1):
        code = _kv_dtype_code(kv_dtype)
        multiple = dp_kv_types[code].head_dim_multiple
        if head_dim % multiple:
            fits = ", ".join(repr(n) for i, n in enumerate(KV_DTYPES) if head_dim % dp_kv_types[i].head_dim_multiple == 0)
            raise ValueError(f"arena: kv_dtype={kv_dtype!r} keeps its scales 4-byte aligned only with a head_dim that "
                             f"is a multiple of {multiple}{' (an even head_dim)' if multiple == 2 else ''}, got "
                             f"head_dim={head_dim}; use one of {fits} for this model")
        st = dp_arena_init(&self.a, block_size, num_blocks, num_layers, num_kv_heads, head_dim, code, numa_node)
        if st == DP_ERR_ARG:
            token = dp_kv_tile_bytes(code, num_kv_heads, head_dim, 1)
            raise ValueError(f"arena: block_size={block_size} must be a power of two holding at least one "
                             f"token ({token} bytes of {kv_dtype} K and V), "
                             f"num_blocks={num_blocks} >= 1, num_layers={num_layers} >= 1, "
                             f"num_kv_heads={num_kv_heads} >= 1, head_dim={head_dim} in [1, {DP_MAX_HEAD_DIM}], "
                             f"and the arena must fit in memory")
        _check(st, f"arena of {num_layers} x {num_blocks} x {block_size} bytes", "the arena")

    def __dealloc__(self):
        dp_arena_free(&self.a)

    @staticmethod
    def _fail_allocations_after(int64_t n):
        """Test only, process-wide: the next ``n`` allocations of the C code (arenas,
        attention buffers, pools) succeed and every one after them fails, until
        called again; n < 0 ends it."""
        dp_test_fail_alloc_after(n)

    @property
    def block_size(self): return self.a.block_size
    @property
    def num_blocks(self): return self.a.num_blocks
    @property
    def num_layers(self): return self.a.num_layers
    @property
    def num_kv_heads(self): return self.a.num_kv_heads
    @property
    def head_dim(self): return self.a.head_dim
    @property
    def kv_dtype(self): return KV_DTYPES[self.a.kv_dtype]
    @property
    def nbytes(self): return self.a.layer_bytes * self.a.num_layers
    @property
    def hugepages(self): return bool(self.a.hugepages)
    @property
    def address(self): return <size_t>self.a.base
    @property
    def numa_node(self): return self.a.numa_node

    def tile_bytes(self, int64_t tile_tokens):
        """Bytes of a tile of ``tile_tokens`` tokens of one layer (values, and q8 scales)."""
        return 2 * self.a.num_kv_heads * tile_tokens * (self.a.head_dim * self.a.elem_bytes + self.a.scale_bytes)

    def write(self, int64_t layer, k, v, slots, str kernel=None):
        """k, v: (n, num_kv_heads * head_dim) f32; slots: (n, 3) int64. Every slot is
        checked before the first write: a refused write leaves the arena as it was."""
        _require(k, "k", 2, np.float32, self.a.num_kv_heads * self.a.head_dim)
        _require(v, "v", 2, np.float32, self.a.num_kv_heads * self.a.head_dim)
        _require(slots, "slots", 2, np.int64, 3)
        if k.shape[0] != slots.shape[0] or v.shape[0] != slots.shape[0]:
            raise ValueError("k, v and slots must have the same number of rows")
        cdef int st
        cdef const float *kp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>k)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>v)
        cdef const int64_t *sp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>slots)
        cdef int64_t n = slots.shape[0], stride = k.shape[1]
        cdef const dp_attn_ops *ops = _ops_for(kernel)
        with nogil:
            st = dp_kv_write_slots(&self.a, ops, layer, kp, vp, stride, sp, n)
        if st != DP_OK:
            _check(st, f"write of {n} tokens to layer {layer}{_bad_slot(&self.a, slots, 'slots')}; nothing written",
                   "the arena")

    def copy(self, src_slots, dst_slots):
        """Copy all layers' K/V of each src slot to the matching dst slot (every slot
        checked first: a refused copy leaves the arena as it was)."""
        _require(src_slots, "src_slots", 2, np.int64, 3)
        _require(dst_slots, "dst_slots", 2, np.int64, 3)
        if src_slots.shape[0] != dst_slots.shape[0]:
            raise ValueError("src_slots and dst_slots must have the same length")
        cdef int st
        cdef const int64_t *s = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>src_slots)
        cdef const int64_t *d = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>dst_slots)
        cdef int64_t n = src_slots.shape[0]
        with nogil:
            st = dp_kv_copy_slots(&self.a, s, d, n)
        if st != DP_OK:
            bad = _bad_slot(&self.a, src_slots, "src_slots") or _bad_slot(&self.a, dst_slots, "dst_slots")
            _check(st, f"copy of {n} tokens{bad}; nothing copied", "the arena")

    def read_tiles(self, offsets, int64_t tile_tokens):
        """The bytes of whole tiles (every layer, as stored): (len(offsets), num_layers,
        tile_bytes) uint8, a copy."""
        out = np.empty(self._tiles_shape(offsets, tile_tokens), np.uint8)
        self._tiles_io(offsets, tile_tokens, out, 0)
        return out

    def write_tiles(self, offsets, int64_t tile_tokens, data):
        """Write ``data`` (len(offsets), num_layers, tile_bytes) uint8 over the tiles at
        ``offsets`` (what ``read_tiles`` returned, perhaps in another process)."""
        want = self._tiles_shape(offsets, tile_tokens)
        _require(data, "data", 3, np.uint8)
        if tuple(data.shape) != want:
            raise ValueError(f"data must have shape {want}, got {tuple(data.shape)}")
        self._tiles_io(offsets, tile_tokens, data, 1)

    def _tiles_shape(self, offsets, int64_t tile_tokens):
        _require(offsets, "offsets", 1, np.int64)
        if tile_tokens <= 0:
            raise ValueError(f"tile_tokens must be >= 1, got {tile_tokens}")
        return (offsets.shape[0], self.a.num_layers, self.tile_bytes(tile_tokens))

    cdef _tiles_io(self, offsets, int64_t tile_tokens, buf, int to_arena):
        cdef int st
        cdef const int64_t *op = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>offsets)
        cdef void *bp = cnp.PyArray_DATA(<cnp.ndarray>buf)
        cdef int64_t n = offsets.shape[0]
        with nogil:
            st = dp_kv_tiles_io(&self.a, op, n, tile_tokens, bp, to_arena)
        _check(st, f"{'write' if to_arena else 'read'} of {n} tiles of {tile_tokens} tokens; nothing copied",
               "the arena")

    def release_tiles(self, layers, offsets, int64_t tile_tokens):
        """Give the memory of the tiles at ``offsets`` (int64, as ``read_tiles``) back to
        the OS in the layers flagged in ``layers`` (num_layers bools): their rows read as
        zeros until written again (kv_arena.h). Every offset is checked first."""
        flags = self._layer_flags(layers)
        _require(offsets, "offsets", 1, np.int64)
        cdef int st
        cdef const uint8_t *fp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>flags)
        cdef const int64_t *op = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>offsets)
        cdef int64_t n = offsets.shape[0]
        with nogil:
            st = dp_kv_release_tiles(&self.a, fp, op, n, tile_tokens)
        _check(st, f"release of {n} tiles of {tile_tokens} tokens; nothing released", "the arena")

    def small_pages(self, layers):
        """No transparent huge pages in the layers flagged in ``layers`` (see kv_arena.h)."""
        flags = self._layer_flags(layers)
        cdef const uint8_t *fp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>flags)
        _check(dp_kv_small_pages(&self.a, fp), "small_pages", "the arena")

    def _layer_flags(self, layers):
        flags = np.ascontiguousarray(layers, dtype=np.uint8)
        if flags.ndim != 1 or flags.shape[0] != self.a.num_layers:
            raise ValueError(f"layers must be {self.a.num_layers} flags, one per layer, got shape {flags.shape}")
        return flags

    def gather(self, int64_t layer, spans, int64_t num_tokens):
        """Dense (k, v), each (num_kv_heads, num_tokens, head_dim) f32, read through spans
        (q8: dequantized, scale * value)."""
        _require(spans, "spans", 2, np.int64, 3)
        k = np.empty((self.a.num_kv_heads, num_tokens, self.a.head_dim), np.float32)
        v = np.empty_like(k)
        cdef int st
        cdef const int64_t *sp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>spans)
        cdef float *kp = <float *>cnp.PyArray_DATA(<cnp.ndarray>k)
        cdef float *vp = <float *>cnp.PyArray_DATA(<cnp.ndarray>v)
        cdef int64_t ns = spans.shape[0]
        with nogil:
            st = dp_kv_gather(&self.a, layer, sp, ns, num_tokens, kp, vp)
        _check(st, f"gather of {num_tokens} tokens from layer {layer}", "the arena")
        return k, v

    def attention(self, int64_t layer, q, spans, int64_t pos0, float scale=0.0, int prefetch_degree=0,
                  str kernel=None, ThreadPool pool=None, float softcap=0.0, int64_t window=0,
                  bint decode_on_caller=False):
        """Causal attention of q (T, num_heads, head_dim) f32 at positions [pos0, pos0 + T),
        with ``kernel`` (default: the dispatched one) on ``pool`` (default: this thread);
        ``softcap`` > 0 caps scores (Gemma 2), ``window`` > 0 is a sliding window;
        ``decode_on_caller``: a decode runs on this thread alone (no flash-decoding split)."""
        if softcap < 0 or window < 0:
            raise ValueError(f"softcap={softcap} and window={window} must be >= 0")
        _require(q, "q", 3, np.float32)
        _require(spans, "spans", 2, np.int64, 3)
        if q.shape[2] != self.a.head_dim:
            raise ValueError(f"q head_dim {q.shape[2]} != arena head_dim {self.a.head_dim}")
        out = np.empty_like(q)
        cdef int64_t T = q.shape[0], H = q.shape[1], hd = q.shape[2], ns = spans.shape[0]
        cdef dp_attn_params params
        params.scale = scale if scale > 0 else 1.0 / np.sqrt(hd)
        params.softcap = softcap
        params.window = window
        params.prefetch_degree = prefetch_degree
        params.decode_on_caller = decode_on_caller
        cdef int st
        cdef const float *qp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>q)
        cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
        cdef const int64_t *sp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>spans)
        cdef const dp_attn_ops *ops = _ops_for(kernel)
        cdef dp_pool *pp = pool.pool if pool is not None else NULL
        with nogil:
            st = dp_attn_spans(&self.a, ops, pp, layer, qp, H * hd, op, H * hd, H, sp, ns, pos0, T, params)
        _check(st, f"attention (layer {layer}, pos0 {pos0}, {T} tokens, {ns} spans)", "the arena")
        return out


cdef class ArenaStepper:
    """One layer step over bound buffers: write K/V at ``slots``, then attend for every
    sequence of the step over its ``spans`` (``step_batch``; one sequence is a batch of one).

    q, out: (max_tokens, num_heads * head_dim) f32; k, v: (max_tokens, kv_dim) f32
    slots:  (max_tokens, 3) int64; spans: (max_spans, 3) int64
    seqs:   (max_seqs, 5) int64 rows (row0, num_tokens, pos0, span0, num_spans) for
            ``step_batch`` (see dp_attn_batch); optional

    The stepper owns the attention's scratch (a dp_attn_workspace: the batch's jobs,
    span starts, flash-decoding partials and one slice per pool thread), grown when a
    step needs more and kept: once warm, a layer step allocates nothing. One step at a
    time: a step entered while another runs (another Python thread, the GIL released)
    is refused with a RuntimeError instead of sharing the scratch.
    """
    cdef KVArena arena
    cdef dp_attn_workspace ws
    cdef bint busy
    cdef readonly object q, k, v, out, slots, spans, seqs
    cdef readonly ThreadPool pool
    cdef const dp_attn_ops *ops
    cdef int64_t num_heads, max_tokens, max_spans, kv_stride, q_stride, max_seqs
    cdef float scale, softcap
    cdef int prefetch_degree
    cdef readonly bint decode_on_caller
    cdef object windows  # (num_layers,) int64: each layer's sliding window, 0 = none

    def __init__(self, KVArena arena, q, k, v, out, slots, spans, float scale, int prefetch_degree,
                 ThreadPool pool=None, str kernel=None, seqs=None, float softcap=0.0, windows=None,
                 bint decode_on_caller=False):
        kv_dim = arena.num_kv_heads * arena.head_dim
        for name, a in (("q", q), ("out", out)):
            _require(a, name, 2, np.float32)
        _require(k, "k", 2, np.float32, kv_dim)
        _require(v, "v", 2, np.float32, kv_dim)
        _require(slots, "slots", 2, np.int64, 3)
        _require(spans, "spans", 2, np.int64, 3)
        if q.shape != out.shape or q.shape[1] % arena.head_dim or q.shape[0] != k.shape[0] \
                or k.shape != v.shape or slots.shape[0] != q.shape[0]:
            raise ValueError("q/out/k/v/slots shapes are inconsistent")
        self.arena = arena
        self.q, self.k, self.v, self.out, self.slots, self.spans = q, k, v, out, slots, spans
        if seqs is not None:
            _require(seqs, "seqs", 2, np.int64, 5)
        self.seqs = seqs
        self.max_seqs = seqs.shape[0] if seqs is not None else 0
        self.num_heads = q.shape[1] // arena.head_dim
        if self.num_heads % arena.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.max_tokens = q.shape[0]
        self.max_spans = spans.shape[0]
        self.kv_stride = kv_dim
        self.q_stride = q.shape[1]
        self.scale = scale
        self.prefetch_degree = prefetch_degree
        self.decode_on_caller = decode_on_caller
        if softcap < 0:
            raise ValueError(f"softcap={softcap} must be >= 0")
        self.softcap = softcap
        w = np.zeros(arena.num_layers, np.int64) if windows is None else np.array(windows, np.int64)
        if w.shape != (arena.num_layers,) or (w < 0).any():
            raise ValueError(f"windows must be {arena.num_layers} non-negative sliding windows (0 = none)")
        self.windows = w
        self.pool = pool
        self.ops = _ops_for(kernel)

    def __dealloc__(self):
        dp_attn_workspace_free(&self.ws)

    @property
    def kernel(self):
        return dp_ops_name(self.ops).decode()

    @property
    def workspace_bytes(self):
        """Bytes of attention scratch the stepper holds (0 before its first step)."""
        return self.ws.bytes

    def step_batch(self, int64_t layer, int64_t num_rows, int64_t num_seqs, int64_t num_spans):
        """Write the K/V of rows [0, num_rows) at their slots, then attend for every
        sequence of ``seqs[:num_seqs]`` over ``spans[:num_spans]``: one C call, one pool
        run. Slots, sequences and spans are all checked, and the scratch grown, before
        the first write, so a refused step (MemoryError included) leaves the arena as
        it was."""
        if num_rows < 1 or num_rows > self.max_tokens:
            raise ValueError(f"num_rows {num_rows} out of range [1, {self.max_tokens}]")
        if num_seqs < 1 or num_seqs > self.max_seqs:
            raise ValueError(f"num_seqs {num_seqs} out of range [1, {self.max_seqs}]")
        if num_spans < 1 or num_spans > self.max_spans:
            raise ValueError(f"num_spans {num_spans} out of range [1, {self.max_spans}]")
        cdef int st
        cdef const dp_arena *a = &self.arena.a
        cdef const float *kp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.k)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.v)
        cdef const float *qp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.q)
        cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>self.out)
        cdef const int64_t *slp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>self.slots)
        cdef const int64_t *spp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>self.spans)
        cdef const int64_t *sqp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>self.seqs)
        cdef dp_pool *pp = self.pool.pool if self.pool is not None else NULL
        cdef dp_attn_params params
        params.scale = self.scale
        params.softcap = self.softcap
        # (a layer out of range is the C call's DP_ERR_BOUNDS)
        params.window = (<const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>self.windows))[layer] \
            if 0 <= layer < a.num_layers else 0
        params.prefetch_degree = self.prefetch_degree
        params.decode_on_caller = self.decode_on_caller
        if self.busy:
            raise RuntimeError("ArenaStepper.step_batch entered while another step of this stepper runs "
                               "(it owns one scratch workspace: give each thread its own stepper)")
        self.busy = True
        try:
            with nogil:
                st = dp_step_batch(a, self.ops, pp, layer, kp, vp, self.kv_stride, slp, qp, self.q_stride, op,
                                   self.q_stride, self.num_heads, num_rows, sqp, num_seqs, spp, num_spans, params,
                                   &self.ws)
        finally:
            self.busy = False
        if st != DP_OK:
            bad = _bad_slot(a, self.slots[:num_rows], "slots")
            _check(st, f"batched attention step (layer {layer}, {num_rows} rows, {num_seqs} sequences)"
                       f"{bad or ' (in seqs or spans)'}", "the arena")


cdef class QMatmul:
    """``out[:R] = x[:R] @ W.T`` in our kernels, W in the 8-bit MatMulNBits form read in
    place (csrc/qmatmul.h): the classifier, instead of ONNX Runtime's packed copy of it.

    w:      (N, K / bs, bs) uint8, values + 128;  scales: (N * K / bs,) f32
    x:      (max_rows, K) f32;  out: (max_rows, N) f32, both bound once

    ``run(R, pool)`` multiplies the first R rows, on ``pool`` (split by rows of W) or, with
    None, on the calling thread. ``int8_act``: activations quantized to int8 per block, as
    MatMulNBits quantizes them at accuracy level 4; else f32 as given.
    """
    cdef readonly object w, scales, x, out
    cdef const dp_attn_ops *ops
    cdef int64_t N, K, bs, max_rows
    cdef readonly bint int8_act

    def __init__(self, w, scales, x, out, str kernel=None, bint int8_act=True):
        _require(w, "w", 3, np.uint8)
        _require(scales, "scales", 1, np.float32)
        _require(x, "x", 2, np.float32)
        _require(out, "out", 2, np.float32)
        self.N, self.bs, self.K = w.shape[0], w.shape[2], x.shape[1]
        if self.bs not in (16, 32) or w.shape[1] * self.bs != self.K or self.K % 32:
            raise ValueError(f"w {w.shape} is not rows of {self.K} values in blocks of 16 or 32 "
                             f"(K a multiple of 32)")
        if scales.shape[0] != self.N * w.shape[1]:
            raise ValueError(f"scales {scales.shape} do not match w {w.shape}")
        if out.shape[1] != self.N or out.shape[0] != x.shape[0]:
            raise ValueError(f"out {out.shape} does not match x {x.shape} and w's {self.N} rows")
        self.ops = _ops_for(kernel)
        self.w, self.scales, self.x, self.out = w, scales, x, out
        self.max_rows = x.shape[0]
        self.int8_act = int8_act

    def run(self, int64_t R, ThreadPool pool=None):
        if not 1 <= R <= self.max_rows:
            raise ValueError(f"R={R} outside 1..{self.max_rows}")
        cdef dp_pool *pp = pool.pool if pool is not None else NULL
        cdef const uint8_t *wp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>self.w)
        cdef const float *sp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.scales)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.x)
        cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>self.out)
        cdef int64_t wl = self.w.size, sl = self.scales.size, ol = self.out.size
        cdef int st
        with nogil:
            st = dp_qmatmul(pp, self.ops, wp, wl, sp, sl, self.bs, self.N, self.K, xp, R, op, ol, self.N,
                            self.int8_act)
        _check(st, f"classifier product ({R} x {self.K} by {self.N})", "the matrix")


LFORM_TYPES = tuple(dp_lkinds[i].name.decode() for i in range(DP_L_NUM_KINDS))
"""The GGML types our layer products take (csrc/lmatmul.h's form)."""


cdef int _lkind(str type_name) except -1:
    if type_name not in LFORM_TYPES:
        raise ValueError(f"GGML type {type_name!r} has no layer-product form (those that do: "
                         f"{', '.join(LFORM_TYPES)})")
    return LFORM_TYPES.index(type_name)


def lform_bytes(str type_name, int64_t N, int64_t K):
    """Bytes of the form (csrc/lmatmul.h) of an N x K ``type_name`` weight, or 0 when N is
    not whole groups of 16 rows or K not whole superblocks."""
    return dp_lform_bytes(_lkind(type_name), N, K)


def lform_from_ggml(raw, str type_name, shape, out):
    """The GGML blocks ``raw`` (uint8, C-contiguous: exactly the file's bytes of a
    ``shape`` = (N, K) weight) rearranged into ``out`` (uint8, C-contiguous,
    ``lform_bytes`` long): the form our layer products read (csrc/lmatmul.h)."""
    cdef int kind = _lkind(type_name)
    cdef int64_t N = shape[0], K = shape[1]
    cdef int64_t need = dp_lform_bytes(kind, N, K)
    if not need:
        raise ValueError(f"{type_name} weight of shape {tuple(shape)}: rows must be a multiple of 16 and "
                         f"columns of {dp_lkinds[kind].sb}")
    _require(raw, "raw", 1, np.uint8)
    _require(out, "out", 1, np.uint8)
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    cdef const uint8_t *rp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>raw)
    cdef uint8_t *op = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int64_t rb = raw.size, ob = out.size
    cdef int st
    with nogil:
        st = dp_lform_from_ggml(kind, rp, rb, N, K, op, ob)
    _check(st, f"lform_from_ggml({type_name}, shape {tuple(shape)})", "the raw blocks or out")


def lform_rows(form, str type_name, shape, ids, out):
    """Rows ``ids`` (int64, 1-D) of an (N, K) ``type_name`` weight in the form (csrc/lmatmul.h)
    as f32 values into ``out`` (len(ids), K): a tied embedding's lookup. An id outside
    [0, N) raises IndexError before anything is written."""
    cdef int kind = _lkind(type_name)
    cdef int64_t N = shape[0], K = shape[1]
    _require(form, "form", 1, np.uint8)
    _require(ids, "ids", 1, np.int64)
    _require(out, "out", 2, np.float32)
    if out.shape[0] < ids.shape[0] or out.shape[1] != K or not out.flags.writeable:
        raise ValueError(f"out {out.shape} cannot hold {ids.shape[0]} writeable rows of {K} values")
    cdef const uint8_t *wp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>form)
    cdef const int64_t *ip = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int64_t wl = form.size, n = ids.shape[0], ol = out.size
    cdef int st
    with nogil:
        st = dp_lform_rows(kind, wp, wl, N, K, ip, n, op, ol)
    if st == DP_ERR_BOUNDS and wl >= dp_lform_bytes(kind, N, K):
        bad = ids[(ids < 0) | (ids >= N)]
        raise IndexError(f"token id {int(bad[0])} outside the table's {N} rows")
    _check(st, f"lform_rows({type_name}, shape {tuple(shape)})", "the form")


cdef class LMatmul:
    """``outs[j][:R] = x[:R] @ W_j.T`` for every weight j, in our kernels over the form of
    csrc/lmatmul.h read in place (a layer's products, instead of ONNX Runtime's packed
    copies): the activations are quantized once for all of them.

    weights: [(type_name, form (uint8, 1-D), out (max_rows, N_j) f32)], at most 8; an out
             may be a view of a wider array's columns (rows strided, values contiguous)
    x:       (max_rows, K) f32

    ``run(R, pool)`` multiplies the first R rows, on ``pool`` (split by groups of 16 rows
    of the weights) or, with None, on the calling thread. ``int8_act``: activations
    quantized to int8 per block of 32 (as llama.cpp and MatMulNBits at accuracy level 4
    do); else f32 as given (slower: an exactness mode).
    """
    cdef readonly object weights, x
    cdef const dp_attn_ops *ops
    cdef dp_ljob jobs[8]
    cdef int njobs
    cdef int64_t K, max_rows
    cdef readonly bint int8_act
    cdef const uint8_t *ahead
    cdef int64_t ahead_bytes
    cdef object ahead_owner

    def __init__(self, weights, x, str kernel=None, bint int8_act=True):
        _require(x, "x", 2, np.float32)
        if not 1 <= len(weights) <= 8:
            raise ValueError(f"{len(weights)} weights: a product takes 1 to 8")
        self.K, self.max_rows = x.shape[1], x.shape[0]
        cdef int64_t N, need
        cdef int kind
        cdef cnp.ndarray o
        self.njobs = 0
        for type_name, form, out in weights:
            kind = _lkind(type_name)
            _require(form, "form", 1, np.uint8)
            if not isinstance(out, np.ndarray) or out.ndim != 2 or out.dtype != np.float32:
                raise ValueError(f"out must be a 2-d float32 array, got {getattr(out, 'shape', type(out).__name__)}")
            o = <cnp.ndarray>out
            N = out.shape[1]
            if out.shape[0] != self.max_rows or out.strides[1] != 4 or out.strides[0] % 4 or \
                    out.strides[0] < 4 * N or not out.flags.writeable:
                raise ValueError(f"out {out.shape} (strides {out.strides}) is not {self.max_rows} writeable rows "
                                 f"of contiguous float32 values")
            need = dp_lform_bytes(kind, N, self.K)
            if not need or form.size != need:
                raise ValueError(f"{type_name} form of {form.size} bytes is not {N} x {self.K} "
                                 f"(that is {need} bytes; rows a multiple of 16)")
            self.jobs[self.njobs].kind = kind
            self.jobs[self.njobs].w = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>form)
            self.jobs[self.njobs].w_len = need
            self.jobs[self.njobs].N = N
            self.jobs[self.njobs].out = <float *>cnp.PyArray_DATA(o)
            self.jobs[self.njobs].ldo = out.strides[0] // 4
            self.jobs[self.njobs].out_len = (self.max_rows - 1) * (out.strides[0] // 4) + N
            self.njobs += 1
        self.ops = _ops_for(kernel)
        self.weights, self.x = list(weights), x
        self.int8_act = int8_act

    def per_256(self, int64_t R):
        """Whether ``run(R)`` quantizes the activations with one scale per 256 values, not per
        32 (csrc/dp_attn_ops.h ``dp_lmatmul_sb256``: a prefill of Q4_K weights on an ISA that
        folds their scales)."""
        return self.int8_act and dp_lmatmul_sb256(self.ops, self.jobs, self.njobs, R, self.K) != 0

    def read_ahead(self, LMatmul following, int64_t max_bytes):
        """After each ``run`` on a pool, its workers read the first ``max_bytes`` of
        ``following``'s first weight into their caches while they wait for the next job
        (csrc/dp_pool.h ``dp_pool_warm``): the product that comes next, whose weights then
        start streaming during the graph parts between the two. None or 0 stops it."""
        if following is None or max_bytes <= 0:
            self.ahead, self.ahead_bytes, self.ahead_owner = NULL, 0, None
            return
        self.ahead = following.jobs[0].w
        self.ahead_bytes = min(max_bytes, following.jobs[0].w_len)
        self.ahead_owner = following.weights[0][1]

    @property
    def read_ahead_bytes(self) -> int:
        """Bytes of the following product's first weight its workers read ahead (0: none)."""
        return self.ahead_bytes

    def run(self, int64_t R, ThreadPool pool=None):
        if not 1 <= R <= self.max_rows:
            raise ValueError(f"R={R} outside 1..{self.max_rows}")
        cdef dp_pool *pp = pool.pool if pool is not None else NULL
        cdef const float *xp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.x)
        cdef int st
        with nogil:
            st = dp_lmatmul(pp, self.ops, self.jobs, self.njobs, xp, R, self.K, self.int8_act)
        if pool is not None and self.ahead != NULL:
            pool.warm(self.ahead_owner, self.ahead, self.ahead_bytes)
        if st != DP_OK:
            _check(st, f"layer product ({R} x {self.K} by {', '.join(str(w[2].shape[1]) for w in self.weights)})",
                   "the weights")


cdef class EncAttention:
    """An encoder's attention over packed texts (csrc/enc_attn.h), in our kernels: for each
    text of a batch and each head, ``out = softmax(scale * q k^T) v`` over the text's own
    tokens.

    q, k, v: (max_rows, num_heads * head_dim) f32 with one row stride (rows strided, values
             contiguous), out: the same shape, writeable (its own row stride)

    ``run(starts, pool)``: ``starts`` (B + 1,) int64 the texts' first rows, ``starts[0] = 0``,
    non-decreasing, ``starts[-1]`` the batch's rows (at most max_rows); on ``pool`` (a task per
    head of a text) or, with None, on the calling thread.
    """
    cdef readonly object q, k, v, out
    cdef const dp_attn_ops *ops
    cdef int64_t nh, hd, ld, ldo, max_rows
    cdef float scale

    def __init__(self, q, k, v, out, int64_t num_heads, float scale, str kernel=None):
        for a, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype != np.float32 or a.strides[1] != 4 or \
                    a.strides[0] % 4 or a.shape != q.shape:
                raise ValueError(f"{name} must be a 2-d float32 array of contiguous rows shaped like q {q.shape}, "
                                 f"got {getattr(a, 'shape', type(a).__name__)}")
        if not (k.strides[0] == v.strides[0] == q.strides[0]):
            raise ValueError(f"q, k and v must share a row stride, got {q.strides[0]}, {k.strides[0]}, {v.strides[0]}")
        if not out.flags.writeable:
            raise ValueError("out must be writeable")
        if num_heads < 1 or q.shape[1] % num_heads:
            raise ValueError(f"{q.shape[1]} columns are not {num_heads} heads")
        self.q, self.k, self.v, self.out = q, k, v, out
        self.nh, self.hd, self.max_rows = num_heads, q.shape[1] // num_heads, q.shape[0]
        self.ld, self.ldo, self.scale = q.strides[0] // 4, out.strides[0] // 4, scale
        self.ops = _ops_for(kernel)

    def run(self, starts, ThreadPool pool=None):
        _require(starts, "starts", 1, np.int64)
        cdef int64_t B = starts.shape[0] - 1
        if B < 1:
            raise ValueError("starts must hold at least one text (B + 1 >= 2 values)")
        cdef int64_t rows = starts[B]
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"{rows} rows outside 1..{self.max_rows}")
        cdef dp_pool *pp = pool.pool if pool is not None else NULL
        cdef const int64_t *sp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>starts)
        cdef const float *qp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.q)
        cdef const float *kp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.k)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>self.v)
        cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>self.out)
        cdef int st
        with nogil:
            st = dp_enc_attention(pp, self.ops, qp, kp, vp, self.ld, rows, sp, B, self.nh, self.hd, self.scale,
                                  op, self.ldo)
        _check(st, f"encoder attention ({B} texts, {rows} rows, {self.nh} heads of {self.hd})",
               "the texts' rows (starts must begin at 0, never decrease and end at the batch's rows)")
