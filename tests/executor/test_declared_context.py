"""A file's declared ``context_length`` does not decide allocations (issue 41): a file
declaring 2^24, 2^32-1 or 2^62 positions loads with a context the memory plan allows,
or is refused with the figures before anything grows with it; nothing escapes as a
traceback, and a failed load leaves no graphs folder in the cache."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import gguf
import pytest

from dualpath.config import load_config
from dualpath.errors import ConfigError
from dualpath.executor import memory_plan as mp
from dualpath.models.store import ModelStore
from tests_shared import copy_gguf

DECLARED = [1 << 24, (1 << 32) - 1, 1 << 62]


def _with_context(src, dst, context_length: int):
    """``src`` (stories260K.gguf) copied with ``llama.context_length`` replaced."""
    vtype = gguf.GGUFValueType.UINT32 if context_length < 1 << 32 else gguf.GGUFValueType.UINT64
    return copy_gguf(src, dst, {"llama.context_length": (context_length, vtype)})


@pytest.fixture(scope="module", params=DECLARED, ids=["2^24", "2^32-1", "2^62"])
def declared(request, tmp_path_factory, gguf_path):
    folder = tmp_path_factory.mktemp("declared")
    return request.param, _with_context(gguf_path, folder / "m.gguf", request.param)


# The peak is the process's own VmHWM: getrusage's ru_maxrss survives fork and exec, so a
# child of a pytest process grown to 1.4 GB reported 1.4 GB before it did anything.
_LOAD = textwrap.dedent("""
    import json, sys
    from dualpath import LLM
    from dualpath.sampling.sampler import SamplingParams
    llm = LLM(sys.argv[1], prefix_cache=False)
    ids = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)).token_ids
    with open("/proc/self/status") as f:
        hwm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"context": llm.context_tokens, "generated": len(ids), "peak_mib": hwm_kib / 1024}))
""")


def test_a_huge_declared_context_loads_with_the_default_cap_under_300_mib(declared, tmp_path):
    value, path = declared
    cache = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DUALPATH_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["generated"] == 8 and got["context"] <= mp.DEFAULT_MAX_CONTEXT
    assert got["peak_mib"] < 300, got
    assert f"declares a context of {value:,} tokens" in out.stderr  # the file's own value is shown
    (entry,) = os.listdir(cache)
    graphs = [g for g in os.listdir(cache / entry) if g.startswith("graphs-")]
    assert len(graphs) == 1 and graphs[0].endswith(f"-c{got['context']}")  # RoPE tables of that context only


def test_a_budget_never_plans_past_the_default_cap(declared):
    value, path = declared
    cfg = load_config(None, {"runtime.num_threads": 1})
    plan = mp.fit(path, cfg, 1 << 50, nbits8=True)
    assert plan.context == mp.DEFAULT_MAX_CONTEXT


def _run_cli(path, cache, *args, limit_mib: int | None = None):
    code = "import sys\n"
    if limit_mib:  # address space: an allocation past it fails as it would on a smaller machine
        code += (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_mib << 20}, {limit_mib << 20}))\n")
    code += "from dualpath.cli import main; sys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "run", "-m", str(path), "-n", "2", "--no-prefix-cache",
                           *args, "Once"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DUALPATH_CACHE_DIR": str(cache)})


def _graphs_and_temporaries(cache) -> list[str]:
    out = []
    for _dirpath, dirnames, _ in os.walk(cache):
        out += [d for d in dirnames if d.startswith(("graphs-", ".tmp-"))]
    return out


@pytest.mark.parametrize("ctx", [(1 << 32) - 1, 1 << 40])
def test_an_explicit_context_over_memavailable_is_refused_with_figures_before_graphs(tmp_path, gguf_path, ctx):
    cache = tmp_path / "cache"
    out = _run_cli(gguf_path, cache, "--ctx-size", str(ctx))
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("dualpath: error: runtime.max_context_tokens=") and "Traceback" not in out.stderr
    assert "MiB" in out.stderr and "MemAvailable" in out.stderr and "kv cache" in out.stderr
    assert _graphs_and_temporaries(cache) == []


def test_a_context_the_machine_cannot_allocate_fails_cleanly_and_leaves_no_graphs(tmp_path, gguf_path):
    """The plan may let 2^24 tokens through on a large machine: with 4 GiB of address space
    the KV arena cannot be had, and the load says so, before any graph is built."""
    cache = tmp_path / "cache"
    out = _run_cli(gguf_path, cache, "--ctx-size", str(1 << 24), limit_mib=4096)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("dualpath: error:") and "Traceback" not in out.stderr
    assert "16,777,216" in out.stderr
    assert _graphs_and_temporaries(cache) == []


def _spec(path, tmp_path):
    return ModelStore(tmp_path / "cache").load(path)


def test_without_memory_for_the_files_context_the_default_is_lowered_and_said(tmp_path, gguf_path, caplog):
    spec = _spec(_with_context(gguf_path, tmp_path / "m.gguf", 1 << 20), tmp_path)
    cfg = load_config(None, {"runtime.num_threads": 1})
    small = {"MemTotal": 1 << 30, "MemAvailable": 400 << 20}  # 256 MiB of it kept for the system
    with caplog.at_level(logging.WARNING):
        ctx = mp.context_without_budget(spec, cfg, small)
    budget = (400 - 256) << 20
    layout, merges = mp.layout_of(spec)
    assert mp.MIN_CONTEXT <= ctx < mp.DEFAULT_MAX_CONTEXT
    assert mp.plan_memory(spec.config, layout, merges, cfg, ctx).total_full <= budget
    assert mp.plan_memory(spec.config, layout, merges, cfg, ctx + 1).total_full > budget
    assert "declares a context of 1,048,576 tokens" in caplog.text and f"using {ctx:,}" in caplog.text
    plenty = {"MemTotal": 64 << 30, "MemAvailable": 60 << 30}
    assert mp.context_without_budget(spec, cfg, plenty) == mp.DEFAULT_MAX_CONTEXT
    tiny = {"MemTotal": 1 << 30, "MemAvailable": 300 << 20}  # 44 MiB: not even the runtime fits
    with pytest.raises(ConfigError, match=r"does not fit this machine's memory \(44 MiB free.*[\d,]+ MiB at 256"):
        mp.context_without_budget(spec, cfg, tiny)


def test_an_explicit_context_is_refused_not_lowered_and_a_normal_default_is_kept(tmp_path, gguf_path):
    spec = _spec(gguf_path, tmp_path)
    small = {"MemTotal": 4 << 30, "MemAvailable": 1 << 30}
    cfg = load_config(None, {"runtime.max_context_tokens": 1 << 22})
    with pytest.raises(ConfigError, match=r"max_context_tokens=4,194,304 does not fit .* [\d,]+ MiB at 4,194,304 "
                                          r"tokens.*over the 1,024 MiB MemAvailable"):
        mp.context_without_budget(spec, cfg, small)
    assert mp.context_without_budget(spec, load_config(None), small) == 2048  # the file's own
    assert mp.layout_of(spec) == mp.read_layout(gguf_path)[1:]  # the plan reads what the header says
