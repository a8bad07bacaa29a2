"""The converted-model cache: what loading a model file produces, kept on disk so
that the next load of the same file converts nothing and copies nothing.

An entry is a folder named by the source file's identity (size, mtime, a hash of
its first 64 KiB, the tokenizer file's the same way, and ``CONVERSION_VERSION``)::

    <root>/<key>/
      manifest.json        config, metadata, where every weight array lives, checksums,
                           and the hash of the source's whole header and tensor table
      tokenizer.json       the TokenizerSpec
      weights.bin          every converted array at a 64 KiB-aligned offset (memory-mapped
                           on load: ONNX Runtime and our kernels read it in place)
      graphs-vV-oO-a{A}-c{C}/ the ONNX graph parts (version V, opset O) for accuracy level A and context C:
        parts.json, part{i}.onnx, weights.placeholder (sparse: the graphs' external
        initializers point into it; the real arrays are handed over at session creation)

Arrays that are already in ONNX Runtime's layout in the source (F32 tensors of an
F32 file, a llama2.c checkpoint) are not copied: the manifest records their offset
in the source file, which is mapped too.

Writes are atomic: an entry (and each graphs folder) is written into a temporary
folder beside it and renamed into place, so a crash or a full disk leaves only a
``.tmp-*`` folder that ``prune`` removes, never a partial entry. Two processes that
convert the same file at once both succeed: the first rename wins and the other
process opens the winner's entry. On load the header hash, the file sizes and an XOR
checksum of every array are checked: a truncated or corrupted entry is logged,
removed and rebuilt from the source, never used.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import shutil
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import DualPathError, ModelLoadError
from ..tokenizer.spec import TokenizerSpec
from . import private_files as private
from .files import mapped_memmap
from .spec import ModelConfig, ModelSpec, Weight

log = logging.getLogger(__name__)

CONVERSION_VERSION = 7
"""Bump when conversion or the graphs change meaning: older entries are then never
matched (and the size limit removes them in time). 2: the last graph part outputs hidden.
3: float matrices stored (in, out) for MatMul (``Weight.data_t``). 4: tokenizer.json holds
the scores and token types as base64 little-endian arrays (``_ARRAY_FIELDS``). 5: a
layer's Q4_K, Q6_K, Q5_0, Q8_0 and Q4_0 matrices in our kernels' form (``Weight.kernel_form``).
6: the classifier's (and a tied embedding's) too. 7: weights.bin written in whole 2 MiB
pieces, its gaps zeros (the page cache then holds it in huge folios: ``_Writer._append``)."""
ALIGN = 1 << 16
"""Offset alignment of arrays in weights.bin: a page on every kernel (4 KiB, and the
16 KiB and 64 KiB pages of some ARM64 systems), so each array can be dropped from
memory on its own (madvise)."""
DEFAULT_MAX_BYTES = 32 << 30
WRITE_CHUNK = 2 << 20
"""weights.bin is written in whole, aligned pieces of this size: a huge page on x86-64
and 4 KiB-page ARM64 (``_Writer._append``)."""
HEAD_BYTES = 1 << 16
SAMPLE_BLOCKS = 256
SAMPLE_BYTES = 4096
"""A file's identity hashes ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BYTES`` spread evenly
over the whole file (the whole file when it is smaller): new weights of the same size
under a kept mtime (``cp -p``, ``touch -r``) change a new key. A change of a few bytes
between the samples is caught by the source's checksum (``_source_changed``)."""
STALE_TMP_S = 3600.0
"""A ``.tmp-*`` folder older than this belongs to a writer that died."""

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as a long load advances (``convert``: bytes
of tensors converted; ``sessions``: graph parts ready)."""


class CorruptEntry(DualPathError):
    """A cache entry failed a check; the caller discards and rebuilds it."""


def default_root() -> str:
    """Where entries live: ``$DUALPATH_CACHE_DIR``; in an Android app its private
    storage (``$ANDROID_PRIVATE``, set by python-for-android); else the platform's
    user cache folder (``$XDG_CACHE_HOME``, ``~/.cache``, also under Termux)."""
    env = os.environ.get("DUALPATH_CACHE_DIR")
    if env:
        return env
    if os.environ.get("ANDROID_PRIVATE"):
        return os.path.join(os.environ["ANDROID_PRIVATE"], "cache", "dualpath", "models")
    if sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    elif os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "dualpath", "models")


def _file_identity(path: str) -> dict:
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


def _inode(path: str) -> list[int]:
    """(device, inode, ctime) of ``path``: any write to the file, a copy over it or a
    new file under its name changes them, and no ``touch`` can set the ctime back."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_ctime_ns]


XOR_THREADS = 4
"""Threads that read a file for ``_file_xor`` at most (as many as there are CPUs)."""
XOR_PARTS = 16
"""Pieces the file is cut into for them."""


