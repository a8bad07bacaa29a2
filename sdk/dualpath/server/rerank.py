"""``POST /v1/rerank`` and ``POST /rerank``: documents scored against a query by a reranker.

The request and response are Jina's and Cohere's, as llama-server answers them::

    {"model": "...", "query": "...", "documents": ["...", {"text": "..."}], "top_n": 3,
     "return_documents": true, "truncate": false}
    -> {"model": "...", "object": "list",
        "results": [{"index": 2, "relevance_score": 0.93, "document": {"text": "..."}}, ...],
        "usage": {"prompt_tokens": 123, "total_tokens": 123}}

Results come best first (rerank.py); ``top_n`` keeps the first n (more than there are
documents: all of them), ``return_documents`` false leaves ``document`` out. A pair longer
than the model's positions is refused (400, ``context_length_exceeded``) unless
``truncate``, which cuts the document to fit. A model that is not a reranker is a 400
naming what it is (``model_not_supported``).
"""

from __future__ import annotations

import asyncio

import numpy as np

from ..engine.encoder_queue import RankJob
from ..rerank import head_outputs_async, pair_ids, rank_head, ranked
from .errors import bad_request, engine_call
from .parsing import check_fields, get_field

RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "truncate", "user"}
MAX_RERANK_DOCUMENTS = 1000
"""Documents one request may carry (Cohere's limit): every one is a model pass."""


def rerank_request(body: dict) -> tuple[str, list[str], int | None, bool, bool]:
    """(query, documents, top_n, return_documents, truncate) of a request, or a 400 naming the field."""
    check_fields(body, RERANK_FIELDS, "/v1/rerank")
    query = body.get("query")
    if not isinstance(query, str):
        raise bad_request(f"'query' must be a string, got {type(query).__name__}", "query")
    raw = body.get("documents")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RERANK_DOCUMENTS:
        got = f"{len(raw)} documents" if isinstance(raw, list) else type(raw).__name__
        raise bad_request(f"'documents' must be a list of 1 to {MAX_RERANK_DOCUMENTS} strings or "
                          f"{{\"text\": string}} objects, got {got}", "documents")
    documents = []
    for i, d in enumerate(raw):
        if isinstance(d, dict) and set(d) == {"text"}:
            d = d["text"]
        if not isinstance(d, str):
            raise bad_request(f"'documents[{i}]' must be a string or {{\"text\": string}}, got "
                              f"{type(d).__name__}", "documents")
        documents.append(d)
    top_n = get_field(body, "top_n", (int,), None, check=lambda v: v >= 1, allowed="an integer >= 1")
    return_documents = get_field(body, "return_documents", (bool,), True)
    truncate = get_field(body, "truncate", (bool,), False)
    return query, documents, top_n, return_documents, truncate


async def rerank_response(llm, model_name: str, body: dict, queue=None) -> dict:
    """The response to a checked-out request ``body`` (see the module docstring). ``queue``:
    the server's encoder queue (server/embeddings.py ``Embeddings``) when ``llm`` is its encoder,
    so that pairs are batched with other clients' encoder work in the engine's steps."""
    query, documents, top_n, return_documents, truncate = rerank_request(body)
    head = rank_head(llm)  # a model that is not a reranker: refused before any work
    # a pair too long: a 400 (context_length_exceeded) naming query or documents
    ids = await asyncio.to_thread(pair_ids, llm, query, documents, truncate, '"truncate": true')
    if queue is not None and ids:
        rows = await queue.queued(lambda on_done: RankJob(ids, on_done), "documents")
        scores = head.outputs(np.stack(rows))[:, 0]
    else:
        scores = (await engine_call(head_outputs_async(llm, ids), "documents"))[:, 0]
    results = []
    for r in ranked(scores, documents, top_n):
        item: dict = {"index": r.index, "relevance_score": r.relevance_score}
        if return_documents:
            item["document"] = {"text": r.document}
        results.append(item)
    tokens = sum(len(i) for i in ids)
    return {"model": model_name, "object": "list", "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

