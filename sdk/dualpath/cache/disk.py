"""The prefix cache on disk: full prompt pages that survive a restart.

A page is one file, ``<prefix hash>.kv``, named by the chained hash the in-memory
prefix table already uses (cache/manager.py), so a page on disk is found the way a
cached page in memory is. The files sit in a folder named by the *namespace*: a digest
of everything that decides a page's bytes (the converted model, the KV type, the page
size and shape, the ONNX Runtime version and graphs, the accuracy level, the kernel
that writes the KV, this format's version). Another model, quantization, tokenizer or
layout therefore looks in another folder and never finds a page.

A file holds a header (which repeats the namespace, the hash and the shape), the
page's token ids and its bytes for every layer as the arena stores them. It is
checked before use: size, header, token ids and a CRC-32 of all of it. A damaged or
truncated file is dropped with one log line, and its tokens are computed again.

A page holds the token ids of a prompt someone sent, so the text reads back from it:
folders are 0700 and files 0600 (models/private_files.py), a temporary file has an
unpredictable name and is never opened through a link, and a namespace folder that is
a symbolic link or another user's is neither read, written, pruned nor removed.

The engine never waits for the disk on a write: it copies the page out of the arena
(one memcpy per layer) and queues it; one thread writes. A file is written under a
temporary name and renamed into place, so a reader sees a whole page or none; a
process killed mid-write leaves only a temporary file, which the next process to open
the folder removes. The store is kept under ``max_bytes`` (all namespaces under the
root together) by removing the least recently used files; a read touches a file's
modification time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import queue
import shutil
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..models import private_files as private
from .sequence import TokenIds

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when a page's bytes or the file layout change: older stores are then never read."""
MAGIC = b"DPKVPAGE"
_HEAD = struct.Struct("<8s16s16sIIQ")  # magic, namespace, page hash, tokens, layers, tile bytes
_CRC = struct.Struct("<I")
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
NAMESPACE_FILE = "namespace.json"
MAX_PENDING_BYTES = 64 << 20
"""Pages queued for the writer beyond this are not written (the disk is slower than
prefill): a page left out is recomputed after a restart, never waited for."""


def default_root() -> str:
    """Beside the converted-model cache: ``<its parent>/prefix`` (``~/.cache/dualpath/prefix``)."""
    from ..models.store import default_root as models_root

    return os.path.join(os.path.dirname(models_root().rstrip(os.sep)), "prefix")


