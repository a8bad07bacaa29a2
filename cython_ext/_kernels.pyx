# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over DualPath's C kernels.

The checked functions (``kv_write``, ``attention``, ``embed``) validate shapes and
dtypes and are what tests and one-off callers use. ``ContiguousKV`` binds its
buffers once and then runs a whole layer step (write K/V, attend) per call with
only small integers crossing the boundary: nothing is allocated per token.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uintptr_t
from dp_kernels cimport *

cnp.import_array()

_DTYPES = {"f32": DP_F32, "f16": DP_F16}


cdef int _check(int status, str what) except -1:
    if status == DP_OK:
        return 0
    if status == DP_ERR_BOUNDS:
        raise IndexError(f"{what}: position or index out of bounds")
    if status == DP_ERR_NOMEM:
        raise MemoryError(what)
    raise ValueError(f"{what}: invalid argument (shape, stride or dtype)")


cdef int _kv_code(object a) except -1:
    if a.dtype == np.float32:
        return DP_F32
    if a.dtype == np.float16:
        return DP_F16
    raise TypeError(f"KV cache dtype must be float32 or float16, got {a.dtype}")


def _require(a, str name, int ndim, dtype=None):
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name} must be {np.dtype(dtype)}, got {a.dtype}")


def kv_write(src, cache, int64_t pos):
    """Write ``src`` (num_tokens, num_kv_heads, head_dim) f32 into ``cache``
    (num_kv_heads, capacity, head_dim) f32/f16 at positions [pos, pos + num_tokens)."""
    _require(src, "src", 3, np.float32)
    _require(cache, "cache", 3)
    if src.shape[1] != cache.shape[0] or src.shape[2] != cache.shape[2]:
        raise ValueError(f"src {src.shape} does not match cache {cache.shape}")
    cdef int code = _kv_code(cache)
    cdef int st
    cdef const float *s = <const float *>cnp.PyArray_DATA(<cnp.ndarray>src)
    cdef void *c = cnp.PyArray_DATA(<cnp.ndarray>cache)
    cdef int64_t nkv = cache.shape[0], cap = cache.shape[1], hd = cache.shape[2], n = src.shape[0]
    with nogil:
        st = dp_kv_write_generic(s, nkv * hd, c, code, nkv, cap, hd, pos, n)
    _check(st, f"kv_write(pos={pos}, num_tokens={n}, capacity={cap})")


def attention(q, k_cache, v_cache, int64_t pos0, scale=None):
    """Causal attention of ``q`` (num_tokens, num_heads, head_dim) f32 at positions
    [pos0, pos0 + num_tokens) over caches (num_kv_heads, capacity, head_dim).
    Returns (num_tokens, num_heads, head_dim) f32."""
    _require(q, "q", 3, np.float32)
    _require(k_cache, "k_cache", 3)
    _require(v_cache, "v_cache", 3)
    if k_cache.dtype != v_cache.dtype or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must have the same shape and dtype")
    if q.shape[2] != k_cache.shape[2]:
        raise ValueError(f"q head_dim {q.shape[2]} != cache head_dim {k_cache.shape[2]}")
    cdef int code = _kv_code(k_cache)
    cdef int64_t n = q.shape[0], nh = q.shape[1], hd = q.shape[2]
    cdef int64_t nkv = k_cache.shape[0], cap = k_cache.shape[1]
    cdef float sc = (1.0 / np.sqrt(hd)) if scale is None else scale
    out = np.empty((n, nh, hd), dtype=np.float32)
    cdef int st
    cdef const float *qp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>q)
    cdef const void *kp = cnp.PyArray_DATA(<cnp.ndarray>k_cache)
    cdef const void *vp = cnp.PyArray_DATA(<cnp.ndarray>v_cache)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    with nogil:
        st = dp_attn_f32out_generic(qp, nh * hd, kp, vp, code, op, nh * hd,
                                    nh, nkv, hd, cap, pos0, n, sc)
    _check(st, f"attention(pos0={pos0}, num_tokens={n}, capacity={cap}, heads={nh}/{nkv})")
    return out


