"""The memory mappings of a cache entry: dropping pages from this process, madvise,
transparent huge pages, and where an array lies in a mapping or a source file."""

from __future__ import annotations

import mmap
import os

import numpy as np

from .files import mapped_memmap

FAULT_AROUND_BYTES = 64 << 10
"""Linux's default ``fault_around_bytes``: a read fault on a file mapping maps the pages
of the aligned 64 KiB window around it that are in the page cache."""


def drop_range(m: mmap.mmap, start: int, nbytes: int) -> None:
    """Unmap the pages of ``m[start : start + nbytes]`` from this process, and the rest of
    the fault-around windows they lie in: reading a small array mapped its whole window
    (the padding to the next array, the next array's first pages), and dropping the array's
    own pages alone left many MiB of such neighbours resident on Gemma 3 270M. Read-only file
    pages: a later read maps them back from the page cache, so dropping a neighbour's pages
    is harmless."""
    if hasattr(m, "madvise") and nbytes > 0:
        lo = start // FAULT_AROUND_BYTES * FAULT_AROUND_BYTES
        hi = min(len(m), -(-(start + nbytes) // FAULT_AROUND_BYTES) * FAULT_AROUND_BYTES)
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


MADV_POPULATE_READ = 22
"""madvise: map the range's pages now, reading what is not cached (Linux 5.14)."""
THP_SYSFS = "/sys/kernel/mm/transparent_hugepage"


def advise(m: mmap.mmap, advice: int | None, start: int = 0, length: int | None = None) -> bool:
    """``m.madvise(advice, ...)``; False where the platform or kernel does not take it."""
    if advice is None or not hasattr(m, "madvise") or len(m) == 0:
        return False
    try:
        m.madvise(advice, start, len(m) - start if length is None else length)
    except (OSError, ValueError):
        return False
    return True


def huge_page_bytes() -> int | None:
    """The size of a PMD huge page when transparent huge pages are on (not ``never``)."""
    try:
        with open(os.path.join(THP_SYSFS, "enabled")) as f:
            if "[never]" in f.read():
                return None
        with open(os.path.join(THP_SYSFS, "hpage_pmd_size")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def pmd_mapped(m: mmap.mmap) -> int | None:
    """Bytes of ``m`` that this process maps with huge-page (PMD) entries: the
    FilePmdMapped of its areas in /proc/self/smaps; None where that is unknown."""
    lo = np.frombuffer(m, np.uint8, 1).ctypes.data
    hi = lo + len(m)
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    a, b = line.split(" ", 1)[0].split("-")
                    inside = lo <= int(a, 16) and int(b, 16) <= -(-hi // mmap.PAGESIZE) * mmap.PAGESIZE
                elif inside and line.startswith("FilePmdMapped:"):
                    total += int(line.split()[1]) << 10
    except (OSError, ValueError):
        return None
    return total


def offset_in(m: mmap.mmap, a: np.ndarray) -> int | None:
    """``a``'s offset inside mapping ``m``, or None when it lies elsewhere."""
    if len(m) == 0:
        return None
    start = a.ctypes.data - np.frombuffer(m, np.uint8, 1).ctypes.data
    return start if 0 <= start < len(m) else None


def source_offset(arr: np.ndarray, path: str) -> int | None:
    """The offset in file ``path`` of an array that is a view of an np.memmap of it, or None."""
    owner = mapped_memmap(arr)
    if owner is None:
        return None
    if not (owner.filename and os.path.exists(owner.filename) and os.path.samefile(owner.filename, path)):
        return None
    return int(owner.offset + arr.ctypes.data - owner.ctypes.data)


