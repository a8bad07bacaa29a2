"""Model loaders: every format becomes one ``ModelSpec``."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import ModelLoadError
from .files import GGUF_MAGIC, check_model_file
from .spec import ModelConfig, ModelSpec, Weight

EMBEDDED_MODEL = "stories260K.gguf"
"""The default model shipped inside the package (MIT, Karpathy's stories260K; see
data/NOTICE): a really trained 260K-parameter story model, 1.1 MB."""

SYNTH_PREFIX = "synth:"
"""``--model synth:PRESET`` names a random-weight model of a preset's shape (F32,
seed 0), synthesized into the user's cache on first use: real speed, noise for text."""


def embedded_model_path() -> str:
    """The file of the package's built-in default model."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", EMBEDDED_MODEL)


def resolve_model(name: str | os.PathLike | None, hf_repo: str | None = None) -> tuple[str, str]:
    """The file a model argument names, and a note for the user ("" for a plain path):
    None -> the embedded default model; ``synth:PRESET`` -> its random-weight file
    (made on first use); ``hf_repo`` (``REPO[:QUANT]``, instead of ``name``) -> the GGUF
    downloaded from, or found in the cache of, the Hugging Face Hub (models/hub.py)."""
    if hf_repo:
        if name:
            raise ModelLoadError(name, f"give a model file or a Hugging Face repo ({hf_repo}), not both")
        from .hub import resolve_hf_model

        found = resolve_hf_model(hf_repo)
        return found.path, found.describe()
    if name is None or name == "":
        return embedded_model_path(), (f"no --model given; using the built-in {EMBEDDED_MODEL} (Karpathy's "
                                       "stories260K, MIT): a tiny story model. --model FILE runs yours.")
    name = os.fspath(name)
    if name.startswith(SYNTH_PREFIX):
        from .synth import PRESETS, ensure_synth_model

        preset = name[len(SYNTH_PREFIX):]
        if preset not in PRESETS:
            raise ModelLoadError(name, f"unknown synthetic preset {preset!r} (presets: {', '.join(PRESETS)})")
        path, created = ensure_synth_model(preset=preset)
        return path, (f"{name}: {path}, the {preset} shape with RANDOM weights (seed 0): its text is noise, "
                      f"its speed is real{' (synthesized just now)' if created else ''}.")
    return name, ""


def load_model(path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
               sink: Callable[[Weight, int], Weight] | None = None, projector: bool = False) -> ModelSpec:
    """Load a GGUF file or a llama2.c checkpoint (chosen by content, not by name),
    converting in memory; with ``projector``, an image projector file (models/mmproj.py).
    ``sink(weight, source_bytes)`` (the converted-model cache's
    writer) receives each weight as soon as it is converted and returns what the spec
    keeps in its place. ``ModelStore.load`` is the cached way to load."""
    from .gguf import load_gguf
    from .llama2c import load_llama2c
    from .mmproj import load_projector

    path = os.fspath(path)
    if projector:
        return load_projector(path, sink)
    if check_model_file(path) == GGUF_MAGIC:
        return load_gguf(path, sink)
    return load_llama2c(path, tokenizer_path, sink)


def read_layout(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, tuple[str, tuple[int, ...]]], int]:
    """A model file's hyper-parameters, tensor types and shapes and BPE merge count,
    from its header only (a memory plan before load): see ``gguf.read_layout``. A
    llama2.c checkpoint is all F32, its tensors named as a GGUF's would be."""
    from .gguf import read_layout as gguf_layout
    from .llama2c import read_layout as llama2c_layout

    path = os.fspath(path)
    if check_model_file(path) == GGUF_MAGIC:
        return gguf_layout(path)
    return llama2c_layout(path)


__all__ = ["EMBEDDED_MODEL", "check_model_file", "ModelConfig", "ModelSpec", "SYNTH_PREFIX", "Weight",
           "embedded_model_path", "load_model", "resolve_model"]
