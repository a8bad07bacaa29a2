"""Model families: what each GGUF ``general.architecture`` adds to the Llama decoder.

Every family is the Llama block (RMSNorm, attention with RoPE, gated MLP, residuals)
plus a few explicit differences, read from llama.cpp's model definitions
(``src/models/<arch>.cpp`` of the version llama-cpp-python vendors) and written down
here once, as data and one ``configure`` step per family:

==========  ======  =========================================================
family      RoPE    differences from ``llama``
==========  ======  =========================================================
llama       norm    (Llama 2/3.x, TinyLlama, SmolLM) llama3 frequency factors
                    (``rope_freqs``), linear RoPE scaling
qwen2       neox    biases on q, k, v
qwen3       neox    RMSNorm over each q and k head (``attn_q_norm``/``attn_k_norm``)
gemma2      neox    embeddings x sqrt(dim); GELU (tanh) MLP; norms after attention
                    and MLP too; attention scores soft-capped (50) and logits (30);
                    every other layer (even ones) a 4096-token sliding window;
                    tied classifier
gemma3      neox    as gemma2, without the attention soft-cap, plus q/k head
                    norms; 5 of 6 layers sliding (``sliding_window_pattern``),
                    with their own RoPE base (``rope.freq_base_swa``, default
                    10000) and no RoPE scaling
phi3        neox    q, k, v in one ``attn_qkv`` and gate|up in one ``ffn_up``;
                    LongRoPE factors (short or long by context) and their
                    attention factor; no sliding window (as llama.cpp)
bert        none    an encoder (``causal`` False): learned absolute positions
                    (``position_embd``), token type 0 added (``token_types``),
                    LayerNorm with biases on the embeddings and after attention
                    and MLP (post-norm), GELU (tanh) MLP without gate, biases on
                    the projections; no classifier; embeds, never generates
nomic-bert  neox    as bert, with RoPE instead of learned positions and a SwiGLU
                    MLP (``ffn_gate``), no biases on the MLP
==========  ======  =========================================================

``norm`` RoPE rotates adjacent pairs (x[2i], x[2i+1]); ``neox`` rotates the halves
(x[i], x[i + head_dim/2]). The graph builder reads only the ``ModelConfig`` fields
set here, never the family's name.
"""

from __future__ import annotations

import math

from ..errors import ModelLoadError


class Family:
    """The Llama decoder; subclasses name their differences."""

    name = "llama"
    rope_type = "norm"
    ffn_act = "silu"
    qkv_bias = False
    qk_norm = False
    post_norms = False
    embed_scale = False
    always_tied = False

    def configure(self, meta, cfg: dict, tensors: set[str]) -> dict:
        """Family-specific hyper-parameters, added to the common ones in ``cfg``
        (``meta``: the file's typed metadata; ``tensors``: its tensor names)."""
        return {}

    def config_fields(self, meta, cfg: dict, tensors: set[str]) -> dict:
        fields = dict(rope_type=self.rope_type, ffn_act=self.ffn_act, qkv_bias=self.qkv_bias,
                      qk_norm=self.qk_norm, post_norms=self.post_norms,
                      embed_scale=math.sqrt(cfg["dim"]) if self.embed_scale else 1.0,
                      fused_qkv="blk.0.attn_qkv.weight" in tensors,
                      rope_freqs="rope_freqs.weight" in tensors)
        if self.always_tied:
            fields["tied_output"] = True
        fields.update(_rope_scaling(meta, self.name))
        fields.update(self.configure(meta, cfg, tensors))
        return fields


def _rope_scaling(meta, arch: str) -> dict:
    """Linear RoPE scaling (positions / factor); other kinds are refused by name."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get_float(f"{arch}.rope.scaling.factor", 0.0)
    if kind in (None, "none") or (kind == "linear" and factor in (0.0, 1.0)):
        return {}
    if kind == "linear":
        if factor < 0:
            raise ModelLoadError(meta.path, f"{arch}.rope.scaling.factor={factor} must be positive")
        return {"rope_scale": 1.0 / factor}
    if kind == "longrope" and arch == "phi3":
        return {}
    raise ModelLoadError(meta.path, f"{arch}.rope.scaling.type={kind!r} is not supported "
                                    "(supported: none, linear; llama3 frequency factors; phi3 longrope)")


class Qwen2(Family):
    name = "qwen2"
    rope_type = "neox"
    qkv_bias = True


class Qwen3(Family):
    name = "qwen3"
    rope_type = "neox"
    qk_norm = True


def _swa_layers(meta, arch: str, num_layers: int, default_pattern: int) -> tuple[bool, ...]:
    """llama.cpp's ``load_swa_pattern``: an array of per-layer flags, or a period n
    whose last layer of every n is global (n = 0 or 1: every layer sliding/global)."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = meta.get(key)
    if isinstance(value, list):
        if len(value) != num_layers:
            raise ModelLoadError(meta.path, f"{key} has {len(value)} entries, expected {num_layers}")
        return tuple(bool(v) for v in value)
    n = meta.get_int(key, default_pattern)
    if n < 0:
        raise ModelLoadError(meta.path, f"{key}={n} must be >= 0")
    return tuple(n == 0 or i % n < n - 1 for i in range(num_layers))


