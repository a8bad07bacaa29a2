"""/v1/embeddings from an embedding model (an encoder): served alone, or beside a chat model
(``--embedding-model``), the texts of concurrent clients batched in the engine's steps
(engine/encoder_queue.py), through the real ``openai`` client."""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from test_server import KEY, LiveServer  # noqa: E402

import dualpath  # noqa: E402
from dualpath.models.synth import synth_gguf  # noqa: E402
from dualpath.server.embeddings import load_embedder  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "search the world for the best answer",
         "water is wet"]


@pytest.fixture(scope="module")
def bert_file(tmp_path_factory):
    return synth_gguf(tmp_path_factory.mktemp("enc") / "bert-tiny.gguf", "bert-tiny", "F32")


@pytest.fixture(scope="module")
def reference(bert_file):
    """The same encoder file in an LLM of its own: ``LLM.embed`` is what the server must match."""
    return dualpath.LLM(bert_file)


@pytest.fixture(scope="module")
def alone(bert_file):
    srv = LiveServer(dualpath.LLM(bert_file, dualpath.load_config(None, {"server.api_key": KEY})))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def both(chat_gguf, bert_file):
    """A chat model (stories260K) with the encoder beside it, as ``serve --embedding-model``."""
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 256, "runtime.max_num_seqs": 4,
                                      "server.api_key": KEY, "server.embedding_model": bert_file,
                                      "server.embedding_dimensions": "64,32"})
    srv = LiveServer(dualpath.LLM(chat_gguf, cfg), embedder=load_embedder(cfg))
    yield srv
    srv.stop()


def metric(srv, name: str) -> float:
    text = httpx.get(srv.base + "/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def vectors(srv, texts, **kw) -> np.ndarray:
    r = srv.client().embeddings.create(model="x", input=texts, **kw)
    assert [d.index for d in r.data] == list(range(len(texts)))
    return np.array([d.embedding for d in r.data])


def test_an_embedding_only_server_answers_with_llm_embeds_vectors(alone, reference):
    got = vectors(alone, TEXTS)
    np.testing.assert_allclose(got, reference.embed(TEXTS), atol=1e-5)
    r = alone.client().embeddings.create(model="x", input=TEXTS[0])
    assert r.usage.prompt_tokens == len(reference.tokenize(TEXTS[0]))
    models = alone.client().models.list().data
    assert [m.id for m in models] == ["bert-tiny.gguf"]


def test_chat_on_an_embedding_only_server_is_a_400_naming_the_problem(alone):
    with pytest.raises(openai.BadRequestError) as info:
        alone.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    assert "this server's model bert-tiny.gguf is an embedding model" in info.value.message
    assert info.value.body["code"] == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as info:
        alone.client().completions.create(model="x", prompt="hi")
    assert "/v1/completions" in info.value.message


def test_concurrent_requests_share_encoder_batches(alone, reference):
    """Eight clients at once, each with 24 texts of 100 token ids: the queue runs their texts
    together (the counter of runs holding two requests or more moves), and every client gets
    its own texts' vectors."""
    rng = np.random.default_rng(0)
    inputs = [[[101] + rng.integers(1000, 1024, 98).tolist() + [102] for _ in range(24)] for _ in range(8)]
    shared_before = metric(alone, "dualpath_encoder_shared_batches_total")
    start, out, errors = threading.Barrier(8), [None] * 8, []

    def client(k):
        start.wait()
        try:
            out[k] = vectors(alone, inputs[k])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert metric(alone, "dualpath_encoder_shared_batches_total") > shared_before
    assert metric(alone, "dualpath_encoder_most_requests_per_batch") >= 2
    runner = reference.encoder
    for k in (0, 7):
        np.testing.assert_allclose(out[k], runner.embed(inputs[k], runner.pooling), atol=1e-5)


def test_chat_and_embeddings_are_served_together_each_by_its_model(both, reference):
    client = both.client()
    models = [m.id for m in client.models.list().data]
    assert models[1] == "bert-tiny.gguf" and len(models) == 2
    chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Once upon a time"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.content
    got = vectors(both, TEXTS)
    assert got.shape == (4, 128)  # the encoder's size, not the chat model's 64
    np.testing.assert_allclose(got, reference.embed(TEXTS), atol=1e-5)
    r = client.embeddings.create(model="x", input="hi")
    assert r.model == "bert-tiny.gguf"
    assert metric(both, "dualpath_encoder_texts_total") >= 5  # the engine's /metrics counts its encoder


def test_dimensions_cut_and_renormalise_only_to_the_declared_sizes(both, reference):
    full = reference.embed(TEXTS[:2])
    short = vectors(both, TEXTS[:2], dimensions=32)
    want = full[:, :32] / np.linalg.norm(full[:, :32], axis=1, keepdims=True)
    np.testing.assert_allclose(short, want, atol=1e-5)
    for bad in (100, 256, 0):
        with pytest.raises(openai.BadRequestError) as info:
            both.client().embeddings.create(model="x", input="hi", dimensions=bad)
        assert info.value.body["param"] == "dimensions" and "128 or 64 or 32" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:  # shorter, but not a declared size
        both.client().embeddings.create(model="x", input="hi", dimensions=16)
    assert info.value.body["param"] == "dimensions"


def test_bad_inputs_are_400s_naming_the_field(both, reference):
    client = both.client()
    long_ids = [101] + [1000] * 200 + [102]  # the encoder has 128 positions
    for bad in ("", [[]], [], ["fine", ""]):
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model="x", input=bad)
        assert info.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="x", input=[[101, 102], long_ids])
    assert info.value.body["param"] == "input" and info.value.body["code"] == "context_length_exceeded"
    assert "input[1] has 202 tokens" in info.value.message and "truncate" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="x", input=[[101, 5000]])  # outside the 1024-token vocabulary
    assert info.value.body["param"] == "input"
    cut = vectors(both, [long_ids], extra_body={"truncate": True})
    runner = reference.encoder
    np.testing.assert_allclose(cut[0], runner.embed([long_ids[:128]], runner.pooling)[0], atol=1e-5)


