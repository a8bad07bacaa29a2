"""Model files before and after a loader reads them: the checks every format shares, and
the memory mapping an array was read from.

Each check has one message, whichever loader (``load_model``, ``load_gguf``,
``load_llama2c``, the converted-model cache) runs it first.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
"""The first 4 bytes of every GGUF file."""


def read_magic(path: str) -> bytes:
    """The first 4 bytes of ``path``, after the checks every format shares: it is a file,
    not empty, and readable."""
    if os.path.isdir(path):
        raise ModelLoadError(path, "is a folder; Hugging Face folders are not supported yet "
                                   "(pass a .gguf or llama2.c .bin)")
    if not os.path.isfile(path):
        raise ModelLoadError(path, "no such file")
    if os.path.getsize(path) == 0:
        raise ModelLoadError(path, "empty file (0 bytes), not a model")
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read: {e.strerror or e}") from e


def check_model_file(path: str) -> bytes:
    """``read_magic``, and a file named ``*.gguf`` must be a GGUF file."""
    magic = read_magic(path)
    if path.endswith(".gguf"):
        _check_gguf_magic(path, magic)
    return magic


def check_gguf_file(path: str) -> None:
    """``read_magic``, and the file must be a GGUF file whatever its name."""
    _check_gguf_magic(path, read_magic(path))


def _check_gguf_magic(path: str, magic: bytes) -> None:
    if magic != GGUF_MAGIC:
        raise ModelLoadError(path, f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


def mapped_memmap(arr: np.ndarray) -> np.memmap | None:
    """The np.memmap that ``arr`` is a view of and that owns the mapping (its ``base`` is the
    ``mmap.mmap``, and its first byte is at file offset ``offset``), or None. A slice of a
    memmap is a memmap too, but keeps its parent's ``offset``: only the owner's is exact."""
    base: np.ndarray | None = arr
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and isinstance(base.base, mmap.mmap):
            return base
        base = base.base
    return None
