"""ONNX graphs for the dense math of a Llama-family model, split at attention.

Attention is ours (compiled kernels over our KV cache), so the model becomes
``num_layers + 1`` graphs, one per layer boundary:

* part 0:            h -> q, k, v of layer 0 (RMSNorm, projections, RoPE)
* part i (1..L-1):   h, attn -> h', q, k, v: closes layer i-1 (output projection,
                     residual, RMSNorm, SwiGLU MLP, residual) and opens layer i
* part L:            h, attn, rows -> logits, hidden: closes layer L-1 for the
                     selected rows only, final RMSNorm (hidden: what embeddings pool), lm_head;
                     without logits when our kernels run the classifier
                     (``ModelSpec.classifier_in_kernels``: the runtime multiplies hidden)

Shapes (T = tokens in this step, R = rows whose logits are wanted):
    h, h'     (T, dim) f32          positions (T,) int64
    q, attn   (T, num_heads * head_dim) f32
    k, v      (T, num_kv_heads * head_dim) f32
    rows      (R,) int64            logits (R, vocab_size) f32   hidden (R, dim) f32

Weights are initializers whose data is *external*: every part points into one
placeholder file, and the runtime hands ONNX Runtime the real arrays with
``SessionOptions.add_initializer``, so the weights live in memory once, shared
by every session (see ``executor/ort_sessions.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..models.spec import QUANT_BLOCK, ModelSpec, Weight
from . import OPSET

IR_VERSION = 10
PLACEHOLDER = "weights.placeholder"
KERNEL_OP, KERNEL_DOMAIN = "KernelMatMul", "dualpath"
"""A node no runtime executes: x @ W^T for each weight it names (attribute ``weights``), one
output per weight, which our kernels compute (``Weight.kernel_form``). ``segments.split``
cuts a part's graph at these nodes into the graphs ONNX Runtime runs between them."""
ATTENTION_OP = "KernelAttention"
"""Another such node (domain ``KERNEL_DOMAIN``): an encoder's attention over its packed texts,
inputs q, k, v (N, heads * head_dim), output the heads' values (N, heads * head_dim), computed
by our kernels (csrc/enc_attn.h; attributes ``num_heads``, ``scale``)."""


@dataclass
class GraphPart:
    """One ONNX graph and the weight arrays it needs (initializer name -> array)."""

    index: int
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    placeholder_bytes: int = 0
    """Size of the placeholder file every part's external initializers point into."""
    tables: dict[str, np.ndarray] = field(default_factory=dict)
    """Initializers that live in the graph folder (RoPE tables), name -> array."""
    derived: dict[str, np.ndarray] = field(default_factory=dict)
    """Initializers that are the entry's derived arrays (fused matrices), name -> array."""
    prepack: bool = False
    """True when the part has quantized matmuls: MatMulNBits needs ONNX Runtime's
    prepacking to be fast (docs/performance.md), and the prepacked copy replaces ours."""
    kernel_shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Weights of the part's ``KERNEL_OP`` nodes -> their (out_features, in_features)."""


