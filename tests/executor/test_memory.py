"""Resident memory: what a loaded model keeps mapped, and the row reads that keep the
token-embedding table out of the process (``kernels.read_rows``).

Residency is read from /proc/self/pagemap (bit 63: the page is mapped in this process),
not from mincore, which answers for the page cache."""

from __future__ import annotations

import errno
import os
import sys

import numpy as np
import pytest

from dualpath.bench.memory import resident_bytes
from dualpath.config import load_config
from dualpath.executor.runner_step import TokenEmbedding, this_machines_read_ahead
from dualpath.kernels import read_rows
from dualpath.llm import LLM
from dualpath.models.synth import synth_gguf
from dualpath.sampling.sampler import SamplingParams

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")

PAGE = os.sysconf("SC_PAGE_SIZE")


def mapped_bytes(a: np.ndarray) -> int:
    """Bytes of ``a``'s pages mapped in this process."""
    return resident_bytes(a.ctypes.data, a.nbytes)


def weight_arrays(spec, name: str | None = None) -> list[np.ndarray]:
    ws = [spec.weights[name]] if name else spec.weights.values()
    return [a for w in ws for a in w.arrays().values() if a.nbytes]


@pytest.fixture
def table_file(tmp_path):
    rows = np.arange(10 * 12, dtype=np.uint8).reshape(10, 12)
    path = tmp_path / "table.bin"
    path.write_bytes(b"x" * 100 + rows.tobytes())
    fd = os.open(path, os.O_RDONLY)
    yield fd, rows, path
    os.close(fd)


def test_read_rows_reads_the_rows_asked_for_in_their_order(table_file):
    fd, rows, _ = table_file
    ids = np.array([7, 0, 7, 9], np.int64)
    out = read_rows(fd, 100, 12, 10, ids, np.zeros((4, 12), np.uint8))
    np.testing.assert_array_equal(out, rows[ids])


def test_read_rows_refuses_ids_outside_the_table_and_short_buffers(table_file):
    fd, _, _ = table_file
    with pytest.raises(IndexError, match="outside the table"):
        read_rows(fd, 100, 12, 10, np.array([3, 10], np.int64), np.zeros((2, 12), np.uint8))
    with pytest.raises(IndexError):
        read_rows(fd, 100, 12, 10, np.array([-1], np.int64), np.zeros((1, 12), np.uint8))
    with pytest.raises(ValueError, match="cannot hold 2 rows of 12 bytes"):
        read_rows(fd, 100, 12, 10, np.array([1, 2], np.int64), np.zeros((1, 12), np.uint8))


def test_read_rows_names_a_file_shorter_than_its_table_and_a_bad_descriptor(table_file):
    fd, _, path = table_file
    os.truncate(path, 100 + 12 * 5)  # rows 5.. are gone
    out = np.zeros((1, 12), np.uint8)
    read_rows(fd, 100, 12, 10, np.array([4], np.int64), out)
    with pytest.raises(OSError) as e:
        read_rows(fd, 100, 12, 10, np.array([5], np.int64), out)
    assert e.value.errno == errno.EIO and "the table" in str(e.value)
    with pytest.raises(OSError) as e:
        read_rows(9999, 100, 12, 10, np.array([0], np.int64), out)
    assert e.value.errno == errno.EBADF


@pytest.mark.parametrize("weight_type", ["F32", "Q8_0", "Q4_0", "Q4_K_M"])
def test_embedding_rows_read_from_the_file_equal_the_mapped_ones(weight_type, tmp_path):
    path = synth_gguf(tmp_path / f"tiny-{weight_type}.gguf", "kquant-tiny", weight_type, seed=5)
    llm = LLM(path, load_config(None, {"runtime.num_threads": 1, "runtime.max_context_tokens": 64}))
    w, entry = llm.spec.weights["token_embd"], llm.spec.entry
    ids = np.array([4095, 0, 17, 17, 2048, 1], np.int64)
    from_file = TokenEmbedding(w, 1.0, 8, entry)
    assert from_file._reads is not None  # every array of the table lies in one of the entry's files
    a, b = np.zeros((6, w.shape[1]), np.float32), np.ones((6, w.shape[1]), np.float32)
    from_file(ids, a)
    TokenEmbedding(w, 1.0)(ids, b)  # through the mapping
    np.testing.assert_array_equal(a, b)
    assert np.abs(a).sum() > 0