def test_a_chat_server_answers_embeddings_only_when_asked(chat_gguf):
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 256})
    srv = LiveServer(dualpath.LLM(chat_gguf, cfg))
    try:
        r = httpx.post(srv.base + "/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"
        assert "--embedding-model" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_a_decoder_whose_file_declares_pooling_answers_embeddings_unasked(chat_gguf, tmp_path):
    """As a Qwen3-Embedding GGUF (``pooling_type`` last): the default ``auto`` serves it."""
    import gguf

    from tests_shared import copy_gguf

    path = copy_gguf(chat_gguf, tmp_path / "embedder.gguf", {"llama.pooling_type": (3, gguf.GGUFValueType.UINT32)})
    llm = dualpath.LLM(path, dualpath.load_config(None, {"runtime.max_context_tokens": 256}))
    srv = LiveServer(llm)
    try:
        got = vectors(srv, ["Once upon a time", "The sun"])
        assert got.shape == (2, 64) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        llama_cpp = pytest.importorskip("llama_cpp")  # the file's last-token pooling, as llama.cpp reads it
        ref = llama_cpp.Llama(str(path), embedding=True, n_ctx=256, verbose=False)
        assert float(np.array(ref.embed("Once upon a time", normalize=True)) @ got[0]) > 0.9999
    finally:
        srv.stop()


def test_declared_pooling_reads_the_files_header(bert_file, chat_gguf):
    from dualpath.models.gguf import declared_pooling

    assert declared_pooling(bert_file) == "mean"
    assert declared_pooling(chat_gguf) is None  # a chat model declares none: not an embedder


def test_a_short_soak_of_chats_and_64_text_batches_has_no_5xx(both):
    """Chats and 64-text embedding batches at once for a few seconds: every answer a 200."""
    statuses: list[int] = []
    stop = time.monotonic() + 4.0
    texts = [f"{TEXTS[i % 4]} number {i}" for i in range(64)]

    def chats():
        with httpx.Client(base_url=both.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as h:
            while time.monotonic() < stop:
                statuses.append(h.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "Once"}], "max_tokens": 16}).status_code)

    def embeds():
        with httpx.Client(base_url=both.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as h:
            while time.monotonic() < stop:
                r = h.post("/v1/embeddings", json={"input": texts})
                statuses.append(r.status_code if r.status_code != 200 or len(r.json()["data"]) == 64 else -1)

    before = metric(both, "dualpath_encoder_texts_total")
    threads = [threading.Thread(target=f) for f in (chats, chats, chats, embeds, embeds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses and set(statuses) == {200}
    assert metric(both, "dualpath_encoder_texts_total") >= before + 64
    assert httpx.get(both.base + "/health").json()["running"] == 0


def test_dualpath_serve_runs_an_embedder_alone_and_beside_a_chat_model(bert_file, gguf_path, reference):
    """The command line: ``serve -m bert.gguf`` and ``serve -m chat.gguf --embedding-model bert.gguf``."""
    import sys

    from dualpath.bench.common import free_port, live_server

    want = reference.embed(TEXTS[:2])
    for extra in (["--model", bert_file], ["--model", str(gguf_path), "--embedding-model", bert_file]):
        port = free_port()
        argv = [sys.executable, "-m", "dualpath.cli", "serve", *extra, "--port", str(port), "--ctx-size", "256",
                "--no-prefix-cache"]
        with live_server("dualpath", argv, f"http://127.0.0.1:{port}", 120) as s:
            r = httpx.post(s.base + "/v1/embeddings", json={"input": TEXTS[:2]}, timeout=60)
            assert r.status_code == 200, r.text
            np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], want, atol=1e-5)
            chat = httpx.post(s.base + "/v1/completions", json={"prompt": "Once", "max_tokens": 4}, timeout=60)
            ids = [m["id"] for m in httpx.get(s.base + "/v1/models").json()["data"]]
            err = s.stop()
        assert "/v1/embeddings from bert-tiny.gguf (bert, 128 dimensions, mean pooling" in err
        if len(extra) == 2:  # alone: generation is refused
            assert chat.status_code == 400 and "is an embedding model" in chat.json()["error"]["message"]
            assert ids == ["bert-tiny.gguf"]
        else:
            assert chat.status_code == 200 and ids == [os.path.basename(gguf_path), "bert-tiny.gguf"]
            assert "planned at" in err and "KV cache invariants hold" in err


def test_a_memory_budget_is_shared_with_the_embedding_model(reference):
    from dualpath.errors import ConfigError
    from dualpath.server.embeddings import chat_config, embedder_bytes

    need_mb = -(-embedder_bytes(reference) // (1 << 20))
    assert need_mb >= 1
    cfg = dualpath.load_config(None, {"runtime.memory_budget_mb": 1000})
    assert chat_config(cfg, reference).runtime.memory_budget_mb == 1000 - need_mb
    assert chat_config(cfg, None) is cfg
    with pytest.raises(ConfigError, match="embedding model bert-tiny.gguf alone is planned at"):
        chat_config(dualpath.load_config(None, {"runtime.memory_budget_mb": need_mb}), reference)
