"""The prefix cache on disk (cache/disk.py): pages written by one store are read back by
the next, only when whole and checked, and never across models, KV types or layouts."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from dualpath.cache import disk
from dualpath.cache.disk import PrefixStore

NS = {"model": "m", "kv_dtype": "f16", "page_tokens": 4}
LAYERS, TILE = 3, 256


def _store(root, namespace=NS, max_bytes=1 << 30, **shape) -> PrefixStore:
    kw = {"page_tokens": 4, "num_layers": LAYERS, "tile_bytes": TILE, **shape}
    return PrefixStore(str(root), namespace, max_bytes=max_bytes, **kw)


@functools.lru_cache(maxsize=4)
def _noise(layers: int, tile: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (layers, tile), dtype=np.uint8)


def _page(i: int, layers=LAYERS, tile=TILE):
    """(hash, tokens, data) of page i: its bytes follow from i, so a reader can check them
    (cheap to make, so that a writer spends its time writing)."""
    h = hashlib.blake2b(str(i).encode(), digest_size=16).digest()
    data = np.roll(_noise(layers, tile), i, axis=1)
    return h, [i, i + 1, i + 2, i + 3], data


def _write(store, pages):
    for i in pages:
        h, toks, data = _page(i)
        assert store.wants(h)
        store.put(h, toks, data)
    store.flush()


def test_pages_round_trip_and_are_not_written_twice(tmp_path):
    a = _store(tmp_path)
    _write(a, range(5))
    assert a.stats.pages_written == 5 and a.stats.bytes_written == 5 * a.file_bytes
    h, toks, data = _page(3)
    assert not a.wants(h)  # on disk already: not copied out of the arena again
    b = _store(tmp_path)  # a new process: the index is read from the folder
    for i in range(5):
        h, toks, data = _page(i)
        np.testing.assert_array_equal(b.read(h, toks), data)
    assert b.read(_page(9)[0], _page(9)[1]) is None
    assert (b.stats.hit_pages, b.stats.miss_pages, b.stats.bytes_read) == (5, 1, 5 * b.file_bytes)


def _only_file(store) -> str:
    (name,) = [n for n in os.listdir(store.folder) if n.endswith(disk.SUFFIX)]
    return os.path.join(store.folder, name)


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "empty"])
def test_a_damaged_page_is_dropped_with_one_log_line(tmp_path, caplog, damage):
    a = _store(tmp_path)
    _write(a, [7])
    path = _only_file(a)
    raw = bytearray(open(path, "rb").read())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x10
    elif damage == "truncate":
        raw = raw[:-100]
    elif damage == "extend":
        raw += b"\0"
    else:
        raw = b""
    open(path, "wb").write(raw)
    b = _store(tmp_path)
    h, toks, _ = _page(7)
    with caplog.at_level(logging.WARNING, logger="dualpath.cache.disk"):
        assert b.read(h, toks) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "dropping" in lines[0] and path in lines[0], lines
    assert not os.path.exists(path) and b.stats.dropped == 1
    assert b.read(h, toks) is None and b.stats.dropped == 1  # gone: a miss now, no second line
    assert b.wants(h)  # and it will be written again


def test_other_token_ids_under_the_same_hash_are_refused(tmp_path, caplog):
    a = _store(tmp_path)
    _write(a, [1])
    h, toks, _ = _page(1)
    with caplog.at_level(logging.WARNING):
        assert _store(tmp_path).read(h, [9, 9, 9, 9]) is None
    assert "token ids differ" in caplog.text


@pytest.mark.parametrize("other", [{"namespace": {**NS, "kv_dtype": "q8"}}, {"namespace": {**NS, "model": "n"}},
                                   {"tile_bytes": TILE * 2}, {"num_layers": LAYERS + 1}])
def test_a_store_of_another_model_layout_or_kv_type_is_never_read(tmp_path, caplog, other):
    a = _store(tmp_path)
    _write(a, range(3))
    namespace = other.pop("namespace", NS)
    b = _store(tmp_path, namespace, **other)
    h, toks, _ = _page(1)
    if namespace is NS:  # same folder, other shape: the header check refuses it
        # (a layout change without a namespace change cannot happen through LLM, which
        # puts the shape in the namespace: this checks the second line of defence)
        with caplog.at_level(logging.WARNING):
            assert b.read(h, toks) is None
        assert "another layout" in caplog.text or "another model" in caplog.text
    else:
        assert b.folder != a.folder
        assert b.read(h, toks) is None and b.stats.dropped == 0
    assert b.stats.hit_pages == 0


def test_a_page_file_moved_into_another_namespace_is_refused(tmp_path, caplog):
    a, b = _store(tmp_path), _store(tmp_path, {**NS, "model": "other"})
    _write(a, [2])
    os.makedirs(b.folder, exist_ok=True)
    os.replace(_only_file(a), os.path.join(b.folder, os.path.basename(_only_file(a))))
    b._known = None
    with caplog.at_level(logging.WARNING):
        assert b.read(*_page(2)[:2]) is None
    assert "another model" in caplog.text


def test_the_size_limit_removes_least_recently_used_pages(tmp_path):
    probe = _store(tmp_path)
    limit = 10 * probe.file_bytes
    a = _store(tmp_path, max_bytes=limit)
    _write(a, range(8))
    time.sleep(0.05)
    for i in (0, 1):  # read: recently used
        assert a.read(*_page(i)[:2]) is not None
    time.sleep(0.05)
    _write(a, range(8, 14))
    total = sum(os.path.getsize(os.path.join(a.folder, n)) for n in os.listdir(a.folder) if n.endswith(".kv"))
    assert total <= limit
    on_disk = {i for i in range(14) if os.path.exists(a._path(_page(i)[0]))}
    assert {0, 1, 13} <= on_disk and 2 not in on_disk, on_disk
    for i in set(range(14)) - on_disk:
        assert a.wants(_page(i)[0])  # the index forgot what was removed


def test_prune_and_remove_store(tmp_path):
    a, b = _store(tmp_path), _store(tmp_path, {**NS, "model": "n"})
    _write(a, range(4))
    _write(b, range(4))
    infos = {s.key: s for s in disk.list_stores(str(tmp_path))}
    assert {k: s.pages for k, s in infos.items()} == {a.digest.hex(): 4, b.digest.hex(): 4}
    assert infos[a.digest.hex()].namespace["model"] == "m"
    removed, left = disk.prune(str(tmp_path), 5 * a.file_bytes)
    assert len(removed) == 3 and left == 5 * a.file_bytes
    assert disk.remove_store(str(tmp_path), b.digest.hex()) and not os.path.exists(b.folder)
    assert not disk.remove_store(str(tmp_path), "../x")


_KILL_WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from cache.test_disk_store import _page, _store
    store = _store(sys.argv[1], tile_bytes=int(sys.argv[2]))
    print("ready", flush=True)
    i = 0
    while True:  # write until killed
        h, toks, data = _page(i, tile=int(sys.argv[2]))
        if store.wants(h):
            store.put(h, toks, data)
        store.flush()
        i += 1
""")


