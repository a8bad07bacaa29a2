"""Fused matrices: the linear layers that read one input run as one matmul.

q | k | v and gate | up of a layer read the same normed input; ONNX Runtime runs
each matmul as its own node, with its per-node cost and a thread-pool fork/join.
Their weights concatenated along the output dimension make one matmul and one
Split. The concatenated arrays live in the converted-model cache entry
(``graph/parts.py``, folder ``fused-v*``); this module only decides and
concatenates, and imports no onnx (a cached load never does).
"""

from __future__ import annotations

import numpy as np

from ..models.spec import ModelSpec, Weight


def fusion_groups(spec: ModelSpec) -> dict[str, list[Weight]]:
    """The matrices that read one input, to run as one matmul (fused name -> parts, in
    output order): q | k | v and gate | up of every layer, when they share a type and
    have no zero points or mins. One launch instead of three (or two) saves ONNX
    Runtime's per-node cost and a thread-pool fork/join each (docs/performance.md)."""
    cfg, w = spec.config, spec.weights
    groups = {}
    for i in range(cfg.num_layers):
        if not cfg.fused_qkv:
            groups[f"blk.{i}.attn_qkv"] = [w[f"blk.{i}.attn_{n}"] for n in "qkv"]
        if not cfg.fused_gate_up:
            groups[f"blk.{i}.ffn_gate_up"] = [w[f"blk.{i}.ffn_gate"], w[f"blk.{i}.ffn_up"]]
    return {name: ws for name, ws in groups.items() if _fusable(ws)}


def _fusable(ws: list[Weight]) -> bool:
    a = ws[0]
    if any(x.kernel_form for x in ws):  # our kernels take them as one product already
        return False
    if any(x.dtype != a.dtype or x.bits != a.bits or x.block_size != a.block_size or x.zero_points is not None
           or x.mins is not None or len(x.shape) != 2 or x.shape[1] != a.shape[1] for x in ws):
        return False
    if a.dtype == "f32":
        return all(x.data_t is not None for x in ws)
    return all(x.scales is not None for x in ws)


def fuse(ws: list[Weight]) -> dict[str, np.ndarray]:
    """The arrays of the fused matrix of ``ws`` (suffix -> array): outputs concatenated."""
    if ws[0].dtype == "f32":
        return {"weight_t": np.concatenate([x.data_t for x in ws], axis=1)}
    return {"weight": np.concatenate([x.data for x in ws], axis=0),
            "scales": np.concatenate([x.scales for x in ws], axis=0)}


def fused_weight(name: str, ws: list[Weight], arrays: dict[str, np.ndarray]) -> Weight:
    """The Weight of fused matrix ``name`` over its (mapped) ``arrays`` (``name.suffix``)."""
    a = ws[0]
    return Weight(name, a.dtype, (sum(x.shape[0] for x in ws), a.shape[1]),
                  arrays.get(f"{name}.weight"),  # type: ignore[arg-type]  # None: a kernel-form weight
                  arrays.get(f"{name}.scales"), bits=a.bits, block_size=a.block_size,
                  data_t=arrays.get(f"{name}.weight_t"))
