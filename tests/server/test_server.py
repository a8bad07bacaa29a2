"""The OpenAI-compatible server, live on 127.0.0.1, driven by the real ``openai`` client
(and raw HTTP where a client would refuse to send what we test)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

import dualpath  # noqa: E402
from dualpath import SamplingParams  # noqa: E402
from dualpath.server import create_app  # noqa: E402
from dualpath.server.connections import uvicorn_config  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
                 "{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}")
KEY = "sk-test-key"


class LiveServer:
    def __init__(self, llm, embedder=None, **config):
        self.llm = llm
        self.app = create_app(llm, embedder=embedder)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(self.app, llm.config.server, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self, key=KEY, **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, **kw)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def live(chat_gguf):
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 256, "runtime.max_num_seqs": 4,
                                      "server.api_key": KEY, "server.max_queued_requests": 4,
                                      "server.model_name": "stories260k", "server.max_body_bytes": 4096})
    srv = LiveServer(dualpath.LLM(chat_gguf, cfg))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def slow_live(tmp_path_factory):
    """A server over a stories15M-shaped model (random weights, 2k context): slow
    enough per request that a test can act while requests are still running."""
    from dualpath.models.synth import synth_gguf

    path = synth_gguf(tmp_path_factory.mktemp("slow") / "s15.gguf", "stories15M", "F32", seed=0,
                      context_length=2048)
    cfg = dualpath.load_config(None, {"runtime.max_num_seqs": 2, "server.max_queued_requests": 2,
                                      "server.model_name": "s15"})
    srv = LiveServer(dualpath.LLM(path, cfg))
    yield srv
    srv.stop()


def idle(engine, timeout=10.0):
    deadline = time.time() + timeout
    while engine.has_work() and time.time() < deadline:
        time.sleep(0.01)
    return not engine.has_work()


# -- the happy paths ---------------------------------------------------------------

def test_models_and_health(live):
    models = live.client().models.list()
    assert [m.id for m in models.data] == ["stories260k"]
    r = httpx.get(live.base + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_completion_matches_the_library(live):
    c = live.client().completions.create(model="stories260k", prompt="Once upon a time", max_tokens=24,
                                         temperature=0)
    ref = live.llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=24))
    assert c.choices[0].text == ref.text and c.choices[0].text
    assert c.choices[0].finish_reason == "length"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (ref.usage.prompt_tokens, 24)
    assert c.model == "stories260k" and c.object == "text_completion"


def test_streamed_completion_adds_up_to_the_whole(live):
    client = live.client()
    whole = client.completions.create(model="stories260k", prompt="One day", max_tokens=32, temperature=0)
    chunks = list(client.completions.create(model="stories260k", prompt="One day", max_tokens=32, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage.completion_tokens == 32
    assert len(chunks) > 5  # really streamed, token by token


def test_chat_non_streamed_and_streamed(live):
    client = live.client()
    messages = [{"role": "system", "content": "Once upon a time"}, {"role": "user", "content": " there was"}]
    ref = live.llm.chat(messages, SamplingParams(temperature=0, max_tokens=20))
    c = client.chat.completions.create(model="stories260k", messages=messages, max_tokens=20, temperature=0)
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == ref.text and ref.text
    assert c.usage.prompt_tokens == len(live.llm.chat_prompt_ids(messages))
    stream = client.chat.completions.create(model="stories260k", messages=messages, max_tokens=20, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_and_seeds_pass_through(live):
    client = live.client()
    full = client.completions.create(model="stories260k", prompt="Once upon a time", max_tokens=40, temperature=0)
    word = full.choices[0].text.split()[3]
    cut = client.completions.create(model="stories260k", prompt="Once upon a time", max_tokens=40, temperature=0,
                                    stop=[word])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full.choices[0].text[:full.choices[0].text.index(word)]
    a, b = (client.completions.create(model="stories260k", prompt="Once", max_tokens=30, temperature=1.0, seed=7)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text


def test_metrics_are_prometheus_text(live):
    live.client().completions.create(model="stories260k", prompt="Hi", max_tokens=4, temperature=0)
    r = httpx.get(live.base + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("dualpath_queue_depth", "dualpath_running_requests", "dualpath_generation_tokens_per_second",
                 "dualpath_time_to_first_token_seconds_bucket", "dualpath_time_per_output_token_seconds_count",
                 'dualpath_kv_cache_bytes{use="sequential"}', 'dualpath_kv_cache_bytes{use="random"}',
                 "dualpath_prefix_cache_hit_rate", "dualpath_power_profile{profile="):
        assert name in text, name
    count = next(line for line in text.splitlines() if line.startswith("dualpath_time_to_first_token_seconds_count"))
    assert int(count.split()[-1]) >= 1


# -- errors ------------------------------------------------------------------------

def test_wrong_or_missing_api_key_is_401(live):
    with pytest.raises(openai.AuthenticationError) as info:
        live.client(key="wrong").completions.create(model="stories260k", prompt="Hi", max_tokens=2)
    assert info.value.status_code == 401
    r = httpx.post(live.base + "/v1/completions", json={"prompt": "Hi"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_bad_parameters_are_400_with_an_openai_error(live):
    client = live.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="stories260k", prompt="Hi", max_tokens=4, temperature=-1)
    assert "temperature" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="stories260k", prompt="Hi " * 400, max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="stories260k", messages=[], max_tokens=4)
    # a single-model server answers whatever model a client names (server.strict_model_name: false)
    assert client.completions.create(model="gpt-4", prompt="Hi", max_tokens=4).model == "stories260k"


def test_malformed_json_and_oversized_bodies(live):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(live.base + "/v1/completions", content=b'{"prompt": "Hi", ', headers=headers)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "not valid JSON" in err["message"]
    r = httpx.post(live.base + "/v1/completions", content=b"[1, 2]", headers=headers)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.post(live.base + "/v1/completions", json={"prompt": "x" * 5000}, headers=headers)
    assert r.status_code == 413 and "4096" in r.json()["error"]["message"]
    r = httpx.post(live.base + "/v1/completions", json={"prompt": {"a": 1}}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.get(live.base + "/v1/nothing-here", headers=headers)
    assert r.status_code == 404 and "error" in r.json()


def test_an_engine_failure_is_a_500_error_object_and_ends_a_stream_with_an_error_event(live):
    headers = {"Authorization": f"Bearer {KEY}"}
    runner = live.llm.runner
    real_run = runner.run

    def broken(entries):  # fault injection: every model run raises (a request is retried once, then fails)
        raise MemoryError("secret internals")

    runner.run = broken
    try:
        r = httpx.post(live.base + "/v1/completions", json={"prompt": "Once", "max_tokens": 4}, headers=headers)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "internal_error"
        assert "secret" not in r.text and "Traceback" not in r.text
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
        with httpx.stream("POST", live.base + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200  # the status line went out before the failure
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
        assert json.loads(events[-2])["error"]["code"] == "internal_error" and events[-1] == "[DONE]"
    finally:
        runner.run = real_run
    c = live.client().completions.create(model="stories260k", prompt="Once", max_tokens=4)
    assert c.choices[0].finish_reason == "length"  # the engine keeps serving
    assert not runner.cache.seqs
    runner.cache.check_invariants()


def test_a_full_queue_answers_429_with_retry_after(slow_live):
    engine = slow_live.llm.engine
    assert idle(engine)
    client = slow_live.client(key="unused")
    results, errors = [], []

    def call():
        try:
            results.append(client.completions.create(model="s15", prompt="Once upon a time", max_tokens=300,
                                                      temperature=0, extra_body={"ignore_eos": True}))
        except openai.RateLimitError as e:
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(12)]  # 2 run, 2 wait, the rest are refused
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) >= 4 and len(errors) >= 1
    assert len(results) + len(errors) == 12
    assert all(e.status_code == 429 and e.code == "queue_full" for e in errors)
    assert errors[0].response.headers["retry-after"] == "1"
    assert all(r.choices[0].finish_reason == "length" for r in results)


def test_a_client_that_disconnects_frees_the_cache(slow_live):
    live = slow_live
    engine, cache = live.llm.engine, live.llm.runner.cache
    assert idle(engine, 120)
    body = {"model": "s15", "prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", live.base + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert engine.num_running == 1
    # The connection is closed mid-stream: the request is aborted and its pages freed.
    assert idle(engine), "the aborted request is still running"
    deadline = time.time() + 5
    while len(cache.seqs) > 1 and time.time() < deadline:
        time.sleep(0.01)
    assert not cache.seqs
    stats = cache.stats()
    assert stats.bytes_used_sequential == 0 and stats.bytes_used_random == 0
    metrics = httpx.get(live.base + "/metrics").text
    assert 'dualpath_requests_finished_total{reason="abort"}' in metrics
    aborted = next(line for line in metrics.splitlines() if 'reason="abort"' in line and not line.startswith("#"))
    assert int(aborted.split()[-1]) >= 1


def test_non_streamed_disconnect_aborts_too(slow_live):
    live = slow_live
    engine = live.llm.engine
    assert idle(engine, 120)
    body = json.dumps({"model": "s15", "prompt": "Once", "max_tokens": 1500, "temperature": 0,
                       "ignore_eos": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", live.port)) as s:
        s.sendall(request)
        deadline = time.time() + 10
        while engine.num_running == 0 and time.time() < deadline:
            time.sleep(0.005)
        assert engine.num_running == 1
    assert idle(engine), "the request of a client that went away is still running"


def test_the_chat_page_is_served_with_a_strict_policy_and_can_be_turned_off(live, chat_gguf):
    r = httpx.get(live.base + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert '<script src="static/chat.js"' in r.text
    assert httpx.get(live.base + "/static/chat.js").headers["content-type"].startswith("text/javascript")
    assert httpx.get(live.base + "/static/../app.py").status_code == 404
    assert httpx.get(live.base + "/static/index.html").status_code == 404  # the page lives at / only
    assert httpx.get(live.base + "/static/nothing.js").json()["error"]["code"] == "not_found"
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 64, "server.webui": False})
    off = LiveServer(dualpath.LLM(chat_gguf, cfg))
    try:
        assert httpx.get(off.base + "/").status_code == 404
        assert httpx.get(off.base + "/v1/models").status_code == 200
    finally:
        off.stop()
