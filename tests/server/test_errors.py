"""Every way a request can fail, against the live server: its status and its OpenAI error
object ``{"error": {"message", "type", "param", "code"}}``, a stream that fails after it
started, and ``/metrics`` beside a running generation.

Faults are real: a model whose final norm is NaN makes every sampled token fail inside
the engine, and an embedding of it cannot be written as JSON. Nothing here is mocked.
"""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil
import shutil
import threading

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from test_server import LiveServer, idle  # noqa: E402

import dualpath  # noqa: E402
from dualpath.errors import DualPathError  # noqa: E402

MODEL = "stories260k"
CHAT = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def live(chat_gguf):
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 256, "runtime.max_num_seqs": 4,
                                      "server.model_name": MODEL, "server.strict_model_name": True,
                                      "server.max_body_bytes": 4096, "server.embeddings": "on"})
    srv = LiveServer(dualpath.LLM(chat_gguf, cfg))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def broken(chat_gguf, tmp_path_factory):
    """A server over a copy of the model whose final norm is NaN: every logit is NaN, so
    sampling at a temperature above 0 raises inside the engine (a real fault)."""
    import gguf

    path = tmp_path_factory.mktemp("nan") / "stories260K-nan.gguf"
    shutil.copy(chat_gguf, path)
    reader = gguf.GGUFReader(str(path), "r+")
    next(t for t in reader.tensors if t.name == "output_norm.weight").data[:] = np.nan
    del reader  # flushes the memory map
    srv = LiveServer(dualpath.LLM(path, dualpath.load_config(None, {"runtime.max_context_tokens": 256,
                                                                         "server.embeddings": "on"})))
    yield srv
    srv.stop()


def error_of(r: httpx.Response) -> dict:
    """The error object of an answer, checked to have OpenAI's four fields and nothing else."""
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def sse_events(r: httpx.Response) -> list[str]:
    return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# -- the mapping, class by class ----------------------------------------------------

def _all_subclasses(cls) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


SERVER_SIDE = {"ModelLoadError", "HubModelError", "ConfigError", "TokenizerError", "DependencyError",
               "CorruptEntry", "BenchProcessError", "ArmBenchError", "IllegalInstruction", "PeerError",
               "UnsafeFolderError", "InvariantError"}
"""DualPath's errors that only a broken install, model or config raises (or a benchmark, which
never runs in the server): 500, message withheld."""
MAKE = {"ModelLoadError": lambda cls, m: cls("model.gguf", m), "HubModelError": lambda cls, m: cls("org/repo", None, m),
        "QueueFullError": lambda cls, m: cls(5, 4), "StructuredOutputError": lambda cls, m: cls("response_format", m)}
"""How to build the errors whose constructors take more than a message."""


def test_every_dualpath_error_is_mapped_to_a_deliberate_status():
    from dualpath.errors import InternalError
    from dualpath.server.errors import INTERNAL_MESSAGE, REFUSALS, api_error

    for info in pkgutil.walk_packages(dualpath.__path__, "dualpath."):  # every subclass, wherever it lives
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    found = {cls.__name__: cls for cls in _all_subclasses(DualPathError)}
    refused = {cls.__name__ for cls, *_ in REFUSALS}
    assert set(found) == refused | SERVER_SIDE | {"InternalError"}, "a new DualPathError needs a status here"
    expected = {"QueueFullError": 429, "CacheFullError": 503, "PromptTooLongError": 400,
                "InvalidPromptError": 400, "SamplingParamsError": 400, "StructuredOutputError": 400,
                "ChatTemplateError": 400, "ToolsNotRenderedError": 400, "ModelTaskError": 400,
                "ImageError": 400}
    for name, cls in found.items():
        exc = MAKE.get(name, lambda c, m: c(m))(cls, f"secret detail of {name}")
        err = api_error(exc, "prompt")
        body = err.body()["error"]
        if name in SERVER_SIDE or name == "InternalError":
            assert err.status == 500 and body["type"] == "server_error" and body["code"] == "internal_error"
            if name != "InternalError":  # only InternalError's message is written to be sent
                assert body["message"] == INTERNAL_MESSAGE
            continue
        assert err.status == expected[name], name
        assert body["message"] == str(exc)  # a refusal's message is the user's answer
        assert ("Retry-After" in err.headers) == (err.status in (429, 503)), name
    assert api_error(found["PromptTooLongError"]("too long"), "input").param == "input"
    assert api_error(found["StructuredOutputError"]("tools[0]", "bad")).param == "tools[0]"
    assert api_error(RuntimeError("secret")).body()["error"]["message"] == INTERNAL_MESSAGE
    assert isinstance(found["InternalError"]("x"), InternalError)


