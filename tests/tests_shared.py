"""Helpers shared by the test conftests (importable: tests/ is on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def models_dir_path() -> Path:
    return Path(os.environ.get("DUALPATH_TEST_MODELS", REPO_ROOT.parent / "shared" / "models"))


def require_file(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"test model file {path} not found (set DUALPATH_TEST_MODELS)")
    return path
