"""A part's graph cut at the products our kernels compute (``builder.KERNEL_OP``) and at an
encoder's attention in our kernels (``builder.ATTENTION_OP``).

A layer's matrices of the types our kernels take (``Weight.kernel_form``) are multiplied
in our kernels, over the file's blocks read in place, not by ONNX Runtime's MatMulNBits
over a packed copy. The builder marks each such product with a node no runtime executes;
``split`` cuts the part there into a program: the graphs ONNX Runtime runs (the norms,
RoPE, activations and residual adds between the products) and the products, in order.

A node runs in the segment after the last product it depends on; a product runs after the
segment that makes its input. The tensors that cross from one step to the next are 2-D,
(rows, width), rows being the part's tokens (T) or, in the last part, the rows whose logits
are wanted (R): the runtime gives each a buffer of its own (``executor/runner_step.py``).
An encoder's graph is cut the same way (rows: the batch's tokens, N; executor/encoder_program.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx
from onnx import helper, shape_inference

from .builder import ATTENTION_OP, KERNEL_DOMAIN, KERNEL_OP, GraphPart


@dataclass(frozen=True)
class Products:
    """Products in our kernels: ``input`` (rows, K) times each named weight, into ``outputs``."""

    input: str
    outputs: tuple[str, ...]
    weights: tuple[str, ...]


@dataclass(frozen=True)
class Attention:
    """An encoder's attention in our kernels (``builder.ATTENTION_OP``): ``inputs`` q, k, v
    into ``outputs`` (one tensor)."""

    inputs: tuple[str, str, str]
    outputs: tuple[str]
    num_heads: int
    scale: float


@dataclass
class Program:
    """A part as ONNX Runtime graphs (``GraphPart``, its ``index`` the part's) and our
    products, in the order they run; ``shapes``: the crossing tensors' (rows symbol, width)."""

    steps: list = field(default_factory=list)
    shapes: dict[str, tuple[str, int]] = field(default_factory=dict)


def split(part: GraphPart) -> Program:
    """``part`` cut at its ``KERNEL_OP`` and ``ATTENTION_OP`` nodes (a part without any is one
    step, itself)."""
    graph = part.model.graph
    nodes = list(graph.node)
    if not any(_is_kernel(n) for n in nodes):
        return Program([part])
    shapes = _shapes(part.model, part.kernel_shapes)
    producer: dict[str, tuple[int, bool]] = {}  # tensor -> (level of its producer, made by a product)
    levels: list[int] = []
    for n in nodes:
        # a node runs at the level after every product it depends on
        level = 0
        for name in n.input:
            if name in producer:
                lv, by_kernel = producer[name]
                level = max(level, lv + 1 if by_kernel else lv)
        levels.append(level)
        kernel = _is_kernel(n)
        for name in n.output:
            producer[name] = (level, kernel)
    graph_outputs = [o.name for o in graph.output]
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    inits = {t.name: t for t in graph.initializer}
    program = Program()
    for level in range(max(levels) + 1):
        ort_nodes = [i for i, n in enumerate(nodes) if levels[i] == level and not _is_kernel(n)]
        if ort_nodes:
            program.steps.append(_segment(part, nodes, ort_nodes, inits, consumers, graph_outputs, shapes, program))
        for i, n in enumerate(nodes):
            if levels[i] == level and _is_kernel(n):
                if n.op_type == ATTENTION_OP:
                    a = {x.name: x for x in n.attribute}
                    program.steps.append(Attention((n.input[0], n.input[1], n.input[2]), (n.output[0],),
                                                   a["num_heads"].i, a["scale"].f))
                else:
                    program.steps.append(Products(n.input[0], tuple(n.output), tuple(_weights_of(n))))
                for name in (*n.input, *n.output):
                    if name not in (i.name for i in graph.input) and name not in graph_outputs:
                        program.shapes[name] = _rows_width(shapes, name)
    return program


def _is_kernel(n: onnx.NodeProto) -> bool:
    return n.op_type in (KERNEL_OP, ATTENTION_OP) and n.domain == KERNEL_DOMAIN


def _shapes(model: onnx.ModelProto, kernel_shapes: dict[str, tuple[int, int]]) -> dict[str, onnx.TypeProto]:
    """Every tensor's type, from ONNX's shape inference over a stand-in of the graph whose
    ops it does not know are ones it does with the same output shape: our products and
    MatMulNBits as MatMul over a (K, N) initializer without data, ONNX Runtime's fused
    norm, RoPE, GELU and attention (an encoder's) as Identity: each one's output is
    shaped like its first input."""
    g = model.graph
    nodes, inits = [], list(g.initializer)

    def matmul(x: str, y: str, k: int, n: int, stem: str) -> onnx.NodeProto:
        w = onnx.TensorProto(name=f"{stem}.shape_of", data_type=onnx.TensorProto.FLOAT, dims=[k, n])
        inits.append(w)
        return helper.make_node("MatMul", [x, w.name], [y])

    for n in g.node:
        if n.op_type == ATTENTION_OP and n.domain == KERNEL_DOMAIN:
            nodes.append(helper.make_node("Identity", [n.input[0]], [n.output[0]]))
        elif _is_kernel(n):
            for out, name in zip(n.output, _weights_of(n)):
                nodes.append(matmul(n.input[0], out, kernel_shapes[name][1], kernel_shapes[name][0], out))
        elif n.op_type == "MatMulNBits":
            a = {x.name: x.i for x in n.attribute}
            nodes.append(matmul(n.input[0], n.output[0], a["K"], a["N"], n.output[0]))
        elif n.op_type in ("SimplifiedLayerNormalization", "RotaryEmbedding", "FastGelu", "MultiHeadAttention"):
            nodes.append(helper.make_node("Identity", [n.input[0]], [n.output[0]]))
        else:
            nodes.append(n)
    stand_in = helper.make_model(helper.make_graph(nodes, g.name, g.input, g.output, initializer=inits),
                                 ir_version=model.ir_version, opset_imports=list(model.opset_import))
    inferred = shape_inference.infer_shapes(stand_in)
    return {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}


def _weights_of(n: onnx.NodeProto) -> list[str]:
    return [w.decode() for a in n.attribute if a.name == "weights" for w in a.strings]


def _rows_width(shapes: dict, name: str) -> tuple[str, int]:
    t = shapes.get(name)
    dims = list(t.tensor_type.shape.dim) if t is not None else []
    if len(dims) != 2 or not dims[0].dim_param or not dims[1].dim_value:
        raise ValueError(f"tensor {name} between our products and a graph is not (rows, width): "
                         f"{[d.dim_param or d.dim_value for d in dims]}")
    return dims[0].dim_param, dims[1].dim_value


def _segment(part: GraphPart, nodes, indices: list[int], inits: dict, consumers: dict, graph_outputs: list[str],
             shapes: dict, program: Program) -> GraphPart:
    """The graph of ``nodes[indices]``: its inputs are what they read and no node of theirs
    makes, its outputs what they make that a later step (or the part) reads."""
    mine = set(indices)
    made = {name for i in indices for name in nodes[i].output}
    inputs, used_inits = [], []
    for i in indices:
        for name in nodes[i].input:
            if not name or name in made:
                continue
            if name in inits:
                if name not in used_inits:
                    used_inits.append(name)
            elif name not in inputs:
                inputs.append(name)
    outputs = [name for i in indices for name in nodes[i].output
               if name in graph_outputs or any(c not in mine for c in consumers.get(name, ()))]
    part_inputs = {v.name: v for v in part.model.graph.input}
    part_outputs = {v.name: v for v in part.model.graph.output}

    def info(name: str, table: dict) -> onnx.ValueInfoProto:
        if name in table:
            return table[name]
        program.shapes[name] = rows, width = _rows_width(shapes, name)
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [rows, width])

    g = helper.make_graph([nodes[i] for i in indices], f"{part.model.graph.name}_{len(program.steps)}",
                          [info(n, part_inputs) for n in inputs], [info(n, part_outputs) for n in outputs],
                          initializer=[inits[n] for n in used_inits])
    model = helper.make_model(g, ir_version=part.model.ir_version, producer_name="dualpath",
                              opset_imports=list(part.model.opset_import))
    names = set(used_inits)
    return replace(part, model=model, inputs=tuple(inputs), outputs=tuple(outputs),
                   weights={n: a for n, a in part.weights.items() if n in names},
                   tables={n: a for n, a in part.tables.items() if n in names},
                   derived={n: a for n, a in part.derived.items() if n in names},
                   prepack=any(nodes[i].op_type == "MatMulNBits" for i in indices))