def _gemma_attn_scale(cfg: dict, layers_27b: int) -> float:
    # gemma_pytorch's query_pre_attn_scalar: dim / heads for 27B, head_dim otherwise (as llama.cpp).
    if cfg["num_layers"] == layers_27b:
        return 1.0 / math.sqrt(cfg["dim"] / cfg["num_heads"])
    return 1.0 / math.sqrt(cfg["head_dim"])


class Gemma2(Family):
    name = "gemma2"
    rope_type = "neox"
    ffn_act = "gelu_tanh"
    post_norms = True
    embed_scale = True
    always_tied = True

    def configure(self, meta, cfg, tensors):
        a = self.name
        window = meta.get_int(f"{a}.attention.sliding_window", 4096)
        return dict(sliding_window=window, swa_layers=_swa_layers(meta, a, cfg["num_layers"], 2),
                    rope_theta_swa=meta.get_float(f"{a}.rope.freq_base_swa", cfg["rope_theta"]),
                    rope_scale_swa=None,
                    attn_softcap=meta.get_float(f"{a}.attn_logit_softcapping", 50.0),
                    final_softcap=meta.get_float(f"{a}.final_logit_softcapping", 30.0),
                    attn_scale=_gemma_attn_scale(cfg, 46))


class Gemma3(Gemma2):
    name = "gemma3"
    qk_norm = True
    always_tied = False  # an ``output`` weight is allowed (llama.cpp: TENSOR_NOT_REQUIRED)

    def configure(self, meta, cfg, tensors):
        a = self.name
        out = dict(final_softcap=meta.get_float(f"{a}.final_logit_softcapping", 0.0),
                   attn_scale=_gemma_attn_scale(cfg, 62))
        window = meta.get_int(f"{a}.attention.sliding_window", 0)
        if window > 0:
            out.update(sliding_window=window, swa_layers=_swa_layers(meta, a, cfg["num_layers"], 6),
                       rope_theta_swa=meta.get_float(f"{a}.rope.freq_base_swa", 10000.0), rope_scale_swa=1.0)
        return out


class Phi3(Family):
    name = "phi3"
    rope_type = "neox"

    def configure(self, meta, cfg, tensors):
        a = self.name
        # llama.cpp disables Phi-3's sliding window (its converters record it wrongly).
        return dict(fused_gate_up="blk.0.ffn_gate.weight" not in tensors,
                    rope_orig_context=meta.get_int(f"{a}.rope.scaling.original_context_length",
                                                   cfg["context_length"]),
                    rope_attn_factor=meta.get_float(f"{a}.rope.scaling.attn_factor", 1.0),
                    rope_factors="rope_factors_short.weight" in tensors)


class Bert(Family):
    """The BERT encoder as llama.cpp runs it (``src/models/bert.cpp``)."""

    name = "bert"
    ffn_act = "gelu_tanh"  # ggml_gelu is the tanh approximation
    learned_positions = True
    ffn_gated = False

    def configure(self, meta, cfg, tensors):
        a = self.name
        # llama.cpp requires the token type count, written by its converter (type_vocab_size).
        types = meta.get_int("tokenizer.ggml.token_type_count", -1)
        if types < 0:
            raise ModelLoadError(meta.path, f"{a} model needs tokenizer.ggml.token_type_count (llama.cpp: "
                                            "'model needs to define token type count')")
        eps_key = f"{a}.attention.layer_norm_epsilon"
        if eps_key not in meta.fields:
            raise ModelLoadError(meta.path, f"missing metadata key {eps_key!r}")
        return dict(causal=False, norm_type="layer", rms_eps=meta.get_float(eps_key, 1e-12),
                    learned_positions=self.learned_positions, ffn_gated=self.ffn_gated,
                    num_token_types=types, tied_output=False)


class NomicBert(Bert):
    name = "nomic-bert"
    rope_type = "neox"
    ffn_act = "silu"
    learned_positions = False
    ffn_gated = True


FAMILIES: dict[str, Family] = {f.name: f for f in (Family(), Qwen2(), Qwen3(), Gemma2(), Gemma3(), Phi3(), Bert(),
                                                   NomicBert())}
"""GGUF ``general.architecture`` -> its family."""


def family(path, arch) -> Family:
    """The family of ``arch``, or ModelLoadError listing the supported ones."""
    f = FAMILIES.get(arch) if isinstance(arch, str) else None
    if f is None and arch == "clip":
        raise ModelLoadError(path, "an image projector file (general.architecture 'clip'), not a text model: "
                                   "load the text model and pass this file as its mmproj (--mmproj FILE)")
    if f is None:
        raise ModelLoadError(path, f"unsupported architecture {arch!r} in general.architecture "
                                   f"(supported: {', '.join(FAMILIES)})")
    return f
