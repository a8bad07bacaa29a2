"""The ``dualpath`` command line, run as a real process (``python -m dualpath.cli``).

Every run gets ``XDG_CACHE_HOME`` under ``tmp_path`` so nothing is written to the user's cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

import dualpath


def dualpath_cli(args, tmp_path, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg-cache"), PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "dualpath.cli", *map(str, args)], capture_output=True,
                          env=env, timeout=timeout)


def assert_clean_usage_error(proc, *fragments):
    """Exit code 2, a one-line-per-problem message on stderr naming ``fragments``, no traceback."""
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert err.startswith("dualpath: error: ")
    for fragment in fragments:
        assert fragment in err, err
    assert proc.stdout == b""


def test_console_script_is_declared_as_cli_main():
    scripts = [e for e in metadata.entry_points(group="console_scripts") if e.name == "dualpath"]
    assert [e.value for e in scripts] == ["dualpath.cli:main"]


def test_run_gguf_greedy_stdout_equals_run_c_byte_for_byte(gguf_path, reference_dir, tmp_path):
    proc = dualpath_cli(["run", "--model", gguf_path, "--temperature", "0", "Once upon a time"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == (reference_dir / "greedy_once_upon_a_time.txt").read_bytes()
    # stderr: prompt and generation speeds, and why it stopped (256 steps)
    err = proc.stderr.decode()
    assert re.search(r"5 prompt tokens at [0-9.]+ tok/s, 252 generated at [0-9.]+ tok/s", err), err
    assert "finish: length" in err
    assert float(re.search(r"generated at ([0-9.]+) tok/s", err).group(1)) > 0


def test_run_llama2c_bin_with_tokenizer_stdout_equals_run_c(bin_path, tok512_path, reference_dir, tmp_path):
    proc = dualpath_cli(["run", "--model", bin_path, "--tokenizer", tok512_path, "--temperature", "0",
                         "One day, a little dog named Max"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == (reference_dir / "greedy_one_day_a_little_dog.txt").read_bytes()
    assert "finish: stop" in proc.stderr.decode()  # the model emitted BOS, as in run.c


def test_run_without_model_tells_a_story_with_the_built_in_model(tmp_path, reference_dir):
    # The README's first command: the embedded stories260K, greedy, gives the golden text.
    proc = dualpath_cli(["run", "--temperature", "0", "One day, a little dog named Max"], tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "built-in stories260K.gguf" in err and "MIT" in err
    assert proc.stdout == (reference_dir / "greedy_one_day_a_little_dog.txt").read_bytes()


def test_the_built_in_model_is_the_shipped_stories260K_with_its_notice():
    import hashlib

    from dualpath.models import embedded_model_path

    path = embedded_model_path()
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert digest == "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d"
    notice = open(os.path.join(os.path.dirname(path), "NOTICE")).read()
    assert "MIT License" in notice and "Copyright (c) 2023 Andrej" in notice


def test_run_synth_model_synthesizes_random_weights_and_says_so(tmp_path):
    proc = dualpath_cli(["run", "--model", "synth:stories15M", "-n", "8", "--seed", "1", "Hello"], tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "RANDOM weights" in err and "synthesized just now" in err
    synthesized = list((tmp_path / "xdg-cache").rglob("*.gguf"))
    assert len(synthesized) == 1, synthesized
    assert str(synthesized[0]) in err
    assert re.search(r"8 generated at [0-9.]+ tok/s", err), err
    out = proc.stdout.decode()
    assert out.startswith("Hello") and out.endswith("\n") and len(out) > len("Hello\n")
    # a second run reuses the file instead of writing it again
    again = dualpath_cli(["run", "--model", "synth:stories15M", "-n", "2", "--seed", "1", "Hello"], tmp_path)
    assert again.returncode == 0 and "synthesized just now" not in again.stderr.decode()


def test_an_unknown_synth_preset_is_a_clear_error(tmp_path):
    proc = dualpath_cli(["run", "--model", "synth:nope", "Hello"], tmp_path)
    assert proc.returncode != 0
    assert "unknown synthetic preset 'nope'" in proc.stderr.decode() and "stories15M" in proc.stderr.decode()


def test_tokenize_ids_only_prints_run_c_prompt_ids_as_json(gguf_path, tmp_path):
    proc = dualpath_cli(["tokenize", "--model", gguf_path, "--ids-only", "Once upon a time"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout) == [1, 403, 407, 261, 378]
    no_bos = dualpath_cli(["tokenize", "--model", gguf_path, "--ids-only", "--no-bos", "Once upon a time"],
                          tmp_path)
    assert json.loads(no_bos.stdout) == [403, 407, 261, 378]


def test_info_prints_hyper_parameters_ort_version_and_cpu_features(gguf_path, tmp_path):
    import onnxruntime

    proc = dualpath_cli(["info", "--model", gguf_path], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert f"onnxruntime {onnxruntime.__version__}" in out
    assert f"dualpath {dualpath.__version__}" in out
    assert re.search(r"^cpu features: \S", out, re.M), out
    for fact in ("dim=64", "hidden_dim=172", "layers=5", "heads=8", "kv_heads=4", "head_dim=8", "vocab=512",
                 "rope_theta=10000", "rms_eps=1e-05", "chat template: no"):
        assert fact in out, (fact, out)


def test_run_and_info_take_kv_dtype_q8(gguf_path, tmp_path):
    args = ["run", "--model", gguf_path, "--temperature", "0", "-n", "24", "Once upon a time"]
    q8, f16 = dualpath_cli(args + ["--kv-dtype", "q8"], tmp_path), dualpath_cli(args + ["--kv-dtype", "f16"], tmp_path)
    assert q8.returncode == 0 and f16.returncode == 0, q8.stderr.decode()
    # Measured: this prompt's first 40 greedy tokens are the same with q8 and f16 KV.
    assert q8.stdout == f16.stdout and q8.stdout.decode().startswith("Once upon a time, there was a little girl")
    info = dualpath_cli(["info", "--model", gguf_path, "--kv-dtype", "q8"], tmp_path)
    out = info.stdout.decode()
    assert "kv_dtype=q8 (int8 + an f32 scale per token and KV head)" in out, out
    # stories260K: 5 layers x 4 KV heads x (8 + 4) bytes x 2 (K and V), against 16 x 2 x 4 x 5 in f16
    assert "480 bytes per token, all layers, in q8 (75% of f16)" in out, out
    bad = dualpath_cli(["run", "--kv-dtype", "q4", "Hi"], tmp_path)
    assert bad.returncode == 2
    assert "--kv-dtype: invalid choice: 'q4' (choose from 'f16', 'f32', 'q8')" in bad.stderr.decode()


def test_info_names_the_configured_kernel_and_prints_the_cache_config_once(tmp_path):
    proc = dualpath_cli(["info", "--set", "runtime.kernel_isa=generic",
                         "--set", "kv_cache.seq_path_threshold=4096", "--set", "power.profile=low_power",
                         "--set", "power.low_power_seq_path_threshold=16384"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert "attention=generic kv_write=generic layer_products=generic classifier=generic " \
           "encoder_attention=generic" in out
    assert "runtime.kernel_isa=generic" in out
    assert out.count("block_bytes=") == 1 and out.count("kv_dtype=") == 1
    # The path line is the low_power profile's policy, the one the cache applies.
    assert "path: dual, sequential from 16384 tokens" in out


def test_synth_q8_0_writes_a_loadable_model(tmp_path):
    out = tmp_path / "s15m-q8.gguf"
    proc = dualpath_cli(["synth", "--preset", "stories15M", "--type", "Q8_0", "-o", out], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert out.is_file() and "random weights" in proc.stdout.decode()
    llm = dualpath.LLM(out)
    assert (llm.spec.config.dim, llm.spec.config.num_layers, llm.spec.config.vocab_size) == (288, 6, 32000)
    c = llm.generate("Hello", dualpath.SamplingParams(max_tokens=3, seed=0))
    assert len(c.token_ids) == 3 or c.finish_reason == "stop"


def test_missing_model_file_exits_2_naming_the_file(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    proc = dualpath_cli(["run", "--model", missing, "x"], tmp_path)
    assert_clean_usage_error(proc, str(missing))


def test_unknown_set_key_exits_2_naming_the_key(gguf_path, tmp_path):
    proc = dualpath_cli(["run", "--model", gguf_path, "--set", "runtime.num_thread=2", "x"], tmp_path)
    assert_clean_usage_error(proc, "runtime.num_thread", "did you mean runtime.num_threads")


def test_negative_temperature_exits_2_naming_the_parameter(gguf_path, tmp_path):
    proc = dualpath_cli(["run", "--model", gguf_path, "--temperature", "-0.5", "x"], tmp_path)
    assert_clean_usage_error(proc, "temperature=-0.5", ">= 0")


@pytest.mark.parametrize("item, fragment", [
    ("runtime.num_threads", "expected KEY=VALUE"),
    ("=2", "expected KEY=VALUE"),
    ("runtime.num_threads=[", "not valid YAML"),
], ids=["no-equals", "no-key", "bad-yaml"])
def test_malformed_set_exits_2_naming_the_item(gguf_path, tmp_path, item, fragment):
    proc = dualpath_cli(["run", "--model", gguf_path, "--set", item, "x"], tmp_path)
    assert_clean_usage_error(proc, repr(item), fragment)


def test_prompt_longer_than_ctx_size_exits_2_naming_both_numbers(gguf_path, tmp_path):
    proc = dualpath_cli(["run", "--model", gguf_path, "--ctx-size", "4", "Once upon a time"], tmp_path)
    assert_clean_usage_error(proc, "5 tokens", "holds 4")


def test_synth_arch_writes_a_family_file_quietly(tmp_path):
    """``dualpath synth --arch qwen3 --type Q4_K_M``: the family's tiny shape, quantized by
    llama.cpp without its per-tensor log (shown only with -v); a preset of another
    family is refused by name."""
    pytest.importorskip("llama_cpp")
    out = tmp_path / "q3.gguf"
    proc = dualpath_cli(["synth", "--arch", "qwen3", "--type", "Q4_K_M", "-o", str(out)], tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "qwen3-tiny" in proc.stdout.decode() and out.is_file()
    assert "converting to" not in err and "llama_model_quantize" not in err
    bad = dualpath_cli(["synth", "--arch", "gemma2", "--preset", "qwen3-tiny", "-o", str(out)], tmp_path)
    assert bad.returncode == 2 and "is a qwen3 model, not gemma2" in bad.stderr.decode()


def test_run_verbose_prints_the_load_split_into_stages_first_converted_then_cached(gguf_path, tmp_path):
    env_dir = tmp_path / "models-cache"
    runs = []
    for _ in range(2):
        env = dict(os.environ, DUALPATH_CACHE_DIR=str(env_dir), PYTHONIOENCODING="utf-8")
        runs.append(subprocess.run([sys.executable, "-m", "dualpath.cli", "run", "--model", str(gguf_path),
                                    "--temperature", "0", "-n", "4", "--verbose", "Once"],
                                   capture_output=True, env=env, timeout=120))
    for proc in runs:
        assert proc.returncode == 0, proc.stderr.decode()
    first, again = (p.stderr.decode() for p in runs)
    stages = (r"converted-model cache {}\): {}, tokenizer [0-9.]+s, graphs [0-9.]+s, "
              r"ONNX Runtime sessions [0-9.]+s, total")
    assert re.search(stages.format("miss", r"converted [0-9.]+s"), first), first
    assert re.search(stages.format("hit", r"opened cached entry [0-9.]+s"), again), again
    assert runs[0].stdout == runs[1].stdout  # the same text from the cached entry


def test_the_progress_bar_draws_on_a_terminal_only():
    import io

    from dualpath.cli.common import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar(stream)
        for done in (0, 3 << 20, 6 << 20):
            bar("convert", done, 6 << 20)
        for done in (1, 2, 3):
            bar("sessions", done, 3)
    assert pipe.getvalue() == ""
    lines = tty.getvalue().split("\n")
    assert lines[0].split("\r")[-1].startswith("converting: 100% |" + "#" * 30 + "| 6/6 MiB")
    assert lines[1].split("\r")[-1].startswith("loading graphs: 100% |" + "#" * 30 + "| 3/3 parts")
    assert "converting:  50% |" + "#" * 15 in lines[0]


def test_info_lists_every_isa_row_of_the_c_table_and_which_run_here(tmp_path):
    from dualpath.kernels import KERNEL_ISAS, available_kernels

    proc = dualpath_cli(["info"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    line = next(ln for ln in proc.stdout.decode().splitlines() if ln.startswith("kernel ISAs: "))
    rows = line.removeprefix("kernel ISAs: ").split("  (")[0].split()
    assert [r.removesuffix("(-)") for r in rows] == list(KERNEL_ISAS)
    assert [r for r in rows if not r.endswith("(-)")] == available_kernels()
    assert {"neon_dotprod", "neon_i8mm", "avx_vnni", "avx512_vnni"} <= set(KERNEL_ISAS)


def test_embed_prints_one_normalised_vector_per_text_and_refuses_generation(tmp_path):
    model = tmp_path / "bert.gguf"
    assert dualpath_cli(["synth", "--arch", "bert", "-o", model], tmp_path).returncode == 0
    proc = dualpath_cli(["embed", "-m", model, "school house", "the city"], tmp_path)  # words of its vocabulary
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [(d["index"], d["tokens"], len(d["embedding"])) for d in lines] == [(0, 4, 128), (1, 4, 128)]
    assert all(abs(sum(x * x for x in d["embedding"]) - 1.0) < 1e-5 for d in lines)
    too_long = dualpath_cli(["embed", "-m", model, "word " * 300], tmp_path)
    assert_clean_usage_error(too_long, "302 tokens, more than the 128 positions", "--truncate")
    assert dualpath_cli(["embed", "-m", model, "--truncate", "word " * 300], tmp_path).returncode == 0
    assert_clean_usage_error(dualpath_cli(["run", "-m", model, "hi"], tmp_path),
                             "is an embedding model (bert, an encoder): it cannot generate text")