class _DequantizedT:
    """W^T (in, out) f32 of a quantized weight, computed only when the graph folder's
    tables are written (one matrix in memory at a time, not every part's at once)."""

    def __init__(self, weight: Weight):
        self.weight = weight
        self.shape = (weight.shape[1], weight.shape[0])
        self.dtype = np.dtype(np.float32)
        self.nbytes = 4 * weight.shape[0] * weight.shape[1]

    def __array__(self, dtype=None, copy=None):
        from ..models.quants import gather_rows

        w = self.weight
        N, K = w.shape
        bs = w.block_size or QUANT_BLOCK
        blob = w.data.reshape(N, K // bs, -1)
        out = np.empty((K, N), np.float32)
        rows = np.empty((min(N, 4096), K), np.float32)  # (rows, in) a band at a time
        for r0 in range(0, N, len(rows)):
            ids = np.arange(r0, min(N, r0 + len(rows)))
            gather_rows(blob, w.scales, w.zero_points, w.mins, w.matmul_bits, bs, ids, rows)
            out[:, r0:r0 + len(ids)] = rows[:len(ids)].T
        return out if dtype is None else out.astype(dtype)


class _Builder:
    """Accumulates nodes and initializers for one part."""

    def __init__(self, spec: ModelSpec, layout: dict[str, tuple[int, int]], accuracy_level: int,
                 context_tokens: int = 0, fused: dict[str, Weight] | None = None,
                 rope_memo: dict | None = None, nbits8: bool = True):
        self.spec = spec
        self.nbits8 = nbits8
        """MatMulNBits runs 8 bits (ONNX Runtime 1.22 and newer); else 8-bit matrices run
        as f32 (``dequantized_linear``)."""
        self.context_tokens = context_tokens or spec.config.context_length
        self.cfg = spec.config
        self.layout = layout
        self.accuracy_level = accuracy_level
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.weights: dict[str, np.ndarray] = {}
        self.consts: dict[str, str] = {}
        self.prepack = False
        self.blocksums: dict[tuple[str, int], str] = {}  # (input, block size) -> its block sums (T, in / block)
        self.tables: dict[str, np.ndarray] = {}  # graph-folder initializers (RoPE tables)
        self.derived: set[str] = set()  # initializers that are no model weight (tables, fused matrices)
        self.fused = fused or {}
        self.rope_memo = rope_memo if rope_memo is not None else {}  # table key -> (cos, sin)
        self.kernel_shapes: dict[str, tuple[int, int]] = {}  # weights of KERNEL_OP nodes -> (out, in)
        self._n = 0

    def tmp(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def node(self, op: str, inputs: list[str], stem: str, domain: str = "", **attrs) -> str:
        out = self.tmp(stem)
        self.nodes.append(helper.make_node(op, inputs, [out], domain=domain, **attrs))
        return out

    def const(self, key: str, array: np.ndarray) -> str:
        if key not in self.consts:
            name = f"const.{key}"
            self.inits.append(numpy_helper.from_array(array, name))
            self.consts[key] = name
        return self.consts[key]

    def external(self, name: str, array: np.ndarray) -> str:
        """Declare ``array`` as an initializer whose bytes live outside the model: a
        model weight, or one of the entry's derived arrays (fused matrices) or of the
        graph folder's tables, which get a placeholder range of their own."""
        if name in self.weights:
            return name
        if name.rpartition(".")[0] not in self.spec.weights:
            self.derived.add(name)
            if name not in self.layout:  # the layout is shared by the parts: one range per array
                end = self.layout[""][0]
                self.layout[name] = (end, int(array.nbytes))
                self.layout[""] = (end + -(-int(array.nbytes) // 64) * 64, 0)
        offset, length = self.layout[name]
        t = TensorProto()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        t.dims.extend(array.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", PLACEHOLDER), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self.inits.append(t)
        self.weights[name] = array
        return name

    # -- layers ---------------------------------------------------------------
    def rmsnorm(self, x: str, weight: Weight) -> str:
        w = self.external(f"{weight.name}.weight", weight.data)
        return self.node("SimplifiedLayerNormalization", [x, w], "norm", axis=-1, epsilon=float(self.cfg.rms_eps),
                         stash_type=1)

    def head_norm(self, x: str, num_heads: int, weight: Weight) -> str:
        """RMSNorm over each head of x (T, num_heads * head_dim) (Qwen3, Gemma 3 q/k norms)."""
        hd = self.cfg.head_dim
        x3 = self.node("Reshape", [x, self.const(f"heads_{num_heads}", np.array([0, num_heads, hd], np.int64))], "hr")
        y = self.rmsnorm(x3, weight)
        return self.node("Reshape", [y, self.const(f"flat_{num_heads}", np.array([0, num_heads * hd], np.int64))], "hf")

    def kernel_linear(self, x: str, weights: list[Weight]) -> list[str]:
        """x @ W^T for each of ``weights`` (all ``kernel_form``, one input width), one output
        each, in our kernels: the activations are quantized once for all of them."""
        outs = [self.tmp("kmm") for _ in weights]
        self.kernel_shapes.update((w.name, (w.shape[0], w.shape[1])) for w in weights)
        self.nodes.append(helper.make_node(KERNEL_OP, [x], outs, domain=KERNEL_DOMAIN,
                                           weights=[w.name for w in weights]))
        return outs

    def linears(self, x: str, weights: list[Weight]) -> list[str]:
        """x @ W^T for matrices that read one input (q, k, v; gate, up): one product in our
        kernels when they all have its form, else each its own graph node."""
        if all(w.kernel_form for w in weights):
            return self.kernel_linear(x, weights)
        return [self.linear(x, w) for w in weights]

    def linear(self, x: str, weight: Weight) -> str:
        """x (T, in) @ W^T -> (T, out), for W (out, in) in any supported dtype."""
        if weight.kernel_form:
            return self.kernel_linear(x, [weight])[0]
        if weight.dtype == "f32":
            if weight.data_t is not None:  # (in, out): see Weight.data_t
                return self.node("MatMul", [x, self.external(f"{weight.name}.weight_t", weight.data_t)], "mm")
            w = self.external(f"{weight.name}.weight", weight.data)
            return self.node("Gemm", [x, w], "mm", transB=1)
        bits = weight.matmul_bits
        if bits == 8 and not self.nbits8:
            return self.dequantized_linear(x, weight)
        assert weight.scales is not None  # a MatMulNBits weight has its scales
        inputs = [x, self.external(f"{weight.name}.weight", weight.data),
                  self.external(f"{weight.name}.scales", weight.scales)]
        if weight.zero_points is not None:
            inputs.append(self.external(f"{weight.name}.zero_points", weight.zero_points))
        self.prepack = True
        out_features, in_features = weight.shape
        y = self.node("MatMulNBits", inputs, "mmq", domain="com.microsoft", K=in_features, N=out_features,
                      bits=bits, block_size=weight.block_size or QUANT_BLOCK, accuracy_level=self.accuracy_level)
        if weight.mins is None:
            return y
        # x = s * q - m per block (Q5_K, Q5_1): y holds the s * q part; subtract
        # blocksum(x) (T, in / block) @ mins^T (in / block, out).
        bs = weight.block_size
        sums = self.blocksums.get((x, bs))
        if sums is None:  # shared by the matmuls of one input (q, k, v; gate, up)
            blocks = self.node("Reshape", [x, self.const(f"blocks_{in_features}_{bs}",
                                                         np.array([0, in_features // bs, bs], np.int64))], "xb")
            sums = self.node("ReduceSum", [blocks, self.const("axes_2", np.array([2], np.int64))], "xs", keepdims=0)
            self.blocksums[(x, bs)] = sums
        mins = self.external(f"{weight.name}.mins", weight.mins)
        return self.node("Gemm", [sums, mins, y], "mmq", transB=1, alpha=-1.0, beta=1.0)  # y - sums @ mins^T

    def dequantized_linear(self, x: str, weight: Weight) -> str:
        """x @ W^T for an 8-bit MatMulNBits weight on an ONNX Runtime whose MatMulNBits takes
        4 bits only: ``MatMul`` over W^T (in, out) dequantized to f32 (mins included), an
        array of the graph folder (``rope.bin``) made when the folder is written."""
        return self.node("MatMul", [x, self.table(f"dq8.{weight.name}.weight_t",
                                                        _DequantizedT(weight))], "mm")  # type: ignore[arg-type]

    def inv_freq(self, layer: int) -> np.ndarray:
        """Angle per position of each rotated pair of ``layer``: (head_dim / 2,) f32."""
        cfg, hd = self.cfg, self.cfg.head_dim
        theta, scale = cfg.layer_rope(layer)
        # As run.c: freq_i = 1 / theta^(2i / head_dim), in float32.
        inv = (1.0 / np.power(np.float32(theta), np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
        factors = None
        if cfg.rope_freqs:  # Llama 3: rope_freqs divides each frequency
            factors = self.spec.weights["rope_freqs"].data
        elif cfg.rope_factors:  # Phi-3 LongRoPE: long factors past the original context
            long = self.context_tokens > (cfg.rope_orig_context or cfg.context_length)
            factors = self.spec.weights["rope_factors_long" if long else "rope_factors_short"].data
        if factors is not None:
            inv = inv / np.asarray(factors, np.float32).reshape(-1)
        return (inv * np.float32(scale)).astype(np.float32)

    def rope_tables(self, layer: int) -> tuple[str, str]:
        """The cos and sin tables of ``layer``'s angles, (context, head_dim / 2) f32 each,
        named by their content: layers with the same frequencies share one pair, and every
        part hands ONNX Runtime the same arrays (graph folder's ``rope.bin``)."""
        inv = self.inv_freq(layer)
        key = hashlib.sha1(inv.tobytes() + np.float32(self.cfg.rope_attn_factor).tobytes()).hexdigest()[:12]
        if key not in self.rope_memo:  # shared by the parts: computed once per distinct table
            self.rope_memo[key] = rope_cache(inv, self.context_tokens, self.cfg.rope_attn_factor)
        cos, sin = self.rope_memo[key]
        return self.table(f"rope.{key}.cos", cos), self.table(f"rope.{key}.sin", sin)

    def table(self, name: str, array: np.ndarray) -> str:
        """An external initializer that lives in the graph folder, not the entry."""
        if name not in self.tables:
            self.tables[name] = array
            self.external(name, array)
        return name

    def rope(self, x: str, num_heads: int, positions: str, layer: int) -> str:
        """Rotate every head of x (T, num_heads * head_dim) at ``positions`` (1, T):
        adjacent pairs (x[2i], x[2i+1]) (llama.cpp NORM RoPE, run.c) or halves (x[i],
        x[i + head_dim/2]) (NEOX), with ONNX Runtime's fused RotaryEmbedding over tables
        of every position (one kernel instead of about twenty small ones per layer).
        Returns (1, T, num_heads * head_dim): the graph's q and k outputs keep that
        leading 1 (the runner binds its (T, ...) buffers so), which saves a node."""
        cos, sin = self.rope_tables(layer)
        x3 = self.node("Unsqueeze", [x, self.const("axes_0", np.array([0], np.int64))], "x3")
        return self.node("RotaryEmbedding", [x3, positions, cos, sin], "rope", domain="com.microsoft",
                         interleaved=int(self.cfg.rope_type == "norm"), num_heads=num_heads)

    def split(self, x: str, sizes: list[int], stem: str) -> list[str]:
        outs = [self.tmp(stem) for _ in sizes]
        self.nodes.append(helper.make_node("Split", [x, self.const(f"split_{'_'.join(map(str, sizes))}",
                                                                   np.array(sizes, np.int64))], outs, axis=1))
        return outs

    def open_layer(self, i: int, h: str, positions: str) -> tuple[str, str, str]:
        cfg, w = self.cfg, self.spec.weights
        x = self.rmsnorm(h, w[f"blk.{i}.attn_norm"])
        qkv = w.get(f"blk.{i}.attn_qkv") if cfg.fused_qkv else self.fused.get(f"blk.{i}.attn_qkv")
        if qkv is not None:  # one matmul, then q | k | v (Phi-3's own, or ours: fusion_groups)
            q, k, v = self.split(self.linear(x, qkv), [cfg.q_dim, cfg.kv_dim, cfg.kv_dim], "qkv")
        else:
            q, k, v = self.linears(x, [w[f"blk.{i}.attn_{n}"] for n in "qkv"])
        if cfg.qkv_bias:  # Qwen2
            q, k, v = (self.node("Add", [t, self.external(f"blk.{i}.attn_{n}.bias.weight",
                                                          w[f"blk.{i}.attn_{n}.bias"].data)],
                                 "bias") for t, n in zip((q, k, v), "qkv"))
        if cfg.qk_norm:  # Qwen3, Gemma 3
            q = self.head_norm(q, cfg.num_heads, w[f"blk.{i}.attn_q_norm"])
            k = self.head_norm(k, cfg.num_kv_heads, w[f"blk.{i}.attn_k_norm"])
        return self.rope(q, cfg.num_heads, positions, i), self.rope(k, cfg.num_kv_heads, positions, i), v

    def close_layer(self, i: int, h: str, attn: str) -> str:
        cfg, w = self.cfg, self.spec.weights
        o = self.linear(attn, w[f"blk.{i}.attn_output"])
        if cfg.post_norms:  # Gemma: normalize each branch before its residual add
            o = self.rmsnorm(o, w[f"blk.{i}.post_attention_norm"])
        h = self.node("Add", [h, o], "res")
        x = self.rmsnorm(h, w[f"blk.{i}.ffn_norm"])
        gate_up = w[f"blk.{i}.ffn_up"] if cfg.fused_gate_up else self.fused.get(f"blk.{i}.ffn_gate_up")
        if gate_up is not None:  # one matmul, gate first (Phi-3's own, or ours)
            gate, up = self.split(self.linear(x, gate_up), [cfg.hidden_dim, cfg.hidden_dim], "gu")
        else:
            gate, up = self.linears(x, [w[f"blk.{i}.ffn_gate"], w[f"blk.{i}.ffn_up"]])
        if cfg.ffn_act == "gelu_tanh":  # GeGLU (ggml_gelu: the tanh approximation)
            act = self.node("Gelu", [gate], "gelu", approximate="tanh")
        else:  # SwiGLU
            act = self.node("Mul", [gate, self.node("Sigmoid", [gate], "sig")], "silu")
        y = self.linear(self.node("Mul", [act, up], "glu"), w[f"blk.{i}.ffn_down"])
        if cfg.post_norms:
            y = self.rmsnorm(y, w[f"blk.{i}.post_ffw_norm"])
        return self.node("Add", [h, y], "res")

    def lm_head(self, h: str) -> tuple[str | None, str]:
        """(logits, the final-normed hidden state: what embeddings pool); logits None when
        our kernels run the classifier (the runtime applies the soft-cap then)."""
        cfg = self.cfg
        normed = self.rmsnorm(h, self.spec.weights["output_norm"])
        if self.spec.classifier_in_kernels:
            return None, normed
        logits = self.linear(normed, self.spec.output)
        if cfg.final_softcap > 0:  # Gemma 2: cap * tanh(logits / cap)
            cap = cfg.final_softcap
            t = self.node("Tanh", [self.node("Mul", [logits, self.const("inv_cap", np.array(1.0 / cap, np.float32))],
                                             "lc")], "tanh")
            logits = self.node("Mul", [t, self.const("cap", np.array(cap, np.float32))], "capped")
        return logits, normed

    def finish(self, index: int, inputs, outputs, renames: dict[str, str]) -> GraphPart:
        # The producers of the outputs write them under their final names: an Identity
        # node costs a kernel launch per output per step.
        rename: dict[str, str] = {}
        for final, internal in renames.items():
            if internal in rename or not any(internal in n.output for n in self.nodes):  # a graph input
                self.nodes.append(helper.make_node("Identity", [rename.get(internal, internal)], [final]))
            else:
                rename[internal] = final
        for n in self.nodes:
            for io in (n.input, n.output):
                for j, name in enumerate(io):
                    if name in rename:
                        io[j] = rename[name]
        graph = helper.make_graph(self.nodes, f"part{index}", inputs, outputs, initializer=self.inits)
        model = helper.make_model(graph, ir_version=IR_VERSION, producer_name="dualpath",
                                  opset_imports=[helper.make_opsetid("", OPSET),
                                                 helper.make_opsetid("com.microsoft", 1)])
        weights = {n: a for n, a in self.weights.items() if n not in self.derived}
        derived = {n: a for n, a in self.weights.items() if n in self.derived and n not in self.tables}
        return GraphPart(index, model, tuple(i.name for i in inputs), tuple(o.name for o in outputs),
                         weights, self.layout[""][0], self.tables, derived, self.prepack, dict(self.kernel_shapes))


def rope_cache(inv_freq: np.ndarray, context_tokens: int, attn_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * inv_freq for every position below ``context_tokens``:
    (context, head_dim / 2) f32 each, the angles computed in f32 as run.c does."""
    angles = np.arange(context_tokens, dtype=np.float32)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    if attn_factor != 1.0:  # LongRoPE's magnitude scaling (llama.cpp's mscale)
        cos, sin = cos * np.float32(attn_factor), sin * np.float32(attn_factor)
    return cos.astype(np.float32), sin.astype(np.float32)


def weight_layout(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """Byte (offset, length) of every initializer inside the placeholder file."""
    layout: dict[str, tuple[int, int]] = {}
    offset = 0
    for w in spec.weights.values():
        for suffix, arr in w.arrays().items():
            layout[f"{w.name}.{suffix}"] = (offset, int(arr.nbytes))
            offset += -(-int(arr.nbytes) // 64) * 64
    layout[""] = (offset, 0)  # total size
    return layout


def build_parts(spec: ModelSpec, accuracy_level: int = 4, context_tokens: int = 0,
                fused: dict[str, Weight] | None = None, nbits8: bool = True) -> list[GraphPart]:
    """The ``num_layers + 1`` graphs of ``spec`` (see the module docstring) for a
    context of ``context_tokens`` (default: the model's; Phi-3's LongRoPE factors
    depend on it), with the fused matrices ``fused`` (``fusion_groups``) where given.
    ``nbits8``: the runtime's MatMulNBits takes 8 bits (see ``_Builder.nbits8``)."""
    cfg = spec.config
    layout = weight_layout(spec)
    rope_memo: dict = {}  # RoPE tables, computed once for every part
    F, I64 = TensorProto.FLOAT, TensorProto.INT64

    def vi(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    h_in, pos_in = vi("h", F, ["T", cfg.dim]), vi("positions", I64, [1, "T"])
    attn_in = vi("attn", F, ["T", cfg.q_dim])
    qkv_out = [vi("q", F, [1, "T", cfg.q_dim]), vi("k", F, [1, "T", cfg.kv_dim]), vi("v", F, ["T", cfg.kv_dim])]
    parts = []
    for index in range(cfg.num_layers + 1):
        b = _Builder(spec, layout, accuracy_level, context_tokens, fused, rope_memo, nbits8)
        if index == cfg.num_layers:
            rows = "rows"
            h = b.node("Gather", ["h", rows], "hsel", axis=0)
            attn = b.node("Gather", ["attn", rows], "asel", axis=0)
            logits, hidden = b.lm_head(b.close_layer(index - 1, h, attn))
            outs = {"hidden": hidden} if logits is None else {"logits": logits, "hidden": hidden}
            parts.append(b.finish(index, [h_in, attn_in, vi("rows", I64, ["R"])],
                                  [vi(k, F, ["R", cfg.vocab_size if k == "logits" else cfg.dim]) for k in outs],
                                  outs))
            continue
        if index == 0:
            q, k, v = b.open_layer(0, "h", "positions")
            parts.append(b.finish(index, [h_in, pos_in], qkv_out, {"q": q, "k": k, "v": v}))
        else:
            h = b.close_layer(index - 1, "h", "attn")
            q, k, v = b.open_layer(index, h, "positions")
            parts.append(b.finish(index, [h_in, attn_in, pos_in], [vi("h_out", F, ["T", cfg.dim])] + qkv_out,
                                  {"h_out": h, "q": q, "k": k, "v": v}))
    return parts
