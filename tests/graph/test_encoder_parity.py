"""Encoders (BERT, nomic-bert) against llama.cpp on the same files: embeddings, pooling types.

``dualpath synth`` writes each family's tiny twin (dim 128, 2 layers, 4 heads, 128
positions) in F32, F16 and Q8_0, and llama.cpp's own quantizer makes Q4_K_M of BERT
from the F32 file (its mix for rows of 128: Q5_0 / Q8_0 fallbacks beside Q4_K and Q6_K).
Both engines embed the same texts (one batch: texts of different lengths, so padding and
the mask are exercised) and L2-normalise; every text's two vectors must have cosine
>= MIN_COSINE[type]. F32 and F16 files compute with the same weights on both sides
(measured >= 0.99999994). For quantized files both engines quantize activations to int8
in blocks of 32 (llama.cpp's dot products; our kernels' products, graph/encoder.py):
measured >= 0.99996 (Q8_0) and >= 0.99994 (Q4_K_M) at 2 layers.

Pooling: copies of the BERT file with ``bert.pooling_type`` 0 (none), 2 (cls), 3 (last)
must give llama.cpp's vectors too (none: one per token).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from dualpath import LLM
from dualpath.errors import ModelTaskError, PromptTooLongError
from dualpath.models.synth import synth_gguf
from tests_shared import copy_gguf, synth_bert_head_dim_20

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")

TEXTS = ["hello world", "The school is in the north of the city.", "Café, naïve résumé!", "中文字 日本語",
         "emoji 😀 here", "a", "search my notes and answer from my files " * 6]
CASES = [("bert-tiny", "F32"), ("bert-tiny", "F16"), ("bert-tiny", "Q8_0"), ("bert-tiny", "Q4_K_M"),
         ("nomic-bert-tiny", "F32"), ("nomic-bert-tiny", "F16"), ("nomic-bert-tiny", "Q8_0")]
MIN_COSINE = {"F32": 0.9999, "F16": 0.9999, "Q8_0": 0.999, "Q4_K_M": 0.999}
POOLING_TYPES = {"none": 0, "cls": 2, "last": 3}


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    made: dict = {}

    def get(preset: str, weight_type: str):
        key = (preset, weight_type)
        if key not in made:
            made[key] = synth_gguf(root / f"{preset}-{weight_type}.gguf", preset, weight_type)
        return made[key]
    return get


def llama_cpp_embed(path, texts, normalize=True):
    model = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_ctx=1024, n_batch=1024, n_ubatch=1024,
                            n_threads=2)
    return model.embed(texts, normalize=normalize), [model.tokenize(t.encode("utf-8")) for t in texts]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.parametrize("preset,weight_type", CASES)
def test_encoder_embeddings_match_llama_cpp(encoder_file, preset, weight_type):
    path = encoder_file(preset, weight_type)
    llm = LLM(path)
    ours = llm.embed(TEXTS)
    theirs, their_ids = llama_cpp_embed(path, TEXTS)
    assert [llm.tokenize(t) for t in TEXTS] == their_ids
    assert ours.shape == (len(TEXTS), 128) and ours.dtype == np.float32
    cos = cosines(ours, np.array(theirs))
    assert cos.min() >= MIN_COSINE[weight_type], cos
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    # one text alone gives the same vector as inside the padded batch
    np.testing.assert_allclose(llm.embed(TEXTS[1]), ours[1], atol=2e-5)
    again = LLM(path)  # from the converted-model cache entry, graph included
    assert again.load_stats["cache"] == "hit"
    np.testing.assert_allclose(again.embed(TEXTS), ours, atol=1e-6)


def test_a_head_dim_our_attention_does_not_take_runs_onnx_runtimes(tmp_path):
    """head_dim 20: attention is ONNX Runtime's over padded texts, and agrees with llama.cpp."""
    from dualpath.graph.parts import AttentionStep, encoder_graph

    path = synth_bert_head_dim_20(tmp_path / "bert-hd20.gguf")
    llm = LLM(path)
    graph = encoder_graph(llm.spec, 4)
    assert not any(isinstance(s, AttentionStep) for s in graph.steps) and "pad" in graph.parts[0].inputs
    ours = llm.embed(TEXTS)
    theirs, _ = llama_cpp_embed(path, TEXTS)
    assert cosines(ours, np.array(theirs)).min() >= MIN_COSINE["F32"]
    np.testing.assert_allclose(llm.embed(TEXTS[1]), ours[1], atol=2e-5)


