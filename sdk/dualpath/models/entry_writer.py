"""Writing a converted-model cache entry: arrays at aligned offsets, streamed in whole
pieces, JSON flushed to disk, and a temporary folder published by one rename."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable

import numpy as np

from . import private_files as private
from .entry import ARRAY_FIELDS, CONVERSION_VERSION, array_to_json
from .identity import file_identity, hash_prefix, xor_of
from .mapping import source_offset
from .spec import GATHERED_TABLES, ModelSpec, Weight

ALIGN = 1 << 16
"""Offset alignment of arrays in weights.bin: a page on every kernel (4 KiB, and the
16 KiB and 64 KiB pages of some ARM64 systems), so each array can be dropped from
memory on its own (madvise)."""

WRITE_CHUNK = 2 << 20
"""weights.bin is written in whole, aligned pieces of this size: a huge page on x86-64
and 4 KiB-page ARM64 (``EntryWriter._append``)."""

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as a long load advances (``convert``: bytes
of tensors converted; ``sessions``: graph parts ready)."""


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
            index[name] = {"offset": offset, "shape": list(arr.shape), "dtype": arr.dtype.str, "xor": xor_of(arr)}
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


class EntryWriter:
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
                "offset": offset, "xor": xor_of(arr)}

    def put(self, w: Weight, source_bytes: int = 0) -> Weight:
        arrays = {}
        # A float matrix of the graphs is stored (in, out) for their MatMul (Weight.data_t);
        # the (out, in) data stays a view of the source file when it is one, else it is
        # read back as a view of the transpose (nothing stored twice). The embedding tables stay
        # (rows, dim) for the gather; finish() adds token_embd's transpose when it is also lm_head.
        transpose = w.dtype == "f32" and w.data is not None and w.data.ndim == 2 and w.data_t is None \
            and w.name not in GATHERED_TABLES
        if w.name == "token_embd" and w.dtype == "f32":
            self.float_embedding = True
        for kind, arr in w.arrays().items():
            offset = source_offset(arr, self.source_path) if arr.flags.c_contiguous else None
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
            xor ^= xor_of(part)
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
        for name, typecode in ARRAY_FIELDS.items():
            if tokenizer[name] is not None:
                tokenizer[name] = array_to_json(tokenizer[name], typecode)
        write_json(os.path.join(self.folder, "tokenizer.json"), tokenizer)
        tok_path = spec.metadata.get("tokenizer_path")
        manifest = {
            "conversion_version": CONVERSION_VERSION,
            "source": {"path": os.path.abspath(spec.path), **identity, **(contents or {}),
                       "header_bytes": spec.header_bytes, "header_hash": hash_prefix(spec.path, spec.header_bytes)},
            "tokenizer_source": {"path": os.path.abspath(tok_path), **file_identity(tok_path)} if tok_path else None,
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


