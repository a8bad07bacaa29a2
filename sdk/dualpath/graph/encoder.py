"""The ONNX graph of an encoder (``ModelConfig.causal`` False: BERT, nomic-bert).

An encoder reads a batch of whole texts once and keeps no KV cache: the work is a
prefill of every token at once, large matrix products that ONNX Runtime's GEMMs do well,
so the whole model is one graph (no cut at attention, no kernels of ours between
parts). Its forward pass is llama.cpp's (``src/models/bert.cpp``)::

    h = LayerNorm(x)                                  x: token + type 0 + position rows
    for each layer:
        q, k, v = h Wq + bq, h Wk + bk, h Wv + bv     (RoPE on q, k: nomic-bert)
        a = softmax(q k^T / sqrt(head_dim) + mask) v  every token sees its own text
        h = LayerNorm(h + a Wo + bo)
        f = gelu(h Wup + bup) Wdown + bdown           (silu(h Wgate) * h Wup: nomic-bert)
        h = LayerNorm(h + f)

Shapes (B texts padded to T tokens; N = B * T):
    x       (N, dim) f32      the embeddings' sum, gathered by the runner (executor/encoder.py)
    mask    (B, T) f32        0 for a token of the text, a large negative number for padding
    cos/sin (N, head_dim / 2) f32  RoPE angles per token (rotary encoders only)
    hidden  (N, dim) f32      the last layer's output: what pooling reads

Weights are external initializers as in ``builder.py`` (``_Builder.linear`` handles every
weight form: f32, MatMulNBits with zero points and mins).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..models.spec import ModelSpec
from .builder import GraphPart, _Builder, weight_layout

MASKED = -1e30
"""What ``mask`` holds for padding: exp of it underflows to exactly 0 after the max is subtracted."""


class _EncoderBuilder(_Builder):
    """``_Builder`` with the encoder's layers."""

    def bias(self, y: str, name: str) -> str:
        w = self.spec.weights.get(name)
        return y if w is None else self.node("Add", [y, self.external(f"{name}.weight", w.data)], "b")

    def dense(self, x: str, name: str) -> str:
        """x @ W^T (+ b when the file has the bias)."""
        return self.bias(self.linear(x, self.spec.weights[name]), f"{name}.bias")

    def layer_norm(self, x: str, name: str) -> str:
        w, b = self.spec.weights[name], self.spec.weights[f"{name}.bias"]
        return self.node("LayerNormalization", [x, self.external(f"{name}.weight", w.data),
                                                self.external(f"{name}.bias.weight", b.data)],
                         "ln", axis=-1, epsilon=float(self.cfg.rms_eps), stash_type=1)

    def heads(self, x: str, bt: str) -> str:
        """(N, heads * head_dim) -> (B, heads, T, head_dim)."""
        shape = self.node("Concat", [bt, self.const("hd", np.array([self.cfg.num_heads, self.cfg.head_dim],
                                                                     np.int64))], "sh", axis=0)
        return self.node("Transpose", [self.node("Reshape", [x, shape], "r")], "t", perm=[0, 2, 1, 3])

    def rotate(self, x: str) -> str:
        """NeoX RoPE of x (N, heads * head_dim) with the per-token tables ``cos``/``sin``."""
        hd, nh = self.cfg.head_dim, self.cfg.num_heads
        x3 = self.node("Reshape", [x, self.const("nhd", np.array([-1, nh, hd], np.int64))], "r")
        x1, x2 = self.tmp("half"), self.tmp("half")
        self.nodes.append(helper.make_node("Split", [x3, self.const("halves", np.array([hd // 2] * 2, np.int64))],
                                           [x1, x2], axis=-1))
        cos = self.node("Unsqueeze", ["cos", self.const("ax1", np.array([1], np.int64))], "c")
        sin = self.node("Unsqueeze", ["sin", self.const("ax1", np.array([1], np.int64))], "s")
        a = self.node("Sub", [self.node("Mul", [x1, cos], "m"), self.node("Mul", [x2, sin], "m")], "ra")
        b = self.node("Add", [self.node("Mul", [x2, cos], "m"), self.node("Mul", [x1, sin], "m")], "rb")
        y = self.node("Concat", [a, b], "rc", axis=-1)
        return self.node("Reshape", [y, self.const("flatq", np.array([-1, nh * hd], np.int64))], "r")

    def attention(self, i: int, h: str, bt: str, mask: str) -> str:
        p, cfg = f"blk.{i}.", self.cfg
        if cfg.fused_qkv:  # a fused matrix may still come with separate biases (llama.cpp takes both)
            q, k, v = self.split(self.dense(h, p + "attn_qkv"), [cfg.q_dim, cfg.kv_dim, cfg.kv_dim], "qkv")
            q, k, v = (self.bias(y, f"{p}{n}.bias") for y, n in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")))
        else:
            q, k, v = (self.dense(h, p + n) for n in ("attn_q", "attn_k", "attn_v"))
        if not cfg.learned_positions:
            q, k = self.rotate(q), self.rotate(k)
        q, k, v = self.heads(q, bt), self.heads(k, bt), self.heads(v, bt)
        kt = self.node("Transpose", [k], "kt", perm=[0, 1, 3, 2])
        scale = self.const("scale", np.array(cfg.attention_scale, np.float32))
        scores = self.node("Add", [self.node("Mul", [self.node("MatMul", [q, kt], "qk"), scale], "sc"), mask], "sm")
        ctx = self.node("MatMul", [self.node("Softmax", [scores], "p", axis=-1), v], "ctx")
        flat = self.node("Reshape", [self.node("Transpose", [ctx], "t", perm=[0, 2, 1, 3]),
                                     self.const("flat", np.array([-1, cfg.q_dim], np.int64))], "r")
        return self.dense(flat, p + "attn_output")

    def mlp(self, i: int, h: str) -> str:
        p, cfg = f"blk.{i}.", self.cfg
        up = self.dense(h, p + "ffn_up")
        if cfg.ffn_gated:
            gate = self.dense(h, p + "ffn_gate")
            act = self.node("Mul", [self.activation(gate), up], "glu")
        else:
            act = self.activation(up)
        return self.dense(act, p + "ffn_down")

    def activation(self, x: str) -> str:
        if self.cfg.ffn_act == "silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x], "sg")], "silu")
        if self.cfg.ffn_act == "gelu_tanh":
            return self.node("Gelu", [x], "gelu", approximate="tanh")
        raise ValueError(f"encoder activation {self.cfg.ffn_act!r} is not supported")


def build_encoder(spec: ModelSpec, accuracy_level: int = 4, nbits8: bool = True) -> GraphPart:
    """The one graph of the encoder ``spec`` (see the module docstring)."""
    cfg = spec.config
    if cfg.causal:
        raise ValueError(f"{spec.path}: {cfg.arch} is a decoder; build_encoder takes an encoder")
    b = _EncoderBuilder(spec, weight_layout(spec), accuracy_level, nbits8=nbits8)
    F = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", F, ["N", cfg.dim]),
              helper.make_tensor_value_info("mask", F, ["B", "T"])]
    if not cfg.learned_positions:
        inputs += [helper.make_tensor_value_info(n, F, ["N", cfg.head_dim // 2]) for n in ("cos", "sin")]
    bt = b.node("Shape", ["mask"], "bt")
    # (B, 1, 1, T): every query row of a text sees the same keys
    mask = b.node("Unsqueeze", ["mask", b.const("ax12", np.array([1, 2], np.int64))], "mk")
    h = b.layer_norm("x", "token_embd_norm")
    for i in range(cfg.num_layers):
        h = b.layer_norm(b.node("Add", [h, b.attention(i, h, bt, mask)], "res"), f"blk.{i}.attn_output_norm")
        h = b.layer_norm(b.node("Add", [h, b.mlp(i, h)], "res"), f"blk.{i}.layer_output_norm")
    return b.finish(0, inputs, [helper.make_tensor_value_info("hidden", F, ["N", cfg.dim])], {"hidden": h})


def rope_angles(spec: ModelSpec, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (N, head_dim / 2) f32 of ``positions`` (N,) for a rotary encoder."""
    cfg = spec.config
    half = cfg.head_dim // 2
    inv_freq = (1.0 / cfg.rope_theta ** (np.arange(half, dtype=np.float32) * 2 / cfg.head_dim)).astype(np.float32)
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
