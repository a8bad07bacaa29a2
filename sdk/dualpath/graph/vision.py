"""The ONNX graph of an image encoder: a projector file's ViT and projector (models/mmproj.py,
``ModelConfig.arch`` ``clip``), written from llama.cpp's ``tools/mtmd`` graphs
(``clip_graph::build_vit``, ``models/siglip.cpp``, ``build_patch_merge_permute``)::

    h = x Wpatch^T + bpatch + pos                   x: a square's patches, pos: their positions' rows
    mlp: a class row before each square's patches (x's row there is unused), then LayerNorm(h)
    for each layer (pre-norm):
        a = LayerNorm(h)
        h = h + attention(a) Wo + bo                 every patch of a square sees every other
        h = h + act(LayerNorm(h) Wup + bup) Wdown + bdown
    h = LayerNorm(h)                                 (where the file has the norm: LLaVA's has not)
    idefics3: the pixel shuffle (each m x m block of patches side by side: one row of m * m * dim), then Wfc
    gemma3:   the m x m average of each block, an RMS norm, then Wproj
    mlp:      the class rows dropped, then GELU(h W0^T + b0) W2^T + b2

LLaVA's layers follow Hugging Face's CLIP, not llama.cpp's graph, which puts the class row
after the patches and runs one layer fewer than the file holds (docs/models.md): the class
row at position 0 and every layer the converter kept.

The squares of a batch are packed as an encoder's texts (graph/encoder.py), each of the same
P patches: the layers are ``_EncoderBuilder``'s, products in our kernels where a matrix has
their form (Q8_0), attention ours where head_dim is a multiple of 8 (the runner's ``starts``
every P rows) or ONNX Runtime's over the (B, P) layout (``pad``, ``unpad``, ``mask`` all
trivial, since no square is shorter). The patch product stays ONNX Runtime's f32 GEMM.

Shapes (B squares of P patches of p x p pixels, R = P rows a square, P + 1 with a class row; N = B * R):
    x       (N, 3 * p * p) f32   each patch's normalised pixels, channel-major (the convolution's kernel order)
    pos     (N, dim) f32          the position rows of each row (the table repeated per square)
    cls     (N, 1) bool           mlp with a class token: the square's class row
    hidden  (B * P / m^2, text_dim) f32   the image's embeddings, square by square
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..models.spec import ModelSpec
from . import own_attention
from .builder import GraphPart, weight_layout
from .encoder import _EncoderBuilder


class _VisionBuilder(_EncoderBuilder):
    def activation(self, x: str) -> str:
        if self.cfg.ffn_act == "gelu_quick":  # x * sigmoid(1.702 x), ggml_gelu_quick
            scaled = self.node("Mul", [x, self.const("gelu_quick", np.array(1.702, np.float32))], "gq")
            return self.node("Mul", [x, self.node("Sigmoid", [scaled], "sg")], "gq")
        return super().activation(x)

    def blocks(self, h: str, width: int) -> str:
        """h (N, width) -> (B, P / m, m, P / m, m, width): each square's m x m blocks of patches."""
        v = self.spec.metadata["vision"]
        side = v["image_size"] // v["patch_size"]
        m = v["merge"]
        shape = np.array([-1, side // m, m, side // m, m, width], np.int64)
        return self.node("Reshape", [h, self.const(f"blocks_{width}", shape)], "blk")

    def projector(self, h: str) -> str:
        v, w, dim = self.spec.metadata["vision"], self.spec.weights, self.cfg.dim
        m = v["merge"]
        if v["projector"] == "idefics3":
            g = self.node("Transpose", [self.blocks(h, dim)], "shuffle", perm=[0, 1, 3, 2, 4, 5])
            rows = self.node("Reshape", [g, self.const("shuffled", np.array([-1, m * m * dim], np.int64))], "r")
            return self.linear(rows, w["mm.fc"])
        if v["projector"] == "gemma3":
            g = self.node("ReduceMean", [self.blocks(h, dim), self.const("pool_axes", np.array([2, 4], np.int64))],
                          "pool", keepdims=0)
            rows = self.node("Reshape", [g, self.const("pooled", np.array([-1, dim], np.int64))], "r")
            return self.linear(self.rmsnorm(rows, w["mm.norm"]), w["mm.proj"])
        if v["projector"] == "mlp":
            if v["class_token"]:  # each square's rows but its first
                R = v["image_size"] // v["patch_size"]
                R = R * R + 1
                sq = self.node("Reshape", [h, self.const("squares", np.array([-1, R, dim], np.int64))], "r")
                cut = self.node("Slice", [sq, self.const("from1", np.array([1], np.int64)),
                                          self.const("toR", np.array([R], np.int64)),
                                          self.const("axis1", np.array([1], np.int64))], "patches")
                h = self.node("Reshape", [cut, self.const("rows", np.array([-1, dim], np.int64))], "r")
            return self.dense(self.node("Gelu", [self.dense(h, "mm.0")], "gelu"), "mm.2")
        raise ValueError(f"no projector graph for {v['projector']!r}")


def build_vision(spec: ModelSpec, accuracy_level: int = 4) -> GraphPart:
    """The one graph of the image encoder ``spec`` (see the module docstring)."""
    cfg, v = spec.config, spec.metadata["vision"]
    b = _VisionBuilder(spec, weight_layout(spec), accuracy_level)
    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("x", F, ["N", 3 * v["patch_size"] ** 2]),
              helper.make_tensor_value_info("pos", F, ["N", cfg.dim])]
    if v.get("class_token"):
        inputs.append(helper.make_tensor_value_info("cls", TensorProto.BOOL, ["N", 1]))
    if not own_attention(spec):
        inputs += [helper.make_tensor_value_info("pad", I64, ["B", "T"]),
                   helper.make_tensor_value_info("unpad", I64, ["N"]),
                   helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "T"])]
    h = b.dense("x", "patch_embd")
    if v.get("class_token"):
        h = b.node("Where", ["cls", b.external("class_embd.weight", spec.weights["class_embd"].data), h], "cls")
    h = b.node("Add", [h, "pos"], "emb")
    if v.get("pre_norm"):
        h = b.layer_norm(h, "input_norm")
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        y = b.bias(b.attention(i, b.layer_norm(h, p + "attn_norm")), p + "attn_output.bias")
        h = b.node("Add", [h, y], "res")
        y = b.bias(b.mlp(i, b.layer_norm(h, p + "ffn_norm")), p + "ffn_down.bias")
        h = b.node("Add", [h, y], "res")
    out = b.projector(b.layer_norm(h, "output_norm") if v.get("post_norm", True) else h)
    return b.finish(0, inputs, [helper.make_tensor_value_info("hidden", F, ["M", v["text_dim"]])], {"hidden": out})
