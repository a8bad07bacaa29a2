"""The converted-model cache against a careless user and another local user (issue 41):
only this user can read what it writes, it never writes or deletes through a link or
in another user's folder, and a source whose weights changed under a kept size and
mtime is converted again, never served stale."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import gguf
import numpy as np
import pytest

from dualpath.config import load_config
from dualpath.errors import ModelLoadError
from dualpath.llm import LLM
from dualpath.models import identity
from dualpath.models import private_files as private
from dualpath.models.store import ModelStore


def _modes(tree) -> dict[str, int]:
    """Permission bits of every folder and file under ``tree`` (links not followed)."""
    out = {str(tree): stat.S_IMODE(os.lstat(tree).st_mode)}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def _cli(env_cache, *args):
    env = {**os.environ, "DUALPATH_CACHE_DIR": str(env_cache)}
    return subprocess.run([sys.executable, "-m", "dualpath.cli", "cache", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_an_entry_and_its_graphs_are_readable_by_this_user_only(tmp_path, gguf_path):
    old = os.umask(0o022)  # the usual umask: without our modes, files would be 0644
    try:
        root = tmp_path / "home" / "cache" / "dualpath" / "models"
        LLM(gguf_path, load_config(None, {"model_cache.dir": str(root), "runtime.num_threads": 1,
                                          "runtime.max_context_tokens": 64}), prefix_cache=False)
    finally:
        os.umask(old)
    modes = _modes(root)
    (entry,) = [p for p in os.listdir(root)]
    names = {os.path.relpath(p, root) for p in modes}
    assert any(n.startswith(f"{entry}/graphs-") and n.endswith(".onnx") for n in names)  # graphs included
    assert any(n.endswith("weights.bin") for n in names)
    for path, mode in modes.items():
        assert mode == (0o700 if os.path.isdir(path) else 0o600), (path, oct(mode))
    # the folders it had to make above the root too
    for folder in (root.parent, root.parent.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_an_older_versions_open_entry_is_narrowed_to_this_user(tmp_path, gguf_path):
    store = ModelStore(tmp_path)
    folder = store.load(gguf_path).entry.folder
    os.chmod(folder, 0o755)
    store.load(gguf_path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_private_create_never_writes_through_a_planted_link_or_name(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep")
    os.symlink(target, tmp_path / "planted")
    with pytest.raises(OSError):  # ELOOP: O_NOFOLLOW
        private.create(str(tmp_path / "planted"))
    (tmp_path / "taken").write_text("theirs")
    with pytest.raises(FileExistsError):
        private.create(str(tmp_path / "taken"))
    assert target.read_text() == "keep" and (tmp_path / "taken").read_text() == "theirs"
    a, fa = private.temporary(str(tmp_path), ".x.")
    b, fb = private.temporary(str(tmp_path), ".x.")
    fa.close(), fb.close()
    assert a != b and stat.S_IMODE(os.stat(a).st_mode) == 0o600


def _plant_entry_link(store: ModelStore, path, tmp_path):
    """A victim folder with a file, and a link to it where ``path``'s entry belongs."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "manifest.json").write_text("{}")
    (victim / "precious").write_text("keep")
    os.makedirs(store.root, exist_ok=True)
    link = os.path.join(store.root, store.key(os.fspath(path)))
    os.symlink(victim, link)
    return victim, link


def test_a_symlinked_entry_is_skipped_never_loaded_pruned_or_removed(tmp_path, gguf_path):
    store = ModelStore(tmp_path / "cache")
    victim, link = _plant_entry_link(store, gguf_path, tmp_path)
    with pytest.raises(ModelLoadError, match="is a symbolic link"):
        store.load(gguf_path)
    skipped = []
    assert store.entries(skipped) == [] and skipped == [(link, f"is a symbolic link (to {victim})")]
    store.enforce_limit(0)
    with pytest.raises(private.UnsafeFolderError, match="symbolic link"):
        store.remove(os.path.basename(link))
    assert (victim / "precious").read_text() == "keep" and os.path.islink(link)


def test_cache_cli_reports_a_symlinked_entry_and_does_not_claim_it_removed(tmp_path, gguf_path):
    store = ModelStore(tmp_path / "cache")
    victim, link = _plant_entry_link(store, gguf_path, tmp_path)
    key = os.path.basename(link)
    out = _cli(store.root, "ls")
    assert out.returncode == 0 and f"skipped {link}: it is a symbolic link" in out.stderr
    assert "0 entries" in out.stdout
    out = _cli(store.root, "rm", key)
    assert out.returncode == 1 and "removed 0 entries" in out.stdout
    assert "not removed" in out.stderr and "symbolic link" in out.stderr
    out = _cli(store.root, "rm", "--all")
    assert "removed 0 entries" in out.stdout
    out = _cli(store.root, "prune", "--max-size-gb", "0")
    assert out.returncode == 0 and "skipped" in out.stderr
    assert (victim / "precious").read_text() == "keep" and os.path.islink(link)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown a folder")
