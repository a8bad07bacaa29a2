"""XLM-RoBERTa encoders (bge-m3, multilingual-e5: llama.cpp's ``bert`` graph over a t5 vocabulary)
against llama.cpp on the same files.

``dualpath synth --preset xlmr-tiny`` writes bge-m3's tiny twin (dim 128, 2 layers, 4 heads,
one token type, LayerNorm epsilon 1e-5) with a trained SentencePiece Unigram vocabulary in
XLM-R's layout. Both engines tokenize (``<s> text </s>``) and embed the same multilingual texts
in one batch and L2-normalise; every text's two vectors must have cosine >= 0.9999, as the BERT
files of test_encoder_parity.py. The real shapes load in llama.cpp with their vocabulary sizes,
widths and pooling types.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualpath import LLM
from dualpath.models.synth import synth_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")
pytest.importorskip("sentencepiece", reason="the t5 vocabulary of the synthetic file is trained with sentencepiece")

TEXTS = ["hello world", "The school is in the north of the city.", "Café, naïve résumé!", "中文字 日本語 한국어",
         "emoji 😀👍🏽 here", "a", "ＡＢＣ１２３  ｶﾀｶﾅ", "search my notes and answer from my files " * 6]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.parametrize("weight_type", ["F32", "F16"])
def test_xlmr_embeddings_match_llama_cpp(tmp_path, weight_type):
    path = synth_gguf(tmp_path / f"xlmr-tiny-{weight_type}.gguf", "xlmr-tiny", weight_type)
    llm = LLM(path)
    ours = llm.embed(TEXTS)
    model = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_ctx=1024, n_batch=1024, n_ubatch=1024,
                            n_threads=2)
    their_ids = [model.tokenize(t.encode("utf-8")) for t in TEXTS]
    assert [llm.tokenize(t) for t in TEXTS] == their_ids
    assert all(ids[0] == 0 and ids[-1] == 2 for ids in their_ids)  # <s> ... </s>
    assert ours.shape == (len(TEXTS), 128) and ours.dtype == np.float32
    cos = cosines(ours, np.array(model.embed(TEXTS, normalize=True)))
    assert cos.min() >= 0.9999, cos
    again = LLM(path)  # from the converted-model cache entry: the charsmap comes back from tokenizer.json
    assert again.load_stats["cache"] == "hit"
    assert [again.tokenize(t) for t in TEXTS] == their_ids
    np.testing.assert_allclose(again.embed(TEXTS), ours, atol=1e-6)


def test_multilingual_e5_small_shape_loads_in_llama_cpp_and_agrees(tmp_path):
    """multilingual-e5-small: 384 wide, 12 layers, 512 positions, 250,037 ids (XLM-R's
    250,002 padded), mean pooling; the trained vocabulary padded to the real size."""
    path = synth_gguf(tmp_path / "me5.gguf", "multilingual-e5-small", "Q8_0")
    model = llama_cpp.Llama(str(path), embedding=True, verbose=False, n_ctx=512, n_batch=512, n_ubatch=512,
                            n_threads=2)
    assert (model.n_embd(), model.n_vocab(), model.pooling_type()) == (384, 250037, 1)
    llm = LLM(path)
    assert [llm.tokenize(t) for t in TEXTS] == [model.tokenize(t.encode("utf-8")) for t in TEXTS]
    cos = cosines(llm.embed(TEXTS), np.array(model.embed(TEXTS, normalize=True)))
    assert cos.min() >= 0.999, cos
