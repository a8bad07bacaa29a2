"""Model loaders: every format becomes one ``ModelSpec``."""

from __future__ import annotations

import os

from ..errors import ModelLoadError
from .spec import ModelConfig, ModelSpec, Weight


def load_model(path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None) -> ModelSpec:
    """Load a GGUF file or a llama2.c checkpoint (chosen by content, not by name)."""
    from .gguf import load_gguf
    from .llama2c import load_llama2c

    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelLoadError(path, "is a folder; Hugging Face folders are not supported yet (pass a .gguf or llama2.c .bin)")
    if not os.path.isfile(path):
        raise ModelLoadError(path, "no such file")
    if os.path.getsize(path) == 0:
        raise ModelLoadError(path, "empty file (0 bytes), not a model")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read: {e.strerror or e}") from e
    if magic == b"GGUF":
        return load_gguf(path)
    if path.endswith(".gguf"):
        raise ModelLoadError(path, f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    return load_llama2c(path, tokenizer_path)


__all__ = ["ModelConfig", "ModelSpec", "Weight", "load_model"]
