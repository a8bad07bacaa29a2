# Argument checks and C status codes -> Python exceptions, shared by the extension
# modules (``include``d, so each module compiles its own copy of this one source).
import os

import numpy as np
from libc.errno cimport errno


class ArrayDTypeError(TypeError, ValueError):
    """An array has the wrong element type (a TypeError, and a ValueError like every
    other bad-argument error of these modules)."""


class OutOfBoundsError(IndexError, ValueError):
    """A position, index, slot or span outside its buffer (an IndexError, and a
    ValueError like every other bad-argument error of these modules)."""


cdef int _check(int status, str what, str outside) except -1:
    """Raise for a non-OK status; ``outside`` names what a bounds error left."""
    if status == DP_OK:
        return 0
    if status == DP_ERR_BOUNDS:
        raise OutOfBoundsError(f"{what}: position, index, slot or span outside {outside}")
    if status == DP_ERR_ALIGN:
        raise ValueError(f"{what}: a slot or span does not start a tile of {outside} (a tile starts at a "
                         f"multiple of its size inside its block and does not cross into the next block)")
    if status == DP_ERR_NOMEM:
        raise MemoryError(f"{what}: out of memory (a kernel buffer could not be allocated); "
                          f"the output was not computed")
    if status == DP_ERR_IO:
        code = errno  # the failed call's, read before anything else can change it
        raise OSError(code, f"{what}: {os.strerror(code)} (reading {outside})")
    if status == DP_ERR_THREAD:
        raise RuntimeError(f"{what}: thread creation failed (pthread_create; the process may be at its "
                           f"thread limit, see ulimit -u)")
    raise ValueError(f"{what}: invalid argument (shape, stride or dtype)")


def _require(a, str name, int ndim, dtype=None, int cols=0):
    """``a`` is a C-contiguous ndim-d numpy array (of ``dtype``, with ``cols`` columns)."""
    if not isinstance(a, np.ndarray) or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d numpy array, got {getattr(a, 'shape', type(a).__name__)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if dtype is not None and a.dtype != dtype:
        raise ArrayDTypeError(f"{name} must be {np.dtype(dtype)}, got {a.dtype}")
    if cols and a.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {a.shape}")
