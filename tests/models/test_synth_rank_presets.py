"""The reranker and decoder-embedder presets of ``dualpath synth`` have the published models'
shapes, and the head llama.cpp's converter writes for each."""

import math

import pytest

from dualpath.models.synth import PRESETS, _tensor_list
from dualpath.models.synth_encoder import encoder_tensor_list
from dualpath.models.synth_rank import head_tensor_list

QWEN3_0_6B_VOCAB_151669 = 595_776_512
"""Qwen/Qwen3-Embedding-0.6B and Qwen3-Reranker-0.6B (tied LM head): Qwen3-0.6B's 440,467,456
non-embedding parameters and 151,669 x 1,024 embedding rows."""


@pytest.mark.parametrize("preset", ["qwen3-embedding-0.6b", "qwen3-reranker-0.6b"])
def test_qwen3_presets_have_the_published_parameter_count(preset):
    shape = PRESETS[preset]
    assert sum(math.prod(s) for _, s, _ in _tensor_list(shape)) == QWEN3_0_6B_VOCAB_151669
    head = head_tensor_list(shape)
    if preset == "qwen3-embedding-0.6b":
        assert head == [] and shape.pooling == 3
    else:  # the LM head's rows of "yes" and "no": no parameters of their own
        assert [(n, s) for n, s, _ in head] == [("cls.output.weight", (2, 1024))] and shape.pooling == 4


def test_ms_marco_preset_is_minilm_l6_with_a_one_label_projection():
    """cross-encoder/ms-marco-MiniLM-L-6-v2: 22,713,601 parameters, all-MiniLM-L6-v2's body and
    BERT's pooler (which the converter drops) plus a 1 x 384 classifier and its bias."""
    shape = PRESETS["ms-marco-minilm-l6"]
    body = sum(math.prod(s) for _, s, _ in encoder_tensor_list(shape))
    head = head_tensor_list(shape)
    assert [(n, s) for n, s, _ in head] == [("cls.output.weight", (1, 384)), ("cls.output.bias", (1,))]
    assert body + sum(math.prod(s) for _, s, _ in head) + 384 * 384 + 384 == 22_713_601
    assert (shape.pooling, shape.classifier_labels) == (4, ("LABEL_0",))


@pytest.mark.parametrize("tiny,real", [("bert-rerank-tiny", "ms-marco-minilm-l6"),
                                       ("qwen3-embedding-tiny", "qwen3-embedding-0.6b"),
                                       ("qwen3-reranker-tiny", "qwen3-reranker-0.6b")])
def test_a_tiny_twin_has_its_real_shapes_kind(tiny, real):
    a, b = PRESETS[tiny], PRESETS[real]
    assert (a.arch, a.pooling, a.classifier_labels, a.classifier_dense, a.tied) == \
        (b.arch, b.pooling, b.classifier_labels, b.classifier_dense, b.tied)
