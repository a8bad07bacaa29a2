"""The encoder's packed batches (graph/encoder.py, executor/encoder.py): texts run without
padding, cut into batches by tokens (and, where attention is ONNX Runtime's over padded
texts, by attention scores and padding); every text's vector must not depend on the batch
it ran in (each alone is the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from dualpath import LLM
from dualpath.executor.encoder import SHORT_WIDTH, EncoderRunner
from dualpath.models.synth import synth_gguf
from tests_shared import synth_bert_head_dim_20


@pytest.fixture(scope="module", params=["ours", "padded"])
def llm(request, tmp_path_factory):
    """bert-tiny (our attention over the packed texts) and a head_dim-20 twin (ONNX Runtime's
    attention over padded texts)."""
    root = tmp_path_factory.mktemp("packing")
    if request.param == "padded":
        return LLM(synth_bert_head_dim_20(root / "bert-hd20.gguf"))
    return LLM(synth_gguf(root / "bert-tiny.gguf", "bert-tiny", "F32"))


def texts_of(llm, lengths: list[int]) -> list[list[int]]:
    rng = np.random.default_rng(len(lengths))
    vocab = llm.spec.config.vocab_size
    return [[101] + rng.integers(200, vocab, n - 2).tolist() + [102] for n in lengths]


def test_batches_bound_tokens_and_keep_short_texts_apart_from_long_ones(llm):
    runner = EncoderRunner(llm.spec, 2, max_batch_tokens=200)
    lengths = [128, 100, 45, 40, 30, 20, 20, 10, 5]
    batches = runner._batches(texts_of(llm, lengths))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert sum(lengths[i] for i in b) <= 200 or len(b) == 1
    if not runner._program.padded:  # tokens are the only bound: 128 | 100 45 40 | 30 20 20 10 5
        assert [[lengths[i] for i in b] for b in batches] == [[128], [100, 45, 40], [30, 20, 20, 10, 5]]
        return
    for b in batches:
        width = lengths[b[0]]
        assert all(2 * lengths[i] >= width or width <= SHORT_WIDTH for i in b)  # little padding in attention
    # 128 | 100: more than 200 tokens together; 100 | 45: padded to over twice its length
    assert [lengths[b[0]] for b in batches] == [128, 100, 45]


def test_a_text_gives_the_same_vector_in_any_batch(llm):
    runner = EncoderRunner(llm.spec, 2, max_batch_tokens=160)  # several batches
    texts = texts_of(llm, [128, 3, 90, 17, 17, 60, 3, 45, 100, 9])
    together = runner.embed(texts, "mean")
    hidden = runner.hidden(texts)
    for ids, v, h in zip(texts, together, hidden):
        (alone,) = runner.embed([ids], "mean")
        np.testing.assert_allclose(v, alone, atol=2e-5)
        assert h.shape == (len(ids), llm.spec.config.dim)
    cls = runner.embed(texts, "cls", normalize=False)
    np.testing.assert_allclose(np.stack(cls), np.stack([h[0] for h in hidden]), atol=1e-6)
