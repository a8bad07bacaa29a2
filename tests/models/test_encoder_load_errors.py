"""Encoder files that lie or lack something fail to load with a ModelLoadError naming it.

Each case copies a synthetic BERT (or nomic-bert) file with one key changed or removed, or
one tensor left out, and checks the message names the key or tensor and what was expected.
"""

from __future__ import annotations

import gguf
import pytest

from dualpath.errors import ModelLoadError
from dualpath.models.gguf import load_gguf
from dualpath.models.synth import synth_gguf
from tests_shared import copy_gguf

U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoder-errors")
    return {p: synth_gguf(root / f"{p}.gguf", p, "F32") for p in ("bert-tiny", "nomic-bert-tiny")}


CASES = {
    "missing position table": ("bert-tiny", {}, {"position_embd.weight"},
                               r"missing tensor 'position_embd' \(expected shape \(128, 128\)\)"),
    "missing layer norm bias": ("bert-tiny", {}, {"blk.1.attn_output_norm.bias"},
                                r"missing tensor 'blk.1.attn_output_norm.bias'"),
    "missing gate (nomic-bert)": ("nomic-bert-tiny", {}, {"blk.0.ffn_gate.weight"},
                                  r"missing tensor 'blk.0.ffn_gate'"),
    "more layers than tensors": ("bert-tiny", {"bert.block_count": (3, U32)}, set(), r"missing tensor 'blk.2\."),
    "wrong width": ("bert-tiny", {"bert.embedding_length": (256, U32)}, set(),
                    r"tensor 'token_embd' has shape \(1024, 128\), expected \(1024, 256\)"),
    "wrong context": ("bert-tiny", {"bert.context_length": (512, U32)}, set(),
                      r"tensor 'position_embd' has shape \(128, 128\), expected \(512, 128\)"),
    "wrong MLP width": ("bert-tiny", {"bert.feed_forward_length": (384, U32)}, set(),
                        r"tensor 'blk.0.ffn_up' has shape \(512, 128\), expected \(384, 128\)"),
    "no token type count": ("bert-tiny", {}, {"tokenizer.ggml.token_type_count"},
                            r"needs tokenizer.ggml.token_type_count"),
    "no layer norm epsilon": ("bert-tiny", {}, {"bert.attention.layer_norm_epsilon"},
                              r"missing metadata key 'bert.attention.layer_norm_epsilon'"),
    "unknown pooling": ("bert-tiny", {"bert.pooling_type": (9, U32)}, set(),
                        r"bert.pooling_type=9 is not a pooling type"),
    "separator outside the vocabulary": ("bert-tiny", {"tokenizer.ggml.seperator_token_id": (5000, U32)}, set(),
                                         r"'tokenizer.ggml.seperator_token_id'=5000 is not a token id"),
    "heads do not divide the width": ("bert-tiny", {"bert.attention.head_count": (3, U32)}, set(),
                                      r"embedding_length=128 is not a multiple of bert.attention.head_count=3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_encoder_file_names_the_problem(synth_file, tmp_path, case):
    preset, fields, drop, message = CASES[case]
    path = copy_gguf(synth_file[preset], tmp_path / "bad.gguf", fields, frozenset(drop))
    with pytest.raises(ModelLoadError, match=message) as e:
        load_gguf(path)
    assert str(path) in str(e.value)


def test_synth_encoders_load_with_their_families(synth_file):
    bert, nomic = (load_gguf(synth_file[p]) for p in ("bert-tiny", "nomic-bert-tiny"))
    assert not bert.config.causal and bert.config.learned_positions and not bert.config.ffn_gated
    assert bert.config.norm_type == "layer" and bert.config.rms_eps == pytest.approx(1e-12)
    assert not nomic.config.learned_positions and nomic.config.ffn_gated and nomic.config.fused_qkv
    assert bert.metadata["pooling"] == nomic.metadata["pooling"] == "mean"
    # an encoder's matrices stay in ONNX Runtime's layout (one graph runs them all)
    assert not any(w.kernel_form for w in bert.weights.values())
