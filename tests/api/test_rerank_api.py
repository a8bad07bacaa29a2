"""``LLM.rerank``, ``LLM.embed`` on decoders and ``dualpath rerank``: ordering, ``top_n``,
truncation and the errors that name what is wrong (the scores themselves are compared to
llama.cpp's in tests/graph/test_rerank_parity.py)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from dualpath import LLM
from dualpath.errors import InvalidPromptError, ModelTaskError, PromptTooLongError
from dualpath.models.synth import synth_gguf
from dualpath.rerank import RerankResult
from tests_shared import copy_gguf

from .test_cli import assert_clean_usage_error, dualpath_cli

QUERY = "where is the school"
DOCUMENTS = ["The school is in the north of the city.", "hello world", "a", "the city has a river and a school"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank-api")
    made: dict = {}

    def get(preset: str):
        if preset not in made:
            made[preset] = synth_gguf(root / f"{preset}.gguf", preset, "F32")
        return made[preset]
    return get


@pytest.fixture(scope="module")
def cross_encoder(files):
    return LLM(files("bert-rerank-tiny"))


def test_rerank_orders_by_score_and_keeps_the_first_top_n(cross_encoder):
    results = cross_encoder.rerank(QUERY, DOCUMENTS)
    assert sorted(r.index for r in results) == [0, 1, 2, 3]
    assert all(isinstance(r, RerankResult) and r.document == DOCUMENTS[r.index] for r in results)
    scores = [r.relevance_score for r in results]
    assert scores == sorted(scores, reverse=True)
    assert cross_encoder.rerank(QUERY, DOCUMENTS, top_n=2) == results[:2]
    assert cross_encoder.rerank(QUERY, DOCUMENTS, top_n=10) == results  # more than there are: all
    # a document's score does not depend on the others in the batch
    alone = cross_encoder.rerank(QUERY, [DOCUMENTS[results[-1].index]])[0]
    assert alone.index == 0 and abs(alone.relevance_score - results[-1].relevance_score) < 1e-5
    assert cross_encoder.rerank(QUERY, []) == []
    # equal documents keep their order
    assert [r.index for r in cross_encoder.rerank(QUERY, ["same text"] * 3)] == [0, 1, 2]


def test_rerank_refuses_malformed_arguments_naming_them(cross_encoder):
    with pytest.raises(InvalidPromptError, match="documents\\[1\\] must be a string, got int"):
        cross_encoder.rerank(QUERY, ["ok", 3])
    with pytest.raises(InvalidPromptError, match="documents must be a list of strings"):
        cross_encoder.rerank(QUERY, "one string")
    with pytest.raises(InvalidPromptError, match="query must be a string"):
        cross_encoder.rerank(None, DOCUMENTS)
    for top_n in (0, -1, 1.5, True):
        with pytest.raises(InvalidPromptError, match="top_n=.* must be an integer >= 1"):
            cross_encoder.rerank(QUERY, DOCUMENTS, top_n=top_n)


def test_a_pair_too_long_is_refused_or_its_document_cut(cross_encoder):
    long = "word " * 200  # 128 positions
    with pytest.raises(PromptTooLongError, match="documents\\[1\\]: the pair has 20[0-9] tokens, more than the 128"):
        cross_encoder.rerank(QUERY, ["short", long])
    cut = cross_encoder.rerank(QUERY, ["short", long], truncate=True)
    assert sorted(r.index for r in cut) == [0, 1] and cut[0].document in ("short", long)  # the text as given
    with pytest.raises(PromptTooLongError, match="query: the query makes .* no room for a document"):
        cross_encoder.rerank("word " * 130, ["short"], truncate=True)


def test_rerank_on_a_model_that_is_not_a_reranker_names_what_it_is(files):
    with pytest.raises(ModelTaskError, match=r"is an embedding model \(bert, an encoder, pooling mean\), not a "
                                             "reranker"):
        LLM(files("bert-tiny")).rerank(QUERY, DOCUMENTS)
    with pytest.raises(ModelTaskError, match="is a qwen3 text-generation model .* not a reranker"):
        LLM(files("qwen3-embedding-tiny")).rerank(QUERY, DOCUMENTS)


def test_a_reranker_refuses_embed_and_generation(cross_encoder, files):
    with pytest.raises(ModelTaskError, match="reranker .* not embeddings; use LLM.rerank"):
        cross_encoder.embed(["a query"])
    with pytest.raises(ModelTaskError, match="cannot generate text; use LLM.embed or LLM.rerank"):
        cross_encoder.generate("hello")
    with pytest.raises(ModelTaskError, match="reranker .* use LLM.rerank"):
        LLM(files("qwen3-reranker-tiny")).embed("hello")


def test_qwen3_reranker_scores_are_probabilities_of_yes(files):
    llm = LLM(files("qwen3-reranker-tiny"))
    results = llm.rerank(QUERY, DOCUMENTS, top_n=3)
    assert len(results) == 3 and all(0.0 < r.relevance_score < 1.0 for r in results)
    assert [r.relevance_score for r in results] == sorted((r.relevance_score for r in results), reverse=True)


def test_decoder_embed_pools_as_the_file_says(files, tmp_path):
    llm = LLM(files("qwen3-embedding-tiny"))
    vectors = llm.embed(["hello world", "the city"])
    assert vectors.shape == (2, 256) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    raw = llm.embed(["hello world", "the city"], normalize=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), vectors, atol=1e-6)
    assert llm.embed([]).shape == (0, 256)
    # a decoder without a pooling type embeds with mean pooling, as /v1/embeddings does, normalised only
    plain = LLM(copy_gguf(files("qwen3-embedding-tiny"), tmp_path / "mean.gguf",
                          {"qwen3.pooling_type": (1, gguf.GGUFValueType.UINT32)}))
    assert plain.embed("hello world").shape == (256,)
    with pytest.raises(ValueError, match="normalize=False: a decoder's mean-pooled embedding comes normalised"):
        plain.embed("hello world", normalize=False)


def test_cli_rerank_prints_json_lines_best_first(files, tmp_path):
    model = files("bert-rerank-tiny")
    proc = dualpath_cli(["rerank", "-m", model, QUERY, *DOCUMENTS, "--top-n", "3"], tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(lines) == 3 and all(d["document"] == DOCUMENTS[d["index"]] for d in lines)
    expected = LLM(model).rerank(QUERY, DOCUMENTS, top_n=3)
    assert [d["index"] for d in lines] == [r.index for r in expected]
    np.testing.assert_allclose([d["relevance_score"] for d in lines], [r.relevance_score for r in expected],
                               atol=1e-5)
    too_long = dualpath_cli(["rerank", "-m", model, QUERY, "word " * 200], tmp_path)
    assert_clean_usage_error(too_long, "documents[0]: the pair has", "--truncate")
    assert_clean_usage_error(dualpath_cli(["rerank", "-m", files("bert-tiny"), QUERY, "doc"], tmp_path),
                             "not a reranker")


def test_a_head_whose_rows_differ_from_its_labels_is_refused_at_load(files, tmp_path):
    from dualpath.errors import ModelLoadError

    path = copy_gguf(files("bert-rerank-tiny"), tmp_path / "labels.gguf",
                     {"bert.classifier.output_labels": (["a", "b"], gguf.GGUFValueType.ARRAY)})
    with pytest.raises(ModelLoadError, match="cls.output.weight has 1 rows but the file names 2 classifier output"):
        LLM(path)


def test_a_modernbert_style_head_is_refused_at_load(files, tmp_path):
    from dualpath.errors import ModelLoadError

    path = copy_gguf(files("bert-rerank-tiny"), tmp_path / "mean-head.gguf",
                     {"bert.classifier.pooling_type": (1, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ModelLoadError, match="ModernBERT-style head .* not supported"):
        LLM(path)
