# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over DualPath's C kernels that do not touch the KV arena
(the arena and attention live in ``_kvarena``)."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t, uintptr_t
from dp_kernels cimport *

cnp.import_array()



include "dp_checks.pxi"


def embed(ids, table, scales=None, str dtype="f32", out=None):
    """Gather rows ``ids`` (num_tokens,) int64 from an embedding table into ``out``
    (num_tokens, dim) f32. ``table`` is (vocab, dim) f32, or a MatMulNBits blob
    (vocab, dim/32, 32|16) uint8 with ``scales`` (vocab * dim/32,) f32 for q8_0/q4_0."""
    _require(ids, "ids", 1, np.int64)
    if not isinstance(table, np.ndarray) or table.ndim < 1:
        raise ValueError(f"table must be a numpy array, got {type(table).__name__}")
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
    _check(st, f"embed(vocab={vocab})", "the embedding table")
    return out


def repack_ggml(raw, str dtype, blob, scales):
    """Repack GGML ``q8_0`` / ``q4_0`` blocks ``raw`` (uint8, 34 / 18 bytes a block)
    into the MatMulNBits ``blob`` (uint8, 32 / 16 bytes a block) and fp32 ``scales``
    (one a block), both preallocated and C-contiguous; sizes are checked."""
    if dtype not in ("q8_0", "q4_0"):
        raise ValueError(f"unsupported GGML block type {dtype!r} (q8_0, q4_0)")
    cdef int code = DP_Q8_0 if dtype == "q8_0" else DP_Q4_0
    cdef int64_t in_bytes = 34 if dtype == "q8_0" else 18
    for a, name, want in ((raw, "raw", np.uint8), (blob, "blob", np.uint8), (scales, "scales", np.float32)):
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or a.dtype != want:
            raise ValueError(f"{name} must be a C-contiguous {np.dtype(want)} numpy array")
    if not blob.flags.writeable or not scales.flags.writeable:
        raise ValueError("blob and scales must be writeable")
    cdef int64_t n = raw.nbytes // in_bytes
    if raw.nbytes % in_bytes:
        raise ValueError(f"{raw.nbytes} bytes are not whole {dtype} blocks of {in_bytes} bytes")
    cdef const uint8_t *rp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>raw)
    cdef uint8_t *bp = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>blob)
    cdef float *sp = <float *>cnp.PyArray_DATA(<cnp.ndarray>scales)
    cdef int64_t rb = raw.nbytes, bb = blob.nbytes, ns = scales.size
    cdef int st
    with nogil:
        st = dp_repack_ggml(rp, rb, code, n, bp, bb, sp, ns)
    _check(st, f"repack_ggml({dtype}, {n} blocks)", "the output arrays")