# -- refusals: 4xx ------------------------------------------------------------------

LONG = list(range(5, 5 + 300))  # token ids past the 256-token context
REFUSED = [
    # (what, method, path, body: JSON-able or raw bytes, status, type, param, code)
    ("malformed JSON", "POST", "/v1/completions", b'{"prompt": "Hi", ', 400, "invalid_request_error", None,
     "invalid_json"),
    ("not an object", "POST", "/v1/chat/completions", b"[1, 2]", 400, "invalid_request_error", None,
     "invalid_json"),
    ("not UTF-8", "POST", "/v1/completions", b'{"prompt": "\xff"}', 400, "invalid_request_error", None,
     "invalid_json"),
    ("unknown field", "POST", "/v1/completions", {"prompt": "Hi", "frobnicate": 1}, 400,
     "invalid_request_error", "frobnicate", "unknown_field"),
    ("wrong type", "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": "4"}, 400, "invalid_request_error",
     "max_tokens", None),
    ("out of range", "POST", "/v1/completions", {"prompt": "Hi", "temperature": -1}, 400,
     "invalid_request_error", None, "invalid_value"),
    ("n over the slots", "POST", "/v1/chat/completions", {"messages": CHAT, "n": 9}, 400,
     "invalid_request_error", "n", None),
    ("stream_options not an object", "POST", "/v1/chat/completions",
     {"messages": CHAT, "stream": True, "stream_options": "yes"}, 400, "invalid_request_error", "stream_options",
     None),
    ("token outside the vocabulary", "POST", "/v1/completions", {"prompt": [1, 99999]}, 400,
     "invalid_request_error", "prompt", None),
    ("prompt longer than the context", "POST", "/v1/completions", {"prompt": LONG, "max_tokens": 4}, 400,
     "invalid_request_error", "prompt", "context_length_exceeded"),
    ("embedding input longer than the context", "POST", "/v1/embeddings", {"input": LONG}, 400,
     "invalid_request_error", "input", "context_length_exceeded"),
    ("schema not honoured", "POST", "/v1/chat/completions",
     {"messages": CHAT, "response_format": {"type": "json_schema"}}, 400, "invalid_request_error",
     "response_format.json_schema", "invalid_value"),
    ("unsupported field", "POST", "/v1/chat/completions", {"messages": CHAT, "audio": {}}, 400,
     "invalid_request_error", "audio", "unsupported_field"),
    ("unknown model", "POST", "/v1/completions", {"prompt": "Hi", "model": "gpt-4o"}, 404,
     "invalid_request_error", "model", "model_not_found"),
    ("unknown route", "GET", "/v1/nothing", None, 404, "invalid_request_error", None, "not_found"),
    ("wrong method", "GET", "/v1/completions", None, 405, "invalid_request_error", None, "method_not_allowed"),
    ("body over the limit", "POST", "/v1/completions", {"prompt": "x" * 5000}, 413, "invalid_request_error", None,
     "request_too_large"),
]


@pytest.mark.parametrize("what, method, path, body, status, type_, param, code", REFUSED,
                         ids=[case[0] for case in REFUSED])
