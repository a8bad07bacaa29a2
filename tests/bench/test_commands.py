"""``dualpath bench e2e|memory|power|serve|load|embed-serve`` with tiny settings on stories260K: each
runs its measurements through the harness and prints and writes what it says. No
figure is asserted (2 shared cores); ``bench cache`` and ``bench kernels`` have
their own tests (tests/cache, tests/kernels), ``bench load`` its 64-client run
(tests/server/test_load.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dualpath.cli import main


def test_e2e_measures_every_engine_in_its_own_process(gguf_path, tmp_path, capsys):
    out = tmp_path / "e2e.json"
    peer = [] if importlib.util.find_spec("llama_cpp") else ["--no-peer"]
    assert main(["bench", "e2e", "-m", str(gguf_path), "--ctx", "16", "--decode", "4", "--chunk", "16",
                 "-t", "1", "-r", "1", "--no-ortgenai", "--json", str(out), *peer]) == 0
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == (["dualpath"] if peer else ["dualpath", "llama.cpp"])
    for r in rows:
        assert r["model"] == "stories260K.gguf" and r["runs"] == 1 and r["ctx"] == 16
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0 and r["peak_rss_mb"] > 0
    assert "stories260K.gguf" in capsys.readouterr().out


def test_e2e_kv_dtype_adds_a_dualpath_row_per_kv_type(gguf_path, tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "-m", str(gguf_path), "--ctx", "16", "--decode", "4", "--chunk", "16",
                 "-t", "1", "-r", "1", "--no-peer", "--kv-dtype", "f16,q8", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == ["dualpath", "dualpath q8"]
    assert all(r["decode_tps"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "-m", str(gguf_path), "--kv-dtype", "f8"])
    assert "comma-separated KV types" in capsys.readouterr().err


def test_e2e_ort_pools_adds_a_row_per_arrangement_and_kv_type(gguf_path, tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "-m", str(gguf_path), "--ctx", "16", "--decode", "4", "--chunk", "16",
                 "-t", "2", "-r", "1", "--no-peer", "--kv-dtype", "f16,q8", "--ort-pools", "shared,per_part",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == ["dualpath", "dualpath q8", "dualpath per_part", "dualpath q8 per_part"]
    assert all(r["decode_tps"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "-m", str(gguf_path), "--ort-pools", "global"])
    assert "comma-separated ORT pool arrangements from shared, per_part" in capsys.readouterr().err


def test_memory_measures_every_part_beside_the_plan(gguf_path, tmp_path, capsys):
    out = tmp_path / "memory.json"
    peer = ["--peer"] if importlib.util.find_spec("llama_cpp") else []
    assert main(["bench", "memory", "-m", str(gguf_path), "--ctx", "32", "--decode", "4", "--chunk", "16",
                 "-t", "1", "-r", "1", "--json", str(out), *peer]) == 0
    runs = json.loads(out.read_text())
    ours = runs["dualpath"][0]
    parts = ("runtime", "vocabulary", "weights", "kv cache", "activations")
    assert set(ours["measured"]) == set(ours["plan"]) == set(parts)
    assert ours["measured"]["runtime"] > 10 and ours["measured"]["kv cache"] > 0  # the arena's pages were written
    assert ours["peak_rss_mb"] >= ours["end_rss_mb"] > 0 and ours["plan_mb"] > 0
    assert sum(ours["kinds"].values()) > 0
    assert ("llama.cpp" in runs) == bool(peer)
    text = capsys.readouterr().out
    assert "plan / measured" in text and all(p in text for p in parts)


def test_power_gives_one_row_per_profile(gguf_path, tmp_path, capsys):
    out = tmp_path / "power.json"
    assert main(["bench", "power", "-m", str(gguf_path), "--prompt", "8", "--tokens", "4", "-r", "1",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["profile"] for r in rows] == ["performance", "low_power"]
    assert all(r["cpu_s_per_token"] > 0 and r["runs"] == 1 for r in rows)
    text = capsys.readouterr().out
    assert "\nperformance " in text and "\nlow_power " in text


def test_serve_runs_the_same_schedule_in_every_mode(gguf_path, tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "-m", str(gguf_path), "--requests", "4", "--rate", "100", "--ctx", "256",
                 "--system-tokens", "16", "--doc-tokens", "96", "--doc-share", "0.5", "--max-num-seqs", "4",
                 "--modes", "dual,random", "-t", "1", "--set", "runtime.prefill_chunk_tokens=64",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["params"]["overrides"] == {"runtime.prefill_chunk_tokens": 64}
    assert list(res["runs"]) == ["dual", "random"]
    for mode, runs in res["runs"].items():
        assert len(runs) == 1 and runs[0]["mode"] == mode and runs[0]["requests"] == 4
        assert runs[0]["generated_tokens"] > 0
    assert "dual vs random" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["serve", "load"])
@pytest.mark.parametrize("item, fragment", [
    ("runtime.num_threads", "expected KEY=VALUE"),
    ("runtime.num_threads=[", "not valid YAML"),
    ("runtime.num_thread=2", "did you mean runtime.num_threads"),
], ids=["no-equals", "bad-yaml", "unknown-key"])
def test_a_bad_set_is_a_usage_error_before_anything_runs(command, item, fragment, tmp_path, capsys):
    never_read = tmp_path / "no-model-needed.gguf"
    assert main(["bench", command, "-m", str(never_read), "--set", item]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("dualpath: error: ") and fragment in captured.err
    assert captured.out == ""  # nothing started, nothing printed


def test_embed_serve_measures_decode_alone_and_beside_embedding_batches(gguf_path, tmp_path, capsys):
    from dualpath.models.synth import synth_gguf

    bert = synth_gguf(tmp_path / "bert-tiny.gguf", "bert-tiny", "F32")
    out = tmp_path / "embed.json"
    assert main(["bench", "embed-serve", "-m", str(gguf_path), "--embedding-model", bert, "--tokens", "16",
                 "--batch", "8", "-r", "1", "-t", "1", "--embed-seconds", "0.3", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["alone_tok_s"] > 0 and row["beside_tok_s"] > 0 and res["embed_texts_per_s_alone"] > 0
    assert "slower, bound 1.30x" in capsys.readouterr().out
