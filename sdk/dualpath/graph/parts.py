"""The graph parts of a model as files in its converted-model cache entry.

``graph_parts`` returns them from the entry, building them (``builder.py``, which
imports onnx) only when the entry has no graphs for that accuracy level and context
yet. Reading them back imports nothing heavy: a cached load never imports onnx
(about 0.7 s of start-up on its own, most of it ml_dtypes).

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
    import onnx

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
