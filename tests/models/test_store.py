"""The converted-model cache (models/store.py): a cached load is the same model as a
fresh one, a changed source or a damaged entry is never used, writers do not trip
over one another, and the CLI manages entries."""

from __future__ import annotations

import base64
import glob
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from dualpath.config import load_config
from dualpath.executor.session import nbits8_graphs
from dualpath.graph.parts import graph_folder_name
from dualpath.llm import LLM
from dualpath.models import load_model
from dualpath.models.store import ModelStore
from dualpath.models.synth import synth_gguf
from dualpath.sampling.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory) -> str:
    """A small Q4_0 GGUF (random weights): its entry holds converted MatMulNBits arrays."""
    return synth_gguf(tmp_path_factory.mktemp("q4") / "kquant-tiny-q4_0.gguf", "kquant-tiny", "Q4_0", seed=3)


def cfg(cache_dir, enabled: bool = True):
    return load_config(None, {"model_cache.dir": str(cache_dir), "model_cache.enabled": enabled,
                              "runtime.num_threads": 1})


def greedy_ids(llm: LLM, prompt: str = "Once upon a time") -> tuple[int, ...]:
    return llm.generate(prompt, GREEDY).token_ids


def entry_folder(store: ModelStore, path) -> str:
    return os.path.join(store.root, store.key(os.fspath(path)))


@pytest.mark.parametrize("which", ["gguf", "q4_0", "llama2c"])
def test_a_cached_load_generates_the_same_tokens_as_an_uncached_one(which, tmp_path, gguf_path, llama2c_path,
                                                                     q4_model):
    path = {"gguf": gguf_path, "q4_0": q4_model, "llama2c": llama2c_path}[which]
    fresh = LLM(path, cfg(tmp_path / "off", enabled=False))
    assert fresh.load_stats["cache"] == "off"
    assert not (tmp_path / "off").exists()  # nothing written where caching is off
    first = LLM(path, cfg(tmp_path / "c"))
    again = LLM(path, cfg(tmp_path / "c"))
    assert (first.load_stats["cache"], again.load_stats["cache"]) == ("miss", "hit")
    expected = greedy_ids(fresh)
    assert len(expected) == 24
    assert greedy_ids(first) == expected
    assert greedy_ids(again) == expected
    for name, w in fresh.spec.weights.items():
        for kind, arr in w.arrays().items():
            assert np.array_equal(arr, again.spec.weights[name].arrays()[kind]), (name, kind)
    assert again.spec.tokenizer == fresh.spec.tokenizer and again.spec.config == fresh.spec.config