@pytest.mark.parametrize("pooling", list(POOLING_TYPES))
def test_pooling_type_of_the_file_is_llama_cpps(encoder_file, tmp_path, pooling):
    path = copy_gguf(encoder_file("bert-tiny", "F32"), tmp_path / f"{pooling}.gguf",
                     {"bert.pooling_type": (POOLING_TYPES[pooling], gguf.GGUFValueType.UINT32)})
    llm = LLM(path)
    assert llm.encoder.pooling == pooling
    ours = llm.embed(TEXTS)
    if pooling == "none":  # a (tokens, dim) matrix per text
        assert [o.shape for o in ours] == [(len(llm.tokenize(t)), 128) for t in TEXTS]
        # one text per call: llama-cpp-python 0.3.36 reads the per-token rows of a later
        # text of a batch from the wrong offset (it advances by tokens, not tokens * dim)
        for o, text in zip(ours, TEXTS):
            theirs, _ = llama_cpp_embed(path, [text])
            assert cosines(o, np.array(theirs[0])).min() >= 0.9999
    else:
        theirs, _ = llama_cpp_embed(path, TEXTS)
        assert cosines(ours, np.array(theirs)).min() >= 0.9999


def test_unnormalised_mean_is_llama_cpps_raw_vector(encoder_file):
    path = encoder_file("bert-tiny", "F32")
    ours = LLM(path).embed(TEXTS, normalize=False)
    theirs = np.array(llama_cpp_embed(path, TEXTS, normalize=False)[0])
    # the same direction and length: llama.cpp's GELU reads a table at fp16 inputs, so single
    # entries differ by up to a few 1e-4
    assert cosines(ours, theirs).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), np.linalg.norm(theirs, axis=1), rtol=1e-4)


def test_encoder_refuses_generation_and_long_texts(encoder_file):
    llm = LLM(encoder_file("bert-tiny", "F32"))
    with pytest.raises(ModelTaskError, match="embedding model .*cannot generate"):
        llm.generate("hello")
    with pytest.raises(ModelTaskError, match="cannot generate"):
        llm.chat([{"role": "user", "content": "hi"}])
    long = "word " * 200  # 202 tokens, 128 positions
    with pytest.raises(PromptTooLongError, match="202 tokens, more than the 128 positions"):
        llm.embed(["short", long])
    assert llm.embed(long, truncate=True).shape == (128,)
    assert llm.embed([]).shape == (0, 128)


def test_a_reranker_file_is_refused_by_embed(encoder_file, tmp_path):
    path = copy_gguf(encoder_file("bert-tiny", "F32"), tmp_path / "rank.gguf",
                     {"bert.pooling_type": (4, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ModelTaskError, match="pooling type rank.* not embeddings; use LLM.rerank"):
        LLM(path).embed(["a query"])


def test_embed_on_a_decoder_without_a_pooling_type_is_mean_pooled(encoder_file):
    """As /v1/embeddings embeds with it: the mean of the final hidden states, normalised."""
    llm = LLM(synth_gguf(encoder_file("bert-tiny", "F32").replace("bert-tiny-F32", "llama3-tiny"), "llama3-tiny"))
    assert llm.spec.metadata["pooling"] == "mean"
    vectors = llm.embed(["hello", "the school"])
    assert vectors.shape == (2, 256)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("preset,weight_type,pooling", [("all-minilm-l6", "F16", 1), ("bge-small", "Q8_0", 2)])
def test_real_shape_files_load_in_llama_cpp_and_agree(tmp_path, preset, weight_type, pooling):
    """all-MiniLM-L6-v2 (6 layers) and bge-small-en-v1.5 (12 layers) shapes: 384 wide, 12 heads,
    1536 MLP, 512 positions, 30,522 WordPiece tokens; llama.cpp reads their pooling types."""
    path = synth_gguf(tmp_path / f"{preset}.gguf", preset, weight_type)
    model = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_ctx=512, n_batch=512, n_ubatch=512,
                            n_threads=2)
    assert (model.n_embd(), model.n_vocab(), model.pooling_type()) == (384, 30522, pooling)
    assert int(model.metadata["bert.context_length"]) == 512
    llm = LLM(path)
    cos = cosines(llm.embed(TEXTS), np.array(model.embed(TEXTS, normalize=True)))
    assert cos.min() >= MIN_COSINE[weight_type], cos


def test_fused_qkv_with_separate_biases_adds_them_as_llama_cpp(encoder_file, tmp_path):
    """A fused ``attn_qkv`` may come with ``attn_q/k/v.bias`` (llama.cpp's loader takes them)."""
    src = encoder_file("nomic-bert-tiny", "F32")
    rng = np.random.default_rng(3)
    biases = {f"blk.{i}.attn_{n}.bias": (0.3 * rng.standard_normal(128)).astype(np.float32)
              for i in range(2) for n in "qkv"}
    path = copy_gguf(src, tmp_path / "biased.gguf", tensors=biases)
    ours = LLM(path).embed(TEXTS)
    theirs, _ = llama_cpp_embed(path, TEXTS)
    assert cosines(ours, np.array(theirs)).min() >= 0.9999
    assert cosines(ours, LLM(src).embed(TEXTS)).min() < 0.999  # the biases moved the vectors
