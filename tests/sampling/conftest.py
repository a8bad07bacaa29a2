"""Fixtures shared by the grammar tests: the stories260K tokenizer, built once per module."""

from __future__ import annotations

import pytest

from dualpath.models import load_model
from dualpath.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok(gguf_path):
    return build_tokenizer(load_model(gguf_path).tokenizer)