def embed(ids, table, scales=None, str dtype="f32", out=None):
    """Gather rows ``ids`` (num_tokens,) int64 from an embedding table into ``out``
    (num_tokens, dim) f32. ``table`` is (vocab, dim) f32, or a MatMulNBits blob
    (vocab, dim/32, 32|16) uint8 with ``scales`` (vocab * dim/32,) f32 for q8_0/q4_0."""
    _require(ids, "ids", 1, np.int64)
    cdef int code
    cdef int64_t vocab = table.shape[0], dim
    if dtype == "f32":
        _require(table, "table", 2, np.float32)
        code = DP_F32
        dim = table.shape[1]
    elif dtype in ("q8_0", "q4_0"):
        _require(table, "table", 3, np.uint8)
        if scales is None:
            raise ValueError(f"{dtype} embedding needs scales")
        _require(scales, "scales", 1, np.float32)
        code = DP_Q8_0 if dtype == "q8_0" else DP_Q4_0
        dim = table.shape[1] * 32
        if table.shape[2] != (32 if dtype == "q8_0" else 16) or scales.shape[0] != vocab * table.shape[1]:
            raise ValueError(f"{dtype} table {table.shape} / scales {scales.shape} are inconsistent")
    else:
        raise ValueError(f"unsupported embedding dtype {dtype!r}")
    if out is None:
        out = np.empty((ids.shape[0], dim), dtype=np.float32)
    _require(out, "out", 2, np.float32)
    if out.shape[0] < ids.shape[0] or out.shape[1] != dim:
        raise ValueError(f"out {out.shape} cannot hold {ids.shape[0]} rows of {dim}")
    cdef int st
    cdef const void *tp = cnp.PyArray_DATA(<cnp.ndarray>table)
    cdef const float *sp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>scales) if scales is not None else NULL
    cdef const int64_t *ip = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int64_t n = ids.shape[0]
    with nogil:
        st = dp_embed_generic(tp, sp, code, vocab, dim, ip, n, op)
    _check(st, f"embed(vocab={vocab})")
    return out


cdef class ContiguousKV:
    """A contiguous per-sequence KV cache bound to fixed q/k/v/out buffers.

    k_cache, v_cache: (num_layers, num_kv_heads, capacity, head_dim) f32 or f16
    q, out:           (max_tokens, num_heads * head_dim) f32
    k, v:             (max_tokens, num_kv_heads * head_dim) f32
    ``step(layer, pos0, num_tokens)`` writes rows [0, num_tokens) of k/v at
    positions [pos0, pos0 + num_tokens) of ``layer`` and attends q into out.
    """
    cdef readonly object k_cache, v_cache, q, k, v, out
    cdef readonly int64_t num_layers, num_heads, num_kv_heads, head_dim, capacity, max_tokens
    cdef int kv_code
    cdef float scale
    cdef char *kc
    cdef char *vc
    cdef int64_t layer_bytes
    cdef const float *qp
    cdef const float *kp
    cdef const float *vp
    cdef float *op

    def __init__(self, k_cache, v_cache, q, k,
                 v, out, float scale):
        _require(k_cache, "k_cache", 4)
        _require(v_cache, "v_cache", 4)
        for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
            _require(a, name, 2, np.float32)
        if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
            raise ValueError("k_cache and v_cache must have the same shape and dtype")
        self.kv_code = _kv_code(k_cache)
        self.num_layers, self.num_kv_heads, self.capacity, self.head_dim = k_cache.shape
        if q.shape[1] % self.head_dim or out.shape != q.shape:
            raise ValueError(f"q {q.shape} / out {out.shape} do not fit head_dim {self.head_dim}")
        self.num_heads = q.shape[1] // self.head_dim
        kv_cols = self.num_kv_heads * self.head_dim
        if k.shape != (q.shape[0], kv_cols) or v.shape != (q.shape[0], kv_cols):
            raise ValueError(f"k {k.shape} / v {v.shape} must be ({q.shape[0]}, {kv_cols})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        self.max_tokens = q.shape[0]
        self.k_cache, self.v_cache, self.q, self.k, self.v, self.out = k_cache, v_cache, q, k, v, out
        self.scale = scale
        self.kc = <char *>cnp.PyArray_DATA(<cnp.ndarray>k_cache)
        self.vc = <char *>cnp.PyArray_DATA(<cnp.ndarray>v_cache)
        self.layer_bytes = self.num_kv_heads * self.capacity * self.head_dim * k_cache.itemsize
        self.qp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>q)
        self.kp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>k)
        self.vp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>v)
        self.op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)

    def step(self, int64_t layer, int64_t pos0, int64_t num_tokens):
        if layer < 0 or layer >= self.num_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.num_layers})")
        if num_tokens < 1 or num_tokens > self.max_tokens:
            raise ValueError(f"num_tokens {num_tokens} out of range [1, {self.max_tokens}]")
        cdef int st
        cdef int64_t kvs = self.num_kv_heads * self.head_dim
        cdef void *kl = self.kc + layer * self.layer_bytes
        cdef void *vl = self.vc + layer * self.layer_bytes
        with nogil:
            st = dp_kv_write_generic(self.kp, kvs, kl, self.kv_code, self.num_kv_heads,
                                     self.capacity, self.head_dim, pos0, num_tokens)
            if st == DP_OK:
                st = dp_kv_write_generic(self.vp, kvs, vl, self.kv_code, self.num_kv_heads,
                                         self.capacity, self.head_dim, pos0, num_tokens)
            if st == DP_OK:
                st = dp_attn_f32out_generic(self.qp, self.num_heads * self.head_dim, kl, vl,
                                            self.kv_code, self.op, self.num_heads * self.head_dim,
                                            self.num_heads, self.num_kv_heads, self.head_dim,
                                            self.capacity, pos0, num_tokens, self.scale)
        if st != DP_OK:
            _check(st, f"attention step (layer={layer}, pos0={pos0}, num_tokens={num_tokens}, capacity={self.capacity})")