def test_another_users_entry_folder_is_skipped(tmp_path, gguf_path):
    store = ModelStore(tmp_path / "cache")
    folder = store.load(gguf_path).entry.folder
    os.chown(folder, 12345, 12345)
    skipped = []
    assert store.entries(skipped) == [] and skipped[0][0] == folder and "uid 12345" in skipped[0][1]
    store.enforce_limit(0)
    with pytest.raises(private.UnsafeFolderError, match="another user"):
        store.remove(os.path.basename(folder))
    with pytest.raises(ModelLoadError, match="another user"):
        store.load(gguf_path)
    assert os.path.isfile(os.path.join(folder, "weights.bin"))


# -- a changed source under a kept size and mtime ---------------------------------------

def _ffn_down(path) -> tuple[int, int]:
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight")
    return int(t.data_offset), int(t.n_bytes)


def _rewrite(path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` in place and put the mtime back (``touch -r``)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.path.getsize(path) == st.st_size


def _between_samples(size: int, lo: int, hi: int) -> int:
    """An offset in [lo, hi) that no sampled block of the identity covers (the head's neither)."""
    n, b = identity.SAMPLE_BLOCKS, identity.SAMPLE_BYTES
    starts = [(size - b) * i // (n - 1) for i in range(n)]
    for s, nxt in zip(starts, starts[1:]):
        gap = -(-(s + b) // 4) * 4  # a whole f32 after the block, before the next one
        if lo <= gap and gap + 4 <= min(hi, nxt) and gap >= identity.HEAD_BYTES:
            return gap
    raise AssertionError("no gap between the samples in that range")


def _served_matches_the_file(spec) -> bool:
    w = spec.weights["blk.0.ffn_down"]  # data: a view of the source; data_t: the entry's converted copy
    return np.array_equal(w.data_t.T, w.data)


def test_one_weight_changed_between_the_samples_is_caught_by_the_checksum(tmp_path, gguf_path):
    path = tmp_path / "m.gguf"
    shutil.copy2(gguf_path, path)
    store = ModelStore(tmp_path / "cache")
    key = store.key(str(path))
    assert _served_matches_the_file(store.load(str(path)))
    offset, nbytes = _ffn_down(path)
    at = _between_samples(os.path.getsize(path), offset, offset + nbytes)
    _rewrite(path, at, np.float32(123.5).tobytes())
    assert store.key(str(path)) == key  # size, mtime, head and samples all kept
    stats = {}
    spec = store.load(str(path), stats=stats)
    assert stats["cache"] == "miss" and _served_matches_the_file(spec)
    assert 123.5 in spec.weights["blk.0.ffn_down"].data_t


def test_new_weights_copied_over_with_cp_p_are_a_new_entry(tmp_path, gguf_path):
    path, other = tmp_path / "m.gguf", tmp_path / "other.gguf"
    shutil.copy2(gguf_path, path)
    shutil.copy2(gguf_path, other)
    offset, nbytes = _ffn_down(other)
    scaled = -np.frombuffer(open(other, "rb").read()[offset:offset + nbytes], np.float32)
    _rewrite(other, offset, scaled.tobytes())
    os.utime(other, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))
    store = ModelStore(tmp_path / "cache")
    store.load(str(path))
    shutil.copy2(other, path)  # cp -p: same size, same mtime, other weights
    stats = {}
    spec = store.load(str(path), stats=stats)
    assert stats["cache"] == "miss" and _served_matches_the_file(spec)


def test_the_same_bytes_under_a_new_inode_are_still_a_hit_and_checked_once(tmp_path, gguf_path):
    path = tmp_path / "m.gguf"
    shutil.copy2(gguf_path, path)
    store = ModelStore(tmp_path / "cache")
    store.load(str(path))
    copy = tmp_path / "copy.gguf"
    shutil.copy2(path, copy)
    os.replace(copy, path)  # same bytes, size and mtime: another inode and ctime
    stats = {}
    spec = store.load(str(path), stats=stats)
    assert stats["cache"] == "hit" and _served_matches_the_file(spec)
    src = spec.entry.manifest["source"]  # the manifest read at open: the old inode
    import json

    with open(os.path.join(spec.entry.folder, "manifest.json")) as f:
        recorded = json.load(f)["source"]["inode"]
    assert recorded == identity.file_inode(str(path)) != src["inode"]  # the next load reads nothing
    assert stat.S_IMODE(os.stat(os.path.join(spec.entry.folder, "manifest.json")).st_mode) == 0o600