def test_a_cached_load_reproduces_the_llama2c_golden_run(tmp_path, gguf_path, models_dir):
    """The reference ids of run.c (greedy, "Once upon a time") from a cached entry."""
    runs = json.loads((models_dir / "reference" / "greedy_token_ids.json").read_text())["runs"]
    ref = next(r for r in runs if r["name"] == "greedy_once_upon_a_time")
    LLM(gguf_path, cfg(tmp_path))
    llm = LLM(gguf_path, cfg(tmp_path))
    assert llm.load_stats["cache"] == "hit"
    n = 64
    c = llm.generate(ref["prompt_ids"], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    assert list(c.token_ids) == ref["generated_ids"][:n]


def test_converted_arrays_live_in_the_entry_and_f32_views_stay_in_the_source(tmp_path, q4_model, gguf_path):
    store = ModelStore(tmp_path)
    q = store.load(q4_model)
    man = json.loads(open(os.path.join(entry_folder(store, q4_model), "manifest.json")).read())
    where = {(k, kind): a["in"] for k, w in man["weights"].items() for kind, a in w["arrays"].items()}
    # a layer's matrix and the classifier: our kernels' form (one array each)
    for name in ("blk.0.attn_q", "output"):
        assert where[(name, "weight")] == "entry" and (name, "scales") not in where
        assert q.weights[name].kernel_form and man["weights"][name]["kernel_form"]
    assert not q.weights["blk.0.attn_q"].data.flags.writeable  # a read-only view of the mapping
    f = store.load(gguf_path)  # F32 file: every array a view of the source, plus the
    # (in, out) transposes the graphs' MatMul reads (the tied embedding's too: lm_head)
    man = json.loads(open(os.path.join(entry_folder(store, gguf_path), "manifest.json")).read())
    assert {(kind, a["in"]) for w in man["weights"].values() for kind, a in w["arrays"].items()} == {
        ("weight", "source"), ("weight_t", "entry")}
    ref = load_model(gguf_path)
    assert not f.config.tied_output
    for name in ("blk.1.ffn_up", "blk.0.attn_q", "output"):
        assert np.array_equal(f.weights[name].data, ref.weights[name].data)
        assert np.array_equal(f.weights[name].data_t, ref.weights[name].data.T), name
        assert f.weights[name].data_t.flags.c_contiguous
    assert f.weights["token_embd"].data_t is None  # the gather reads rows; lm_head is `output`
    assert f.weights["blk.0.attn_norm"].data_t is None  # vectors have one layout
    assert man["weights_bytes"] >= sum(w.data.nbytes for w in ref.weights.values() if w.data.ndim == 2)


def test_a_tied_float_classifier_gets_its_transpose(tmp_path, llama2c_path, model_file):
    """llama2.c's shared classifier: the embedding stays (vocab, dim) for the gather, and
    lm_head reads its transpose, written at the end of the conversion."""
    spec = ModelStore(tmp_path).load(llama2c_path, model_file("tok512.bin"))
    emb = spec.weights["token_embd"]
    assert spec.config.tied_output and spec.output is emb
    assert emb.data.shape == (spec.config.vocab_size, spec.config.dim)
    assert emb.data_t.flags.c_contiguous and np.array_equal(emb.data_t, emb.data.T)
    spec.entry.verify()  # its checksum, computed band by band, matches what is on disk


def test_a_converted_float_matrix_is_stored_once(tmp_path, gguf_path):
    """A float matrix converted at load (here: F16 widened to f32) is stored (in, out)
    only; its (out, in) data is read back as a view of that transpose."""
    import gguf

    src = tmp_path / "f16.gguf"
    reader = gguf.GGUFReader(gguf_path)
    writer = gguf.GGUFWriter(str(src), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # GGUFWriter writes these itself
        writer.add_key_value(key, field.contents(), field.types[0],
                             sub_type=field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        writer.add_tensor(t.name, data.astype(np.float16) if data.ndim == 2 else data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    store = ModelStore(tmp_path / "cache")
    spec = store.load(src)
    man = json.loads(open(os.path.join(entry_folder(store, src), "manifest.json")).read())
    up = man["weights"]["blk.0.ffn_up"]["arrays"]
    assert up["weight"] == {"in": "transpose", "of": "weight_t"} and up["weight_t"]["in"] == "entry"
    w = spec.weights["blk.0.ffn_up"]
    assert np.shares_memory(w.data, w.data_t) and np.array_equal(w.data, w.data_t.T)
    ref = load_model(src)
    assert np.array_equal(w.data, ref.weights["blk.0.ffn_up"].data)


def test_a_changed_source_header_is_never_served_stale(tmp_path, q4_model, caplog):
    """Same size, same mtime, same first 64 KiB (the entry's key): only the hash of the
    whole header and tensor table can tell. kquant-tiny's header is about 80 KiB."""
    import gguf

    src = tmp_path / "m.gguf"
    src.write_bytes(open(q4_model, "rb").read())
    reader = gguf.GGUFReader(src)
    field = reader.fields["tokenizer.ggml.token_type"]  # one int32 per token, the header's last array
    base = reader.data.ctypes.data
    index, part = next((n, field.parts[i]) for n, i in enumerate(field.data)
                       if field.parts[i].ctypes.data - base > (1 << 16) and int(field.parts[i][0]) == 1)
    offset = part.ctypes.data - base
    assert offset < reader.data_offset
    del reader, field, part
    store = ModelStore(tmp_path / "cache")
    assert store.load(src).tokenizer.token_types[index] == 1  # normal
    st = os.stat(src)
    with open(src, "r+b") as f:
        f.seek(offset)
        f.write(np.int32(4).tobytes())  # user-defined
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    stats: dict = {}
    with caplog.at_level(logging.WARNING, logger="dualpath.models.store"):
        spec = store.load(src, stats=stats)
    assert stats["cache"] == "miss"
    assert "header and tensor table changed" in caplog.text
    assert spec.tokenizer.token_types[index] == 4


def test_a_changed_first_64k_is_a_new_entry(tmp_path, gguf_path):
    src = tmp_path / "m.gguf"
    data = bytearray(gguf_path.read_bytes())
    src.write_bytes(data)
    store = ModelStore(tmp_path / "cache")
    store.load(src)
    st = os.stat(src)
    i = data.index(b"Lily")
    data[i:i + 4] = b"Lucy"
    src.write_bytes(data)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    stats: dict = {}
    spec = store.load(src, stats=stats)
    assert stats["cache"] == "miss" and "Lucy" in "".join(spec.tokenizer.tokens)


def test_a_touched_source_gets_a_new_entry(tmp_path, gguf_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(gguf_path.read_bytes())
    store = ModelStore(tmp_path / "cache")
    store.load(src)
    os.utime(src, ns=(0, os.stat(src).st_mtime_ns + 10**9))
    stats: dict = {}
    store.load(src, stats=stats)
    assert stats["cache"] == "miss"
    assert len(store.entries()) == 2


@pytest.mark.parametrize("damage", ["truncate weights", "flip a weight byte", "garble manifest",
                                    "drop tokenizer", "short tokenizer array", "remove a graph part",
                                    "garble parts.json"])
def test_a_damaged_entry_is_logged_discarded_and_rebuilt(damage, tmp_path, q4_model, caplog):
    first = LLM(q4_model, cfg(tmp_path))
    expected = greedy_ids(first)
    store = ModelStore(tmp_path)
    folder = entry_folder(store, q4_model)
    weights = os.path.join(folder, "weights.bin")
    graphs = os.path.join(folder, graph_folder_name(4, 512, nbits8_graphs(first.spec)))  # kquant-tiny: 512 positions
    assert os.path.isdir(graphs), os.listdir(folder)
    if damage == "truncate weights":
        os.truncate(weights, os.path.getsize(weights) // 2)
    elif damage == "flip a weight byte":
        man = json.loads(open(os.path.join(folder, "manifest.json")).read())
        off = man["weights"]["blk.1.ffn_down"]["arrays"]["weight"]["offset"] + 1234
        with open(weights, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x10]))
    elif damage == "garble manifest":
        with open(os.path.join(folder, "manifest.json"), "r+b") as f:
            f.truncate(100)
    elif damage == "drop tokenizer":
        os.remove(os.path.join(folder, "tokenizer.json"))
    elif damage == "short tokenizer array":  # one token type fewer than tokens: base64 that decodes
        path = os.path.join(folder, "tokenizer.json")
        tok = json.loads(open(path).read())
        raw = base64.b64decode(tok["token_types"]["base64"])
        tok["token_types"]["base64"] = base64.b64encode(raw[:-4]).decode()
        with open(path, "w") as f:
            json.dump(tok, f)
    elif damage == "remove a graph part":
        os.remove(sorted(glob.glob(os.path.join(graphs, "part1*.onnx")))[0])
    else:
        with open(os.path.join(graphs, "parts.json"), "w") as f:
            f.write("{not json")
    with caplog.at_level(logging.WARNING):
        again = LLM(q4_model, cfg(tmp_path))
    assert "discarding" in caplog.text
    assert greedy_ids(again) == expected
    # rebuilt: the next load is a clean hit with nothing to log
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        third = LLM(q4_model, cfg(tmp_path))
    assert third.load_stats["cache"] == "hit" and "discarding" not in caplog.text


def test_a_writer_that_died_leaves_nothing_that_loads_and_prune_removes_it(tmp_path, gguf_path):
    store = ModelStore(tmp_path)
    key = store.key(os.fspath(gguf_path))
    dead = tmp_path / f".tmp-{key}-99999-1"
    dead.mkdir(parents=True)
    (dead / "weights.bin").write_bytes(b"\0" * 100)  # what a crash mid-write leaves
    stats: dict = {}
    store.load(gguf_path, stats=stats)
    assert stats["cache"] == "miss"
    os.utime(dead, (0, 0))  # older than STALE_TMP_S
    store.enforce_limit()
    assert not dead.exists()
    assert [e.key for e in store.entries()] == [key]


def test_two_processes_loading_the_same_file_at_once_both_succeed(tmp_path, q4_model):
    code = ("import sys; from dualpath import LLM; from dualpath.config import load_config; "
            "from dualpath.sampling.sampler import SamplingParams as P; "
            "llm = LLM(sys.argv[1], load_config(None, {'runtime.num_threads': 1})); "
            "print(list(llm.generate('Once', P(temperature=0, max_tokens=8, ignore_eos=True)).token_ids))")
    env = {**os.environ, "DUALPATH_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code, q4_model], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert outs[0][0] == outs[1][0] and len(json.loads(outs[0][0])) == 8
    entries = ModelStore(tmp_path).entries()
    spec = LLM(q4_model, cfg(tmp_path)).spec
    assert len(entries) == 1 and entries[0].graphs == [graph_folder_name(4, 512, nbits8_graphs(spec))]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]


def test_a_cached_load_never_imports_onnx_or_gguf(tmp_path, q4_model):
    LLM(q4_model, cfg(tmp_path))
    code = ("import sys; from dualpath import LLM; from dualpath.config import load_config; "
            f"llm = LLM(sys.argv[1], load_config(None, {{'model_cache.dir': {str(tmp_path)!r}}})); "
            "print(llm.load_stats['cache'], 'onnx' in sys.modules, 'gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, q4_model], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["hit", "False", "False"]


def test_progress_reports_conversion_then_sessions(tmp_path, q4_model):
    seen = []
    LLM(q4_model, cfg(tmp_path), progress=lambda stage, done, total: seen.append((stage, done, total)))
    stages = [s for s, _, _ in seen]
    assert stages[0] == "convert" and stages[-1] == "sessions"
    convert = [(d, t) for s, d, t in seen if s == "convert"]
    assert all(t == os.path.getsize(q4_model) for _, t in convert)  # bytes of the file
    assert all(b[0] > a[0] for a, b in zip(convert, convert[1:])) and 0 < convert[-1][0] <= convert[-1][1]
    sessions = [(d, t) for s, d, t in seen if s == "sessions"]
    # kquant-tiny: 2 layers + the lm_head part, each cut at our products into its graphs
    assert sessions[-1][0] == sessions[-1][1] > 3
    seen.clear()
    LLM(q4_model, cfg(tmp_path), progress=lambda stage, done, total: seen.append(stage))
    assert set(seen) == {"sessions"}  # cached: nothing to convert


def test_the_size_limit_removes_least_recently_used_entries(tmp_path, gguf_path, llama2c_path, q4_model):
    store = ModelStore(tmp_path)
    for p in (gguf_path, llama2c_path, q4_model):
        store.load(p)
    q4_key = store.key(os.fspath(q4_model))
    old = store.key(os.fspath(gguf_path))
    os.utime(os.path.join(tmp_path, old, "manifest.json"), (1, 1))  # the oldest use
    q4_bytes = next(e.size_bytes for e in store.entries() if e.key == q4_key)
    removed = store.enforce_limit(max_bytes=q4_bytes + 1)
    assert removed[0].key == old
    left = {e.key for e in store.entries()}
    assert q4_key in left and old not in left


def test_cache_cli_lists_removes_and_prunes(tmp_path, gguf_path, q4_model):
    store = ModelStore(tmp_path)
    store.load(gguf_path)
    store.load(q4_model)
    env = {**os.environ, "DUALPATH_CACHE_DIR": str(tmp_path)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dualpath.cli", "cache", *args], capture_output=True,
                              text=True, env=env, timeout=120)

    out = cli("ls")
    assert out.returncode == 0, out.stderr
    assert os.fspath(q4_model) in out.stdout and "2 entries" in out.stdout
    key = store.key(os.fspath(gguf_path))
    out = cli("rm", key)
    assert out.returncode == 0 and "removed 1 entries" in out.stdout
    out = cli("rm", "nosuchkey")
    assert out.returncode == 1 and "no cache entry or prefix store 'nosuchkey'" in out.stderr
    out = cli("prune", "--max-size-gb", "0")
    assert out.returncode == 0 and "1 entries removed" in out.stdout
    assert store.entries() == []


def test_cache_cli_lists_prunes_and_removes_prefix_stores(tmp_path):
    import numpy as np

    from dualpath.cache.disk import PrefixStore, list_stores

    root = tmp_path / "prefix"
    pages = PrefixStore(str(root), {"model": "m", "source": "m.gguf", "kv_dtype": "q8", "page_tokens": 4},
                        page_tokens=4, num_layers=2, tile_bytes=64, max_bytes=1 << 20)
    for i in range(3):
        pages.put(bytes([i]) * 16, [i] * 4, np.full((2, 64), i, np.uint8))
    pages.flush()
    env = {**os.environ, "DUALPATH_CACHE_DIR": str(tmp_path / "models")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dualpath.cli", "cache", "--prefix-dir", str(root), *args],
                              capture_output=True, text=True, env=env, timeout=120)

    out = cli("ls")
    assert out.returncode == 0, out.stderr
    assert "prefix pages of m.gguf (kv q8, 4-token pages, 3 pages)" in out.stdout and "1 prefix stores" in out.stdout
    out = cli("prune", "--prefix-max-size-gb", str(2 * pages.file_bytes / (1 << 30)))
    assert out.returncode == 0 and "1 prefix pages removed" in out.stdout, out.stdout
    assert [s.pages for s in list_stores(str(root))] == [2]
    out = cli("rm", pages.digest.hex())
    assert out.returncode == 0 and "removed 1 entries" in out.stdout
    assert list_stores(str(root)) == []


def test_an_unwritable_cache_folder_is_a_clear_error(tmp_path, gguf_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    from dualpath.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="cannot write the converted-model cache"):
        ModelStore(blocker / "cache").load(gguf_path)
