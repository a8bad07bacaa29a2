"""``dualpath serve`` with the prefix cache on disk: a prompt warmed before a SIGKILL is
read back by the next server, which reports it as cached and answers exactly as before."""

from __future__ import annotations

import os
import sys

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from dualpath.bench.common import free_port, live_server, metric  # noqa: E402
from dualpath.cache import disk  # noqa: E402
from tests_shared import models_dir_path  # noqa: E402

GGUF = models_dir_path() / "stories260K.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(), reason="test model not found (set DUALPATH_TEST_MODELS)")

SYSTEM = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
          "friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog took it first.")
P = 16  # kv_cache.page_tokens (default)


def _serve(*extra):
    port = free_port()
    argv = [sys.executable, "-m", "dualpath.cli", "serve", "--model", str(GGUF), "--port", str(port),
            "--ctx-size", "512", "--no-webui", *extra]
    return live_server("dualpath", argv, f"http://127.0.0.1:{port}", 120)


def _complete(base, prompt):
    r = httpx.post(base + "/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_warmed_prompt_survives_a_kill_and_restart(tmp_path):
    store = str(tmp_path / "store")
    question = SYSTEM + " What did Lily do next?"
    with _serve("--prefix-cache", store) as a:
        warm = httpx.post(a.base + "/v1/warm", json={"prompt": SYSTEM}, timeout=60)
        assert warm.status_code == 200, warm.text
        w = warm.json()
        assert w["object"] == "warm" and w["on_disk"] is True
        n = w["usage"]["prompt_tokens"]
        assert w["stored_tokens"] == n // P * P and w["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        (info,) = disk.list_stores(store)  # written before the answer came
        assert info.pages == n // P
        before = _complete(a.base, question)
        assert before["usage"]["prompt_tokens_details"]["cached_tokens"] == n // P * P  # from memory
        written = metric(httpx.get(a.base + "/metrics").text, "dualpath_prefix_disk_bytes_total", 'op="write"')
        (info,) = disk.list_stores(store)  # the question's own full pages too
        assert written == info.size_bytes
        a.proc.kill()
        a.proc.wait()
    with _serve("--prefix-cache", store) as b:
        after = _complete(b.base, question)
        m = before["usage"]["prompt_tokens"]
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == (m - 1) // P * P  # from disk
        assert after["choices"][0]["text"] == before["choices"][0]["text"]
        text = httpx.get(b.base + "/metrics").text
        assert metric(text, "dualpath_prefix_disk_pages_total", 'result="hit"') == (m - 1) // P
        read_bytes = metric(text, "dualpath_prefix_disk_bytes_total", 'op="read"')
        assert read_bytes == (m - 1) // P * info.size_bytes / info.pages


def test_serve_keeps_pages_on_disk_by_default_and_not_when_told(tmp_path, model_cache_dir):
    root = os.path.join(os.path.dirname(str(model_cache_dir)), "prefix")  # beside the converted-model cache
    with _serve() as a:
        assert httpx.post(a.base + "/v1/warm", json={"prompt": SYSTEM}, timeout=60).json()["on_disk"] is True
        assert "prompt pages kept on disk in " + root in a.stderr_text()
    assert disk.list_stores(root)
    with _serve("--no-prefix-cache") as b:
        w = httpx.post(b.base + "/v1/warm", json={"messages": [{"role": "user", "content": SYSTEM}]}, timeout=60)
        assert w.status_code == 400 and w.json()["error"]["param"] == "messages"  # this model has no template
        w = httpx.post(b.base + "/v1/warm", json={"prompt": [1, 2, 3, 4]}, timeout=60)
        assert w.status_code == 200 and w.json()["on_disk"] is False
        assert "dualpath_prefix_disk" not in httpx.get(b.base + "/metrics").text


@pytest.mark.parametrize("body, param", [({}, "prompt"), ({"prompt": "a", "messages": []}, "prompt"),
                                         ({"prompt": 5}, "prompt"), ({"prompt": "a", "max_tokens": 3}, "max_tokens"),
                                         ({"messages": "hi"}, "messages")])
def test_bad_warm_requests_get_400_naming_the_field(tmp_path, body, param):
    with _serve("--prefix-cache", str(tmp_path)) as a:
        r = httpx.post(a.base + "/v1/warm", json=body, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, err