def test_a_loaded_model_maps_only_the_matrices_our_kernels_read(tmp_path):
    """After load every weight is read by row (the embedding), or read in place by our
    kernels (the 8-bit classifier, a layer's matrices in their form), or a copy (the norms):
    no other page of the entry's weights.bin stays mapped, before or after a prompt over
    the whole vocabulary (the embedding's rows are read, not mapped)."""
    path = synth_gguf(tmp_path / "tiny-q8.gguf", "kquant-tiny", "Q8_0", seed=6)
    llm = LLM(path, load_config(None, {"runtime.num_threads": 2, "runtime.max_context_tokens": 600}))
    arrays = weight_arrays(llm.spec)
    assert sum(a.nbytes for a in arrays) > 3 << 20
    assert llm.spec.classifier_in_kernels and llm.spec.output.kernel_form
    classifier = [w.data for w in llm.spec.weights.values() if w.kernel_form]
    assert len(classifier) == 1 + 7 * llm.spec.config.num_layers

    # The arrays our kernels read have a mapping of their own (huge pages where the kernel
    # gives them: models/entry.py, Entry.page_in), which maps nothing else beyond the huge pages they
    # lie in; of the other mapping, the whole file, not only the arrays' own bytes: reading a
    # small array (a norm) maps its fault-around window, the padding to the next array and
    # that array's first pages.
    entry = llm.spec.entry
    whole = np.frombuffer(entry._weights_map, np.uint8)
    own = np.frombuffer(entry._kernel_map, np.uint8)
    assert all(np.shares_memory(a, own) for a in classifier)
    g = 2 << 20 if llm.load_stats.get("huge_mib") else 64 << 10  # a huge page, or a fault-around window
    starts = [a.ctypes.data - own.ctypes.data for a in classifier]
    covering = g * len({c for a, o in zip(classifier, starts) for c in range(o // g, (o + a.nbytes - 1) // g + 1)})
    assert whole.nbytes > 4 << 20 and mapped_bytes(whole) == 0 and mapped_bytes(own) <= covering
    prompt = np.random.default_rng(0).permutation(llm.spec.config.vocab_size)[:512].tolist()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    # The norms ONNX Runtime reads at every step are copies (ort_sessions.SMALL_ARRAY_BYTES),
    # and the embedding's rows are read, not mapped; what our kernels read, whole every step.
    assert mapped_bytes(whole) == 0 and mapped_bytes(own) <= covering
    assert all(mapped_bytes(a) >= a.nbytes - 4096 for a in classifier)


def test_each_product_of_a_step_reads_the_next_ones_weights_ahead(tmp_path):
    """Between two products the calling thread runs graph parts; the pool's workers then
    read the next product's first weight: every product has the one after it, the last
    layer's the classifier, and the classifier the first layer's (the next step's)."""
    path = synth_gguf(tmp_path / "tiny-q8.gguf", "kquant-tiny", "Q8_0", seed=6)
    llm = LLM(path, load_config(None, {"runtime.num_threads": 2, "runtime.max_context_tokens": 600}))
    llm.generate("once upon a time", SamplingParams(max_tokens=2, temperature=0))
    runner = llm.engine.runner
    bindings = list(runner._bindings.values())
    assert bindings
    for b in bindings:
        mms = [k.mm for k in b._kernels] + [runner._classifier.mm, b._kernels[0].mm]
        assert len(mms) > 2 + llm.spec.config.num_layers
        for mm, following in zip(mms, mms[1:]):
            assert mm.read_ahead_bytes == min(this_machines_read_ahead(), following.weights[0][1].nbytes)