def _file_xor(path: str) -> int:
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
                parts = list(pool.map(lambda i: _xor64(m, cuts[i], cuts[i + 1] - cuts[i]), range(XOR_PARTS)))
        else:
            parts = [_xor64(m, 0, words * 8)]
        x = 0
        for part in parts:
            x ^= part
        if size % 8:
            x ^= int(np.frombuffer(m[size // 8 * 8:] + bytes(8 - size % 8), np.uint64)[0])
    return x


def _hash_prefix(path: str, nbytes: int) -> str:
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


def _xor64(buf, offset: int, nbytes: int) -> int:
    """XOR of the 8-byte words of ``buf[offset : offset + nbytes rounded up to 8]`` (the
    padding after an array is zeros): any flipped bit, a zeroed page or a truncation shows."""
    n = -(-nbytes // 8)
    if n == 0:
        return 0
    return int(np.bitwise_xor.reduce(np.frombuffer(buf, np.uint64, n, offset)))


def _xor_of(arr: np.ndarray) -> int:
    """``_xor64`` of a contiguous array as written (zero-padded to 8 bytes)."""
    b = arr.reshape(-1).view(np.uint8)
    n8 = len(b) // 8 * 8
    x = int(np.bitwise_xor.reduce(b[:n8].view(np.uint64))) if n8 else 0
    if n8 < len(b):
        x ^= int(np.frombuffer(bytes(b[n8:]) + bytes(8 - (len(b) - n8)), np.uint64)[0])
    return x


FAULT_AROUND_BYTES = 64 << 10
"""Linux's default ``fault_around_bytes``: a read fault on a file mapping maps the pages
of the aligned 64 KiB window around it that are in the page cache."""


_ARRAY_FIELDS = {"scores": "f", "token_types": "i"}
"""TokenizerSpec fields kept in tokenizer.json as {"base64": little-endian bytes}: a JSON list
of 262,144 floats (Gemma 3) was half of a cached load's JSON parsing."""


def _array_to_json(a: array, typecode: str) -> dict:
    a = array(typecode, a)
    if sys.byteorder == "big":
        a.byteswap()
    return {"base64": base64.b64encode(a.tobytes()).decode("ascii")}


def _array_from_json(obj: dict, typecode: str, count: int) -> array:
    a = array(typecode, base64.b64decode(obj["base64"], validate=True))
    if len(a) != count:
        raise ValueError(f"{len(a)} entries for {count} tokens")
    if sys.byteorder == "big":
        a.byteswap()
    return a


def _drop(m: mmap.mmap, start: int, nbytes: int) -> None:
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


def _advise(m: mmap.mmap, advice: int | None, start: int = 0, length: int | None = None) -> bool:
    """``m.madvise(advice, ...)``; False where the platform or kernel does not take it."""
    if advice is None or not hasattr(m, "madvise") or len(m) == 0:
        return False
    try:
        m.madvise(advice, start, len(m) - start if length is None else length)
    except (OSError, ValueError):
        return False
    return True


def _huge_page_bytes() -> int | None:
    """The size of a PMD huge page when transparent huge pages are on (not ``never``)."""
    try:
        with open(os.path.join(THP_SYSFS, "enabled")) as f:
            if "[never]" in f.read():
                return None
        with open(os.path.join(THP_SYSFS, "hpage_pmd_size")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _pmd_mapped(m: mmap.mmap) -> int | None:
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


def _offset_in(m: mmap.mmap, a: np.ndarray) -> int | None:
    """``a``'s offset inside mapping ``m``, or None when it lies elsewhere."""
    if len(m) == 0:
        return None
    start = a.ctypes.data - np.frombuffer(m, np.uint8, 1).ctypes.data
    return start if 0 <= start < len(m) else None


def _source_offset(arr: np.ndarray, path: str) -> int | None:
    """The offset in file ``path`` of an array that is a view of an np.memmap of it, or None."""
    owner = mapped_memmap(arr)
    if owner is None:
        return None
    if not (owner.filename and os.path.exists(owner.filename) and os.path.samefile(owner.filename, path)):
        return None
    return int(owner.offset + arr.ctypes.data - owner.ctypes.data)


@dataclass
class EntryInfo:
    """One entry, for ``dualpath cache ls``."""

    key: str
    folder: str
    source: str
    size_bytes: int
    last_used: float
    graphs: list[str]


class Entry:
    """An opened entry: its manifest and the mappings its arrays live in."""

    def __init__(self, store: ModelStore, folder: str, manifest: dict):
        self.store = store
        self.folder = folder
        self.manifest = manifest
        self.key = os.path.basename(folder)
        self._maps: list[mmap.mmap] = []  # weights.bin and the source file: alive as long as the entry
        self._files: list = []  # each mapping's file, open as long (file_offset; a temporary entry's are unlinked)
        self._weights_map: mmap.mmap | None = None
        self._kernel_map: mmap.mmap | None = None
        """weights.bin mapped again for the arrays our kernels read in place (``page_in``)."""
        self._kernel_ranges: list[tuple[int, int]] = []  # their [start, end) in weights.bin
        self._derived_maps: list[mmap.mmap] = []  # files of map_arrays
        self.derived_arrays: dict[str, dict[str, np.ndarray]] = {}
        """Derived folder name -> its mapped arrays, once per entry (graph/parts.py)."""
        self._checks: dict[int, tuple[str, int, int, mmap.mmap]] = {}
        """Offset in weights.bin -> (array name, bytes, XOR checksum, the mapping it is read
        through) of arrays not yet verified."""
        self._lock = threading.Lock()

    # -- arrays ----------------------------------------------------------------
    def _map(self, path: str) -> mmap.mmap:
        f = open(path, "rb")
        try:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            f.close()
            raise
        self._maps.append(m)
        self._files.append(f)
        return m

    def file_offset(self, a: np.ndarray) -> tuple[int, int] | None:
        """(file descriptor, byte offset) of ``a``, a view of one of this entry's mappings,
        for reading its rows without mapping them (``kernels.read_rows``); else None."""
        for m, f in zip(self._maps, self._files):
            off = _offset_in(m, a)
            if off is not None:
                return f.fileno(), off
        return None

    def spec(self, source_path: str) -> ModelSpec:
        """The ModelSpec of this entry, every array a read-only view of a mapping
        (checked: sizes, checksums). Raises CorruptEntry."""
        man = self.manifest
        wpath = os.path.join(self.folder, "weights.bin")
        try:
            wsize = os.path.getsize(wpath)
        except OSError as e:
            raise CorruptEntry(f"weights.bin: {e}") from e
        if wsize != man["weights_bytes"]:
            raise CorruptEntry(f"weights.bin has {wsize} bytes, the manifest says {man['weights_bytes']}")
        wmap = self._weights_map = self._map(wpath) if wsize else None
        if wmap is not None and any(w.get("kernel_form") for w in man["weights"].values()):
            self._kernel_map = self._map(wpath)
            # a fault reads one huge page, no more: readahead beyond it made small folios
            _advise(self._kernel_map, getattr(mmap, "MADV_HUGEPAGE", None))
            _advise(self._kernel_map, getattr(mmap, "MADV_RANDOM", None))
        smap = None
        weights: dict[str, Weight] = {}
        for key, w in man["weights"].items():
            arrays: dict[str, np.ndarray] = {}
            for kind, a in w["arrays"].items():
                if a["in"] == "transpose":
                    continue  # a view of another array, below
                buf: mmap.mmap | None
                if a["in"] == "source":
                    if smap is None:
                        smap = self._map(source_path)
                    buf = smap
                elif w.get("kernel_form") and kind == "weight":
                    buf = self._kernel_map
                    self._kernel_ranges.append((a["offset"], a["offset"] + a["nbytes"]))
                else:
                    buf = wmap
                if buf is None:
                    raise CorruptEntry(f"{key}.{kind} names a file the entry does not have")
                shape, dtype = tuple(a["shape"]), np.dtype(a["dtype"])
                count = int(np.prod(shape, dtype=np.int64))
                if a["offset"] + count * dtype.itemsize > len(buf):
                    raise CorruptEntry(f"{key}.{kind} lies past the end of its file")
                arrays[kind] = np.frombuffer(buf, dtype, count, a["offset"]).reshape(shape)
                if a["in"] == "entry":
                    self._checks[a["offset"]] = (f"{key}.{kind}", a["nbytes"], a["xor"], buf)
            for kind, a in w["arrays"].items():
                if a["in"] == "transpose":
                    if a.get("of") not in arrays:
                        raise CorruptEntry(f"{key}.{kind} is the transpose of a missing array")
                    arrays[kind] = arrays[a["of"]].T
            weights[key] = Weight(key, w["dtype"], tuple(w["shape"]), arrays.get("weight"),  # type: ignore[arg-type]
                                  arrays.get("scales"),
                                  source_type=w["source_type"], bits=w["bits"], block_size=w["block_size"],
                                  zero_points=arrays.get("zero_points"), mins=arrays.get("mins"),
                                  data_t=arrays.get("weight_t"), kernel_form=bool(w.get("kernel_form")))
        cfg = dict(man["config"])
        cfg["swa_layers"] = tuple(cfg["swa_layers"])
        try:
            with open(os.path.join(self.folder, "tokenizer.json"), encoding="utf-8") as f:
                tok = json.load(f)
        except (OSError, ValueError) as e:
            raise CorruptEntry(f"tokenizer.json: {e}") from e
        try:
            for name in ("tokens", "merges"):
                if tok.get(name) is not None:
                    tok[name] = tuple(tok[name])
            for name, typecode in _ARRAY_FIELDS.items():
                if tok.get(name) is not None:
                    tok[name] = _array_from_json(tok[name], typecode, len(tok["tokens"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptEntry(f"tokenizer.json: {e}") from e
        spec = ModelSpec(path=source_path, format=man["format"], config=ModelConfig(**cfg),
                         tokenizer=TokenizerSpec(**tok), weights=weights, metadata=man["metadata"])
        spec.entry = self
        return spec

    def _offset(self, a: np.ndarray) -> int | None:
        """``a``'s offset in weights.bin (through either mapping), or None for a view of
        another file."""
        for m in (self._weights_map, self._kernel_map):
            off = None if m is None else _offset_in(m, a)
            if off is not None:
                return off
        return None

    def holds(self, a: np.ndarray) -> bool:
        """Whether ``a`` is a view of weights.bin (what ``drop_pages`` drops behind a
        session), not of the source file, a derived file or other memory."""
        return self._offset(a) is not None

    def verify(self, arrays=None) -> None:
        """Check the XOR checksums of ``arrays`` (views of this entry; None: every array)
        not checked yet, just before their first use: reading them is what the first
        use does anyway. Raises CorruptEntry naming the first array that does not match."""
        with self._lock:
            if arrays is None:
                offsets = list(self._checks)
            else:
                offsets = [off for off in map(self._offset, arrays) if off in self._checks]
            checks = [(off, self._checks.pop(off)) for off in offsets if off in self._checks]
        for off, (name, nbytes, expected, m) in checks:
            # each array through the mapping it is read through (pages mapped twice count twice)
            if _xor64(m, off, nbytes) != expected:
                raise CorruptEntry(f"the checksum of {name} does not match: weights.bin is corrupted")
            if arrays is None and m is self._weights_map:  # the rest: no session packs them (fused
                _drop(m, off, nbytes)  # parts); our kernels' arrays stay

    def page_in(self) -> dict:
        """Map the arrays our kernels read in place (a layer's matrices and the classifier
        in their form) now, with huge pages where the kernel gives them for this file.

        A decode step streams every one of them from DRAM; over 4 KiB pages its products
        take markedly longer (TLB misses; docs/performance-log.md). Their mapping asks for huge
        pages (MADV_HUGEPAGE), which the
        page cache gives to pages it reads from then on; pages it already holds in small
        folios (written by an older version, or read by another process) stay small. When
        less than half of them came out huge, and one huge page's worth shows that this
        kernel and filesystem do map this file with huge pages, they are dropped from the
        cache and read again. The pages stay the file's: clean, so
        that under memory pressure the kernel can reclaim them rather than end the process.
        Returns what it did (MiB mapped huge, of how many; seconds), or {} where it cannot
        tell (no THP, no /proc, kernels before 5.14)."""
        m, huge = self._kernel_map, _huge_page_bytes()
        if m is None or not huge or not self._kernel_ranges:
            return {}
        t0 = time.perf_counter()
        spans: list[tuple[int, int]] = []  # the ranges widened to whole huge pages (a huge page maps whole), merged
        for lo, hi in sorted(self._kernel_ranges):
            lo, hi = lo // huge * huge, min(len(m), -(-hi // huge) * huge)
            if spans and lo <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], hi))
            else:
                spans.append((lo, hi))
        whole = sum((hi // huge - -(-lo // huge)) * huge for lo, hi in spans)  # the huge pages they can map
        if not all(_advise(m, MADV_POPULATE_READ, lo, hi - lo) for lo, hi in spans):
            return {}
        mapped = _pmd_mapped(m)
        stats = {"kernel_weights_mib": whole / 2**20, "huge_mib": (mapped or 0) / 2**20, "reread": False}
        if mapped is not None and mapped < whole // 2 and whole >= huge:
            fd = self._files[self._maps.index(m)].fileno()

            def reread(lo: int, n: int) -> None:
                _advise(m, mmap.MADV_DONTNEED, lo, n)
                os.posix_fadvise(fd, lo, n, os.POSIX_FADV_DONTNEED)
                _advise(m, MADV_POPULATE_READ, lo, n)

            if not mapped:  # does this file get huge pages at all? one huge page's worth tells
                lo, hi = max(self._kernel_ranges, key=lambda r: r[1] - r[0])  # (a span's ends may hold
                # other arrays, mapped through the other mapping: their pages are not dropped)
                probe = -(-lo // huge) * huge
                if probe + huge <= hi:
                    reread(probe, huge)
            if _pmd_mapped(m):
                for lo, hi in spans:
                    reread(lo, hi - lo)
                stats.update(huge_mib=(_pmd_mapped(m) or 0) / 2**20, reread=True)
        stats["page_in_s"] = time.perf_counter() - t0
        return stats

    def map_arrays(self, path: str, index: dict) -> dict[str, np.ndarray]:
        """Read-only views of the arrays of file ``path`` (an entry's derived folder):
        ``index`` maps name -> {offset, shape, dtype, xor} (as ``write_arrays`` wrote it;
        checksums verified here). The mapping lives as long as the entry, and
        ``drop_pages`` can drop its pages. Raises CorruptEntry."""
        m = self._map(path)
        out = {}
        for name, a in index.items():
            dtype, shape = np.dtype(a["dtype"]), tuple(a["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            if a["offset"] < 0 or a["offset"] + -(-count * dtype.itemsize // 8) * 8 > len(m):
                raise CorruptEntry(f"{name} lies past the end of {path}")
            if "xor" in a and _xor64(m, a["offset"], count * dtype.itemsize) != a["xor"]:
                raise CorruptEntry(f"the checksum of {name} does not match: {path} is corrupted")
            out[name] = np.frombuffer(m, dtype, count, a["offset"]).reshape(shape)
        self._derived_maps.append(m)
        return out

    def drop_pages(self, arrays) -> None:
        """Forget the resident pages of ``arrays`` (views of weights.bin or of a file of
        ``map_arrays``) after ONNX Runtime packed its own copy: they come back from the
        page cache if read again."""
        for a in arrays:
            m, start = self._weights_map, self._offset(a)
            if start is None:  # a view of the source file, or of a derived file
                m, start = next(((d, s) for d in self._derived_maps for s in [_offset_in(d, a)] if s is not None),
                                (None, None))
            if m is not None and start is not None:
                _drop(m, start, a.nbytes)

    # -- derived folders -------------------------------------------------------
    def derived(self, name: str, make: Callable[[str], None]) -> str:
        """The folder ``name`` of this entry (e.g. the ONNX graphs for one accuracy level
        and context), made by ``make(folder)`` into a temporary folder and renamed into
        place when absent."""
        folder = os.path.join(self.folder, name)
        if os.path.isdir(folder):
            return folder
        tmp = _tmp_folder(self.folder, name)
        try:
            make(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _publish(tmp, folder)
        return folder


def write_arrays(path: str, arrays: dict[str, np.ndarray]) -> dict:
    """Write ``arrays`` to file ``path`` at ALIGN-aligned offsets (each can be dropped
    from memory on its own); the index ``Entry.map_arrays`` reads them back with."""
    index = {}
    with private.create(path) as f:
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            offset = -(-f.tell() // ALIGN) * ALIGN
            f.seek(offset)
            f.write(arr.data)
            index[name] = {"offset": offset, "shape": list(arr.shape), "dtype": arr.dtype.str, "xor": _xor_of(arr)}
        f.truncate(-(-f.tell() // 8) * 8)  # whole words: each checksum reads its padding
        f.flush()
        os.fsync(f.fileno())
    return index


def write_json(path: str, data) -> None:
    """Write ``data`` as JSON and flush it to disk (before the folder is published)."""
    with private.create(path, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())


def _tmp_folder(parent: str, name: str) -> str:
    """A new private folder in ``parent`` (``.tmp-NAME-PID-`` and a random part)."""
    return private.temporary_folder(parent, f".tmp-{name}-{os.getpid()}-")


def _publish(tmp: str, final: str) -> bool:
    """Rename ``tmp`` to ``final`` (its files made 0600 first: some, as ONNX files, were
    written by code that does not take a mode). False (and ``tmp`` removed) when another
    process published the same folder first: its copy is as good as ours."""
    private.make_private(tmp)
    try:
        os.rename(tmp, final)
        return True
    except OSError:
        if os.path.isdir(final):
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        raise


class _Writer:
    """Streams converted weights into a new entry's weights.bin, one at a time (the
    loader's ``sink``), so that no more than one converted tensor is in memory."""

    def __init__(self, folder: str, source_path: str, progress: Progress | None, total_bytes: int):
        self.folder = folder
        self.source_path = source_path
        self.path = os.path.join(folder, "weights.bin")
        self.f = private.create(self.path)  # opened from a descriptor: its .name is not the path
        self._end = 0  # bytes of weights.bin so far, those staged included
        self._stage = bytearray()  # what lies between the last whole chunk written and _end
        self.weights: dict[str, dict] = {}
        self.progress = progress
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self.float_embedding = False

    def _append(self, data) -> None:
        """Append ``data`` (a buffer) to weights.bin in writes of whole, aligned
        ``WRITE_CHUNK``s: the page cache then holds the file in huge folios, which a later
        load maps with huge pages (``Entry.page_in``). Written at 64 KiB offsets as they
        came, only part of the kernel weights came back huge (a folio that straddles an
        array's start stays small); in these pieces all of them."""
        data = memoryview(data)
        if not data.nbytes:
            return
        data = data.cast("B")
        while len(data):
            room = WRITE_CHUNK - self._end % WRITE_CHUNK
            if not self._stage and room == WRITE_CHUNK and len(data) >= WRITE_CHUNK:
                n = len(data) // WRITE_CHUNK * WRITE_CHUNK  # whole chunks, from the caller's memory
                self.f.write(data[:n])
            else:
                n = min(room, len(data))
                self._stage += data[:n]
                if n == room:
                    self._flush()
            self._end += n
            data = data[n:]

    def _flush(self) -> None:
        self.f.write(self._stage)
        self._stage.clear()
        self.f.flush()

    def _align(self) -> int:
        """Pad weights.bin with zeros to the next ``ALIGN``; the offset reached."""
        pad = -self._end % ALIGN
        if pad:
            self._append(bytes(pad))
        return self._end

    def _write(self, arr: np.ndarray) -> dict:
        """Append ``arr`` (made contiguous) to weights.bin; its record."""
        arr = np.ascontiguousarray(arr)
        offset = self._align()
        self._append(arr.data)
        return {"dtype": arr.dtype.str, "shape": list(arr.shape), "nbytes": int(arr.nbytes), "in": "entry",
                "offset": offset, "xor": _xor_of(arr)}

    def put(self, w: Weight, source_bytes: int = 0) -> Weight:
        arrays = {}
        # A float matrix of the graphs is stored (in, out) for their MatMul (Weight.data_t);
        # the (out, in) data stays a view of the source file when it is one, else it is
        # read back as a view of the transpose (nothing stored twice). The embedding stays
        # (vocab, dim) for the gather; finish() adds its transpose when it is also lm_head.
        transpose = w.dtype == "f32" and w.data is not None and w.data.ndim == 2 and w.data_t is None \
            and w.name != "token_embd"
        if w.name == "token_embd" and w.dtype == "f32":
            self.float_embedding = True
        for kind, arr in w.arrays().items():
            offset = _source_offset(arr, self.source_path) if arr.flags.c_contiguous else None
            if offset is not None:
                arrays[kind] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "nbytes": int(arr.nbytes),
                                "in": "source", "offset": offset}
            elif kind == "weight" and transpose:
                arrays[kind] = {"in": "transpose", "of": "weight_t"}
            else:
                arrays[kind] = self._write(arr)
        if transpose:
            arrays["weight_t"] = self._write(w.data.T)
        self.weights[w.name] = {"dtype": w.dtype, "shape": list(w.shape), "source_type": w.source_type,
                                "bits": w.bits, "block_size": w.block_size, "kernel_form": w.kernel_form,
                                "arrays": arrays}
        self.done_bytes += source_bytes
        if self.progress is not None and source_bytes:
            self.progress("convert", self.done_bytes, self.total_bytes)
        return Weight(w.name, w.dtype, w.shape, None, source_type=w.source_type, bits=w.bits,  # type: ignore[arg-type]
                      block_size=w.block_size, kernel_form=w.kernel_form)

    def _tied_output(self) -> None:
        """The transpose of a float embedding that is also the classifier, read back from
        where put() left it (the loader does not keep converted tensors), a band of
        columns at a time."""
        rec = self.weights["token_embd"]["arrays"]["weight"]
        if rec["in"] == "source":
            table = np.memmap(self.source_path, np.dtype(rec["dtype"]), "r", rec["offset"], tuple(rec["shape"]))
        else:
            self._flush()
            table = np.memmap(self.path, np.dtype(rec["dtype"]), "r", rec["offset"], tuple(rec["shape"]))
        vocab, dim = table.shape
        offset = self._align()
        xor = 0
        band = max(2, (64 << 20) // max(1, 4 * vocab)) // 2 * 2  # even: each band is whole 8-byte words
        for c in range(0, dim, band):
            part = np.ascontiguousarray(table[:, c:c + band].T, np.float32)
            self._append(part.data)
            xor ^= _xor_of(part)
        del table
        self.weights["token_embd"]["arrays"]["weight_t"] = {
            "dtype": np.dtype(np.float32).str, "shape": [dim, vocab], "nbytes": vocab * dim * 4, "in": "entry",
            "offset": offset, "xor": xor}

    def finish(self, spec: ModelSpec, identity: dict, contents: dict | None = None) -> None:
        """Write tokenizer.json and the manifest. ``identity``: the source's, as the key
        has it; ``contents``: its ``inode`` and whole-file ``xor``, taken before it was read."""
        if spec.config.tied_output and self.float_embedding:
            self._tied_output()
        self._append(bytes(-self._end % 8))  # whole words: the checksum of the last array reads its padding
        self._flush()
        end = self._end
        # Not fsynced (it would cost the load time, more on a phone): after a power loss the
        # data the manifest describes may be missing, and its sizes and checksums catch that.
        self.f.close()
        # Its fields by reference: dataclasses.asdict would deep-copy every one of a large
        # vocabulary's strings and scores before json writes them out anyway.
        tokenizer = {f.name: getattr(spec.tokenizer, f.name) for f in dataclasses.fields(spec.tokenizer)}
        for name, typecode in _ARRAY_FIELDS.items():
            if tokenizer[name] is not None:
                tokenizer[name] = _array_to_json(tokenizer[name], typecode)
        write_json(os.path.join(self.folder, "tokenizer.json"), tokenizer)
        tok_path = spec.metadata.get("tokenizer_path")
        manifest = {
            "conversion_version": CONVERSION_VERSION,
            "source": {"path": os.path.abspath(spec.path), **identity, **(contents or {}),
                       "header_bytes": spec.header_bytes, "header_hash": _hash_prefix(spec.path, spec.header_bytes)},
            "tokenizer_source": {"path": os.path.abspath(tok_path), **_file_identity(tok_path)} if tok_path else None,
            "format": spec.format,
            "config": dataclasses.asdict(spec.config),
            "metadata": spec.metadata,
            "weights": self.weights,
            "weights_bytes": end,
        }
        write_json(os.path.join(self.folder, "manifest.json"), manifest)

    def abort(self) -> None:
        self.f.close()
        shutil.rmtree(self.folder, ignore_errors=True)  # a folder of ours: rmtree never follows links


class ModelStore:
    """The converted-model cache under ``root`` (default: ``default_root()``), at most
    ``max_bytes`` (least recently used entries are removed past it)."""

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = os.fspath(root) if root else default_root()
        self.max_bytes = max_bytes

    # -- loading ----------------------------------------------------------------
    def key(self, path: str, tokenizer_path: str | None = None) -> str:
        ident = [CONVERSION_VERSION, _file_identity(path)]
        if tokenizer_path:
            ident.append(_file_identity(tokenizer_path))
        return hashlib.blake2b(json.dumps(ident, sort_keys=True).encode(), digest_size=12).hexdigest()

    def load(self, path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
             progress: Progress | None = None, stats: dict | None = None) -> ModelSpec:
        """The ModelSpec of ``path``, from its entry (made now on a first load). ``stats``
        receives ``cache`` ("hit" / "miss") and the seconds of each stage."""
        from . import check_model_file, load_model

        path = os.fspath(path)
        check_model_file(path)
        stats = stats if stats is not None else {}
        t0 = time.perf_counter()
        try:
            key = self.key(path, os.fspath(tokenizer_path) if tokenizer_path else None)
        except OSError as e:
            raise ModelLoadError(path, f"cannot read: {e.strerror or e}") from e
        folder = os.path.join(self.root, key)
        why = private.untrusted(folder)
        if why:
            raise ModelLoadError(path, f"its converted-model cache entry {folder} {why}: not read, written or "
                                       "removed (remove it yourself, or set model_cache.dir)")
        spec = self._open(folder, path)
        if spec is not None:
            stats.update(cache="hit", open_s=time.perf_counter() - t0)
            return spec
        try:
            private.make_dirs(self.root)
            tmp = _tmp_folder(self.root, key)
            contents = {"inode": _inode(path), "xor": _file_xor(path)}  # before the file is read
        except OSError as e:
            raise ModelLoadError(path, f"cannot write the converted-model cache in {self.root}: "
                                       f"{e.strerror or e} (set model_cache.dir, DUALPATH_CACHE_DIR, "
                                       "or model_cache.enabled: false)") from e
        writer = _Writer(tmp, path, progress, os.path.getsize(path))
        try:
            loaded = load_model(path, tokenizer_path, sink=writer.put)
            writer.finish(loaded, _file_identity(path), contents)
        except OSError as e:
            writer.abort()
            raise ModelLoadError(path, f"cannot write the converted-model cache entry in {self.root}: "
                                       f"{e.strerror or e}") from e
        except BaseException:
            writer.abort()
            raise
        stats.update(cache="miss", convert_s=time.perf_counter() - t0)
        if not _publish(tmp, folder):
            log.info("another process cached %s first; using its entry", path)
        spec = self._open(folder, path)
        if spec is None:
            raise ModelLoadError(path, f"the converted-model cache entry {folder} cannot be read back")
        self.enforce_limit(keep=key)
        return spec

    def _open(self, folder: str, path: str) -> ModelSpec | None:
        manifest_path = os.path.join(folder, "manifest.json")
        if not os.path.isdir(folder):
            return None
        try:
            try:
                with open(manifest_path, encoding="utf-8") as f:
                    man = json.load(f)
            except (OSError, ValueError) as e:
                raise CorruptEntry(f"manifest.json: {e}") from e
            if man.get("conversion_version") != CONVERSION_VERSION:
                raise CorruptEntry(f"conversion version {man.get('conversion_version')}, not {CONVERSION_VERSION}")
            src = man["source"]
            if _hash_prefix(path, src["header_bytes"]) != src["header_hash"]:
                raise CorruptEntry("the source's header and tensor table changed")
            if self._source_changed(path, src, manifest_path):
                raise CorruptEntry("the source's contents changed (its size and mtime did not)")
            tok = man["tokenizer_source"]
            if tok and (not os.path.isfile(tok["path"]) or _file_identity(tok["path"]) != {
                    k: tok[k] for k in ("size", "mtime_ns", "head", "sample")}):
                raise CorruptEntry(f"the tokenizer {tok['path']} changed")
            spec = Entry(self, folder, man).spec(path)
        except (CorruptEntry, KeyError, TypeError, ValueError) as e:
            log.warning("discarding converted-model cache entry %s for %s: %s; converting again", folder, path, e)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        private.narrow(folder)  # an entry of an older version: 0755
        try:
            os.utime(manifest_path)  # last use, for the size limit
        except OSError:
            pass
        return spec

    def _source_changed(self, path: str, src: dict, manifest_path: str) -> bool:
        """Whether the source's bytes differ from those the entry was converted from.
        While its (device, inode, ctime) are those recorded, it was not written since:
        nothing is read. Else (copied, moved, touched, chmod-ed, or changed) its whole-file
        checksum is compared once, and on a match the new (device, inode, ctime) are
        recorded, so that the next load reads nothing again."""
        inode = _inode(path)
        if inode == src["inode"]:
            return False
        if _file_xor(path) != src["xor"]:
            return True
        with open(manifest_path, encoding="utf-8") as f:
            man = json.load(f)
        man["source"]["inode"] = inode
        try:
            tmp, f = private.temporary(os.path.dirname(manifest_path), ".manifest-", ".json", "w")
            with f:
                json.dump(man, f)
            os.replace(tmp, manifest_path)
        except OSError as e:  # a read-only cache: the check runs again next time
            log.info("cannot record the checked source in %s: %s", manifest_path, e)
        return False

    def discard(self, entry: Entry, reason: str) -> None:
        """Remove an entry found damaged after it was opened (``CorruptEntry``)."""
        log.warning("discarding converted-model cache entry %s: %s; converting again", entry.folder, reason)
        shutil.rmtree(entry.folder, ignore_errors=True)

    # -- maintenance ------------------------------------------------------------
    def entries(self, skipped: list[tuple[str, str]] | None = None) -> list[EntryInfo]:
        """The entries, oldest name first. A folder that is a symbolic link or another
        user's is left out, and added to ``skipped`` as (folder, why)."""
        out: list[EntryInfo] = []
        if not os.path.isdir(self.root):
            return out
        for name in sorted(os.listdir(self.root)):
            folder = os.path.join(self.root, name)
            if name.startswith(".") or not os.path.isdir(folder):
                why = private.untrusted(folder) if name.startswith(".tmp-") else None
                if why and skipped is not None:
                    skipped.append((folder, why))
                continue
            why = private.untrusted(folder)
            if why:
                if skipped is not None:
                    skipped.append((folder, why))
                continue
            manifest = os.path.join(folder, "manifest.json")
            try:
                with open(manifest, encoding="utf-8") as f:
                    source = json.load(f)["source"]["path"]
                last_used = os.path.getmtime(manifest)
            except (OSError, ValueError, KeyError):
                source, last_used = "(unreadable entry)", 0.0
            graphs = sorted(g for g in os.listdir(folder) if g.startswith("graphs-"))
            out.append(EntryInfo(name, folder, source, _disk_bytes(folder), last_used, graphs))
        return out

    def remove(self, key: str) -> bool:
        """Remove entry ``key``: False when there is none; UnsafeFolderError when its folder
        is a symbolic link or another user's (left as it is)."""
        folder = os.path.join(self.root, key)
        if not key or os.sep in key or key.startswith(".") or not os.path.lexists(folder):
            return False
        private.check_folder(folder)
        shutil.rmtree(folder)  # an OSError says why it could not be removed, rather than "removed"
        return True

    def enforce_limit(self, max_bytes: int | None = None, keep: str | None = None) -> list[EntryInfo]:
        """Remove stale temporary folders, then least recently used entries (never
        ``keep``) until the cache holds at most ``max_bytes``. Returns what was removed."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        removed: list[EntryInfo] = []
        if not os.path.isdir(self.root):
            return removed
        now = time.time()
        for name in os.listdir(self.root):
            folder = os.path.join(self.root, name)
            if name.startswith(".tmp-") and not private.untrusted(folder):
                try:
                    if now - os.path.getmtime(folder) > STALE_TMP_S:
                        shutil.rmtree(folder, ignore_errors=True)
                except OSError:
                    pass
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.size_bytes for e in entries)
        for e in entries:
            if total <= limit:
                break
            if e.key == keep:
                continue
            shutil.rmtree(e.folder, ignore_errors=True)
            total -= e.size_bytes
            removed.append(e)
        return removed


def _disk_bytes(folder: str) -> int:
    """Bytes a folder really occupies (holes in weights.bin and the sparse placeholders
    count for nothing)."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def temporary_entry(spec: ModelSpec) -> ModelSpec:
    """``spec`` (converted in memory, no entry) written to an entry in a new temporary
    folder and reopened from it: the runtime then has one way to load. The caller
    removes ``spec.entry.store.root`` once its sessions exist (the mappings keep the
    files readable)."""
    import tempfile

    store = ModelStore(tempfile.mkdtemp(prefix="dualpath-model-"))
    folder = os.path.join(store.root, "entry")
    os.mkdir(folder, private.FOLDER_MODE)
    writer = _Writer(folder, spec.path, None, 0)
    try:
        for w in spec.weights.values():
            writer.put(w)
        writer.finish(spec, _file_identity(spec.path))
        with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
            man = json.load(f)
        out = Entry(store, folder, man).spec(spec.path)
        out.entry._checks.clear()  # written just now from the arrays in memory
    except BaseException:
        shutil.rmtree(store.root, ignore_errors=True)
        raise
    return out
