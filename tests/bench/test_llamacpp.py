"""llama.cpp as the benches' peer at its best: the faster flash attention setting for each
figure, its build read from its system info line and judged against this CPU (never AMX;
AVX-512 and VNNI where the CPU has them; none of AVX-512 for a laptop), and the peer run
in the environment of an interpreter of our choice. The rule is tested on system info
lines as real builds print them; the probe, the check command and the laptop mode run
for real."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys

import pytest

from dualpath.bench import _llamacpp_worker as rule
from dualpath.bench import e2e, llamacpp
from dualpath.bench.common import best_of
from dualpath.bench.startup import startup_rows
from dualpath.cli import main
from dualpath.errors import DualPathError

# System info lines as llama-cpp-python builds print them (llama_print_system_info).
NATIVE_AMX = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
              "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | "
              "OPENMP = 1 | REPACK = 1 |")
FULL = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
        "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")
AVX2_ONLY = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | " \
            "OPENMP = 1 | REPACK = 1 |"
LAPTOP = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | " \
         "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
OLD_FORMAT = ("AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | AVX512 = 0 | AVX512_VBMI = 0 | AVX512_VNNI = 0 | "
              "AVX512_BF16 = 0 | FMA = 1 | NEON = 0 | SVE = 0 | ARM_FMA = 0 | F16C = 1 | FP16_VA = 0 | "
              "WASM_SIMD = 0 | BLAS = 0 | SSE3 = 1 | SSSE3 = 1 | VSX = 0 | MATMUL_INT8 = 0 | LLAMAFILE = 1 | ")

# /proc/cpuinfo flags (the part the rule reads) of three machines.
SAPPHIRE_RAPIDS = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16",
                   "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}
EPYC_ZEN4 = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16"}
ALDER_LAKE = {"avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni"}


# -- the faster of the settings, per figure ---------------------------------------------

def test_best_of_takes_each_figure_from_the_setting_that_is_better_at_it():
    settings = {"FA off": {"prefill_tps": 330.0, "decode_tps": 36.0, "peak_rss_mb": 510.0},
                "FA on": {"prefill_tps": 437.0, "decode_tps": 35.1, "peak_rss_mb": 498.0}}
    best = best_of(settings, higher=("prefill_tps", "decode_tps"), lower=("peak_rss_mb",))
    assert (best["prefill_tps"], best["decode_tps"], best["peak_rss_mb"]) == (437.0, 36.0, 498.0)
    assert best["best"] == {"prefill_tps": "FA on", "decode_tps": "FA off", "peak_rss_mb": "FA on"}


def test_best_of_gives_a_tie_to_the_first_setting_and_refuses_none():
    settings = {"FA off": {"decode_tps": 40.0, "load_s": 1.0}, "FA on": {"decode_tps": 40.0, "load_s": 1.0}}
    assert best_of(settings, higher=("decode_tps",), lower=("load_s",))["best"] == \
        {"decode_tps": "FA off", "load_s": "FA off"}
    with pytest.raises(ValueError, match="no settings"):
        best_of({}, higher=("decode_tps",))


def test_startup_puts_llama_cpp_s_two_settings_in_one_row_of_the_faster_figures():
    def run(load, first, last, peak, gen):
        return {"load_s": load, "first_token_s": first, "last_token_s": last, "load_peak_rss_mb": peak,
                "generation_rss_mb": gen}

    runs = {"dualpath cached": [run(1.0, 1.2, 1.5, 900, 930)] * 3,
            "llama.cpp FA off": [run(0.70, 0.91, 1.08, 1194, 1175), run(0.72, 0.93, 1.10, 1194, 1175),
                                 run(0.71, 0.90, 1.09, 1194, 1175)],
            "llama.cpp FA on": [run(0.75, 0.88, 1.02, 1190, 1180)] * 3}
    rows = startup_rows(runs)
    assert [r["variant"] for r in rows] == ["dualpath cached", "llama.cpp"]
    llama = rows[1]
    assert (llama["load_s"], llama["first_token_s"], llama["last_token_s"]) == (0.71, 0.88, 1.02)
    assert (llama["load_peak_rss_mb"], llama["generation_rss_mb"]) == (1190, 1175)
    assert llama["flash_attn"] == {"load_s": "FA off", "first_token_s": "FA on", "last_token_s": "FA on",
                                   "load_peak_rss_mb": "FA on", "generation_rss_mb": "FA off"}
    assert llama["settings"]["FA off"]["load_s"] == 0.71 and llama["runs"] == 3


def test_the_peer_s_variants_are_its_flash_attention_settings_and_nothing_else_is_one():
    assert llamacpp.variants() == ["llama.cpp FA off", "llama.cpp FA on"]
    assert [llamacpp.setting_of(v) for v in llamacpp.variants()] == ["FA off", "FA on"]
    assert [llamacpp.setting_of(v) for v in ("llama.cpp", "llama.cpp FA", "dualpath", "onnxruntime-genai")] == \
        [None] * 4
    assert llamacpp.best_line({"prefill_tps": "FA on", "decode_tps": "FA off"}, e2e.LABELS) == \
        "prefill FA on, decode FA off"


# -- the build, read and judged ----------------------------------------------------------

def test_system_info_is_read_in_both_formats_and_zero_or_absent_means_off():
    new = rule.parse_system_info(NATIVE_AMX)
    assert new["AMX_INT8"] == "1" and new["AVX512_VNNI"] == "1" and new["REPACK"] == "1" and "CPU" not in new
    old = rule.parse_system_info(OLD_FORMAT)
    assert old["AVX2"] == "1" and old["AVX512"] == "0" and old["LLAMAFILE"] == "1"
    assert rule.build_problems(OLD_FORMAT, EPYC_ZEN4, "full")["missing"] == \
        [("bmi2", "BMI2"), ("avx512f", "AVX512"), ("avx512vbmi", "AVX512_VBMI"), ("avx512_vnni", "AVX512_VNNI"),
         ("avx512_bf16", "AVX512_BF16")]


def test_an_amx_build_is_forbidden_and_the_warning_says_why():
    problems = rule.build_problems(NATIVE_AMX, SAPPHIRE_RAPIDS, "full")
    assert problems == {"forbidden": ["AMX_INT8"], "missing": []}
    (line,) = rule.describe_problems(problems, "full")
    assert line.startswith("llama.cpp is built with AMX (AMX_INT8): no phone or laptop has AMX")
    assert "crashed on Q8_0/Q4_0" in line


def test_a_build_without_avx512_on_an_avx512_cpu_is_not_at_its_best():
    problems = rule.build_problems(AVX2_ONLY, EPYC_ZEN4, "full")
    assert problems["forbidden"] == []
    assert [feature for _, feature in problems["missing"]] == ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"]
    assert rule.describe_problems(problems, "full") == [
        "llama.cpp's build lacks AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16, which this CPU has (avx512f, "
        "avx512vbmi, avx512_vnni, avx512_bf16 in /proc/cpuinfo): it is not at its best for the full ISA"]


def test_a_full_build_fits_the_cpu_it_was_made_for_and_an_avx2_cpu_asks_for_no_avx512():
    assert rule.build_problems(FULL, EPYC_ZEN4, "full") == {"forbidden": [], "missing": []}
    # AVX512_VNNI's instructions serve ggml's 256-bit paths too: it stands for AVX_VNNI.
    assert rule.build_problems(FULL, SAPPHIRE_RAPIDS - {"amx_int8"}, "full") == {"forbidden": [], "missing": []}
    assert rule.build_problems(AVX2_ONLY, {"avx", "avx2", "fma", "f16c", "bmi2"}, "full") == \
        {"forbidden": [], "missing": []}
    assert rule.build_problems(AVX2_ONLY, ALDER_LAKE, "full")["missing"] == [("avx_vnni", "AVX_VNNI")]


def test_a_laptop_build_has_no_avx512_and_takes_avx_vnni_where_the_cpu_has_it():
    assert rule.build_problems(LAPTOP, SAPPHIRE_RAPIDS, "laptop") == {"forbidden": [], "missing": []}
    assert rule.build_problems(AVX2_ONLY, EPYC_ZEN4, "laptop") == {"forbidden": [], "missing": []}
    assert rule.build_problems(AVX2_ONLY, ALDER_LAKE, "laptop")["missing"] == [("avx_vnni", "AVX_VNNI")]
    problems = rule.build_problems(NATIVE_AMX, SAPPHIRE_RAPIDS, "laptop")
    assert problems["forbidden"] == ["AMX_INT8", "AVX512", "AVX512_BF16", "AVX512_VBMI", "AVX512_VNNI"]
    assert rule.describe_problems(problems, "laptop")[1] == \
        "llama.cpp is built with AVX-512 (AVX512, AVX512_BF16, AVX512_VBMI, AVX512_VNNI), and a laptop has none"
    with pytest.raises(ValueError, match="isa='phone': one of full, laptop"):
        rule.build_problems(LAPTOP, ALDER_LAKE, "phone")


def test_laptop_mode_refuses_a_peer_built_with_avx512_naming_the_setup_script():
    full = llamacpp.LlamaCppPeer("/envs/full/bin/python", "0.3.36", FULL, "laptop",
                                 rule.build_problems(FULL, EPYC_ZEN4, "laptop"))
    with pytest.raises(llamacpp.PeerError, match=r"the one of /envs/full/bin/python has AVX512, AVX512_BF16, "
                                                 r"AVX512_VBMI, AVX512_VNNI: make one with "
                                                 r"examples/peers/setup_llamacpp_env.sh laptop ENV") as e:
        llamacpp.require_laptop_build(full)
    assert isinstance(e.value, DualPathError)  # the CLI says it in one line, no traceback
    llamacpp.require_laptop_build(llamacpp.LlamaCppPeer("/envs/laptop/bin/python", "0.3.36", LAPTOP, "laptop",
                                                        {"forbidden": [], "missing": []}))


def test_cpu_flags_are_read_from_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f amx_int8\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert rule.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "avx512f", "amx_int8"}
    assert rule.cpu_flags(str(tmp_path / "none")) == set()


def test_laptop_mode_adds_avx512_to_what_is_already_disabled():
    assert e2e.laptop_env("") == {"DUALPATH_DISABLE_CPU_FEATURES": "avx512"}
    assert e2e.laptop_env("avx2") == {"DUALPATH_DISABLE_CPU_FEATURES": "avx2,avx512"}
    assert e2e.laptop_env("avx512, avx2") == {"DUALPATH_DISABLE_CPU_FEATURES": "avx512,avx2"}


def test_default_interpreter_follows_the_isa_s_environment_variable(monkeypatch):
    monkeypatch.delenv(llamacpp.PYTHON_ENV, raising=False)
    monkeypatch.delenv(llamacpp.LAPTOP_PYTHON_ENV, raising=False)
    assert llamacpp.default_python("laptop") == llamacpp.default_python("full") == sys.executable
    monkeypatch.setenv(llamacpp.PYTHON_ENV, "/envs/full/bin/python")
    assert llamacpp.default_python("laptop") == "/envs/full/bin/python"
    monkeypatch.setenv(llamacpp.LAPTOP_PYTHON_ENV, "/envs/laptop/bin/python")
    assert (llamacpp.default_python("full"), llamacpp.default_python("laptop")) == \
        ("/envs/full/bin/python", "/envs/laptop/bin/python")


# -- the peer in an environment ------------------------------------------------------------

needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python is the peer probed")


@needs_llama_cpp
def test_probe_reads_the_build_of_the_interpreter_it_is_given():
    import llama_cpp

    peer = llamacpp.probe(sys.executable)
    assert peer.python == sys.executable and peer.version == llama_cpp.__version__
    assert peer.system_info == llama_cpp.llama_print_system_info().decode().strip()
    assert peer.build_line() == (f"llama.cpp peer: llama-cpp-python {peer.version} ({sys.executable}); its build: "
                                 f"{peer.system_info}")
    assert peer.problems == rule.build_problems(peer.system_info, rule.cpu_flags(), "full")


def test_an_interpreter_without_llama_cpp_is_unavailable_naming_the_module(tmp_path):
    bare = tmp_path / "python-without-site-packages"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    with pytest.raises(llamacpp.Unavailable, match=f"{bare} cannot run llama-cpp-python \\(ModuleNotFoundError: "
                                                   f"No module named 'llama_cpp'\\); make one with "
                                                   f"{llamacpp.SETUP_SCRIPT}"):
        llamacpp.probe(str(bare))
    with pytest.raises(llamacpp.Unavailable, match="is not an executable file"):
        llamacpp.probe(str(tmp_path / "no-env" / "bin" / "python"))


@needs_llama_cpp
@pytest.mark.parametrize("isa", rule.ISAS)
def test_the_check_command_prints_the_build_and_fails_on_any_problem(isa):
    out = subprocess.run([sys.executable, llamacpp.WORKER_SCRIPT, "check", isa], capture_output=True, text=True,
                         timeout=120)
    peer = llamacpp.probe(sys.executable, isa)
    assert out.stdout.splitlines()[0] == f"llama-cpp-python {peer.version} ({sys.executable}): {peer.system_info}"
    problems = [line.removeprefix("PROBLEM: ") for line in out.stdout.splitlines() if line.startswith("PROBLEM: ")]
    assert problems == peer.warnings()
    assert out.returncode == (1 if problems else 0)


@needs_llama_cpp
def test_e2e_quotes_the_faster_flash_attention_setting_per_figure_and_prints_the_build(gguf_path, tmp_path,
                                                                                        capsys):
    out = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "-m", str(gguf_path), "--ctx", "16", "--decode", "4", "--chunk", "16", "-t", "1",
                 "-r", "1", "--no-ortgenai", "--peer-python", sys.executable, "--json", str(out)]) == 0
    llama = json.loads(out.read_text())[1]
    assert llama["engine"] == "llama.cpp" and set(llama["settings"]) == {"FA off", "FA on"}
    for key in ("prefill_tps", "decode_tps"):
        assert llama[key] == max(s[key] for s in llama["settings"].values())
        assert llama["settings"][llama["flash_attn"][key]][key] == llama[key]
    text = capsys.readouterr().out
    peer = llamacpp.probe(sys.executable)
    assert peer.build_line() in text and llama["build"] == peer.system_info
    assert "llama.cpp on stories260K.gguf: the better of flash attention off and on for each figure: prefill FA " \
        in text


@pytest.mark.skipif(platform.machine() != "x86_64" or "avx2" not in rule.cpu_flags(),
                    reason="laptop mode models an x86-64 laptop with AVX2")
def test_laptop_mode_runs_dualpath_without_avx512_kernels(gguf_path, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DUALPATH_DISABLE_CPU_FEATURES", raising=False)
    out = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "-m", str(gguf_path), "--ctx", "16", "--decode", "4", "--chunk", "16", "-t", "1",
                 "-r", "1", "--no-peer", "--isa", "laptop", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["kernel"] in ("avx2", "avx_vnni") and row["decode_tps"] > 0  # AVX-VNNI where the CPU has it
    assert f"dualpath: {row['kernel']} kernels (DUALPATH_DISABLE_CPU_FEATURES=avx512; ONNX Runtime keeps its own " \
           "ISA choice" in capsys.readouterr().out
    assert "DUALPATH_DISABLE_CPU_FEATURES" not in os.environ  # only the workers' environment had it


@needs_llama_cpp
def test_startup_runs_llama_cpp_in_the_peer_s_interpreter_with_both_settings(gguf_path, tmp_path, capsys):
    out = tmp_path / "startup.json"
    assert main(["bench", "startup", "-m", str(gguf_path), "-t", "1", "-n", "2", "-r", "1",
                 "--peer-python", sys.executable, "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["runs"]) == {"dualpath first load", "dualpath cached", "llama.cpp FA off", "llama.cpp FA on"}
    llama = res["rows"][-1]
    assert llama["variant"] == "llama.cpp" and set(llama["flash_attn"].values()) <= {"FA off", "FA on"}
    assert llama["last_token_s"] == min(s["last_token_s"] for s in llama["settings"].values())
    text = capsys.readouterr().out
    assert "llama.cpp: the better of flash attention off and on for each figure: loaded FA o" in text
    assert "2th token FA o" in text and llamacpp.probe(sys.executable).build_line() in text
    assert res["llama_cpp_build"] == llamacpp.probe(sys.executable).system_info
