"""One in-memory description of a Llama-family model: hyper-parameters + weights.

Every loader (GGUF, llama2.c, ...) produces a ``ModelSpec``; the graph builder and
the runtime read nothing else. Weight matrices are stored the way ONNX Runtime
consumes them, so no second copy is ever made:

* ``f32``: a float32 array ``(out_features, in_features)``, used by ``Gemm(transB=1)``.
  For an F32 GGUF this is a read-only view of the memory-mapped file (zero copy).
* ``q8_0`` / ``q4_0``: ``MatMulNBits`` blobs ``(out_features, in_features / 32, 32 | 16)``
  uint8 (values stored unsigned: +128 for 8 bits, +8 for 4 bits, 4-bit low nibble
  first) and fp32 ``scales`` ``(out_features * in_features / 32,)``. GGUF Q8_0 and
  Q4_0 blocks map onto this exactly.
* the other GGML block types (``q6_k``, ``q4_k``, ``q5_0``, ...): ``MatMulNBits`` blobs
  with their own ``bits`` (2, 4, 8) and ``block_size`` (16, 32), and for some types
  uint8 ``zero_points`` and fp32 ``mins``; see ``quants.py`` for what ONNX Runtime accepts and
  the exactness of each mapping.
* a layer's matrices of the types our kernels multiply (``kernel_form``: Q4_K, Q6_K, Q5_0,
  Q8_0, Q4_0 in rows of whole 16s): ``data`` is the 16-row form of the file's blocks
  (uint8, 1-D, csrc/lmatmul.h), which ``kernels.LMatmul`` reads in place; no graph holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..tokenizer.spec import TokenizerSpec

QUANT_BLOCK = 32


def kernel_classifier_form(bits: int, zero_points: bool, block_size: int, cols: int) -> bool:
    """Whether our kernels multiply a classifier of this MatMulNBits form (``kernels.QMatmul``,
    read in place): 8 bits without zero points (Q8_0, Q6_K, Q5_0, IQ4_NL tables) in blocks
    of 16 or 32, rows of whole 32s. The one rule: ``ModelSpec.classifier_in_kernels`` applies
    it to a converted weight, the memory plan to a file's header."""
    return bits == 8 and not zero_points and block_size in (16, 32) and cols % 32 == 0


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder."""

    arch: str
    dim: int
    """Width of the residual stream (GGUF ``embedding_length``)."""
    hidden_dim: int
    """Width of the SwiGLU MLP (``feed_forward_length``)."""
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    """Trained context length: the default maximum number of positions."""
    rope_theta: float = 10000.0
    rope_dim: int = 0
    """Rotated dimensions per head (0 = head_dim)."""
    rms_eps: float = 1e-5
    tied_output: bool = False
    """The classifier is the token embedding (no separate ``output`` weight)."""
    # -- family differences (models/families.py); the defaults are Llama's ----------
    rope_type: str = "norm"
    """``norm``: rotate adjacent pairs (x[2i], x[2i+1]); ``neox``: the halves (x[i], x[i + d/2])."""
    rope_scale: float = 1.0
    """Linear RoPE scaling: angles are position * rope_scale (1 / the file's factor)."""
    rope_freqs: bool = False
    """Llama 3 frequency factors: the weight ``rope_freqs`` (head_dim / 2,) divides the angles."""
    rope_factors: bool = False
    """Phi-3 LongRoPE: ``rope_factors_short`` / ``rope_factors_long`` (head_dim / 2,) divide the
    angles (long when the context exceeds ``rope_orig_context``), cos/sin times ``rope_attn_factor``."""
    rope_orig_context: int = 0
    rope_attn_factor: float = 1.0
    sliding_window: int = 0
    """Tokens a sliding-window layer sees (0: no such layers)."""
    swa_layers: tuple = ()
    """Per layer: True where the layer attends through the sliding window."""
    rope_theta_swa: float = 0.0
    """RoPE base of sliding-window layers (0: rope_theta)."""
    rope_scale_swa: float | None = None
    """RoPE scale of sliding-window layers (None: rope_scale)."""
    attn_scale: float = 0.0
    """Multiplies q.k (0: 1 / sqrt(head_dim))."""
    attn_softcap: float = 0.0
    """> 0: attention scores become softcap * tanh(score / softcap)."""
    final_softcap: float = 0.0
    """> 0: logits become softcap * tanh(logit / softcap)."""
    embed_scale: float = 1.0
    """Token embeddings are multiplied by this (Gemma: sqrt(dim))."""
    ffn_act: str = "silu"
    """Gate activation of the MLP: ``silu`` (SwiGLU) or ``gelu_tanh`` (GeGLU)."""
    qkv_bias: bool = False
    """q, k, v projections have biases (``attn_q.bias`` ...)."""
    qk_norm: bool = False
    """RMSNorm over each head of q and k before RoPE (``attn_q_norm``, ``attn_k_norm``)."""
    post_norms: bool = False
    """RMSNorm on the attention and MLP outputs before their residual adds."""
    fused_qkv: bool = False
    """q, k, v in one ``attn_qkv`` weight (q_dim + 2 kv_dim, dim)."""
    fused_gate_up: bool = False
    """Gate and up in one ``ffn_up`` weight (2 hidden_dim, dim), gate first."""
    # -- encoders (BERT family: models/families.py's Bert, NomicBert) ----------------
    causal: bool = True
    """False: an encoder. Every token attends to every token of its text, the whole text
    runs in one pass and no KV cache is kept; the model embeds, it does not generate
    (graph/encoder.py, executor/encoder.py)."""
    norm_type: str = "rms"
    """``rms`` (RMSNorm, weight only) or ``layer`` (LayerNorm with weight and bias, epsilon
    ``rms_eps``), after attention and MLP (post-norm) in an encoder."""
    learned_positions: bool = False
    """Absolute positions from the ``position_embd`` table (BERT) instead of RoPE."""
    ffn_gated: bool = True
    """The MLP is act(gate) * up; False: act(up) (BERT's GELU MLP, no ``ffn_gate``)."""
    num_token_types: int = 0
    """Rows of ``token_types`` (BERT's segment embeddings): as llama.cpp, every token is of
    type 0, so only row 0 is added."""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_window(self, layer: int) -> int:
        """Sliding window of ``layer`` in tokens, 0 for a global layer."""
        return self.sliding_window if self.swa_layers and self.swa_layers[layer] else 0

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(RoPE base, RoPE scale) of ``layer``."""
        if self.layer_window(layer):
            scale = self.rope_scale if self.rope_scale_swa is None else self.rope_scale_swa
            return (self.rope_theta_swa or self.rope_theta), scale
        return self.rope_theta, self.rope_scale

    def differences(self) -> dict:
        """The family fields (those from ``rope_type`` on) that differ from Llama's
        defaults, for ``dualpath info``."""
        names = list(self.__dataclass_fields__)
        family = [n for n in names[names.index("rope_type"):] if n != "swa_layers"]
        out = {f: getattr(self, f) for f in family if getattr(self, f) != self.__dataclass_fields__[f].default}
        if self.swa_layers:
            out["sliding_layers"] = "".join("s" if w else "g" for w in self.swa_layers)
        return out

    @property
    def attention_scale(self) -> float:
        return self.attn_scale or 1.0 / float(np.sqrt(self.head_dim))


@dataclass
class Weight:
    """One weight tensor in the layout ONNX Runtime consumes (see module docstring)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    """Logical shape: ``(out_features, in_features)`` for matrices, ``(n,)`` for norms."""
    data: np.ndarray
    scales: np.ndarray | None = None
    source_type: str = ""
    """The type in the file (e.g. ``F16``), when it differs from ``dtype``."""
    bits: int = 0
    """MatMulNBits bits (2, 4, 8) of a quantized weight; 0 for float."""
    block_size: int = QUANT_BLOCK
    """MatMulNBits block size (values per scale) of a quantized weight."""
    zero_points: np.ndarray | None = None
    """fp32 ``(out_features * in_features / block_size,)`` MatMulNBits zero points, or None."""
    mins: np.ndarray | None = None
    """fp32 ``(out_features, in_features / block_size)``: the graph subtracts
    blocksum(x) @ mins^T from the MatMulNBits product (Q4_K, Q4_1, Q2_K, Q5_K, Q5_1), or None."""
    data_t: np.ndarray | None = None
    """f32 ``(in_features, out_features)``, contiguous: what the graphs' ``MatMul`` reads
    for a float matrix (the converted-model cache makes it; ``data`` may then be a view
    of it). ONNX Runtime's fp32 GEMV streams this layout faster than ``Gemm`` with
    ``transB`` over ``data`` (docs/performance.md)."""

    kernel_form: bool = False
    """``data`` is the 16-row form of the file's ``source_type`` blocks (uint8, 1-D,
    csrc/lmatmul.h): our kernels multiply it (``kernels.LMatmul``), read in place, and the
    graphs cut there (``builder.KERNEL_OP``) instead of holding a MatMulNBits copy."""

    ARRAYS = {"weight": "data", "scales": "scales", "zero_points": "zero_points", "mins": "mins",
              "weight_t": "data_t"}
    """Initializer suffix -> attribute holding its array."""

    def arrays(self) -> dict[str, np.ndarray]:
        """Initializer suffix -> array, for the arrays this weight has."""
        return {k: getattr(self, a) for k, a in self.ARRAYS.items() if getattr(self, a) is not None}

    @property
    def matmul_bits(self) -> int:
        """MatMulNBits bits of a quantized weight (Q8_0 and Q4_0 say so by their dtype); 0 for float."""
        if self.kernel_form:
            return 0
        return self.bits or {"q8_0": 8, "q4_0": 4}.get(self.dtype, 0)

    @property
    def nbytes(self) -> int:
        """Bytes of the weight's values (a float matrix counts once, whichever layouts it has)."""
        return int(sum(a.nbytes for k, a in self.arrays().items() if k != "weight_t"))


@dataclass
class ModelSpec:
    """A loaded model: where it came from, its hyper-parameters, tokenizer and weights.

    Weight names follow GGUF without the ``.weight`` suffix: ``token_embd``,
    ``output_norm``, ``output`` and ``blk.{i}.{attn_norm,attn_q,attn_k,attn_v,
    attn_output,ffn_norm,ffn_gate,ffn_down,ffn_up}``.
    """

    path: str
    format: str
    config: ModelConfig
    tokenizer: TokenizerSpec
    weights: dict[str, Weight]
    metadata: dict = field(default_factory=dict)
    """A few descriptive strings from the file (name, file type), for ``dualpath info``."""
    header_bytes: int = 0
    """Bytes of the file before its tensor data (header, metadata, tensor table): what the
    converted-model cache hashes to tell a changed file from its entry."""
    entry: Any = field(default=None, repr=False, compare=False)
    """The converted-model cache entry (models/store.py) whose mappings hold the arrays,
    or None for a spec converted in memory."""

    @property
    def output(self) -> Weight:
        return self.weights["token_embd"] if self.config.tied_output else self.weights["output"]

    @property
    def classifier_in_kernels(self) -> bool:
        """The classifier is ours (``kernels.QMatmul`` over the cached 8-bit form, read in
        place), not a graph's MatMulNBits, where ``kernel_classifier_form`` says so. ONNX
        Runtime packs its own copy of such a matrix at 10.7 or 12.8 bits a value against this
        form's 9 or 10 (docs/performance.md, memory), and the classifier is the largest
        matrix of a small model (Gemma 3 270M's tied 262,144 x 640 table)."""
        w = self.output
        if w.kernel_form:  # the file's blocks in our kernels' form (quants.kernel_form)
            return True
        return (w.data.ndim == 3 and kernel_classifier_form(w.matmul_bits, w.zero_points is not None or
                                                            w.mins is not None, w.block_size, w.shape[1]))

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights.values())

    def weight_types(self) -> dict[str, int]:
        """Bytes per in-memory weight type."""
        out: dict[str, int] = {}
        for w in self.weights.values():
            out[w.dtype] = out.get(w.dtype, 0) + w.nbytes
        return out


