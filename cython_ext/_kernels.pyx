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


def read_rows(int fd, int64_t offset, int64_t row_bytes, int64_t num_rows, ids, out):
    """Rows ``ids`` (n,) int64 of a table of ``num_rows`` rows of ``row_bytes`` stored in
    file ``fd`` from byte ``offset``, read (pread, not mapped) into ``out`` (a C-contiguous
    array of at least n * row_bytes bytes, its rows in order). Returns ``out``."""
    _require(ids, "ids", 1, np.int64)
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writable C-contiguous numpy array")
    cdef int64_t n = ids.shape[0]
    if row_bytes <= 0 or out.nbytes < n * row_bytes:
        raise ValueError(f"out ({out.nbytes} bytes) cannot hold {n} rows of {row_bytes} bytes")
    cdef const int64_t *ip = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
    cdef uint8_t *op = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st
    with nogil:
        st = dp_read_rows(fd, offset, row_bytes, num_rows, ip, n, op)
    _check(st, f"read_rows(fd={fd}, {num_rows} rows of {row_bytes} bytes at {offset})", "the table")
    return out


GGML_TYPES = tuple(dp_ggml_layouts[i].name.decode() for i in range(dp_num_ggml_layouts))
"""The GGML block types ``repack_ggml`` converts (csrc/ggml_repack.c's table)."""


def ggml_layout(str type_name):
    """GGML ``type_name`` (e.g. ``"Q4_K"``) and its MatMulNBits form: ``block`` and
    ``type_size`` (values and bytes a GGML block), ``bits``, ``block_size`` (values a
    scale) and ``zero_points`` (True: uint8 zero points and mins)."""
    if type_name not in GGML_TYPES:
        raise ValueError(f"unsupported GGML block type {type_name!r} (supported: {', '.join(GGML_TYPES)})")
    cdef const dp_ggml_layout *L = &dp_ggml_layouts[GGML_TYPES.index(type_name)]
    return {"block": L.block, "type_size": L.type_size, "bits": L.bits, "block_size": L.sub,
            "zero_points": bool(L.zero_points)}


def _out(a, str name, want, int64_t size):
    """``a`` is a writeable C-contiguous ``want`` array of ``size`` elements."""
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or a.dtype != want:
        raise ValueError(f"{name} must be a C-contiguous {np.dtype(want)} numpy array")
    if not a.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    if a.size != size:
        raise ValueError(f"{name} has {a.size} elements; this weight needs {size}")


def repack_ggml(raw, str type_name, shape, blob, scales, zero_points=None, mins=None):
    """Convert the GGML blocks ``raw`` (uint8, C-contiguous, exactly the bytes of a
    ``shape`` = (rows, cols) weight of ``type_name``) into its MatMulNBits arrays, all
    preallocated (see ``ggml_layout``; nb = cols / block_size): ``blob`` uint8
    (rows, nb, block_size * bits / 8), ``scales`` f32 (rows * nb,), and for the
    zero-point types ``zero_points`` uint8 (rows * ceil(nb * bits / 8),) and ``mins``
    f32 (rows, nb). Every size is checked; models/quants.py states the mappings."""
    layout = ggml_layout(type_name)
    cdef int64_t rows = shape[0], cols = shape[1]
    cdef int64_t block = layout["block"], bits = layout["bits"], sub = layout["block_size"]
    if rows < 0 or cols <= 0 or cols % block:
        raise ValueError(f"{type_name} weight of shape {tuple(shape)}: columns must be a positive multiple of {block}")
    if not isinstance(raw, np.ndarray) or not raw.flags.c_contiguous or raw.dtype != np.uint8:
        raise ValueError("raw must be a C-contiguous uint8 numpy array")
    cdef int64_t want = rows * (cols // block) * layout["type_size"], nb = cols // sub
    if raw.nbytes != want:
        raise ValueError(f"{type_name} weight of shape {tuple(shape)} is {want} bytes ({rows * (cols // block)} "
                         f"blocks of {layout['type_size']}), got {raw.nbytes}"
                         + (" (truncated)" if raw.nbytes < want else ""))
    _out(blob, "blob", np.uint8, rows * cols * bits // 8)
    _out(scales, "scales", np.float32, rows * nb)
    if layout["zero_points"]:
        _out(zero_points, "zero_points", np.uint8, rows * ((nb * bits + 7) // 8))
        _out(mins, "mins", np.float32, rows * nb)
    elif zero_points is not None or mins is not None:
        raise ValueError(f"{type_name} has no zero points or mins (offset {1 << (bits - 1)})")
    cdef const uint8_t *rp = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>raw)
    cdef uint8_t *bp = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>blob)
    cdef float *sp = <float *>cnp.PyArray_DATA(<cnp.ndarray>scales)
    cdef uint8_t *zp = NULL
    cdef float *mp = NULL
    cdef int64_t zb = 0, nm = 0, bb = blob.nbytes, ns = scales.size
    if layout["zero_points"]:
        zp, zb = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>zero_points), zero_points.nbytes
        mp, nm = <float *>cnp.PyArray_DATA(<cnp.ndarray>mins), mins.size
    cdef int st, code = GGML_TYPES.index(type_name)
    with nogil:
        st = dp_repack_ggml(rp, want, code, rows, cols, bp, bb, sp, ns, zp, zb, mp, nm)
    _check(st, f"repack_ggml({type_name}, shape {tuple(shape)})", "the output arrays")