def namespace_digest(namespace: dict[str, Any]) -> bytes:
    text = json.dumps({"format": FORMAT_VERSION, **namespace}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass
class StoreStats:
    hit_pages: int = 0
    """Pages read from disk into the arena."""
    miss_pages: int = 0
    """Lookups that found no page on disk (one per prompt at most: the chain stops there)."""
    bytes_read: int = 0
    bytes_written: int = 0
    pages_written: int = 0
    dropped: int = 0
    """Files found damaged (checksum, size, header) and removed."""
    write_errors: int = 0
    skipped_writes: int = 0
    """Pages not queued because the writer was too far behind."""


class PrefixStore:
    """The pages of one namespace under ``root`` (see the module docstring)."""

    def __init__(self, root: str, namespace: dict[str, Any], *, page_tokens: int, num_layers: int, tile_bytes: int,
                 max_bytes: int):
        self.root = os.fspath(root)
        self.namespace = namespace
        self.digest = namespace_digest(namespace)
        self.folder = os.path.join(self.root, self.digest.hex())
        self.page_tokens, self.num_layers, self.tile_bytes = page_tokens, num_layers, tile_bytes
        self.max_bytes = max_bytes
        self.file_bytes = _HEAD.size + _CRC.size + 8 * page_tokens + num_layers * tile_bytes
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._known: set[bytes] | None = None  # hashes on disk, listed on first use
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self._queue: queue.Queue[tuple[bytes, np.ndarray, np.ndarray] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._root_bytes: int | None = None  # bytes of every store under root (writer thread only)
        self._warned: set[int | None] = set()  # errno of each kind of write failure logged

    # -- lookups (the engine's thread) -------------------------------------------
    def _index(self) -> set[bytes]:
        if self._known is None:
            known: set[bytes] = set()
            why = private.untrusted(self.folder)
            try:
                if why:
                    raise private.UnsafeFolderError(f"{self.folder} {why}")
                private.narrow(self.folder)  # an older version's: 0755
                names = os.listdir(self.folder)
            except FileNotFoundError:
                names = []
            except OSError as e:
                log.warning("prefix cache: cannot list %s: %s; pages are computed", self.folder, e.strerror or e)
                names = []
            for name in names:
                if name.endswith(SUFFIX) and len(name) == 32 + len(SUFFIX):
                    try:
                        known.add(bytes.fromhex(name[:32]))
                    except ValueError:
                        pass
                elif name.endswith(TMP_SUFFIX):
                    _remove_if_orphan(os.path.join(self.folder, name))
            with self._lock:
                self._known = known
        return self._known

    def _path(self, page_hash: bytes) -> str:
        return os.path.join(self.folder, page_hash.hex() + SUFFIX)

    def read(self, page_hash: bytes, tokens: TokenIds) -> np.ndarray | None:
        """The page's bytes, (num_layers, tile_bytes) uint8, or None (absent or damaged:
        a damaged file is removed)."""
        if page_hash not in self._index():
            self.stats.miss_pages += 1
            return None
        path = self._path(page_hash)
        try:
            with open(path, "rb") as f:
                buf = f.read(self.file_bytes + 1)
        except FileNotFoundError:  # another process evicted it
            self._forget(page_hash)
            self.stats.miss_pages += 1
            return None
        except OSError as e:
            log.warning("prefix cache: cannot read %s: %s; computing its tokens", path, e)
            self._forget(page_hash)
            return None
        problem = self._check(buf, page_hash, tokens)
        if problem:
            log.warning("prefix cache: dropping %s: %s; computing its tokens", path, problem)
            self.stats.dropped += 1
            self._forget(page_hash)
            _unlink(path)
            return None
        try:
            os.utime(path)  # recently used: the size limit removes the oldest first
        except OSError:
            pass
        self.stats.hit_pages += 1
        self.stats.bytes_read += len(buf)
        start = len(buf) - self.num_layers * self.tile_bytes
        return np.frombuffer(buf, np.uint8, offset=start).reshape(self.num_layers, self.tile_bytes)

    def _check(self, buf: bytes, page_hash: bytes, tokens: TokenIds) -> str:
        if len(buf) != self.file_bytes:
            return f"{len(buf)} bytes, not {self.file_bytes} (truncated or from another layout)"
        magic, ns, h, ntok, layers, tb = _HEAD.unpack_from(buf)
        if magic != MAGIC:
            return "not a DualPath KV page"
        if (ns, h, ntok, layers, tb) != (self.digest, page_hash, self.page_tokens, self.num_layers,
                                         self.tile_bytes):
            return "its header names another model, layout or page"
        (crc,) = _CRC.unpack_from(buf, _HEAD.size)
        body = memoryview(buf)[_HEAD.size + _CRC.size:]
        if zlib.crc32(body, zlib.crc32(memoryview(buf)[:_HEAD.size])) != crc:
            return "checksum mismatch"
        ids = np.frombuffer(buf, "<i8", count=ntok, offset=_HEAD.size + _CRC.size)
        if not np.array_equal(ids, np.asarray(tokens, np.int64)):
            return "its token ids differ from the prompt's (hash collision)"
        return ""

    def _forget(self, page_hash: bytes) -> None:
        with self._lock:
            if self._known is not None:
                self._known.discard(page_hash)

    # -- writes --------------------------------------------------------------------
    def wants(self, page_hash: bytes) -> bool:
        """Whether a page should be offered: not on disk, not queued, writer not behind."""
        if page_hash in self._index() or page_hash in self._pending:
            return False
        if self._pending_bytes + self.num_layers * self.tile_bytes > MAX_PENDING_BYTES:
            self.stats.skipped_writes += 1
            return False
        return True

    def put(self, page_hash: bytes, tokens: TokenIds, data: np.ndarray) -> None:
        """Queue a page (``data``: (num_layers, tile_bytes) uint8, a copy the caller gives up)."""
        with self._lock:
            self._pending.add(page_hash)
            self._pending_bytes += data.nbytes
        if self._thread is None:
            self._thread = threading.Thread(target=self._writer, name="dualpath-prefix-store", daemon=True)
            self._thread.start()
        self._queue.put((page_hash, np.asarray(tokens, "<i8"), data))

    def flush(self) -> None:
        """Wait until every queued page is on disk (or failed)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.join()
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception:  # never lose the writer: a page not written is only recomputed
                log.exception("prefix cache: writing a page failed")
            finally:
                if item is not None:
                    with self._lock:
                        self._pending.discard(item[0])
                        self._pending_bytes -= item[2].nbytes
                self._queue.task_done()

    def _write(self, page_hash: bytes, tokens: np.ndarray, data: np.ndarray) -> None:
        head = _HEAD.pack(MAGIC, self.digest, page_hash, self.page_tokens, self.num_layers, self.tile_bytes)
        crc = zlib.crc32(data.data, zlib.crc32(tokens.data, zlib.crc32(head)))  # .data: the arrays' buffers
        final = self._path(page_hash)
        tmp = None
        try:
            if self._root_bytes is None:
                self._start_folder()
            tmp, f = private.temporary(self.folder, f".{page_hash.hex()}.{os.getpid()}.", TMP_SUFFIX)
            with f:
                f.write(head)
                f.write(_CRC.pack(crc))
                f.write(tokens)
                f.write(data)
            os.replace(tmp, final)
        except OSError as e:
            if tmp is not None:
                _unlink(tmp)
            self.stats.write_errors += 1
            if e.errno not in self._warned:  # one line per kind of failure, not one per page
                self._warned.add(e.errno)
                log.warning("prefix cache: cannot write pages in %s: %s; they are recomputed after a restart "
                            "(prefix_cache.dir, --prefix-cache)", self.folder, e.strerror or e)
            if e.errno == errno.ENOSPC:
                self._evict(self.max_bytes // 2)
            return
        with self._lock:
            if self._known is not None:
                self._known.add(page_hash)
        self.stats.pages_written += 1
        self.stats.bytes_written += self.file_bytes
        assert self._root_bytes is not None  # counted by _start_folder before the first write
        self._root_bytes += self.file_bytes
        if self._root_bytes > self.max_bytes:
            self._evict(self.max_bytes * 9 // 10)  # a margin, so that eviction does not run on every write

    def _start_folder(self) -> None:
        private.private_folder(self.folder)  # UnsafeFolderError (an OSError) when not ours
        meta = os.path.join(self.folder, NAMESPACE_FILE)
        if not os.path.exists(meta):
            tmp, f = private.temporary(self.folder, f".ns.{os.getpid()}.", TMP_SUFFIX, "w")
            with f:
                json.dump({"format": FORMAT_VERSION, **self.namespace}, f, indent=1, sort_keys=True)
            os.replace(tmp, meta)
        self._root_bytes = sum(e.size_bytes for e in list_stores(self.root))

    def _evict(self, target: int) -> None:
        """Remove the least recently used pages of every store under root down to ``target`` bytes."""
        removed, self._root_bytes = prune(self.root, target)
        for path in removed:
            if os.path.dirname(path) == self.folder:
                self._forget(bytes.fromhex(os.path.basename(path)[:32]))


@dataclass
class StoreInfo:
    """One namespace folder under a prefix-cache root (``dualpath cache ls``)."""

    key: str
    folder: str
    namespace: dict[str, Any]
    files: list[tuple[float, int, str]]
    """(mtime, bytes, path) of each page file, listed once."""

    @property
    def pages(self) -> int:
        return len(self.files)

    @property
    def size_bytes(self) -> int:
        return sum(size for _, size, _ in self.files)

    @property
    def last_used(self) -> float:
        return max((m for m, _, _ in self.files), default=0.0)


def _page_files(folder: str) -> list[tuple[float, int, str]]:
    out: list[tuple[float, int, str]] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if name.endswith(SUFFIX):
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((st.st_mtime, st.st_size, path))
    return out


def list_stores(root: str, skipped: list[tuple[str, str]] | None = None) -> list[StoreInfo]:
    """The namespace folders under ``root``. One that is a symbolic link or another
    user's is left out (so never pruned), and added to ``skipped`` as (folder, why)."""
    out: list[StoreInfo] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        folder = os.path.join(root, name)
        if len(name) != 32 or not os.path.isdir(folder):
            continue
        why = private.untrusted(folder)
        if why:
            if skipped is not None:
                skipped.append((folder, why))
            continue
        try:
            with open(os.path.join(folder, NAMESPACE_FILE), encoding="utf-8") as f:
                namespace = json.load(f)
        except (OSError, ValueError):
            namespace = {}
        out.append(StoreInfo(name, folder, namespace, _page_files(folder)))
    return out


def prune(root: str, max_bytes: int) -> tuple[list[str], int]:
    """Remove orphaned temporary files, then the least recently used pages of every store
    under ``root`` until they hold at most ``max_bytes``. Returns the removed pages' paths
    and the bytes left."""
    files = []
    for store in list_stores(root):
        files += store.files
        try:
            names = os.listdir(store.folder)
        except OSError:
            continue
        for name in names:
            if name.endswith(TMP_SUFFIX):
                _remove_if_orphan(os.path.join(store.folder, name))
    files.sort()
    total = sum(size for _, size, _ in files)
    removed = []
    for _, size, path in files:
        if total <= max_bytes:
            break
        _unlink(path)
        total -= size
        removed.append(path)
    return removed, total


def remove_store(root: str, key: str) -> bool:
    """Remove the store ``key`` (a namespace folder) under ``root``: False when there is
    none; UnsafeFolderError when it is a symbolic link or another user's (left as it is)."""
    folder = os.path.join(root, key)
    if len(key) != 32 or os.sep in key or not os.path.lexists(folder):
        return False
    private.check_folder(folder)
    shutil.rmtree(folder)  # an OSError says why it could not be removed, rather than "removed"
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_if_orphan(path: str) -> None:
    """Remove a temporary file whose writer is gone (killed mid-write): ``.WHAT.PID.RANDOM.tmp``."""
    try:
        pid = int(os.path.basename(path).split(".")[2])
    except (ValueError, IndexError):
        pid = -1
    if pid > 0 and pid != os.getpid():
        try:
            os.kill(pid, 0)
            return  # its writer is alive (another process sharing the store)
        except ProcessLookupError:
            pass
        except PermissionError:
            return
    elif pid == os.getpid():
        return
    _unlink(path)


EMBED_MAGIC = b"DPIMGEMB"
_EMBED_HEAD = struct.Struct("<8s16sIIIII")  # magic, digest, grid columns, grid rows, squares, tokens, width


class EmbeddingStore:
    """Images' embeddings under a prefix-cache ``root``, so that a restarted process skips the
    encoder for an image it has seen: a namespace folder of their own (``kind``
    image-embeddings, the projector ``identity``), one ``<digest>.kv`` file per image, so the
    root's listing, size limit and removal (``list_stores``, ``prune``, ``dualpath cache``)
    count them with the pages. A file is a header, the rows (squares, tokens, width) f32 and a
    CRC-32 of both, written under a temporary name and renamed; a damaged one is dropped and
    the image encoded again."""

    def __init__(self, root: str, identity: str, max_bytes: int):
        self.root = os.fspath(root)
        self.namespace = {"kind": "image-embeddings", "format": 1, "projector": identity}
        self.folder = os.path.join(self.root, namespace_digest(self.namespace).hex())
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._warned = False

    def _path(self, digest: bytes) -> str:
        return os.path.join(self.folder, digest.hex() + SUFFIX)

    def get(self, digest: bytes, tokens: int, width: int) -> tuple[tuple[int, int], np.ndarray] | None:
        """(grid, rows (squares, tokens, width)) of the image ``digest``, or None."""
        path = self._path(digest)
        if private.untrusted(self.folder):
            return None
        try:
            with open(path, "rb") as f:
                buf = f.read()
        except OSError:
            return None
        try:
            magic, got, cols, rows, squares, t, w = _EMBED_HEAD.unpack_from(buf)
            n = squares * t * w * 4
            if (magic, got, t, w) != (EMBED_MAGIC, digest, tokens, width) or len(buf) != _EMBED_HEAD.size + n + 4:
                raise ValueError("not this image's embeddings")
            (crc,) = _CRC.unpack_from(buf, _EMBED_HEAD.size + n)
            if crc != zlib.crc32(memoryview(buf)[:_EMBED_HEAD.size + n]):
                raise ValueError("checksum mismatch")
        except (struct.error, ValueError) as e:
            log.warning("image embeddings %s are damaged (%s): dropped, the image is encoded again", path, e)
            _unlink(path)
            return None
        try:
            os.utime(path)  # last use, for the size limit
        except OSError:
            pass
        data = np.frombuffer(buf, np.float32, squares * t * w, _EMBED_HEAD.size).reshape(squares, t, w)
        return (cols, rows), data

    def put(self, digest: bytes, grid: tuple[int, int], rows: np.ndarray) -> None:
        """Keep the rows (squares, tokens, width) of the image ``digest``; a failure is logged
        once and never raised (the image is encoded again next time)."""
        rows = np.ascontiguousarray(rows, np.float32)
        head = _EMBED_HEAD.pack(EMBED_MAGIC, digest, grid[0], grid[1], *rows.shape)
        body = head + rows.tobytes()
        tmp = None
        try:
            with self._lock:
                private.private_folder(self.folder)
                meta = os.path.join(self.folder, NAMESPACE_FILE)
                if not os.path.exists(meta):
                    tmp, f = private.temporary(self.folder, f".ns.{os.getpid()}.", TMP_SUFFIX, "w")
                    with f:
                        json.dump(self.namespace, f, indent=1, sort_keys=True)
                    os.replace(tmp, meta)
                tmp, f = private.temporary(self.folder, f".img.{os.getpid()}.", TMP_SUFFIX)
                with f:
                    f.write(body + _CRC.pack(zlib.crc32(body)))
                os.replace(tmp, self._path(digest))
                tmp = None
                prune(self.root, self.max_bytes)
        except OSError as e:
            if tmp is not None:
                _unlink(tmp)
            if not self._warned:
                self._warned = True
                log.warning("image embeddings: cannot write %s: %s; images are encoded again after a restart",
                            self.folder, e.strerror or e)