def test_sigkill_during_writes_leaves_only_whole_pages(tmp_path):
    """20 writers killed at random points: the next store reads only whole, correct pages
    and clears the dead writers' temporary files."""
    tile = 1 << 19  # 1.5 MiB a page: a kill often lands inside a write
    rng = random.Random(5)
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "writer.py"
    script.write_text(_KILL_WRITER.format(tests=tests_dir))
    root = tmp_path / "store"
    torn = whole = 0
    for _ in range(20):
        p = subprocess.Popen([sys.executable, str(script), str(root), str(tile)], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        store = _store(root, tile_bytes=tile)
        names = os.listdir(store.folder) if os.path.isdir(store.folder) else []
        torn += any(n.endswith(disk.TMP_SUFFIX) for n in names)
        i, found = 0, 0
        while i < 200:
            h, toks, data = _page(i, tile=tile)
            got = store.read(h, toks)
            if got is not None:
                np.testing.assert_array_equal(got, data)
                found += 1
            i += 1
        assert store.stats.dropped == 0
        assert not any(n.endswith(disk.TMP_SUFFIX) for n in os.listdir(store.folder)) if names else True
        whole += found
    assert torn >= 1, "no kill landed inside a write: the test did not test what it says"
    assert whole > 0


def test_a_full_disk_fails_writes_with_one_log_line(tmp_path):
    """A write the file system refuses (here RLIMIT_FSIZE, as a full disk would) is logged
    once, leaves no temporary file, and the process goes on."""
    code = textwrap.dedent(f"""
        import logging, resource, signal, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        logging.basicConfig(level=logging.WARNING)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))
        from cache.test_disk_store import _page, _store
        store = _store(sys.argv[1])
        for i in range(5):
            h, toks, data = _page(i)
            store.put(h, toks, data)
        store.flush()
        print("errors", store.stats.write_errors, "written", store.stats.pages_written)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "errors 5 written 0" in r.stdout
    assert r.stderr.count("cannot write pages") == 1, r.stderr
    store = _store(tmp_path)
    assert [n for n in os.listdir(store.folder) if n != disk.NAMESPACE_FILE] == []
