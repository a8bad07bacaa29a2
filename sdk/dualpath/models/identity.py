"""What names a source file's cache entry and what checks an entry's arrays: the file's
identity (size, mtime, sampled hashes), its inode, and XOR checksums of 8-byte words."""

from __future__ import annotations

import hashlib
import mmap
import os

import numpy as np

HEAD_BYTES = 1 << 16
SAMPLE_BLOCKS = 256
SAMPLE_BYTES = 4096
"""A file's identity hashes ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BYTES`` spread evenly
over the whole file (the whole file when it is smaller): new weights of the same size
under a kept mtime (``cp -p``, ``touch -r``) change a new key. A change of a few bytes
between the samples is caught by the source's checksum (``store.ModelStore._source_changed``)."""


def file_identity(path: str) -> dict:
    """What names a source file's entry: its size, mtime, and hashes of its first
    ``HEAD_BYTES`` and of blocks sampled across all of it (``SAMPLE_BLOCKS``)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        head = os.pread(fd, HEAD_BYTES, 0)
        sample = hashlib.blake2b(digest_size=16)
        size = st.st_size
        if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
            sample.update(os.pread(fd, size, 0))
        else:
            if hasattr(os, "posix_fadvise"):  # no readahead around each block
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for i in range(SAMPLE_BLOCKS):
                sample.update(os.pread(fd, SAMPLE_BYTES, (size - SAMPLE_BYTES) * i // (SAMPLE_BLOCKS - 1)))
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)
    finally:
        os.close(fd)
    return {"size": size, "mtime_ns": st.st_mtime_ns, "head": hashlib.blake2b(head, digest_size=16).hexdigest(),
            "sample": sample.hexdigest()}


def file_inode(path: str) -> list[int]:
    """(device, inode, ctime) of ``path``: any write to the file, a copy over it or a
    new file under its name changes them, and no ``touch`` can set the ctime back."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_ctime_ns]


XOR_THREADS = 4
"""Threads that read a file for ``file_xor`` at most (as many as there are CPUs)."""
XOR_PARTS = 16
"""Pieces the file is cut into for them."""


def file_xor(path: str) -> int:
    """XOR of the 8-byte words of the whole file (the tail zero-padded): any changed bit
    shows. About the cost of reading the file once from the page cache, spread over up to
    ``XOR_THREADS`` threads: one thread's page faults took longer than the XOR itself
    (docs/performance.md)."""
    size = os.path.getsize(path)
    if not size:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        words = size // 8
        cuts = [words * i // XOR_PARTS * 8 for i in range(XOR_PARTS + 1)]
        threads = min(XOR_THREADS, os.cpu_count() or 1)
        if threads > 1 and size >= 64 << 20:
            from concurrent.futures import ThreadPoolExecutor  # numpy's reduce lets go of the GIL

            with ThreadPoolExecutor(threads) as pool:
                parts = list(pool.map(lambda i: xor64(m, cuts[i], cuts[i + 1] - cuts[i]), range(XOR_PARTS)))
        else:
            parts = [xor64(m, 0, words * 8)]
        x = 0
        for part in parts:
            x ^= part
        if size % 8:
            x ^= int(np.frombuffer(m[size // 8 * 8:] + bytes(8 - size % 8), np.uint64)[0])
    return x


def hash_prefix(path: str, nbytes: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        left = nbytes
        while left > 0:
            chunk = f.read(min(left, 1 << 22))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def xor64(buf, offset: int, nbytes: int) -> int:
    """XOR of the 8-byte words of ``buf[offset : offset + nbytes rounded up to 8]`` (the
    padding after an array is zeros): any flipped bit, a zeroed page or a truncation shows."""
    n = -(-nbytes // 8)
    if n == 0:
        return 0
    return int(np.bitwise_xor.reduce(np.frombuffer(buf, np.uint64, n, offset)))


def xor_of(arr: np.ndarray) -> int:
    """``xor64`` of a contiguous array as written (zero-padded to 8 bytes)."""
    b = arr.reshape(-1).view(np.uint8)
    n8 = len(b) // 8 * 8
    x = int(np.bitwise_xor.reduce(b[:n8].view(np.uint64))) if n8 else 0
    if n8 < len(b):
        x ^= int(np.frombuffer(bytes(b[n8:]) + bytes(8 - (len(b) - n8)), np.uint64)[0])
    return x