def test_a_refused_request_gets_its_status_and_an_openai_error(live, what, method, path, body, status, type_,
                                                               param, code):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    r = httpx.request(method, live.base + path, headers={"Content-Type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert (err["type"], err["param"], err["code"]) == (type_, param, code), err
    assert "Traceback" not in r.text


def test_a_body_over_the_limit_without_a_length_is_cut_off_at_413(live):
    def chunks():  # no Content-Length: chunked transfer, counted as it arrives
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = httpx.post(live.base + "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert error_of(r)["code"] == "request_too_large" and "4096" in r.json()["error"]["message"]


def test_a_refused_request_leaves_nothing_in_the_engine(live):
    for _, method, path, body, *_ in REFUSED:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
        httpx.request(method, live.base + path, headers={"Content-Type": "application/json"}, **kw)
    assert idle(live.llm.engine)
    cache = live.llm.runner.cache
    assert not cache.seqs
    cache.check_invariants()


# -- failures: 500 and the stream's error event ------------------------------------------

def test_an_engine_fault_is_a_500_whose_cause_goes_to_the_log_not_the_body(broken, caplog):
    with caplog.at_level(logging.ERROR):
        r = httpx.post(broken.base + "/v1/completions", json={"prompt": "Once", "max_tokens": 4})
    assert r.status_code == 500
    err = error_of(r)
    assert (err["type"], err["param"], err["code"]) == ("server_error", None, "internal_error")
    assert "failed inside the engine" in err["message"]
    assert "finite" not in r.text and "ValueError" not in r.text and "Traceback" not in r.text
    logged = "\n".join(rec.getMessage() + (str(rec.exc_info[1]) if rec.exc_info else "") for rec in caplog.records)
    assert "logits have no finite maximum" in logged  # the cause, for whoever runs the server


def test_an_answer_that_cannot_be_written_is_a_500_without_internals(broken, caplog):
    with caplog.at_level(logging.ERROR):
        r = httpx.post(broken.base + "/v1/embeddings", json={"input": "Once"})  # NaN: not JSON
    assert r.status_code == 500
    err = error_of(r)
    assert (err["type"], err["code"]) == ("server_error", "internal_error")
    assert err["message"] == "the server failed to complete the request; it may be retried"
    assert "JSON compliant" not in r.text
    assert any("JSON compliant" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "n": 2}),
    ("/v1/completions", {"prompt": "Once", "max_tokens": 4, "stream_options": {"include_usage": True}}),
], ids=["chat", "chat n=2", "completion"])
def test_a_stream_that_fails_after_it_started_sends_one_error_event_then_done(broken, path, body):
    with httpx.stream("POST", broken.base + path, json={**body, "stream": True}) as r:
        assert r.status_code == 200  # the status line went out before the failure
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    errors = [json.loads(e) for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1 and json.loads(events[-2]) == errors[0]  # one error event, just before [DONE]
    assert set(errors[0]["error"]) == {"message", "type", "param", "code"}
    assert errors[0]["error"]["code"] == "internal_error" and "finite" not in json.dumps(errors[0])
    for e in events[:-2]:  # before it: chunks (the chat's role deltas), none finished
        assert all(c["finish_reason"] is None for c in json.loads(e)["choices"])
    assert idle(broken.llm.engine)
    assert not broken.llm.runner.cache.seqs
    broken.llm.runner.cache.check_invariants()


def test_the_server_goes_on_serving_after_its_faults(broken):
    r = httpx.post(broken.base + "/v1/completions", json={"prompt": "Once", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200  # greedy picks a token even from NaN logits: nothing raises
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert httpx.get(broken.base + "/health").json()["status"] == "ok"


# -- /metrics beside a generation --------------------------------------------------------

def test_metrics_requests_do_not_disturb_a_running_generation(live):
    body = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    expected = httpx.post(live.base + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    generating, stop = threading.Event(), threading.Event()
    answers, during = [], []

    def scrape():
        with httpx.Client(base_url=live.base, timeout=60) as http:
            while not stop.is_set():
                r = http.get("/metrics")
                answers.append(r.status_code)
                if generating.is_set():
                    during.append("dualpath_running_requests" in r.text)

    scrapers = [threading.Thread(target=scrape) for _ in range(8)]
    for t in scrapers:
        t.start()
    try:
        while not answers and all(t.is_alive() for t in scrapers):  # the scrapers are running first
            stop.wait(0.01)
        text = []
        with httpx.stream("POST", live.base + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():  # as they come
                if line.startswith("data: ") and line != "data: [DONE]":
                    generating.set()
                    text.append(json.loads(line[6:])["choices"][0]["text"])
        generating.clear()
    finally:
        stop.set()
        for t in scrapers:
            t.join(timeout=60)
    assert "".join(text) == expected  # same tokens as without the scrapers
    assert during and all(during), len(during)  # /metrics answered while tokens were being made
    assert answers and set(answers) == {200}
