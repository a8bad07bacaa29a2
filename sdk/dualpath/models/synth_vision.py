"""Synthetic projector files (``dualpath synth --vision``): random weights in the shapes of real
vision models' ``--mmproj`` GGUF, written with the keys and tensor names llama.cpp's
converter writes (``conversion/smolvlm.py``, ``conversion/gemma.py``), so that llama.cpp's
``mtmd`` loads the very file. Pair one with a text model of the width it projects to
(``VisionShape.text_preset``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from .mmproj import DEFAULT_MERGE, WEIGHT_TYPES, VisionSpec, expected_tensors

log = logging.getLogger(__name__)


def _spec(projector: str, image_size: int, patch_size: int, dim: int, ffn_dim: int, num_layers: int, num_heads: int,
          merge: int, text_dim: int, longest_edge: int = 0) -> VisionSpec:
    """A preset's hyper-parameters (SigLIP's epsilon, mean and std, the tanh GELU)."""
    return VisionSpec("", projector, image_size, patch_size, dim, ffn_dim, num_layers, num_heads, 1e-6, (0.5,) * 3,
                      (0.5,) * 3, merge, text_dim, "gelu", longest_edge, {})


def _clip(image_size: int, patch_size: int, dim: int, ffn_dim: int, num_layers: int, num_heads: int,
          text_dim: int) -> VisionSpec:
    """An ``mlp`` (LLaVA 1.5-style) preset: CLIP's epsilon, mean, std and quick GELU, a class
    token and a norm before the layers, none after; ``num_layers`` as the converter keeps them
    (CLIP's but the last)."""
    return VisionSpec("", "mlp", image_size, patch_size, dim, ffn_dim, num_layers, num_heads, 1e-5,
                      (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), 1, text_dim,
                      "gelu_quick", 0, {}, class_token=True, pre_norm=True, post_norm=False, patch_bias=False,
                      projector_dim=text_dim, ffn_swapped=True)


@dataclass(frozen=True)
class VisionShape:
    spec: VisionSpec
    text_preset: str
    """The ``dualpath synth --preset`` whose width the projector's embeddings have."""
    init_std: float = 0.02


VISION_PRESETS = {
    # SmolVLM-256M-Instruct: SigLIP-B/16 at 512 px, pixel shuffle by 4 into SmolLM2-135M's width.
    "smolvlm-256m": VisionShape(_spec("idefics3", 512, 16, 768, 3072, 12, 12, 4, 576, 2048), "smollm2-135m"),
    # Gemma 3 4B: SigLIP-So400m/14 at 896 px, pooled 4 x 4 into 256 embeddings of Gemma 3 4B's width.
    "gemma3-4b": VisionShape(_spec("gemma3", 896, 14, 1152, 4304, 27, 16, 4, 2560), "gemma3-4b"),
    # llava-phi-3-mini: CLIP-L/14 at 336 px (23 of its 24 layers), two matrices into Phi-3-mini's width.
    "llava-phi3-mini": VisionShape(_clip(336, 14, 1024, 4096, 23, 16, 3072), "phi3-mini"),
    # Tiny twins for the tests, paired with the tiny text shapes; Gemma 3's has a head_dim of 24, which
    # like the real one's (72) is in whole 8s but not 16s.
    "smolvlm-tiny": VisionShape(_spec("idefics3", 64, 16, 64, 128, 2, 4, 2, 256, 128), "llama3-tiny", 0.08),
    "gemma3-vision-tiny": VisionShape(_spec("gemma3", 64, 8, 96, 192, 2, 4, 4, 256), "gemma3-tiny", 0.08),
    "llava-tiny": VisionShape(_clip(56, 14, 64, 128, 2, 4, 256), "llama3-tiny", 0.08),
}


def synth_mmproj(path: str | os.PathLike, preset: str, weight_type: str = "F16", seed: int = 0) -> str:
    """Write the projector file of ``preset`` (``VISION_PRESETS``) with random weights in
    ``weight_type`` (matrices; norms, biases and the embeddings stay F32, as llama.cpp's
    converter keeps them); returns the path."""
    import gguf

    if preset not in VISION_PRESETS:
        raise ValueError(f"unknown vision preset {preset!r}; choose one of {', '.join(VISION_PRESETS)}")
    weight_type = weight_type.upper()
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"a projector file's weights are {', '.join(WEIGHT_TYPES)}, not {weight_type!r}")
    s = VISION_PRESETS[preset].spec
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".part"
    w = gguf.GGUFWriter(tmp, "clip")
    w.add_name(f"dualpath-synth-{preset}-mmproj-{weight_type}-seed{seed}")
    w.add_description("random weights with real shapes, written by `dualpath synth --vision`")
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[weight_type])
    # Written as plain keys: the gguf package's named helpers for them vary across its versions.
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", s.projector)
    if s.projector == "mlp":  # as LLaVA's legacy converter writes them: projection_dim is CLIP's own
        w.add_bool("clip.has_text_encoder", False)
        w.add_bool("clip.has_llava_projector", True)
    w.add_uint32("clip.vision.projection_dim", s.dim if s.projector == "mlp" else s.text_dim)
    w.add_uint32("clip.vision.image_size", s.image_size)
    w.add_uint32("clip.vision.patch_size", s.patch_size)
    w.add_uint32("clip.vision.embedding_length", s.dim)
    w.add_uint32("clip.vision.feed_forward_length", s.ffn_dim)
    w.add_uint32("clip.vision.block_count", s.num_layers)
    w.add_uint32("clip.vision.attention.head_count", s.num_heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", s.eps)
    w.add_array("clip.vision.image_mean", list(s.image_mean))
    w.add_array("clip.vision.image_std", list(s.image_std))
    w.add_bool("clip.use_gelu", s.activation == "gelu")
    if s.projector == "idefics3" or s.merge != DEFAULT_MERGE[s.projector]:  # the converter writes Gemma 3's
        w.add_uint32("clip.vision.projector.scale_factor", s.merge)         # only when not its default
    if s.projector == "idefics3":
        w.add_uint32("clip.vision.preproc_image_size", s.longest_edge or s.image_size)
    rng = np.random.default_rng(seed)
    qtype = getattr(gguf.GGMLQuantizationType, weight_type)
    for name, shape in expected_tensors(s).items():
        if name.endswith(("ln1.weight", "ln2.weight", "post_ln.weight", "pre_ln.weight", "soft_emb_norm.weight")):
            data = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        else:
            data = rng.standard_normal(shape, dtype=np.float32) * np.float32(VISION_PRESETS[preset].init_std)
        # As the converter stores them: the patch embedding (a convolution) in F16 in an F16
        # file and F32 otherwise; the positions, norms and biases in F32.
        kind = weight_type if len(shape) == 2 and "position_embd" not in name else "F32"
        if name == "v.patch_embd.weight" and (weight_type == "F16" or s.projector == "mlp"):
            kind = "F16"  # (LLaVA's converter keeps a convolution in F16 in any file)
        if name == "v.position_embd.weight" and weight_type == "F16" and s.projector == "mlp":
            kind = "F16"  # (and every 2-D weight, the positions too)
        if kind == "Q8_0" and shape[-1] % 32:  # rows that are not whole blocks: F16, as the converter falls back
            kind = "F16"
        if name == "mm.input_projection.weight":  # Gemma 3's, always F16 (llama.cpp transposes it)
            kind = "F16"
        if kind == "F32":
            w.add_tensor(name, data)
        elif kind == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    log.info("wrote %s (%s projector, %s)", path, preset, weight_type)
    return path


def vision_tokens(projector: str) -> tuple:
    """(piece, token type) of the markers llama.cpp's ``mtmd`` puts around a ``projector``
    kind's images, which a text model of the pair has as tokens (``synth_text``)."""
    from ..tokenizer.spec import TOKEN_NORMAL, TOKEN_USER_DEFINED

    if projector == "idefics3":  # Idefics3's processor: a tile's row and column, the overview's start
        marks = ["<fake_token_around_image>", "<global-img>"]
        marks += [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        return (("\n\n", TOKEN_NORMAL),) + tuple((m, TOKEN_USER_DEFINED) for m in marks)
    if projector == "mlp":  # LLaVA's rows stand alone in the prompt
        return ()
    return (("<start_of_image>", TOKEN_USER_DEFINED), ("<end_of_image>", TOKEN_USER_DEFINED))


def synth_text(path: str | os.PathLike, preset: str, weight_type: str = "F32", seed: int = 0) -> str:
    """The text model of the vision ``preset``'s pair (``VisionShape.text_preset``), its
    vocabulary ending in the projector's markers (``vision_tokens``); returns the path."""
    from .synth import synth_gguf

    shape = VISION_PRESETS[preset]
    return synth_gguf(path, shape.text_preset, weight_type, seed, extra_tokens=vision_tokens(shape.spec.projector))
