"""``dualpath bench embed`` on a tiny synthetic BERT: its workloads (short texts, passages fitted
to the model's positions), one process per engine and repeat, llama.cpp's two flash attention
settings, and what it prints and writes. No figure is asserted (2 shared cores)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dualpath import LLM
from dualpath.bench.embed import fit_passage, prepare, short_texts
from dualpath.cli import main
from dualpath.models.synth import synth_gguf


@pytest.fixture(scope="module")
def bert_file(tmp_path_factory):
    return synth_gguf(tmp_path_factory.mktemp("embed") / "bert-tiny.gguf", "bert-tiny", "F32")


def test_texts_are_short_sentences_and_a_passage_of_the_positions(bert_file):
    llm = LLM(bert_file)
    lengths = [len(llm.tokenize(t)) for t in short_texts(64)]
    assert 8 <= min(lengths) and max(lengths) <= 24
    assert short_texts(5) == short_texts(5) and short_texts(5) != short_texts(5, seed=1)
    passage = fit_passage(llm.tokenize, 128)
    assert 120 <= len(llm.tokenize(passage)) <= 128  # as close to the positions as whole words allow
    passages = prepare(bert_file, [1], 3)["passages"]  # each its own words, as a real batch's are
    assert len(set(passages)) == 3 and all(120 <= len(llm.tokenize(p)) <= 128 for p in passages)


def test_embed_bench_measures_each_workload_beside_llama_cpp(bert_file, tmp_path, capsys):
    out = tmp_path / "embed.json"
    peer = [] if importlib.util.find_spec("llama_cpp") else ["--no-peer"]
    assert main(["bench", "embed", "-m", bert_file, "--sizes", "1,3", "--passages", "2", "-r", "1", "--inner", "1",
                 "--json", str(out), *peer]) == 0
    (res,) = json.loads(out.read_text())
    assert res["model"] == "bert-tiny.gguf" and res["positions"] == 128 and res["threads"] == 2
    assert [(r["workload"], r["texts"]) for r in res["rows"]] == [("short x 1", 1), ("short x 3", 3),
                                                                  ("passage x 2", 2)]
    assert res["rows"][2]["tokens_per_text"] <= 128 and res["rerank"] is None  # not a reranker
    for r in res["rows"]:
        assert r["dualpath_tps"] > 0
        if not peer:
            assert set(r["settings"]) == {"FA off", "FA on"} and r["flash_attn"] in r["settings"]
            assert r["llama_cpp_tps"] == r["settings"][r["flash_attn"]] == max(r["settings"].values())
            assert r["ratio"] == pytest.approx(r["dualpath_tps"] / r["llama_cpp_tps"])
    text = capsys.readouterr().out
    assert "passage x 2" in text and "rerank" not in text
    if not peer:
        assert res["peer"]["build"] and "llama.cpp peer: llama-cpp-python" in text


def test_embed_bench_times_a_reranker_beside_llama_cpp(tmp_path, capsys):
    """A reranker's file: one query against 20 documents, the same pairs' token ids for both
    engines, llama.cpp's faster flash attention setting quoted."""
    path = synth_gguf(tmp_path / "ce.gguf", "bert-rerank-tiny", "F32")
    out = tmp_path / "rerank.json"
    peer = [] if importlib.util.find_spec("llama_cpp") else ["--no-peer"]
    assert main(["bench", "embed", "-m", path, "-r", "1", "--inner", "1", "--json", str(out), *peer]) == 0
    (res,) = json.loads(out.read_text())
    rr = res["rerank"]
    assert res["rows"] == [] and rr["documents"] == 20 and rr["dualpath_ms"] > 0
    assert 4 < rr["tokens_per_pair"] <= res["positions"]
    if not peer:
        assert set(rr["settings"]) == {"FA off", "FA on"} and rr["llama_cpp_ms"] == min(rr["settings"].values())
        assert rr["ratio"] == pytest.approx(rr["llama_cpp_ms"] / rr["dualpath_ms"])
    assert "rerank, 1 query x 20 documents" in capsys.readouterr().out


def test_embed_bench_refuses_bad_sizes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "embed", "-m", "x.gguf", "--sizes", "16,0"])
    assert "comma-separated numbers of texts" in capsys.readouterr().err
