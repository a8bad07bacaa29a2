"""``dualpath serve --speculative ngram``: clients change nothing; /metrics counts the
proposals and the answers are the plain server's."""

from __future__ import annotations

import sys

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from dualpath.bench.common import free_port, live_server, metric  # noqa: E402
from tests_shared import models_dir_path  # noqa: E402

GGUF = models_dir_path() / "stories260K.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(), reason="test model not found (set DUALPATH_TEST_MODELS)")
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside. "
          "Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time")


def _answers(*extra):
    port = free_port()
    argv = [sys.executable, "-m", "dualpath.cli", "serve", "--model", str(GGUF), "--port", str(port),
            "--ctx-size", "512", "--no-webui", "--no-prefix-cache", *extra]
    with live_server("dualpath", argv, f"http://127.0.0.1:{port}", 120) as s:
        texts = []
        for body in ({"prompt": PROMPT, "max_tokens": 60, "temperature": 0},
                     {"prompt": PROMPT, "max_tokens": 60, "temperature": 0.8, "seed": 4},
                     {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "n": 2}):
            r = httpx.post(s.base + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            texts.append([c["text"] for c in r.json()["choices"]])
        text = httpx.get(s.base + "/metrics").text
        counts = (metric(text, "dualpath_spec_proposed_tokens_total"),
                  metric(text, "dualpath_spec_accepted_tokens_total"))
    return texts, counts


def test_speculative_server_answers_as_the_plain_one():
    plain, (p0, a0) = _answers()
    spec, (proposed, accepted) = _answers("--speculative", "ngram")
    assert spec == plain
    assert (p0, a0) == (0, 0) and proposed > accepted > 0
