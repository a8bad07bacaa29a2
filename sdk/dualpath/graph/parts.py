"""The graph parts of a model as files in its converted-model cache entry.

``graph_parts`` returns them from the entry, building them (``builder.py``, which
imports onnx) only when the entry has no graphs for that accuracy level and context
yet. Reading them back imports nothing heavy: a cached load never imports onnx
(a noticeable share of start-up on its own, most of it ml_dtypes), so an install without onnx (Termux,
an Android app) loads any model whose entry already has the graphs, e.g. an entry made on a
desktop with the phone's configuration and copied over (android/README.md). Building graphs
without onnx raises ``ModelLoadError`` naming the package and the command.

Folder ``graphs-v{GRAPH_VERSION}-o{OPSET}[-dq8]-a{accuracy}-c{context}`` of the entry
(``-dq8``: 8-bit matrices as f32 tables, for ONNX Runtime before 1.22)::

    parts.json          per part: inputs, outputs, initializer names, prepack; the tables
    rope.bin            RoPE cos/sin tables of every position (f32), shared by the parts;
                        in a -dq8 folder also the 8-bit matrices dequantized (f32, (in, out))
    part{i}.onnx        the graph; its external initializers point into
    weights.placeholder a sparse file (no disk, never read): the runtime hands ONNX
                        Runtime the entry's mapped arrays under the same names
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelLoadError
from ..models.spec import ModelSpec
from ..models.store import CorruptEntry, write_arrays, write_json
from . import OPSET

log = logging.getLogger(__name__)

TABLES = "rope.bin"
"""Graph-folder file of the initializers that are not model weights (RoPE cos/sin tables)."""
FUSED_VERSION = 1
"""Bump when builder.fusion_groups or fuse change: older fused folders are then never read."""
GRAPH_VERSION = 6
"""Bump when the graphs change (builder.py): an entry's older graph folders are then never
read (``dualpath cache prune`` removes entries, not folders; ``rm`` frees them).
2: MatMul over (in, out) float weights, outputs written by their producers, fused RoPE.
3: positions (1, T), q and k (1, T, ...); fused q | k | v and gate | up.
4: opset 21 (SimplifiedLayerNormalization for RMSNorm): ONNX Runtime 1.20 loads it.
5: no classifier in the last part when our kernels run it (ModelSpec.classifier_in_kernels).
6: parts cut at the products our kernels compute (segments.py), part{i}.{j}.onnx.
The folder name carries the opset too, so a cache shared by two environments never hands
a graph to a runtime that cannot load it."""


@dataclass(frozen=True)
class KernelStep:
    """Products in our kernels (``segments.split``): ``input`` (rows, K) times each of
    ``weights`` (the spec's, ``kernel_form``) into ``outputs``, one per weight."""

    input: str
    outputs: tuple[str, ...]
    weights: tuple[str, ...]


@dataclass
class PartFile:
    """One graph on disk that ONNX Runtime runs, and the arrays its initializers name: a
    whole part, or a segment of one between our products (``segments.py``). The list
    ``graph_parts`` returns is in the order they run."""

    index: int
    """The part it belongs to: attention of layer ``index`` follows the part's last graph."""
    path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: dict[str, np.ndarray]
    """Initializer name (``blk.0.attn_q.weight``, ``.scales`` ...) -> the spec's array."""
    prepack: bool
    """The part has MatMulNBits: ONNX Runtime packs its own copy of those weights."""
    before: tuple[KernelStep, ...] = ()
    """Our products that run before this graph (after the previous one)."""
    last: bool = True
    """The last graph of its part."""
    matmuls: bool = True
    """It multiplies weight matrices (MatMulNBits, MatMul, Gemm): worth ONNX Runtime's threads."""
    shapes: dict = field(default_factory=dict)
    """Tensors between its steps and our products -> (rows symbol "T" or "R", width)."""
    after: tuple[KernelStep, ...] = ()
    """Our products after this graph, the last of its part (a q, k or v they make)."""


def graph_folder_name(accuracy_level: int, context_tokens: int, nbits8: bool = True) -> str:
    """The entry's folder of the graphs for that accuracy level and context (see the module
    docstring): named by everything that changes them."""
    return f"graphs-v{GRAPH_VERSION}-o{OPSET}{'' if nbits8 else '-dq8'}-a{accuracy_level}-c{context_tokens}"


def graph_parts(spec: ModelSpec, accuracy_level: int, context_tokens: int, nbits8: bool = True) -> list[PartFile]:
    """The ``num_layers + 1`` graph parts of ``spec`` (which must have a cache entry).
    ``nbits8``: the runtime's MatMulNBits takes 8-bit weights (ONNX Runtime 1.22 and newer);
    the folder name says which graphs it holds, so a cache shared by two environments
    never hands one of them graphs it cannot load."""
    name = graph_folder_name(accuracy_level, context_tokens, nbits8)
    _remove_stale(spec.entry.folder)
    fused_arrays(spec)  # made before the graphs, which name its arrays
    for _ in range(2):
        folder = spec.entry.derived(name, lambda tmp: _write_parts(spec, accuracy_level, context_tokens, tmp,
                                                                   nbits8))
        parts = _read_parts(folder, spec)
        if parts is not None:
            return parts
        shutil.rmtree(folder, ignore_errors=True)  # unreadable (logged): build it again, once
    raise RuntimeError(f"the graphs in {folder} cannot be read back after writing them")


def fused_arrays(spec: ModelSpec) -> dict[str, np.ndarray]:
    """The entry's fused matrices (``builder.fusion_groups``), ``name.suffix`` -> a
    mapped array of its folder ``fused-v{FUSED_VERSION}``: made once per entry, shared
    by every graph folder (accuracy level, context) and session set. Fusion only
    concatenates the parts' arrays, so it needs no onnx."""
    entry = spec.entry
    name = f"fused-v{FUSED_VERSION}"
    arrays = entry.derived_arrays.get(name)
    if arrays is None:
        folder = entry.derived(name, lambda tmp: _write_fused(spec, tmp))
        try:
            with open(os.path.join(folder, "fused.json"), encoding="utf-8") as f:
                index = json.load(f)
            arrays = entry.map_arrays(os.path.join(folder, "fused.bin"), index) if index else {}
        except (OSError, ValueError, CorruptEntry) as e:
            shutil.rmtree(folder, ignore_errors=True)  # made again by the next load
            raise ModelLoadError(spec.path, f"its fused matrices in {folder} cannot be read ({e}); "
                                            "they are made again on the next load") from e
        entry.derived_arrays[name] = arrays
    return arrays


def _write_fused(spec: ModelSpec, folder: str) -> None:
    from .fusion import fuse, fusion_groups

    arrays = {}
    for name, ws in fusion_groups(spec).items():
        parts = [a for w in ws for a in w.arrays().values()]
        spec.entry.verify(parts)
        for suffix, arr in fuse(ws).items():
            arrays[f"{name}.{suffix}"] = arr
        spec.entry.drop_pages(parts)  # no session reads them: the graphs name the fused copy
    index = write_arrays(os.path.join(folder, "fused.bin"), arrays)
    write_json(os.path.join(folder, "fused.json"), index)


def _fused_weights(spec: ModelSpec) -> dict:
    from .fusion import fused_weight, fusion_groups

    arrays = fused_arrays(spec)
    return {name: fused_weight(name, ws, arrays) for name, ws in fusion_groups(spec).items()
            if any(k.startswith(name + ".") for k in arrays)}


def _remove_stale(entry_folder: str) -> None:
    """Remove the graph, fused and encoder folders of older versions (no current code reads them)."""
    try:
        names = os.listdir(entry_folder)
    except OSError:
        return
    for n in names:
        if (n.startswith("graphs-") and not n.startswith(f"graphs-v{GRAPH_VERSION}-")) or \
                (n.startswith("fused-") and n != f"fused-v{FUSED_VERSION}") or \
                (n.startswith("encoder-") and not n.startswith(f"encoder-v{ENCODER_VERSION}-")):
            shutil.rmtree(os.path.join(entry_folder, n), ignore_errors=True)


def _write_parts(spec: ModelSpec, accuracy_level: int, context_tokens: int, folder: str,
                 nbits8: bool = True) -> None:
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

    built = build_parts(spec, accuracy_level, context_tokens, _fused_weights(spec), nbits8)
    with open(os.path.join(folder, PLACEHOLDER), "wb") as f:
        f.truncate(max((p.placeholder_bytes for p in built), default=0))  # sparse: never read
    tables, offset = {}, 0
    with open(os.path.join(folder, TABLES), "wb") as f:
        for p in built:
            for name, arr in p.tables.items():
                if name not in tables:
                    tables[name] = {"offset": offset, "shape": list(arr.shape)}
                    f.write(np.ascontiguousarray(arr, np.float32).data)
                    offset += arr.nbytes
    from .segments import Products, split

    listing: list[dict] = []
    for p in built:
        program = split(p)
        steps = program.steps
        graphs = [g for g in steps if not isinstance(g, Products)]
        if not graphs:
            raise RuntimeError(f"part {p.index} has no graph left between our products")
        before: list = []
        for step in steps:
            if isinstance(step, Products):
                before.append({"input": step.input, "outputs": list(step.outputs), "weights": list(step.weights)})
                continue
            name = f"part{p.index}.onnx" if len(graphs) == 1 else f"part{p.index}.{len(listing)}.onnx"
            onnx.save(step.model, os.path.join(folder, name))
            listing.append({"index": p.index, "file": name, "inputs": list(step.inputs),
                            "outputs": list(step.outputs), "weights": list(step.weights),
                            "tables": list(step.tables), "derived": list(step.derived), "prepack": step.prepack,
                            "before": before, "after": [], "last": step is graphs[-1],
                            "matmuls": any(n.op_type in ("MatMulNBits", "MatMul", "Gemm")
                                           for n in step.model.graph.node),
                            "shapes": {k: list(v) for k, v in program.shapes.items()}})
            before = []
        listing[-1]["after"] = before  # products after the part's last graph (its q, k or v)
    write_json(os.path.join(folder, "parts.json"), {"num_layers": spec.config.num_layers, "parts": listing,
                                                    "tables": tables})


def _map_tables(path: str, index: dict) -> dict[str, np.ndarray]:
    """The graph folder's tables (name -> read-only f32 view of ``rope.bin``)."""
    if not index:
        return {}
    data = np.memmap(path, np.float32, "r")
    out = {}
    for name, t in index.items():
        count = int(np.prod(t["shape"]))
        if t["offset"] % 4 or t["offset"] // 4 + count > len(data):
            raise ValueError(f"{name} lies past the end of {TABLES}")
        out[name] = np.asarray(data[t["offset"] // 4:t["offset"] // 4 + count]).reshape(t["shape"])
    return out


def _graph_file(spec: ModelSpec, folder: str, listed: dict) -> tuple[str, dict[str, np.ndarray]]:
    """A listed graph's path in ``folder`` (ValueError when missing) and the spec's arrays its
    ``weights`` initializers name (``blk.0.attn_q.weight`` -> that weight's ``weight`` array)."""
    path = os.path.join(folder, listed["file"])
    if not os.path.isfile(path):
        raise ValueError(f"{listed['file']} is missing")
    weights = {}
    for name in listed["weights"]:
        key, _, kind = name.rpartition(".")
        weights[name] = spec.weights[key].arrays()[kind]
    return path, weights


def _read_parts(folder: str, spec: ModelSpec) -> list[PartFile] | None:
    """The parts in ``folder``, or None (logged) when anything is missing or unreadable."""
    try:
        with open(os.path.join(folder, "parts.json"), encoding="utf-8") as f:
            doc = json.load(f)
        listing = doc["parts"]
        tables = _map_tables(os.path.join(folder, TABLES), doc["tables"])
        parts = []
        for p in listing:
            path, weights = _graph_file(spec, folder, p)
            for name in p["tables"]:
                weights[name] = tables[name]
            if p["derived"]:
                fused = fused_arrays(spec)
                for name in p["derived"]:
                    weights[name] = fused[name]
            before, after = (tuple(KernelStep(k["input"], tuple(k["outputs"]), tuple(k["weights"])) for k in p[key])
                             for key in ("before", "after"))
            for k in before + after:
                if not all(w in spec.weights and spec.weights[w].kernel_form for w in k.weights):
                    raise ValueError(f"{p['file']}: our products name weights {k.weights} the entry does not "
                                     "hold in their form")
            parts.append(PartFile(p["index"], path, tuple(p["inputs"]), tuple(p["outputs"]), weights,
                                  bool(p["prepack"]), before, bool(p["last"]), bool(p["matmuls"]),
                                  {k: (v[0], int(v[1])) for k, v in p["shapes"].items()}, after))
        if sum(p.last for p in parts) != spec.config.num_layers + 1:
            raise ValueError(f"{sum(p.last for p in parts)} parts for {spec.config.num_layers} layers")
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("discarding cached graphs %s (%s); building them again", folder, e)
        return None
    return parts


ENCODER_VERSION = 6
"""Bump when graph/encoder.py changes the graph: older encoder folders are then never read
(``dualpath cache prune`` removes entries, not folders).
2: separate q, k, v biases added to a fused ``attn_qkv``.
3: packed texts (no padding but in attention), fused MultiHeadAttention, SkipLayerNormalization, FastGelu.
4: cut at the products in our kernels (``encoder.json`` lists the steps); Adds and
LayerNormalization instead of SkipLayerNormalization.
5: attention in our kernels over the packed texts where head_dim is a multiple of 16.
6: ... and of 8 (SigLIP's 72)."""


@dataclass(frozen=True)
class AttentionStep:
    """An encoder's attention in our kernels (``segments.Attention``): q, k, v (``inputs``)
    into the heads' values (``outputs``, one tensor), every text of the batch on its own."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    num_heads: int
    scale: float


@dataclass
class EncoderGraph:
    """An encoder in its cache entry: ONNX Runtime's graphs (``PartFile``), our products
    (``KernelStep``) and our attention (``AttentionStep``) in the order they run, and the
    tensors crossing between them -> (rows symbol, width). One graph and nothing else where
    nothing runs in our kernels."""

    steps: list
    shapes: dict[str, tuple[str, int]]

    @property
    def parts(self) -> list[PartFile]:
        return [s for s in self.steps if isinstance(s, PartFile)]


def encoder_graph(spec: ModelSpec, accuracy_level: int) -> EncoderGraph:
    """The graph of an encoder (graph/encoder.py) in ``spec``'s cache entry, folder
    ``encoder-v{ENCODER_VERSION}-o{OPSET}-a{accuracy}``: built (which imports onnx) when absent."""
    name = f"encoder-v{ENCODER_VERSION}-o{OPSET}-a{accuracy_level}"
    _remove_stale(spec.entry.folder)
    for _ in range(2):
        folder = spec.entry.derived(name, lambda tmp: _write_encoder(spec, accuracy_level, tmp))
        try:
            with open(os.path.join(folder, "encoder.json"), encoding="utf-8") as f:
                doc = json.load(f)
            return EncoderGraph([_encoder_step(spec, folder, s) for s in doc["steps"]],
                                {k: (v[0], int(v[1])) for k, v in doc["shapes"].items()})
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("discarding cached encoder graph %s (%s); building it again", folder, e)
            shutil.rmtree(folder, ignore_errors=True)
    raise RuntimeError(f"the encoder graph in {folder} cannot be read back after writing it")


def _encoder_step(spec: ModelSpec, folder: str, step: dict) -> PartFile | KernelStep | AttentionStep:
    """One step of ``encoder.json``, checked against the entry."""
    if "attention" in step:
        a = step["attention"]
        if len(a["inputs"]) != 3 or len(a["outputs"]) != 1 or int(a["num_heads"]) != spec.config.num_heads:
            raise ValueError(f"attention step {a} is not q, k, v of the model's {spec.config.num_heads} heads")
        return AttentionStep(tuple(a["inputs"]), tuple(a["outputs"]), int(a["num_heads"]), float(a["scale"]))
    if "products" in step:
        k = step["products"]
        if not all(w in spec.weights and spec.weights[w].kernel_form for w in k["weights"]):
            raise ValueError(f"our products name weights {k['weights']} the entry does not hold in their form")
        return KernelStep(k["input"], tuple(k["outputs"]), tuple(k["weights"]))
    path, weights = _graph_file(spec, folder, step)
    return PartFile(0, path, tuple(step["inputs"]), tuple(step["outputs"]), weights, bool(step["prepack"]),
                    matmuls=bool(step["matmuls"]))


PARALLEL_OPS = ("MatMulNBits", "MatMul", "Gemm", "MultiHeadAttention")
"""Ops of a graph worth ONNX Runtime's threads (``PartFile.matmuls``): products, and an
encoder's attention."""


def _write_encoder(spec: ModelSpec, accuracy_level: int, folder: str) -> None:
    try:
        import onnx
    except ImportError as e:
        raise ModelLoadError(spec.path, "its ONNX graph is not in the converted-model cache entry yet, and "
                                        "building it needs the onnx package: pip install 'dualpath[convert]'") from e
    from .builder import PLACEHOLDER
    from .encoder import build_encoder
    from .segments import Attention, Products, split
    from .vision import build_vision

    part = (build_vision if spec.config.arch == "clip" else build_encoder)(spec, accuracy_level)
    if part.tables or part.derived:
        raise RuntimeError("an encoder graph names no tables or derived arrays")
    with open(os.path.join(folder, PLACEHOLDER), "wb") as f:
        f.truncate(part.placeholder_bytes)  # sparse: never read
    program = split(part)
    steps: list[dict] = []
    for step in program.steps:
        if isinstance(step, Attention):
            steps.append({"attention": {"inputs": list(step.inputs), "outputs": list(step.outputs),
                                        "num_heads": step.num_heads, "scale": step.scale}})
            continue
        if isinstance(step, Products):
            steps.append({"products": {"input": step.input, "outputs": list(step.outputs),
                                       "weights": list(step.weights)}})
            continue
        file = f"encoder.{len(steps)}.onnx"
        onnx.save(step.model, os.path.join(folder, file))
        steps.append({"file": file, "inputs": list(step.inputs), "outputs": list(step.outputs),
                      "weights": list(step.weights), "prepack": step.prepack,
                      "matmuls": any(n.op_type in PARALLEL_OPS for n in step.model.graph.node)})
    write_json(os.path.join(folder, "encoder.json"), {"steps": steps,
                                                       "shapes": {k: list(v) for k, v in program.shapes.items()}})
