"""The ONNX graph of an encoder (``ModelConfig.causal`` False: BERT, nomic-bert).

An encoder reads a batch of whole texts once and keeps no KV cache: the work is a
prefill of every token at once, so the model is one graph (no cut at attention). A layer's
matrices that have our kernels' form (Q8_0, Q4_K ...: ``Weight.kernel_form``) are products
in our kernels, as in a decoder's parts: ``segments.split`` cuts the graph at them
(graph/parts.py ``encoder_graph``), and float matrices stay ONNX Runtime's MatMul. Its
forward pass is llama.cpp's (``src/models/bert.cpp``)::

    h = LayerNorm(x)                                  x: token + type 0 + position rows
    for each layer:
        q, k, v = h Wq + bq, h Wk + bk, h Wv + bv     (RoPE on q, k: nomic-bert)
        a = softmax(q k^T / sqrt(head_dim) + mask) v  every token sees its own text
        h = LayerNorm(h + a Wo + bo)
        f = gelu(h Wup + bup) Wdown + bdown           (silu(h Wgate) * h Wup: nomic-bert)
        h = LayerNorm(h + f)

The texts are packed, without padding: every matrix product and norm runs over the N
real tokens of the batch. Only attention needs the texts apart. Where head_dim is a
multiple of 8 (the ISAs' kernels), attention is ours (``builder.ATTENTION_OP``,
csrc/enc_attn.h), over the packed rows and the texts' first rows (``starts``, which the
program hands to the kernel: no graph input). Otherwise q, k and v are gathered into a
padded (B, T) layout (``pad``), attended by ONNX Runtime's fused ``MultiHeadAttention``
with the key padding ``mask``, and gathered back (``unpad``).
The up projection's bias rides in ``FastGelu`` (bias + the tanh GELU, llama.cpp's
``ggml_gelu``).

Shapes (B texts, the longest T tokens; N real tokens in all):
    x       (N, dim) f32      the embeddings' sum, gathered by the runner (executor/encoder.py)
    pad     (B, T) int64      row of x of each text's token t (any row for padding)   } ONNX Runtime's
    unpad   (N,) int64        row of the (B * T) padded layout of each packed token   } attention
    mask    (B, T) int32      1 for a token of the text, 0 for padding                } only
    cos/sin (N, 1, head_dim / 2) f32  RoPE angles per token, one row for every head (rotary encoders only)
    hidden  (N, dim) f32      the last layer's output: what pooling reads

Weights are external initializers as in ``builder.py`` (``_Builder.linear`` handles every
weight form: f32, MatMulNBits with zero points and mins).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..models.spec import ModelSpec
from . import own_attention
from .builder import ATTENTION_OP, KERNEL_DOMAIN, GraphPart, _Builder, weight_layout

MASKED = -1e30
"""What attention adds for a padding key: exp of it underflows to exactly 0 after the max is subtracted."""


class _EncoderBuilder(_Builder):
    """``_Builder`` with the encoder's layers."""

    def bias(self, y: str, name: str) -> str:
        w = self.spec.weights.get(name)
        return y if w is None else self.node("Add", [y, self.external(f"{name}.weight", w.data)], "b")

    def bias_input(self, name: str) -> list[str]:
        """The bias ``name`` as a fused op's optional input: [] when the file has none."""
        w = self.spec.weights.get(name)
        return [] if w is None else [self.external(f"{name}.weight", w.data)]

    def dense(self, x: str, name: str) -> str:
        """x @ W^T (+ b when the file has the bias)."""
        return self.bias(self.linear(x, self.spec.weights[name]), f"{name}.bias")

    def norm_inputs(self, name: str) -> list[str]:
        w, b = self.spec.weights[name], self.spec.weights[f"{name}.bias"]
        return [self.external(f"{name}.weight", w.data), self.external(f"{name}.bias.weight", b.data)]

    def layer_norm(self, x: str, name: str) -> str:
        return self.node("LayerNormalization", [x, *self.norm_inputs(name)], "ln", axis=-1,
                         epsilon=float(self.cfg.rms_eps), stash_type=1)

    def skip_norm(self, y: str, h: str, name: str, bias: str) -> str:
        """LayerNorm(h + y + the bias ``bias`` where the file has it): two Adds and the
        standard LayerNormalization, which together run faster than ONNX Runtime's fused
        SkipLayerNormalization (docs/performance.md)."""
        return self.layer_norm(self.node("Add", [self.bias(y, bias), h], "res"), name)

    def rotate(self, x: str) -> str:
        """NeoX RoPE of x (N, heads * head_dim) with the per-token tables ``cos``/``sin``."""
        hd, nh = self.cfg.head_dim, self.cfg.num_heads
        x3 = self.node("Reshape", [x, self.const("nhd", np.array([-1, nh, hd], np.int64))], "r")
        x1, x2 = self.tmp("half"), self.tmp("half")
        self.nodes.append(helper.make_node("Split", [x3, self.const("halves", np.array([hd // 2] * 2, np.int64))],
                                           [x1, x2], axis=-1))
        a = self.node("Sub", [self.node("Mul", [x1, "cos"], "m"), self.node("Mul", [x2, "sin"], "m")], "ra")
        b = self.node("Add", [self.node("Mul", [x2, "cos"], "m"), self.node("Mul", [x1, "sin"], "m")], "rb")
        y = self.node("Concat", [a, b], "rc", axis=-1)
        return self.node("Reshape", [y, self.const("flatq", np.array([-1, nh * hd], np.int64))], "r")

    def attention(self, i: int, h: str) -> str:
        """a Wo of layer ``i`` over the packed h (N, dim), without Wo's bias (``skip_norm`` adds it)."""
        p, cfg = f"blk.{i}.", self.cfg
        if cfg.fused_qkv:  # a fused matrix may still come with separate biases (llama.cpp takes both)
            q, k, v = self.split(self.dense(h, p + "attn_qkv"), [cfg.q_dim, cfg.kv_dim, cfg.kv_dim], "qkv")
            q, k, v = (self.bias(y, f"{p}{n}.bias") for y, n in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")))
        else:  # one product in our kernels where the matrices have their form (activations quantized once)
            w = self.spec.weights
            qkv = self.linears(h, [w[p + n] for n in ("attn_q", "attn_k", "attn_v")])
            q, k, v = (self.bias(y, f"{p}{n}.bias") for y, n in zip(qkv, ("attn_q", "attn_k", "attn_v")))
        if not cfg.learned_positions:
            q, k = self.rotate(q), self.rotate(k)
        if own_attention(self.spec):
            ctx = self.tmp("attn")
            self.nodes.append(helper.make_node(ATTENTION_OP, [q, k, v], [ctx], domain=KERNEL_DOMAIN,
                                               num_heads=cfg.num_heads, scale=float(cfg.attention_scale)))
            return self.linear(ctx, self.spec.weights[p + "attn_output"])
        # (N, dim) -> (B, T, dim): each text's rows, padded to the longest
        q, k, v = (self.node("Gather", [t, "pad"], "pad", axis=0) for t in (q, k, v))
        ctx = self.node("MultiHeadAttention", [q, k, v, "", "mask"], "mha", domain="com.microsoft",
                        num_heads=cfg.num_heads, scale=float(cfg.attention_scale), mask_filter_value=MASKED)
        flat = self.node("Reshape", [ctx, self.const("flat", np.array([-1, cfg.q_dim], np.int64))], "r")
        return self.linear(self.node("Gather", [flat, "unpad"], "unpad", axis=0), self.spec.weights[p + "attn_output"])

    def mlp(self, i: int, h: str) -> str:
        """The MLP of layer ``i`` without the down projection's bias (``skip_norm`` adds it)."""
        p, cfg = f"blk.{i}.", self.cfg
        if cfg.ffn_gated:
            gate, up = (self.bias(y, f"{p}{n}.bias") for y, n in
                        zip(self.linears(h, [self.spec.weights[p + n] for n in ("ffn_gate", "ffn_up")]),
                            ("ffn_gate", "ffn_up")))
            act = self.node("Mul", [self.activation(gate), up], "glu")
        elif cfg.ffn_act == "gelu_tanh":  # the bias and the tanh GELU in one op
            up = self.linear(h, self.spec.weights[p + "ffn_up"])
            act = self.node("FastGelu", [up, *self.bias_input(p + "ffn_up.bias")], "gelu", domain="com.microsoft")
        else:
            act = self.activation(self.dense(h, p + "ffn_up"))
        return self.linear(act, self.spec.weights[p + "ffn_down"])

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
    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("x", F, ["N", cfg.dim])]
    if not own_attention(spec):
        inputs += [helper.make_tensor_value_info("pad", I64, ["B", "T"]),
                   helper.make_tensor_value_info("unpad", I64, ["N"]),
                   helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "T"])]
    if not cfg.learned_positions:
        inputs += [helper.make_tensor_value_info(n, F, ["N", 1, cfg.head_dim // 2]) for n in ("cos", "sin")]
    h = b.layer_norm("x", "token_embd_norm")
    for i in range(cfg.num_layers):
        h = b.skip_norm(b.attention(i, h), h, f"blk.{i}.attn_output_norm", f"blk.{i}.attn_output.bias")
        h = b.skip_norm(b.mlp(i, h), h, f"blk.{i}.layer_output_norm", f"blk.{i}.ffn_down.bias")
    return b.finish(0, inputs, [helper.make_tensor_value_info("hidden", F, ["N", cfg.dim])], {"hidden": h})


def rope_angles(spec: ModelSpec, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (N, 1, head_dim / 2) f32 of ``positions`` (N,) for a rotary encoder."""
    cfg = spec.config
    half = cfg.head_dim // 2
    inv_freq = (1.0 / cfg.rope_theta ** (np.arange(half, dtype=np.float32) * 2 / cfg.head_dim)).astype(np.float32)
    angles = positions.astype(np.float32)[:, None, None] * inv_freq[None, None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
