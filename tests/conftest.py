"""Shared fixtures: where the real test model lives.

The shared models (stories260K.gguf, stories260K.bin, tok512.bin, tok512.model and
reference/) are found through ``$DUALPATH_TEST_MODELS`` (default
``<repo>/../shared/models``). Tests that need them skip, naming the folder, where
it is absent. They are never copied into the repository.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests_shared import models_dir_path, require_file  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def model_cache_dir():
    """The converted-model cache of the whole run lives in a temporary folder (never the
    user's ~/.cache); server and CLI subprocesses inherit it through the environment."""
    old = os.environ.get("DUALPATH_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="dualpath-test-cache-") as folder:
        # models/ inside it: the prefix cache's default folder is its sibling, prefix/
        # (cache/disk.default_root), so that stays inside the temporary folder too.
        os.environ["DUALPATH_CACHE_DIR"] = os.path.join(folder, "models")
        yield Path(folder) / "models"
        if old is None:
            os.environ.pop("DUALPATH_CACHE_DIR", None)
        else:
            os.environ["DUALPATH_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def models_dir() -> Path:
    path = models_dir_path()
    if not path.is_dir():
        pytest.skip(f"test models folder {path} not found (set DUALPATH_TEST_MODELS to the folder "
                    "holding stories260K.gguf, stories260K.bin, tok512.bin and reference/)")
    return path


@pytest.fixture(scope="session")
def model_file(models_dir):
    """``model_file(name)``: the path of a file of the test-model folder, or a skip."""
    return lambda name: require_file(models_dir / name)


@pytest.fixture(scope="session")
def gguf_path(model_file) -> Path:
    """``stories260K.gguf``: GGUF v3, 48 F32 tensors, tokenizer inside."""
    return model_file("stories260K.gguf")


@pytest.fixture(scope="session")
def tok512_path(model_file) -> Path:
    """``tok512.bin``: the llama2.c tokenizer of stories260K."""
    return model_file("tok512.bin")
