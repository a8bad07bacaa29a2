"""Rerankers and decoder embedders against llama.cpp on the same files.

Rerankers (pooling type rank): both engines score the same (query, document) pairs; the
pairs' token ids must be the ones llama.cpp's server builds (``format_prompt_rerank``,
rebuilt here from llama.cpp's own vocabulary flags and ``rerank`` template), and every
output of the head (``llama_get_embeddings_seq``: ``n_cls_out`` values per sequence) must
be within MAX_SCORE_DIFF of llama.cpp's, the documents in the same order. llama.cpp runs
one pair per decode, its memory cleared in between; we batch them.

- ``bert-rerank-tiny``: BertForSequenceClassification as the converter writes it (the
  ``cls.output`` projection alone, one label): the raw logit.
- ``bert-rerank-dense-tiny``: RoBERTa's head (``cls`` dense, tanh, ``cls.output``) with
  three labels: all three outputs compared, the score is the first.
- ``xlmr-rerank-tiny``: bge-reranker's kind (XLM-R: a SentencePiece Unigram vocabulary, the
  pair as ``<s> query </s> </s> document </s>``, RoBERTa's head, one label).
- ``qwen3-reranker-tiny``: the rerank template, the last token's state through the
  "yes"/"no" rows, softmax: P("yes").

Measured (2026-12-06): largest difference 7.1e-4 (bert, F16; llama.cpp's GELU reads a table
at fp16 inputs), 1.4e-4 on the ms-marco shape, 2.6e-4 (Qwen3, F16).

Decoder embedder: ``qwen3-embedding-tiny`` (pooling last), L2-normalised last-token
states, cosine >= 0.9999 against llama.cpp's.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualpath import LLM
from dualpath.models.synth import synth_gguf
from dualpath.rerank import head_outputs, pair_ids

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")

QUERY = "where is the school"
DOCUMENTS = ["The school is in the north of the city.", "hello world", "a", "Café, naïve résumé! " * 3,
             "the city has a river and a school", "中文字 日本語", ""]
MAX_SCORE_DIFF = 1e-3
RERANKERS = [("bert-rerank-tiny", "F32"), ("bert-rerank-tiny", "F16"), ("bert-rerank-dense-tiny", "F32"),
             ("bert-rerank-dense-tiny", "F16"), ("xlmr-rerank-tiny", "F32"), ("xlmr-rerank-tiny", "F16"),
             ("qwen3-reranker-tiny", "F32"), ("qwen3-reranker-tiny", "F16")]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerankers")
    made: dict = {}

    def get(preset: str, weight_type: str):
        if (preset, weight_type) not in made:
            made[preset, weight_type] = synth_gguf(root / f"{preset}-{weight_type}.gguf", preset, weight_type)
        return made[preset, weight_type]
    return get


class Peer:
    """llama.cpp with pooling type rank through llama-cpp-python's low-level API (its
    ``Llama.embed`` reads ``n_embd`` values per sequence, where a reranker has ``n_cls_out``)."""

    def __init__(self, path, pooling=None):
        pooling = llama_cpp.LLAMA_POOLING_TYPE_RANK if pooling is None else pooling
        self.model = llama_cpp.Llama(str(path), embedding=True, pooling_type=pooling, verbose=False,
                                     n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=2)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model.model)

    def pair(self, query: str, document: str) -> list[int]:
        """llama-server's ``format_prompt_rerank``, from llama.cpp's vocabulary flags and template."""
        m, v = self.model, self.vocab
        template = llama_cpp.llama_model_chat_template(m.model, b"rerank")
        if template is not None:
            prompt = template.decode().replace("{query}", query).replace("{document}", document)
            return m.tokenize(prompt.encode(), add_bos=False, special=True)
        eos = llama_cpp.llama_vocab_eos(v)
        eos = llama_cpp.llama_vocab_sep(v) if eos == llama_cpp.LLAMA_TOKEN_NULL else eos
        ids = [llama_cpp.llama_vocab_bos(v)] if llama_cpp.llama_vocab_get_add_bos(v) else []
        ids += m.tokenize(query.encode(), add_bos=False, special=False)
        ids += [eos] if llama_cpp.llama_vocab_get_add_eos(v) else []
        ids += [llama_cpp.llama_vocab_sep(v)] if llama_cpp.llama_vocab_get_add_sep(v) else []
        ids += m.tokenize(document.encode(), add_bos=False, special=False)
        ids += [eos] if llama_cpp.llama_vocab_get_add_eos(v) else []
        return ids

    def outputs(self, ids: list[int], width: int) -> list[float]:
        """The first ``width`` values llama.cpp pools for one sequence."""
        m = self.model
        m._ctx.kv_cache_clear()
        m._batch.reset()
        m._batch.add_sequence(ids, 0, True)
        m._ctx.decode(m._batch)
        return llama_cpp.llama_get_embeddings_seq(m._ctx.ctx, 0)[:width]


@pytest.mark.parametrize("preset,weight_type", RERANKERS)
def test_rerank_scores_match_llama_cpp(model_file, preset, weight_type):
    path = model_file(preset, weight_type)
    llm, peer = LLM(path), Peer(path)
    ids = pair_ids(llm, QUERY, DOCUMENTS)
    assert ids == [peer.pair(QUERY, d) for d in DOCUMENTS]
    num_out = llama_cpp.llama_model_n_cls_out(peer.model.model)
    assert num_out == len(llm.spec.metadata["rank"]["labels"])
    ours = head_outputs(llm, ids)
    theirs = np.array([peer.outputs(i, num_out) for i in ids])
    assert ours.shape == theirs.shape == (len(DOCUMENTS), num_out)
    assert np.abs(ours - theirs).max() <= MAX_SCORE_DIFF, np.abs(ours - theirs).max()
    results = llm.rerank(QUERY, DOCUMENTS)
    assert [r.index for r in results] == list(np.argsort(-theirs[:, 0], kind="stable"))
    # a second call of a decoder may batch the pairs otherwise and reuse the query's cached
    # prefix pages: equal to float32 rounding, not bit for bit
    np.testing.assert_allclose([r.relevance_score for r in results], ours[[r.index for r in results], 0],
                               rtol=1e-5, atol=1e-6)
    if preset.startswith("qwen3"):  # softmax over yes / no: P("yes")
        np.testing.assert_allclose(ours.sum(axis=1), 1.0, rtol=1e-6)


def test_real_shape_cross_encoder_loads_in_llama_cpp_and_agrees(tmp_path):
    """ms-marco-MiniLM-L-6-v2's shape: 6 layers, 384 wide, 30,522 WordPiece tokens, one label."""
    path = synth_gguf(tmp_path / "ms-marco.gguf", "ms-marco-minilm-l6", "F16")
    peer = Peer(path)
    model = peer.model
    assert (model.n_embd(), model.n_vocab(), model.pooling_type()) == (384, 30522, 4)
    assert llama_cpp.llama_model_n_cls_out(model.model) == 1
    llm = LLM(path)
    ids = pair_ids(llm, QUERY, DOCUMENTS)
    theirs = np.array([peer.outputs(i, 1) for i in ids])
    assert np.abs(head_outputs(llm, ids) - theirs).max() <= MAX_SCORE_DIFF