GATHERED_TABLES = ("token_embd", "position_embd", "token_types")
"""Tables read by row (embeddings), never multiplied as a graph's matrix (but a tied classifier)."""

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_down", "ffn_up")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Logical shape of every weight a model with ``cfg`` must have."""
    if not cfg.causal:
        return encoder_shapes(cfg)[0]
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd": (cfg.vocab_size, cfg.dim),
        "output_norm": (cfg.dim,),
    }
    if not cfg.tied_output:
        shapes["output"] = (cfg.vocab_size, cfg.dim)
    half = (cfg.head_dim // 2,)
    if cfg.rope_freqs:
        shapes["rope_freqs"] = half
    if cfg.rope_factors:
        shapes["rope_factors_short"] = shapes["rope_factors_long"] = half
    per_layer = {"attn_norm": (cfg.dim,), "attn_output": (cfg.dim, cfg.q_dim), "ffn_norm": (cfg.dim,),
                 "ffn_down": (cfg.dim, cfg.hidden_dim)}
    if cfg.fused_qkv:
        per_layer["attn_qkv"] = (cfg.q_dim + 2 * cfg.kv_dim, cfg.dim)
    else:
        per_layer.update(attn_q=(cfg.q_dim, cfg.dim), attn_k=(cfg.kv_dim, cfg.dim), attn_v=(cfg.kv_dim, cfg.dim))
    if cfg.qkv_bias:
        per_layer.update({"attn_q.bias": (cfg.q_dim,), "attn_k.bias": (cfg.kv_dim,), "attn_v.bias": (cfg.kv_dim,)})
    if cfg.qk_norm:
        per_layer.update(attn_q_norm=(cfg.head_dim,), attn_k_norm=(cfg.head_dim,))
    if cfg.post_norms:
        per_layer.update(post_attention_norm=(cfg.dim,), post_ffw_norm=(cfg.dim,))
    if cfg.fused_gate_up:
        per_layer["ffn_up"] = (2 * cfg.hidden_dim, cfg.dim)
    else:
        per_layer.update(ffn_gate=(cfg.hidden_dim, cfg.dim), ffn_up=(cfg.hidden_dim, cfg.dim))
    for i in range(cfg.num_layers):
        for name, shape in per_layer.items():
            shapes[f"blk.{i}.{name}"] = shape
    return shapes


def encoder_shapes(cfg: ModelConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The weights an encoder must have, and those it may have (biases, token types),
    each name -> its logical shape: the tensors llama.cpp's ``bert`` and ``nomic-bert``
    loaders require and accept."""
    d, q, kv, ff = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    required: dict[str, tuple[int, ...]] = {"token_embd": (cfg.vocab_size, d), "token_embd_norm": (d,),
                                            "token_embd_norm.bias": (d,)}
    optional: dict[str, tuple[int, ...]] = {}
    if cfg.learned_positions:
        required["position_embd"] = (cfg.context_length, d)
    if cfg.num_token_types:
        optional["token_types"] = (cfg.num_token_types, d)
    per_layer = {"attn_output": (d, q), "attn_output_norm": (d,), "attn_output_norm.bias": (d,),
                 "ffn_up": (ff, d), "ffn_down": (d, ff), "layer_output_norm": (d,), "layer_output_norm.bias": (d,)}
    maybe = {"attn_output.bias": (d,), "ffn_up.bias": (ff,), "ffn_down.bias": (d,)}
    if cfg.ffn_gated:
        per_layer["ffn_gate"] = (ff, d)
    maybe.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if cfg.fused_qkv:
        per_layer["attn_qkv"] = (q + 2 * kv, d)
        maybe["attn_qkv.bias"] = (q + 2 * kv,)
    else:
        per_layer.update(attn_q=(q, d), attn_k=(kv, d), attn_v=(kv, d))
    for i in range(cfg.num_layers):
        required.update((f"blk.{i}.{name}", shape) for name, shape in per_layer.items())
        optional.update((f"blk.{i}.{name}", shape) for name, shape in maybe.items())
    return required, optional


def check_config(path, cfg: ModelConfig) -> None:
    """Raise ModelLoadError when hyper-parameters are inconsistent."""
    from ..errors import ModelLoadError

    for name in ("dim", "hidden_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "vocab_size", "context_length"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value <= 0:
            raise ModelLoadError(path, f"hyper-parameter {name}={value!r} must be a positive integer")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelLoadError(path, f"num_heads={cfg.num_heads} is not a multiple of num_kv_heads={cfg.num_kv_heads}")
    if cfg.head_dim % 2:
        raise ModelLoadError(path, f"head_dim={cfg.head_dim} must be even for RoPE")
    if cfg.rope_dim not in (0, cfg.head_dim):
        raise ModelLoadError(path, f"partial rotary embeddings (rope dimension {cfg.rope_dim} of head_dim "
                                   f"{cfg.head_dim}) are not supported")
    if not (cfg.rms_eps > 0 and cfg.rope_theta > 0):
        raise ModelLoadError(path, f"rms_eps={cfg.rms_eps} and rope_theta={cfg.rope_theta} must be positive")
    if cfg.sliding_window < 0 or (cfg.swa_layers and len(cfg.swa_layers) != cfg.num_layers):
        raise ModelLoadError(path, f"sliding window {cfg.sliding_window} must be >= 0 with one flag per layer")
    for name in ("attn_softcap", "final_softcap", "attn_scale", "rope_theta_swa"):
        value = getattr(cfg, name)
        if not (value >= 0 and np.isfinite(value)):
            raise ModelLoadError(path, f"hyper-parameter {name}={value} must be a finite number >= 0")
    if not (cfg.rope_scale > 0 and np.isfinite(cfg.rope_scale)):
        raise ModelLoadError(path, f"RoPE scale {cfg.rope_scale} must be positive")


def check_weights(path, cfg: ModelConfig, weights: dict[str, Weight]) -> None:
    """Raise ModelLoadError for a missing tensor or a shape mismatch."""
    from ..errors import ModelLoadError

    optional = {} if cfg.causal else encoder_shapes(cfg)[1]
    for name, shape in (expected_shapes(cfg) | optional).items():
        w = weights.get(name)
        if w is None:
            if name in optional:
                continue
            raise ModelLoadError(path, f"missing tensor {name!r} (expected shape {shape})")
        if tuple(w.shape) != shape:
            raise ModelLoadError(path, f"tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if w.dtype != "f32" and len(shape) == 1:
            raise ModelLoadError(path, f"tensor {name!r} is {w.dtype}; norm weights must be float")
