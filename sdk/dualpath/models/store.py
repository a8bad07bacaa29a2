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

import hashlib
import json
import logging
import os
import shutil
import sys
import time

from ..errors import ModelLoadError
from . import private_files as private
from .entry import CONVERSION_VERSION, CorruptEntry, Entry, EntryInfo, publish, tmp_folder
from .entry_writer import ALIGN, WRITE_CHUNK, EntryWriter, Progress, write_arrays, write_json
from .identity import file_identity, file_inode, file_xor, hash_prefix
from .spec import ModelSpec

log = logging.getLogger(__name__)


__all__ = ["ALIGN", "CONVERSION_VERSION", "DEFAULT_MAX_BYTES", "WRITE_CHUNK", "CorruptEntry", "Entry", "EntryInfo",
           "EntryWriter", "ModelStore", "Progress", "default_root", "publish", "temporary_entry", "tmp_folder",
           "write_arrays", "write_json"]
"""Every entry name other modules import from here; the entry's format and writer live in
``entry.py`` and ``entry_writer.py``, its checks in ``identity.py``, its mappings in ``mapping.py``."""



DEFAULT_MAX_BYTES = 32 << 30

STALE_TMP_S = 3600.0
"""A ``.tmp-*`` folder older than this belongs to a writer that died."""



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



class ModelStore:
    """The converted-model cache under ``root`` (default: ``default_root()``), at most
    ``max_bytes`` (least recently used entries are removed past it)."""

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = os.fspath(root) if root else default_root()
        self.max_bytes = max_bytes

    # -- loading ----------------------------------------------------------------
    def key(self, path: str, tokenizer_path: str | None = None) -> str:
        ident = [CONVERSION_VERSION, file_identity(path)]
        if tokenizer_path:
            ident.append(file_identity(tokenizer_path))
        return hashlib.blake2b(json.dumps(ident, sort_keys=True).encode(), digest_size=12).hexdigest()

    def load(self, path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
             progress: Progress | None = None, stats: dict | None = None, projector: bool = False) -> ModelSpec:
        """The ModelSpec of ``path``, from its entry (made now on a first load); with
        ``projector``, of an image projector file (``load_model``). ``stats``
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
            if (spec.config.arch == "clip") != projector:  # the entry of the other kind of file
                load_model(path, tokenizer_path, projector=projector)  # raises the loader's error
            stats.update(cache="hit", open_s=time.perf_counter() - t0)
            return spec
        try:
            private.make_dirs(self.root)
            tmp = tmp_folder(self.root, key)
            contents = {"inode": file_inode(path), "xor": file_xor(path)}  # before the file is read
        except OSError as e:
            raise ModelLoadError(path, f"cannot write the converted-model cache in {self.root}: "
                                       f"{e.strerror or e} (set model_cache.dir, DUALPATH_CACHE_DIR, "
                                       "or model_cache.enabled: false)") from e
        writer = EntryWriter(tmp, path, progress, os.path.getsize(path))
        try:
            loaded = load_model(path, tokenizer_path, sink=writer.put, projector=projector)
            writer.finish(loaded, file_identity(path), contents)
        except OSError as e:
            writer.abort()
            raise ModelLoadError(path, f"cannot write the converted-model cache entry in {self.root}: "
                                       f"{e.strerror or e}") from e
        except BaseException:
            writer.abort()
            raise
        stats.update(cache="miss", convert_s=time.perf_counter() - t0)
        if not publish(tmp, folder):
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
            if hash_prefix(path, src["header_bytes"]) != src["header_hash"]:
                raise CorruptEntry("the source's header and tensor table changed")
            if self._source_changed(path, src, manifest_path):
                raise CorruptEntry("the source's contents changed (its size and mtime did not)")
            tok = man["tokenizer_source"]
            if tok and (not os.path.isfile(tok["path"]) or file_identity(tok["path"]) != {
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
        inode = file_inode(path)
        if inode == src["inode"]:
            return False
        if file_xor(path) != src["xor"]:
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
    writer = EntryWriter(folder, spec.path, None, 0)
    try:
        for w in spec.weights.values():
            writer.put(w)
        writer.finish(spec, file_identity(spec.path))
        with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
            man = json.load(f)
        out = Entry(store, folder, man).spec(spec.path)
        out.entry._checks.clear()  # written just now from the arrays in memory
    except BaseException:
        shutil.rmtree(store.root, ignore_errors=True)
        raise
    return out
