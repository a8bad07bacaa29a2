"""onnxruntime-genai as the third engine of ``dualpath bench e2e``: its options, the
one-line notice when its environment is missing or a file does not fit it, and (where
an environment with onnxruntime-genai exists) a real build and run on a tiny
synthetic model.

The environment is found through ``$DUALPATH_ORTGENAI_PYTHON``, else
``<repo>/../ortg-venv/bin/python`` (examples/peers/setup_ortgenai_env.sh makes it);
the tests that need it skip, naming both, where neither exists."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from dualpath.bench import ortgenai
from dualpath.cli import build_parser, main
from dualpath.models.synth import synth_gguf
from tests_shared import REPO_ROOT

TINY = "kquant-tiny"
"""A plain llama shape (dim 256, 2 layers, vocab 4096, context 512): builds in seconds."""


@pytest.fixture(scope="module")
def peer_python() -> str:
    path = os.environ.get(ortgenai.PYTHON_ENV) or str(REPO_ROOT.parent / "ortg-venv" / "bin" / "python")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no onnxruntime-genai environment at {path} (${ortgenai.PYTHON_ENV}, else "
                    f"<repo>/../ortg-venv): make one with {ortgenai.SETUP_SCRIPT}")
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return Path(synth_gguf(tmp_path_factory.mktemp("ortg") / "tiny-f32.gguf", TINY, "F32"))


# -- options and notices (no onnxruntime-genai needed) ----------------------------------

def test_e2e_takes_the_ortgenai_options():
    args = build_parser().parse_args(["bench", "e2e", "-m", "m.gguf", "--ortgenai-python", "/env/bin/python",
                                      "--ortgenai-precision", "int4", "--ortgenai-cache", "/c"])
    assert (args.ortgenai_python, args.ortgenai_precision, args.ortgenai_cache, args.no_ortgenai) == \
        ("/env/bin/python", "int4", "/c", False)
    defaults = build_parser().parse_args(["bench", "e2e", "-m", "m.gguf", "--no-ortgenai"])
    assert (defaults.ortgenai_python, defaults.ortgenai_precision, defaults.ortgenai_cache) == (None, "auto", None)
    assert defaults.no_ortgenai


def test_an_unknown_precision_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "e2e", "-m", "m.gguf", "--ortgenai-precision", "fp16"])
    assert e.value.code == 2 and "--ortgenai-precision" in capsys.readouterr().err


def test_default_interpreter_is_the_environment_variable_else_this_one(monkeypatch):
    monkeypatch.setenv(ortgenai.PYTHON_ENV, "/peer/bin/python")
    assert ortgenai.default_python() == "/peer/bin/python"
    monkeypatch.delenv(ortgenai.PYTHON_ENV)
    assert ortgenai.default_python() == sys.executable


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is not None,
                    reason="this interpreter has onnxruntime_genai: it is not the missing environment")
def test_an_interpreter_without_onnxruntime_genai_skips_the_engine_with_one_line(gguf_path, tmp_path, capsys):
    out = tmp_path / "e2e.json"
    peer = [] if importlib.util.find_spec("llama_cpp") else ["--no-peer"]
    if peer:
        pytest.skip("llama-cpp-python is not installed (--no-peer would leave onnxruntime-genai out too)")
    assert main(["bench", "e2e", "-m", str(gguf_path), "--ctx", "16", "--decode", "4", "--chunk", "16", "-t", "1",
                 "-r", "1", "--ortgenai-python", sys.executable, "--ortgenai-cache", str(tmp_path / "c"),
                 "--json", str(out)]) == 0
    assert [r["engine"] for r in json.loads(out.read_text())] == ["dualpath", "llama.cpp"]
    notices = [line for line in capsys.readouterr().err.splitlines() if "onnxruntime-genai" in line]
    assert notices == [f"dualpath bench: onnxruntime-genai skipped: {sys.executable} cannot import onnxruntime_genai "
                       "(ModuleNotFoundError: No module named 'onnxruntime_genai'), needed to run onnxruntime-genai; "
                       f"make an environment with {ortgenai.SETUP_SCRIPT} and pass --ortgenai-python "
                       f"ENV/bin/python (or set {ortgenai.PYTHON_ENV})"]
    assert not (tmp_path / "c").exists()  # nothing built


def test_an_interpreter_that_is_not_there_is_named(tmp_path):
    missing = str(tmp_path / "no-env" / "bin" / "python")
    with pytest.raises(ortgenai.Unavailable, match=f"--ortgenai-python {missing} is not an executable file; "
                                                   f"make an environment with {ortgenai.SETUP_SCRIPT}"):
        ortgenai.OrtGenaiPeer(missing, str(tmp_path / "c")).check()


def test_a_file_recording_too_short_a_context_is_refused_before_anything_runs(tmp_path):
    short = synth_gguf(tmp_path / "ctx64.gguf", TINY, "F32", context_length=64)
    assert ortgenai.check_file(short, 48, 15) == ["F32"]  # 48 + 15 + 1 = 64 fits
    with pytest.raises(ortgenai.Unavailable, match=r"records a context length of 64 \(llama.context_length\), "
                                                   r"below the prompt \+ decoded tokens \+ 1 = 65"):
        ortgenai.check_file(short, 48, 16)


def test_a_file_of_another_architecture_is_refused(tmp_path):
    qwen = synth_gguf(tmp_path / "qwen.gguf", "qwen2-tiny", "F32")
    with pytest.raises(ortgenai.Unavailable, match="it is a qwen2 model; .* llama-architecture GGUFs only"):
        ortgenai.check_file(qwen, 16, 4)


@pytest.mark.parametrize("types, precision", [
    (["F32"], "fp32"), (["F16"], "fp32"), (["BF16", "F32"], "fp32"),
    (["Q8_0"], "int8"), (["F32", "Q8_0"], "int8"),
    (["Q4_0"], "int4"), (["Q4_K", "Q6_K"], "int4"), (["Q6_K", "Q8_0"], "int4"),
])
def test_auto_precision_is_fp32_for_floats_int8_for_q8_0_else_int4(types, precision):
    assert ortgenai.auto_precision(types) == precision


def test_cache_key_follows_the_file_the_precision_and_the_version(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(60))
    key = ortgenai.cache_key(str(f), "fp32", "0.18.0")
    assert ortgenai.cache_key(str(f), "fp32", "0.18.0") == key
    assert len({key, ortgenai.cache_key(str(f), "int4", "0.18.0"), ortgenai.cache_key(str(f), "fp32", "0.19.0")}) == 3
    os.utime(f, ns=(0, 1_000_000_000))
    assert ortgenai.cache_key(str(f), "fp32", "0.18.0") != key


# -- a real build and run (needs the environment) ----------------------------------------

def test_e2e_shows_onnxruntime_genai_as_a_third_engine(peer_python, tiny_gguf, tmp_path, capsys):
    out = tmp_path / "e2e.json"
    peer = [] if importlib.util.find_spec("llama_cpp") else ["--no-peer"]
    if peer:
        pytest.skip("llama-cpp-python is not installed (--no-peer would leave onnxruntime-genai out too)")
    assert main(["bench", "e2e", "-m", str(tiny_gguf), "--ctx", "64", "--decode", "8", "--chunk", "32", "-t", "1",
                 "-r", "1", "--ortgenai-python", peer_python, "--ortgenai-cache", str(tmp_path / "c"),
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == ["dualpath", "llama.cpp", "onnxruntime-genai"]
    ort = rows[-1]
    assert ort["precision"] == "fp32" and ort["runs"] == 1 and ort["ctx"] == 64
    assert ort["prefill_tps"] > 0 and ort["decode_tps"] > 0 and ort["peak_rss_mb"] > 0
    captured = capsys.readouterr()
    assert "\ntiny-f32.gguf                      onnxruntime-genai " in captured.out
    assert "onnxruntime-genai 0." in captured.err and ": built its fp32 model of tiny-f32.gguf" in captured.err


@pytest.fixture(scope="module")
def peer(peer_python, tmp_path_factory) -> ortgenai.OrtGenaiPeer:
    """One peer for the tests below: it probes the builder's imports (about 6 s) once."""
    return ortgenai.OrtGenaiPeer(peer_python, str(tmp_path_factory.mktemp("ortg-cache")))


