"""The prefix pages on disk against another local user (issue 41): a page holds a prompt's
token ids, so only this user can read it; the writer never follows a planted name; a
namespace folder that is a link or another user's is never read, written or deleted."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from dualpath.cache import disk
from dualpath.cache.disk import PrefixStore

NS = {"model": "m", "kv_dtype": "f16", "page_tokens": 4, "source": "m.gguf"}


def _store(root, namespace=NS) -> PrefixStore:
    return PrefixStore(str(root), namespace, page_tokens=4, num_layers=2, tile_bytes=64, max_bytes=1 << 30)


def _page(i: int):
    h = hashlib.blake2b(str(i).encode(), digest_size=16).digest()
    return h, [i] * 4, np.full((2, 64), i, np.uint8)


def _write(store, pages) -> None:
    for i in pages:
        store.put(*_page(i))
    store.flush()


def test_pages_and_their_folders_are_readable_by_this_user_only(tmp_path):
    old = os.umask(0o022)
    try:
        root = tmp_path / "cache" / "dualpath" / "prefix"
        store = _store(root)
        _write(store, range(3))
    finally:
        os.umask(old)
    names = sorted(os.listdir(store.folder))
    assert len([n for n in names if n.endswith(disk.SUFFIX)]) == 3 and disk.NAMESPACE_FILE in names
    for name in names:
        assert stat.S_IMODE(os.stat(os.path.join(store.folder, name)).st_mode) == 0o600, name
    for folder in (store.folder, root, root.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder


def test_an_older_versions_open_folder_is_narrowed_on_first_use(tmp_path):
    _write(_store(tmp_path), range(2))
    store = _store(tmp_path)
    os.chmod(store.folder, 0o755)
    assert store.read(*_page(0)[:2]) is not None
    assert stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700


def test_links_planted_at_the_old_temporary_and_final_names_are_never_written_through(tmp_path):
    store = _store(tmp_path)
    _write(store, [100])  # makes the folder, as a process before would have
    targets = []
    for i in range(15):
        h = _page(i)[0]
        for name in (f".{h.hex()}.{os.getpid()}{disk.TMP_SUFFIX}", h.hex() + disk.SUFFIX):
            target = tmp_path / f"target-{i}-{len(targets)}"
            target.write_text("keep")
            targets.append(target)
            os.symlink(target, os.path.join(store.folder, name))
    _write(store, range(15))
    assert all(t.read_text() == "keep" for t in targets)
    assert store.stats.pages_written == 16 and store.stats.write_errors == 0
    fresh = _store(tmp_path)
    assert all(fresh.read(*_page(i)[:2]) is not None for i in range(15))  # the links were replaced


def _plant_namespace_link(tmp_path):
    """A victim folder holding page-like files, linked where store NS's folder belongs."""
    root, victim = tmp_path / "prefix", tmp_path / "victim"
    root.mkdir()
    victim.mkdir()
    for i in range(3):
        (victim / f"{i:032x}{disk.SUFFIX}").write_bytes(b"precious")
    link = root / disk.namespace_digest(NS).hex()
    os.symlink(victim, link)
    return root, victim, link


def test_a_symlinked_namespace_folder_is_never_read_written_pruned_or_removed(tmp_path, caplog):
    root, victim, link = _plant_namespace_link(tmp_path)
    store = _store(root)
    assert store.folder == str(link)
    _write(store, range(3))
    assert store.stats.pages_written == 0 and store.stats.write_errors == 3
    assert "symbolic link" in caplog.text
    assert store.read(*_page(0)[:2]) is None
    skipped = []
    assert disk.list_stores(str(root), skipped) == [] and skipped[0][0] == str(link)
    removed, _ = disk.prune(str(root), 0)
    assert removed == []
    with pytest.raises(PermissionError, match="symbolic link"):
        disk.remove_store(str(root), link.name)
    assert sorted(os.listdir(victim)) == [f"{i:032x}{disk.SUFFIX}" for i in range(3)]
    assert all((victim / n).read_bytes() == b"precious" for n in os.listdir(victim))


def test_cache_cli_reports_a_symlinked_prefix_store_and_does_not_claim_it_removed(tmp_path):
    root, victim, link = _plant_namespace_link(tmp_path)
    env = {**os.environ, "DUALPATH_CACHE_DIR": str(tmp_path / "models")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dualpath.cli", "cache", "--prefix-dir", str(root), *args],
                              capture_output=True, text=True, env=env, timeout=120)

    out = cli("ls")
    assert out.returncode == 0 and f"skipped {link}: it is a symbolic link" in out.stderr
    assert "0 prefix stores" in out.stdout
    out = cli("prune", "--prefix-max-size-gb", "0")
    assert "0 prefix pages removed" in out.stdout and "skipped" in out.stderr
    out = cli("rm", link.name)
    assert out.returncode == 1 and "removed 0 entries" in out.stdout and "not removed" in out.stderr
    assert len(os.listdir(victim)) == 3 and link.is_symlink()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown a folder")
def test_another_users_namespace_folder_is_never_read_written_or_pruned(tmp_path):
    _write(_store(tmp_path), range(2))
    store = _store(tmp_path)
    os.chown(store.folder, 12345, 12345)
    assert store.read(*_page(0)[:2]) is None  # pages someone else could have made up
    _write(store, [5])
    assert store.stats.pages_written == 0
    skipped = []
    assert disk.list_stores(str(tmp_path), skipped) == [] and "uid 12345" in skipped[0][1]
    disk.prune(str(tmp_path), 0)
    assert len([n for n in os.listdir(store.folder) if n.endswith(disk.SUFFIX)]) == 2
