"""The weights our kernels read in place, in huge pages (models/entry.py, entry_writer.py): weights.bin is
written in whole 2 MiB pieces, so that the page cache holds it in huge folios; a load maps
those arrays through a mapping of their own with huge pages, and reads them again once
when the page cache holds them in small folios. The pages stay the file's (clean,
reclaimable). Where the kernel or filesystem gives no huge pages for files the tests
that need them skip, naming why."""

from __future__ import annotations

import glob
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest

from dualpath.models import mapping
from dualpath.models.store import ALIGN, WRITE_CHUNK, EntryWriter, ModelStore
from dualpath.models.synth import synth_gguf


def _file_huge_pages(folder) -> bool:
    """Whether this kernel maps a file of ``folder``'s filesystem with huge pages: a 4 MiB
    file written in whole 2 MiB pieces, mapped with MADV_HUGEPAGE and populated."""
    huge = mapping.huge_page_bytes()
    if huge is None or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    path = os.path.join(folder, "probe.bin")
    with open(path, "wb") as f:
        for _ in range(2):
            f.write(np.random.default_rng(0).integers(0, 255, huge, np.uint8).tobytes())
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        ok = mapping.advise(m, mmap.MADV_HUGEPAGE) and mapping.advise(m, mapping.MADV_POPULATE_READ)
        got = ok and bool(mapping.pmd_mapped(m))
        m.close()
    os.unlink(path)
    return got


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory) -> str:
    """stories15M's shapes in Q8_0: a 32,000 x 288 classifier in our kernels' form (9.8 MB,
    whole huge pages of it)."""
    return synth_gguf(tmp_path_factory.mktemp("q8") / "s15-q8_0.gguf", "stories15M", "Q8_0", seed=5)


@pytest.fixture
def huge_pages(tmp_path):
    if not _file_huge_pages(tmp_path):
        pytest.skip("this kernel or filesystem maps no file pages with huge pages (THP off, "
                    "no large folios, or no MADV_POPULATE_READ)")


class _Recording:
    """A file that records where each write lands (the real file is written)."""

    def __init__(self, f):
        self.f, self.writes = f, []

    def write(self, data):
        self.writes.append((self.f.tell(), memoryview(data).nbytes))
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_weights_bin_is_written_in_whole_aligned_pieces(tmp_path):
    w = EntryWriter(str(tmp_path), str(tmp_path / "none.gguf"), None, 0)
    w.f = rec = _Recording(w.f)
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 255, n, np.uint8) for n in (5, 3 << 20, 70_000, 0, (4 << 20) + 17, 1)]
    records = [w._write(a) for a in arrays]
    w._append(bytes(-w._end % 8))
    w._flush()
    w.f.close()
    *chunks, last = rec.writes
    # every write but the closing one is whole pieces at a piece's start (the page cache then
    # makes huge folios of them); the last is what remains
    assert chunks and all(off % WRITE_CHUNK == 0 and n % WRITE_CHUNK == 0 for off, n in chunks)
    assert last[0] % WRITE_CHUNK == 0 and last[0] + last[1] == w._end
    data = np.fromfile(tmp_path / "weights.bin", np.uint8)
    assert len(data) == w._end and w._end % 8 == 0
    expect = np.zeros_like(data)
    for a, r in zip(arrays, records):
        assert r["offset"] % ALIGN == 0 and r["nbytes"] == a.nbytes
        expect[r["offset"]:r["offset"] + a.nbytes] = a
    assert np.array_equal(data, expect)  # the arrays where their records say, zeros between


def test_no_transparent_huge_pages_leaves_the_mapping_as_it_is(tmp_path, q8_model, monkeypatch):
    sysfs = tmp_path / "thp"
    sysfs.mkdir()
    (sysfs / "enabled").write_text("always madvise [never]\n")
    (sysfs / "hpage_pmd_size").write_text("2097152\n")
    monkeypatch.setattr(mapping, "THP_SYSFS", str(sysfs))
    spec = ModelStore(tmp_path / "cache").load(q8_model)
    assert spec.weights["output"].kernel_form
    assert spec.entry.page_in() == {}


def _rewrite_in_small_pieces(path: str) -> None:
    """The same bytes written again 1 MiB at a time from a 64 KiB offset, then synced: the
    page cache holds them in small folios, as an entry written by an older version, or one
    another process read, would be."""
    data = open(path, "rb").read()
    with open(path, "r+b") as f:
        os.fsync(f.fileno())  # (the conversion's pages, clean, leave the page cache: cached
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # folios would keep their size)
        f.write(data[:64 << 10])
        for i in range(64 << 10, len(data), 1 << 20):
            f.write(data[i:i + (1 << 20)])
        f.flush()
        os.fsync(f.fileno())


PAGE_IN = r"""
import json, sys
import numpy as np
from dualpath.models.store import ModelStore
spec = ModelStore(sys.argv[1]).load(sys.argv[2])
stats = spec.entry.page_in()
out = spec.weights["output"].data
print(json.dumps({**stats, "sum": int(out.astype(np.int64).sum())}))
"""


def _page_in(cache, model) -> dict:
    import json

    r = subprocess.run([sys.executable, "-c", PAGE_IN, str(cache), model], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def test_kernel_weights_are_mapped_with_huge_pages_and_read_again_from_small_folios(
        tmp_path, q8_model, huge_pages):
    cache = tmp_path / "cache"
    first = _page_in(cache, q8_model)  # converts: written in whole pieces, huge from the start
    assert first["kernel_weights_mib"] >= 4 and first["huge_mib"] == first["kernel_weights_mib"]
    assert not first["reread"]
    (wbin,) = glob.glob(str(cache / "*" / "weights.bin"))
    _rewrite_in_small_pieces(wbin)
    small = _page_in(cache, q8_model)  # small folios: dropped and read again, once
    assert small["reread"] and small["huge_mib"] >= small["kernel_weights_mib"] / 2
    again = _page_in(cache, q8_model)  # the page cache now holds huge folios
    assert not again["reread"] and again["huge_mib"] >= small["huge_mib"]
    assert first["sum"] == small["sum"] == again["sum"]  # the same bytes throughout


def test_an_llm_reports_its_kernel_weights_in_huge_pages(tmp_path, q8_model, huge_pages):
    from dualpath.config import load_config
    from dualpath.llm import LLM
    from dualpath.sampling.sampler import SamplingParams

    cfg = load_config(None, {"model_cache.dir": str(tmp_path / "cache"), "runtime.num_threads": 1})
    llm = LLM(q8_model, cfg)
    st = llm.load_stats
    assert st["huge_mib"] == st["kernel_weights_mib"] >= 4
    ids = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)).token_ids
    assert len(ids) == 8
    # the arrays are views of their own mapping, still the entry's file (checked, droppable)
    entry = llm.spec.entry
    assert entry._kernel_map is not None and entry.holds(llm.spec.weights["output"].data)
    assert not np.shares_memory(np.frombuffer(entry._weights_map, np.uint8), llm.spec.weights["output"].data)