def test_a_q4_0_file_is_dequantized_built_as_int4_once_and_measured(peer, tmp_path):
    q4 = synth_gguf(tmp_path / "tiny-q4_0.gguf", TINY, "Q4_0")
    first = peer.prepare(q4, 32, 4)
    assert (first.precision, first.built, first.vocab_size) == ("int4", True, 4096)
    with open(os.path.join(os.path.dirname(first.model_dir), "build.json")) as f:
        build = json.load(f)
    assert build["tensor_types"] == ["F32", "Q4_0"] and build["dequantized"]
    assert not os.path.exists(os.path.join(os.path.dirname(first.model_dir), "weights-f32.gguf"))
    again = peer.prepare(q4, 32, 4)
    assert again.model_dir == first.model_dir and not again.built
    row = peer.measure(again, [1] + list(range(3, 34)), 4, 1, 16)
    assert row["prefill_tps"] > 0 and row["decode_tps"] > 0 and row["num_generated_tokens"] == 5


def test_a_failed_build_is_a_notice_naming_the_builders_log_and_leaves_no_model(peer, tiny_gguf, tmp_path):
    import gguf

    reader = gguf.GGUFReader(str(tiny_gguf))
    bad = tmp_path / "unknown-tensor.gguf"  # the same file with a tensor name the builder does not know
    writer = gguf.GGUFWriter(str(bad), "llama")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for t in reader.tensors:
        writer.add_tensor(t.name.replace("ffn_gate", "ffn_odd"), t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ortgenai.Unavailable, match=r"building its model \(-p fp32\) failed: RuntimeError: "
                                                   r"onnxruntime-genai's model builder exited with status 1") as e:
        peer.prepare(str(bad), 16, 4)
    log = str(e.value).rsplit("its log: ", 1)[1]
    assert "blk.0.ffn_odd.weight in your GGUF model is not recognized" in Path(log).read_text()
    assert not [name for name in os.listdir(peer.cache_dir) if ".part-" in name]  # no half-built folder left
