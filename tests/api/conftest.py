"""Fixtures for the public-API tests: the shared stories260K files, their run.c references,
and LLMs built from them.

The model folder is ``$DUALPATH_TEST_MODELS`` (default ``<repo>/../shared/models``); every
fixture that needs it skips, saying why, where it is absent. Model files are read in
place and never copied into the repository; derived files go to ``tmp_path``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dualpath
from tests_shared import models_dir_path, require_file


def _reference_runs_or_none() -> list[dict] | None:
    path = models_dir_path() / "reference" / "greedy_token_ids.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["runs"]


def pytest_generate_tests(metafunc):
    """``reference_run``: one test per run recorded in greedy_token_ids.json (read at collection)."""
    if "reference_run" in metafunc.fixturenames:
        runs = _reference_runs_or_none()
        if runs is None:
            metafunc.parametrize("reference_run", [None], ids=["no-reference"])
        else:
            metafunc.parametrize("reference_run", runs, ids=[r["name"] for r in runs])


@pytest.fixture
def reference_run(request):
    run = request.param
    if run is None:
        pytest.skip(f"{models_dir_path() / 'reference/greedy_token_ids.json'} not found (set DUALPATH_TEST_MODELS)")
    return run





@pytest.fixture(scope="session")
def bin_path(model_file) -> Path:
    return model_file("stories260K.bin")



@pytest.fixture(scope="session")
def reference_dir(models_dir) -> Path:
    path = models_dir / "reference"
    if not path.is_dir():
        pytest.skip(f"reference folder {path} not found")
    return path


@pytest.fixture(scope="session")
def reference_runs_by_name(reference_dir) -> dict[str, dict]:
    runs = json.loads(require_file(reference_dir / "greedy_token_ids.json").read_text(encoding="utf-8"))["runs"]
    return {run["name"]: run for run in runs}


@pytest.fixture(scope="session")
def reference_logits(reference_dir) -> dict:
    return json.loads(require_file(reference_dir / "once_upon_a_time_logits_pos0-4.json").read_text())


@pytest.fixture(scope="session")
def model_paths(gguf_path, bin_path, tok512_path) -> dict[str, tuple[Path, Path | None]]:
    """Format name -> (model file, tokenizer file or None)."""
    return {"gguf": (gguf_path, None), "bin": (bin_path, tok512_path)}


@pytest.fixture(scope="session")
def make_llm(model_paths):
    """``make_llm(fmt="gguf", **overrides)``: a new LLM (load ~0.1 s) with dotted config overrides."""

    def make(fmt: str = "gguf", overrides: dict | None = None) -> dualpath.LLM:
        model, tokenizer = model_paths[fmt]
        return dualpath.LLM(model, dualpath.load_config(None, overrides or {}), tokenizer_path=tokenizer)

    return make


@pytest.fixture(scope="session")
def shared_llms(make_llm):
    """``shared_llms(fmt, kv_dtype)``: one LLM per (format, KV type) for the whole session.

    Tests that share one run one sequence after another, so each request starts from
    whatever prefix the previous one left in the KV cache: results must not depend on it.
    """
    cache: dict[tuple[str, str], dualpath.LLM] = {}

    def get(fmt: str = "gguf", kv_dtype: str = "f16") -> dualpath.LLM:
        key = (fmt, kv_dtype)
        if key not in cache:
            cache[key] = make_llm(fmt, {"kv_cache.kv_dtype": kv_dtype})
        return cache[key]

    return get
