"""Fixtures for the tokenizer tests: the shared test models, specs read from them, the string corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from tok_corpus import parity_corpus
from tok_gguf import spec_from_gguf
from tok_vocabs import train_bpe_spec

from dualpath.tokenizer import TokenizerSpec, build_tokenizer, load_llama2c_tokenizer


@pytest.fixture(scope="session")
def tok512_bin(model_file) -> Path:
    return model_file("tok512.bin")


@pytest.fixture(scope="session")
def tok512_model(model_file) -> Path:
    return model_file("tok512.model")


@pytest.fixture(scope="session")
def reference_runs(model_file) -> list[dict]:
    import json
    return json.loads(model_file("reference/greedy_token_ids.json").read_text())["runs"]


@pytest.fixture(scope="session")
def gguf_spec(gguf_path) -> TokenizerSpec:
    return spec_from_gguf(gguf_path)


@pytest.fixture(scope="session")
def tok512_spec(tok512_bin) -> TokenizerSpec:
    return load_llama2c_tokenizer(tok512_bin, vocab_size=512)


@pytest.fixture(scope="session")
def stories_tok(tok512_spec):
    return build_tokenizer(tok512_spec)


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    """The shared parity corpus (tok_corpus.py): about 600 strings."""
    return parity_corpus()


@pytest.fixture(scope="session")
def bpe_spec() -> TokenizerSpec:
    """A byte-level BPE vocabulary (6,000 tokens, special tokens of every type) trained on the corpus."""
    return train_bpe_spec()
