"""The graph parts of a model as files in its converted-model cache entry.

``graph_parts`` returns them from the entry, building them (``builder.py``, which
imports onnx) only when the entry has no graphs for that accuracy level and context
yet. Reading them back imports nothing heavy: a cached load never imports onnx
(about 0.7 s of start-up on its own, most of it ml_dtypes), so an install without onnx (Termux,
an Android app) loads any model whose entry already has the graphs, e.g. an entry made on a
desktop with the phone's configuration and copied over (android/README.md). Building graphs
without onnx raises ``ModelLoadError`` naming the package and the command.

Folder ``graphs-a{accuracy}-c{context}`` of the entry::

    parts.json          per part: inputs, outputs, initializer names, prepack
    part{i}.onnx        the graph; its external initializers point into
    weights.placeholder a sparse file (no disk, never read): the runtime hands ONNX
                        Runtime the entry's mapped arrays under the same names
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass

import numpy as np

from ..errors import ModelLoadError
from ..models.spec import ModelSpec
from ..models.store import write_json

log = logging.getLogger(__name__)


@dataclass
class PartFile:
    """One graph part on disk and the arrays its initializers name."""

    index: int
    path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: dict[str, np.ndarray]
    """Initializer name (``blk.0.attn_q.weight``, ``.scales`` ...) -> the spec's array."""
    prepack: bool
    """The part has MatMulNBits: ONNX Runtime packs its own copy of those weights."""


def graph_parts(spec: ModelSpec, accuracy_level: int, context_tokens: int) -> list[PartFile]:
    """The ``num_layers + 1`` graph parts of ``spec`` (which must have a cache entry)."""
    name = f"graphs-a{accuracy_level}-c{context_tokens}"
    for _ in range(2):
        folder = spec.entry.derived(name, lambda tmp: _write_parts(spec, accuracy_level, context_tokens, tmp))
        parts = _read_parts(folder, spec)
        if parts is not None:
            return parts
        shutil.rmtree(folder, ignore_errors=True)  # unreadable (logged): build it again, once
    raise RuntimeError(f"the graphs in {folder} cannot be read back after writing them")


def _write_parts(spec: ModelSpec, accuracy_level: int, context_tokens: int, folder: str) -> None:
    try:
        import onnx
    except ImportError as e:
        missing = "" if e.name in (None, "onnx") else f" (onnx needs {e.name!r}, which is missing)"
        raise ModelLoadError(spec.path, (
            f"its ONNX graphs for accuracy level {accuracy_level} and context {context_tokens} tokens are not in "
            f"the converted-model cache entry {spec.entry.folder} yet, and building them needs the onnx package, "
            f"which cannot be imported{missing}: pip install 'onnx>=1.16' 'ml_dtypes>=0.5,<0.7' (or pip install "
            "'dualpath[convert]'). On a phone, make the entry on a desktop instead, with the phone's "
            "configuration, and copy it over (examples/android_app/model_bundle.py, android/README.md)")) from e

    from .builder import PLACEHOLDER, build_parts

    built = build_parts(spec, accuracy_level, context_tokens)
    with open(os.path.join(folder, PLACEHOLDER), "wb") as f:
        f.truncate(built[0].placeholder_bytes if built else 0)  # sparse: never read
    listing = []
    for p in built:
        onnx.save(p.model, os.path.join(folder, f"part{p.index}.onnx"))
        listing.append({"index": p.index, "inputs": list(p.inputs), "outputs": list(p.outputs),
                        "weights": list(p.weights), "prepack": p.prepack})
    write_json(os.path.join(folder, "parts.json"), {"num_layers": spec.config.num_layers, "parts": listing})


def _read_parts(folder: str, spec: ModelSpec) -> list[PartFile] | None:
    """The parts in ``folder``, or None (logged) when anything is missing or unreadable."""
    try:
        with open(os.path.join(folder, "parts.json"), encoding="utf-8") as f:
            listing = json.load(f)["parts"]
        parts = []
        for p in listing:
            path = os.path.join(folder, f"part{p['index']}.onnx")
            if not os.path.isfile(path):
                raise ValueError(f"part{p['index']}.onnx is missing")
            weights = {}
            for name in p["weights"]:
                key, _, kind = name.rpartition(".")
                weights[name] = spec.weights[key].arrays()[kind]
            parts.append(PartFile(p["index"], path, tuple(p["inputs"]), tuple(p["outputs"]), weights,
                                  bool(p["prepack"])))
        if len(parts) != spec.config.num_layers + 1:
            raise ValueError(f"{len(parts)} parts for {spec.config.num_layers} layers")
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("discarding cached graphs %s (%s); building them again", folder, e)
        return None
    return parts
