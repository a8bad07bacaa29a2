"""``POST /v1/rerank`` and ``POST /rerank`` (server/rerank.py) live over a Qwen3 reranker
(a decoder: its pairs run through the engine), and over a cross-encoder served alone and
beside a chat model (an encoder: its pairs run on the server's encoder queue)."""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from test_server import LiveServer  # noqa: E402

import dualpath  # noqa: E402
from dualpath.models.synth import synth_gguf  # noqa: E402
from dualpath.server.errors import APIError  # noqa: E402
from dualpath.server.rerank import MAX_RERANK_DOCUMENTS, rerank_response  # noqa: E402

QUERY = "where is the school"
DOCUMENTS = ["The school is in the north of the city.", "hello world", "a", "the city has a river and a school"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = synth_gguf(tmp_path_factory.mktemp("reranker") / "qwen3-reranker.gguf", "qwen3-reranker-tiny", "F32")
    cfg = dualpath.load_config(None, {"server.model_name": "reranker", "runtime.max_num_seqs": 4})
    srv = LiveServer(dualpath.LLM(path, cfg))
    yield srv
    srv.stop()


def post(live, route, body):
    return httpx.post(live.base + route, json=body, timeout=60)


def test_rerank_routes_answer_in_jina_and_cohere_shape(live):
    expected = live.llm.rerank(QUERY, DOCUMENTS)
    for route in ("/v1/rerank", "/rerank"):
        r = post(live, route, {"model": "reranker", "query": QUERY, "documents": DOCUMENTS[:2] + [
            {"text": d} for d in DOCUMENTS[2:]]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "reranker" and body["object"] == "list"
        assert [d["index"] for d in body["results"]] == [e.index for e in expected]
        assert [d["document"] for d in body["results"]] == [{"text": e.document} for e in expected]
        for got, want in zip(body["results"], expected):
            assert abs(got["relevance_score"] - want.relevance_score) < 1e-5
        tokens = sum(len(i) for i in dualpath.rerank.pair_ids(live.llm, QUERY, DOCUMENTS))
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    r = post(live, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": False})
    assert r.status_code == 200
    assert r.json()["results"] == [{"index": e.index, "relevance_score": pytest.approx(e.relevance_score, abs=1e-5)}
                                   for e in expected[:2]]


@pytest.mark.parametrize("body,param,fragment", [
    ({"query": QUERY, "documents": []}, "documents", "list of 1 to"),
    ({"query": QUERY, "documents": ["d"] * (MAX_RERANK_DOCUMENTS + 1)}, "documents", f"got {MAX_RERANK_DOCUMENTS + 1}"),
    ({"query": QUERY, "documents": ["ok", 7]}, "documents", "'documents[1]' must be a string"),
    ({"query": QUERY, "documents": [{"txt": "x"}]}, "documents", "'documents[0]' must be a string"),
    ({"query": 3, "documents": DOCUMENTS}, "query", "'query' must be a string"),
    ({"documents": DOCUMENTS}, "query", "'query' must be a string"),
    ({"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n", "must be an integer >= 1"),
    ({"query": QUERY, "documents": DOCUMENTS, "top_n": "2"}, "top_n", "must be an integer >= 1, got str"),
    ({"query": QUERY, "documents": DOCUMENTS, "rank_fields": ["x"]}, "rank_fields", "unknown field"),
    ({"query": QUERY, "documents": ["word " * 1200]}, "documents", "\"truncate\": true cuts the document"),
    ({"query": "word " * 1200, "documents": ["d"], "truncate": True}, "query", "no room for a document"),
])
def test_bad_rerank_requests_are_400_naming_the_field(live, body, param, fragment):
    r = post(live, "/v1/rerank", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and fragment in err["message"], err


def test_truncate_cuts_a_long_document_to_fit(live):
    r = post(live, "/v1/rerank", {"query": QUERY, "documents": ["short", "word " * 1200], "truncate": True})
    assert r.status_code == 200, r.text
    assert sorted(d["index"] for d in r.json()["results"]) == [0, 1]
    assert r.json()["usage"]["prompt_tokens"] <= 2 * live.llm.context_tokens


def test_embeddings_of_a_reranker_are_refused(live):
    r = post(live, "/v1/embeddings", {"input": "hello"})
    assert r.status_code == 400 and "use POST /v1/rerank" in r.json()["error"]["message"]


def _scores(body: dict) -> list[tuple[int, float]]:
    return [(d["index"], d["relevance_score"]) for d in body["results"]]


def test_a_cross_encoder_served_alone_and_beside_a_chat_model(tmp_path, gguf_path):
    """``dualpath serve -m ce.gguf`` and ``--embedding-model ce.gguf`` beside a chat model: the
    pairs run on the encoder queue (its metrics count them) and the scores are LLM.rerank's."""
    ce = dualpath.LLM(synth_gguf(tmp_path / "ce.gguf", "bert-rerank-tiny", "F32"))
    expected = [(e.index, e.relevance_score) for e in ce.rerank(QUERY, DOCUMENTS, top_n=3)]
    chat = dualpath.LLM(gguf_path, dualpath.load_config(None, {"runtime.max_num_seqs": 2}))
    for srv in (LiveServer(ce), LiveServer(chat, embedder=ce)):
        try:
            r = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 3})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == "ce.gguf"
            got = _scores(r.json())
            assert [i for i, _ in got] == [i for i, _ in expected]
            assert got == [(i, pytest.approx(v, abs=1e-5)) for i, v in expected]
            metrics = httpx.get(srv.base + "/metrics", timeout=30).text
            items = [line for line in metrics.splitlines() if line.startswith("dualpath_encoder_texts_total")]
            assert items and float(items[0].split()[-1]) >= len(DOCUMENTS), metrics
            r = post(srv, "/v1/embeddings", {"input": "hello"})
            assert r.status_code == 400 and "relevance scores" in r.json()["error"]["message"]
        finally:
            srv.stop()


def test_rerank_on_an_embedding_model_is_a_400_naming_it(tmp_path):
    embedder = dualpath.LLM(synth_gguf(tmp_path / "bert.gguf", "bert-tiny", "F32"))
    srv = LiveServer(embedder)
    try:
        r = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
        assert r.status_code == 400 and "not a reranker" in r.json()["error"]["message"], r.text
    finally:
        srv.stop()
    with pytest.raises(dualpath.errors.ModelTaskError, match="not a reranker") as e:
        asyncio.run(rerank_response(embedder, "bert", {"query": QUERY, "documents": DOCUMENTS}))
    assert not isinstance(e.value, APIError)
