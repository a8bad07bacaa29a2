"""An opened converted-model cache entry (``Entry``): its manifest, the mappings its
arrays live in, their checks, paging them in and out, and folders derived from it."""

from __future__ import annotations

import base64
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
from typing import Protocol

import numpy as np

from ..errors import DualPathError
from ..tokenizer.spec import TokenizerSpec
from . import private_files as private
from .identity import xor64
from .mapping import MADV_POPULATE_READ, advise, drop_range, huge_page_bytes, offset_in, pmd_mapped
from .spec import ModelConfig, ModelSpec, Weight

log = logging.getLogger(__name__)


class StoreRoot(Protocol):
    """What an entry needs of the store it belongs to (``store.ModelStore``)."""

    root: str


CONVERSION_VERSION = 9
"""Bump when conversion or the graphs change meaning: older entries are then never
matched (and the size limit removes them in time). 2: the last graph part outputs hidden.
3: float matrices stored (in, out) for MatMul (``Weight.data_t``). 4: tokenizer.json holds
the scores and token types as base64 little-endian arrays (``ARRAY_FIELDS``). 5: a
layer's Q4_K, Q6_K, Q5_0, Q8_0 and Q4_0 matrices in our kernels' form (``Weight.kernel_form``).
6: the classifier's (and a tied embedding's) too. 7: weights.bin written in whole 2 MiB
pieces, its gaps zeros (the page cache then holds it in huge folios: ``EntryWriter._append``).
8: a reranker's metadata has ``rank`` (labels, prompt format), a decoder's pooling may be rank.
9: an encoder's layer matrices in our kernels' form too (graph/encoder.py cuts at them)."""


class CorruptEntry(DualPathError):
    """A cache entry failed a check; the caller discards and rebuilds it."""


ARRAY_FIELDS = {"scores": "f", "token_types": "i"}
"""TokenizerSpec fields kept in tokenizer.json as {"base64": little-endian bytes}: a JSON list
of 262,144 floats (Gemma 3) was half of a cached load's JSON parsing."""


def array_to_json(a: array, typecode: str) -> dict:
    a = array(typecode, a)
    if sys.byteorder == "big":
        a.byteswap()
    return {"base64": base64.b64encode(a.tobytes()).decode("ascii")}


def array_from_json(obj: dict, typecode: str, count: int) -> array:
    a = array(typecode, base64.b64decode(obj["base64"], validate=True))
    if len(a) != count:
        raise ValueError(f"{len(a)} entries for {count} tokens")
    if sys.byteorder == "big":
        a.byteswap()
    return a



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

    def __init__(self, store: StoreRoot, folder: str, manifest: dict):
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
            off = offset_in(m, a)
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
            advise(self._kernel_map, getattr(mmap, "MADV_HUGEPAGE", None))
            advise(self._kernel_map, getattr(mmap, "MADV_RANDOM", None))
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
            for name, typecode in ARRAY_FIELDS.items():
                if tok.get(name) is not None:
                    tok[name] = array_from_json(tok[name], typecode, len(tok["tokens"]))
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
            off = None if m is None else offset_in(m, a)
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
            if xor64(m, off, nbytes) != expected:
                raise CorruptEntry(f"the checksum of {name} does not match: weights.bin is corrupted")
            if arrays is None and m is self._weights_map:  # the rest: no session packs them (fused
                drop_range(m, off, nbytes)  # parts); our kernels' arrays stay

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
        m, huge = self._kernel_map, huge_page_bytes()
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
        if not all(advise(m, MADV_POPULATE_READ, lo, hi - lo) for lo, hi in spans):
            return {}
        mapped = pmd_mapped(m)
        stats = {"kernel_weights_mib": whole / 2**20, "huge_mib": (mapped or 0) / 2**20, "reread": False}
        if mapped is not None and mapped < whole // 2 and whole >= huge:
            fd = self._files[self._maps.index(m)].fileno()

            def reread(lo: int, n: int) -> None:
                advise(m, mmap.MADV_DONTNEED, lo, n)
                os.posix_fadvise(fd, lo, n, os.POSIX_FADV_DONTNEED)
                advise(m, MADV_POPULATE_READ, lo, n)

            if not mapped:  # does this file get huge pages at all? one huge page's worth tells
                lo, hi = max(self._kernel_ranges, key=lambda r: r[1] - r[0])  # (a span's ends may hold
                # other arrays, mapped through the other mapping: their pages are not dropped)
                probe = -(-lo // huge) * huge
                if probe + huge <= hi:
                    reread(probe, huge)
            if pmd_mapped(m):
                for lo, hi in spans:
                    reread(lo, hi - lo)
                stats.update(huge_mib=(pmd_mapped(m) or 0) / 2**20, reread=True)
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
            if "xor" in a and xor64(m, a["offset"], count * dtype.itemsize) != a["xor"]:
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
                m, start = next(((d, s) for d in self._derived_maps for s in [offset_in(d, a)] if s is not None),
                                (None, None))
            if m is not None and start is not None:
                drop_range(m, start, a.nbytes)

    # -- derived folders -------------------------------------------------------
    def derived(self, name: str, make: Callable[[str], None]) -> str:
        """The folder ``name`` of this entry (e.g. the ONNX graphs for one accuracy level
        and context), made by ``make(folder)`` into a temporary folder and renamed into
        place when absent."""
        folder = os.path.join(self.folder, name)
        if os.path.isdir(folder):
            return folder
        tmp = tmp_folder(self.folder, name)
        try:
            make(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        publish(tmp, folder)
        return folder


def tmp_folder(parent: str, name: str) -> str:
    """A new private folder in ``parent`` (``.tmp-NAME-PID-`` and a random part)."""
    return private.temporary_folder(parent, f".tmp-{name}-{os.getpid()}-")


def publish(tmp: str, final: str) -> bool:
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
