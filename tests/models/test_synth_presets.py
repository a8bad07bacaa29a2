"""The real-shape presets of ``dualpath synth`` are the published models' shapes: their
tensors add up to the parameter counts the models' own pages give (RoPE frequency
factors, a buffer in those counts, left out; an encoder's count includes BERT's pooler,
a 384 x 384 dense layer and its bias that llama.cpp's converter drops)."""

import math

import pytest

from dualpath.models.synth import PRESETS, _tensor_list
from dualpath.models.synth_encoder import encoder_tensor_list

PUBLISHED_PARAMETERS = {
    "tinyllama-1.1b": 1_100_048_384,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
}


@pytest.mark.parametrize("preset", sorted(PUBLISHED_PARAMETERS))
def test_a_preset_has_the_published_parameter_count(preset):
    tensors = _tensor_list(PRESETS[preset])
    count = sum(math.prod(shape) for name, shape, _ in tensors if not name.startswith("rope_"))
    assert count == PUBLISHED_PARAMETERS[preset]


ENCODER_PARAMETERS = {
    "all-minilm-l6": 22_713_216,  # sentence-transformers/all-MiniLM-L6-v2
    "bge-small": 33_360_000,      # BAAI/bge-small-en-v1.5
}
POOLER = 384 * 384 + 384


@pytest.mark.parametrize("preset", sorted(ENCODER_PARAMETERS))
def test_an_encoder_preset_has_the_published_parameter_count(preset):
    tensors = encoder_tensor_list(PRESETS[preset])
    assert sum(math.prod(shape) for _, shape, _ in tensors) + POOLER == ENCODER_PARAMETERS[preset]


def test_the_qwen2_5_1_5b_preset_fits_k_quant_super_blocks():
    """Q4_K_M files of it (llama.cpp's quantizer through ``dualpath synth``) need every
    matrix row to be whole 256-value super-blocks."""
    shape = PRESETS["qwen2.5-1.5b"]
    assert shape.arch == "qwen2" and shape.tied and shape.hd == 128
    assert shape.dim % 256 == 0 and shape.hidden_dim % 256 == 0


XLMR_PARAMETERS = {
    "bge-m3": (567_754_752, 2),                # BAAI/bge-m3: XLM-R large, 8194 positions in the checkpoint
    "multilingual-e5-small": (117_653_760, 0),  # intfloat/multilingual-e5-small: a BERT, 512 positions
}


@pytest.mark.parametrize("preset", sorted(XLMR_PARAMETERS))
def test_an_xlmr_preset_has_the_published_parameter_count(preset):
    """XLM-R checkpoints count the two position rows before ``pad_token_id + 1`` that
    llama.cpp's converter cuts; both count the pooler (dim x dim and a bias)."""
    shape = PRESETS[preset]
    published, cut_positions = XLMR_PARAMETERS[preset]
    tensors = encoder_tensor_list(shape)
    pooler = shape.dim * shape.dim + shape.dim
    assert sum(math.prod(s) for _, s, _ in tensors) + pooler + cut_positions * shape.dim == published
    assert shape.vocab == "t5"