@pytest.mark.parametrize("weight_type", ["F32", "F16"])
def test_qwen3_embedding_last_pooling_matches_llama_cpp(model_file, weight_type):
    path = model_file("qwen3-embedding-tiny", weight_type)
    llm = LLM(path)
    assert llm.spec.metadata["pooling"] == "last"
    texts = [d for d in DOCUMENTS if d] + ["search my notes and answer from my files " * 6]
    ours = llm.embed(texts)
    peer = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_ctx=1024, n_batch=1024, n_ubatch=1024,
                           n_threads=2)
    assert peer.pooling_type() == 3
    assert [llm.tokenize(t) for t in texts] == [peer.tokenize(t.encode()) for t in texts]
    theirs = np.array(peer.embed(texts, normalize=True))
    cos = np.sum(ours * theirs, axis=1) / np.linalg.norm(theirs, axis=1)
    assert ours.shape == (len(texts), 256) and cos.min() >= 0.9999, cos
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    raw = llm.embed(texts, normalize=False)  # the last token's state as it is
    raw_theirs = np.array(peer.embed(texts, normalize=False))
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), np.linalg.norm(raw_theirs, axis=1), rtol=1e-3)
    np.testing.assert_allclose(llm.embed(texts[1]), ours[1], atol=1e-5)
