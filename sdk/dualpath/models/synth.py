"""Synthetic GGUF models: random weights with the real shapes of known models.

For performance work only. Files are written with the ``gguf`` package in the
layout llama.cpp writes, so llama.cpp loads the very same file. Their text is
noise: the weights are random.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

import numpy as np

from .synth_encoder import ALWAYS_F32, ENCODER_ARCHES, add_encoder_keys, add_encoder_vocabulary, encoder_tensor_list
from .synth_rank import QWEN3_SPECIAL_PIECES, add_decoder_rank_keys, add_encoder_rank_keys, head_tensor_list

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    dim: int
    hidden_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int = 32000
    context_length: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    arch: str = "llama"
    """GGUF ``general.architecture`` (a family of models/families.py)."""
    head_dim: int = 0
    """0: dim / num_heads."""
    tied: bool = False
    """No ``output`` weight: the classifier is the token embedding."""
    sliding_window: int = 0
    swa_pattern: int = 0
    """Written as ``sliding_window_pattern`` when set (else the family's default)."""
    rope_freqs: bool = False
    """Llama 3 frequency factors (a ``rope_freqs`` tensor)."""
    rope_factors: bool = False
    """Phi-3 LongRoPE factors (``rope_factors_short``/``_long``), original context half the context."""
    pooling: int = 1
    """``pooling_type`` (llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank): always written for
    an encoder, for a decoder only when not 1 (an embedder or a reranker, as the converter writes
    Qwen3-Embedding and Qwen3-Reranker)."""
    vocab: str = ""
    """An encoder's vocabulary: "" WordPiece (BERT's), "t5" SentencePiece Unigram in XLM-R's
    layout (synth_unigram.py)."""
    token_types: int = 2
    """An encoder's ``token_type_count`` (BERT's type_vocab_size; XLM-R has 1)."""
    classifier_labels: tuple[str, ...] = ()
    """A reranker's ``classifier.output_labels``: one ``cls.output`` row per label."""
    classifier_dense: bool = False
    """A ``cls`` dense layer (then tanh) before ``cls.output`` (RoBERTa's head, as the converter
    writes it); without it the head is the one projection (BertForSequenceClassification)."""
    init_std: float = 0.02
    """Standard deviation of the random matrices (larger in the tiny test shapes, so
    that every layer moves the output and greedy text does not repeat one token)."""

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.num_heads


PRESETS: dict[str, Shape] = {
    # Karpathy's tinyllamas (llama2.c), Llama-2 tokenizer size.
    "stories15M": Shape(dim=288, hidden_dim=768, num_layers=6, num_heads=6, num_kv_heads=6),
    "stories42M": Shape(dim=512, hidden_dim=1376, num_layers=8, num_heads=8, num_kv_heads=8),
    "stories110M": Shape(dim=768, hidden_dim=2048, num_layers=12, num_heads=12, num_kv_heads=12),
    # TinyLlama-1.1B: 22 layers, GQA 32 query heads over 4 KV heads.
    "tinyllama-1.1b": Shape(dim=2048, hidden_dim=5632, num_layers=22, num_heads=32, num_kv_heads=4),
    # Small, with every row a multiple of 256 (K-quant super-blocks): for quantization tests.
    "kquant-tiny": Shape(dim=256, hidden_dim=768, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=4096,
                         context_length=512),
    # The popular small models' shapes (from their config.json), and a tiny twin of each
    # family for tests (rows multiples of 256; windows shorter than a test's sequence).
    "llama3.2-1b": Shape(dim=2048, hidden_dim=8192, num_layers=16, num_heads=32, num_kv_heads=8, vocab_size=128256,
                         context_length=131072, rope_theta=500000.0, tied=True, rope_freqs=True),
    "smollm2-135m": Shape(dim=576, hidden_dim=1536, num_layers=30, num_heads=9, num_kv_heads=3, vocab_size=49152,
                          context_length=8192, rope_theta=100000.0, tied=True),
    "qwen2.5-0.5b": Shape(dim=896, hidden_dim=4864, num_layers=24, num_heads=14, num_kv_heads=2, vocab_size=151936,
                          context_length=32768, rope_theta=1000000.0, rms_eps=1e-6, arch="qwen2", tied=True),
    "qwen2.5-1.5b": Shape(dim=1536, hidden_dim=8960, num_layers=28, num_heads=12, num_kv_heads=2, vocab_size=151936,
                          context_length=32768, rope_theta=1000000.0, rms_eps=1e-6, arch="qwen2", tied=True),
    "qwen3-0.6b": Shape(dim=1024, hidden_dim=3072, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                        vocab_size=151936, context_length=40960, rope_theta=1000000.0, rms_eps=1e-6, arch="qwen3",
                        tied=True),
    "gemma2-2b": Shape(dim=2304, hidden_dim=9216, num_layers=26, num_heads=8, num_kv_heads=4, head_dim=256,
                       vocab_size=256000, context_length=8192, rms_eps=1e-6, arch="gemma2", tied=True,
                       sliding_window=4096),
    "gemma3-1b": Shape(dim=1152, hidden_dim=6912, num_layers=26, num_heads=4, num_kv_heads=1, head_dim=256,
                       vocab_size=262144, context_length=32768, rope_theta=1000000.0, rms_eps=1e-6, arch="gemma3",
                       tied=True, sliding_window=512),
    "gemma3-4b": Shape(dim=2560, hidden_dim=10240, num_layers=34, num_heads=8, num_kv_heads=4, head_dim=256,
                       vocab_size=262208, context_length=131072, rope_theta=1000000.0, rms_eps=1e-6, arch="gemma3",
                       tied=True, sliding_window=1024),
    "phi3-mini": Shape(dim=3072, hidden_dim=8192, num_layers=32, num_heads=32, num_kv_heads=32, vocab_size=32064,
                       context_length=4096, arch="phi3"),
    "llama3-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=2048,
                         context_length=512, rope_theta=500000.0, tied=True, rope_freqs=True, init_std=0.08),
    "qwen2-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=2048,
                        context_length=512, rope_theta=1000000.0, rms_eps=1e-6, arch="qwen2", init_std=0.08),
    "qwen3-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=128,
                        vocab_size=2048, context_length=512, rope_theta=1000000.0, rms_eps=1e-6, arch="qwen3",
                        init_std=0.08),
    "gemma2-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=256,
                         vocab_size=2048, context_length=512, rms_eps=1e-6, arch="gemma2", tied=True,
                         sliding_window=12, init_std=0.08),
    "gemma3-tiny": Shape(dim=256, hidden_dim=512, num_layers=3, num_heads=4, num_kv_heads=1, head_dim=64,
                         vocab_size=2048, context_length=512, rope_theta=1000000.0, rms_eps=1e-6, arch="gemma3",
                         tied=True, sliding_window=10, swa_pattern=3, init_std=0.08),
    # Encoders (BERT family): sentence-transformers' all-MiniLM-L6-v2 (mean pooling) and
    # BAAI's bge-small-en-v1.5 (CLS pooling), LayerNorm epsilon 1e-12; a tiny twin of each family.
    "all-minilm-l6": Shape(dim=384, hidden_dim=1536, num_layers=6, num_heads=12, num_kv_heads=12,
                           vocab_size=30522, context_length=512, rms_eps=1e-12, arch="bert"),
    "bge-small": Shape(dim=384, hidden_dim=1536, num_layers=12, num_heads=12, num_kv_heads=12,
                       vocab_size=30522, context_length=512, rms_eps=1e-12, arch="bert", pooling=2),
    "bert-tiny": Shape(dim=128, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=1024,
                       context_length=128, rms_eps=1e-12, arch="bert", init_std=0.08),
    "nomic-bert-tiny": Shape(dim=128, hidden_dim=256, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=1024,
                             context_length=128, rope_theta=1000.0, rms_eps=1e-12, arch="nomic-bert",
                             init_std=0.08),
    # XLM-RoBERTa encoders (SentencePiece Unigram vocabulary, llama.cpp's "bert" graph): BAAI's
    # bge-m3 (XLM-R large, CLS pooling, LayerNorm epsilon 1e-5, one token type, 8194 positions
    # less the two the converter cuts), intfloat's multilingual-e5-small (a BERT with XLM-R's
    # vocabulary padded to 250,037, mean pooling), and a tiny twin.
    "bge-m3": Shape(dim=1024, hidden_dim=4096, num_layers=24, num_heads=16, num_kv_heads=16, vocab_size=250002,
                    context_length=8192, arch="bert", pooling=2, vocab="t5", token_types=1),
    "multilingual-e5-small": Shape(dim=384, hidden_dim=1536, num_layers=12, num_heads=12, num_kv_heads=12,
                                   vocab_size=250037, context_length=512, rms_eps=1e-12, arch="bert", vocab="t5"),
    "xlmr-tiny": Shape(dim=128, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=1002,
                       context_length=128, arch="bert", vocab="t5", token_types=1, init_std=0.08),
    # Rerankers, as llama.cpp's converter writes them: cross-encoder/ms-marco-MiniLM-L-6-v2
    # (BertForSequenceClassification: one label, the projection alone; the converter drops
    # the pooler), and tiny twins: that head, and RoBERTa's dense + tanh head with three labels.
    "ms-marco-minilm-l6": Shape(dim=384, hidden_dim=1536, num_layers=6, num_heads=12, num_kv_heads=12,
                                vocab_size=30522, context_length=512, rms_eps=1e-12, arch="bert", pooling=4,
                                classifier_labels=("LABEL_0",)),
    "bert-rerank-tiny": Shape(dim=128, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=1024,
                              context_length=128, rms_eps=1e-12, arch="bert", init_std=0.08, pooling=4,
                              classifier_labels=("LABEL_0",)),
    "bert-rerank-dense-tiny": Shape(dim=128, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=4,
                                    vocab_size=1024, context_length=128, rms_eps=1e-12, arch="bert", init_std=0.08,
                                    pooling=4, classifier_labels=("contradiction", "entailment", "neutral"),
                                    classifier_dense=True),
    # BAAI's bge-reranker-base (XLM-RoBERTa base with RoBERTa's dense + tanh head, one label,
    # a SentencePiece Unigram vocabulary) and its tiny twin.
    "bge-reranker-base": Shape(dim=768, hidden_dim=3072, num_layers=12, num_heads=12, num_kv_heads=12,
                               vocab_size=250002, context_length=512, rms_eps=1e-5, arch="bert", vocab="t5",
                               token_types=1, pooling=4, classifier_labels=("LABEL_0",), classifier_dense=True),
    "xlmr-rerank-tiny": Shape(dim=128, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=1002,
                              context_length=128, rms_eps=1e-5, arch="bert", vocab="t5", token_types=1, init_std=0.08,
                              pooling=4, classifier_labels=("LABEL_0",), classifier_dense=True),
    # Qwen3-Embedding-0.6B (last-token pooling) and Qwen3-Reranker-0.6B (rank: ``cls.output`` holds
    # the LM head's rows of "yes" and "no", scored through the file's rerank template), tied,
    # vocabulary 151,669; and their tiny twins (1,024 positions: a rerank prompt is ~230 tokens,
    # and a step of pairs must stay within the RoPE table's rows).
    "qwen3-embedding-0.6b": Shape(dim=1024, hidden_dim=3072, num_layers=28, num_heads=16, num_kv_heads=8,
                                  head_dim=128, vocab_size=151669, context_length=32768, rope_theta=1000000.0,
                                  rms_eps=1e-6, arch="qwen3", tied=True, pooling=3),
    "qwen3-reranker-0.6b": Shape(dim=1024, hidden_dim=3072, num_layers=28, num_heads=16, num_kv_heads=8,
                                 head_dim=128, vocab_size=151669, context_length=40960, rope_theta=1000000.0,
                                 rms_eps=1e-6, arch="qwen3", tied=True, pooling=4, classifier_labels=("yes", "no")),
    "qwen3-embedding-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=128,
                                  vocab_size=2048, context_length=1024, rope_theta=1000000.0, rms_eps=1e-6,
                                  arch="qwen3", tied=True, init_std=0.08, pooling=3),
    "qwen3-reranker-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=128,
                                 vocab_size=2048, context_length=1024, rope_theta=1000000.0, rms_eps=1e-6,
                                 arch="qwen3", tied=True, init_std=0.08, pooling=4, classifier_labels=("yes", "no")),
    "phi3-tiny": Shape(dim=256, hidden_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=2048,
                       context_length=512, arch="phi3", rope_factors=True, init_std=0.08),
}


def preset_for(arch: str | None, preset: str | None) -> str:
    """The preset ``dualpath synth --arch/--preset`` names: the preset when given (it
    must be of ``arch``), else ``arch``'s tiny test shape, else stories15M."""
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        if arch is not None and PRESETS[preset].arch != arch:
            raise ValueError(f"preset {preset!r} is a {PRESETS[preset].arch} model, not {arch}; presets of {arch}: "
                             f"{', '.join(n for n, p in PRESETS.items() if p.arch == arch)}")
        return preset
    if arch is None:
        return "stories15M"
    tiny = "llama3-tiny" if arch == "llama" else f"{arch}-tiny"
    if tiny not in PRESETS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of "
                         f"{', '.join(sorted({p.arch for p in PRESETS.values()}))}")
    return tiny


TYPES = ("F32", "F16", "Q8_0", "Q4_0")
"""Types written here (norms stay F32)."""
LLAMA_CPP_TYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q3_K_M", "Q2_K", "Q5_0", "Q5_1", "Q4_1",
                   "IQ4_NL")
"""llama.cpp file types (``LLAMA_FTYPE_MOSTLY_*``), made by llama-cpp-python's quantizer from an F32 file."""
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7}


def synth_vocab(vocab_size: int, seed: int = 0) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: <unk>, <s>, </s>, 256 byte tokens, then pieces
    built up as merges of shorter pieces (so BPE reaches them), scored by rank."""
    from ..tokenizer.spec import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    chars = list("\u2581etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,!?'\"-:;()")
    pieces: list[str] = []
    seen = set()
    for c in chars:
        pieces.append(c)
        seen.add(c)
    rng = np.random.default_rng(seed)
    want = vocab_size - len(tokens)
    while len(pieces) < want:
        # Merge two existing pieces, favouring early (frequent) ones, as BPE training does.
        a = pieces[int(rng.zipf(1.3)) % len(pieces)]
        b = pieces[int(rng.zipf(1.3)) % len(pieces)]
        p = a + b
        if len(p) <= 16 and p not in seen and "\u2581" not in b:
            seen.add(p)
            pieces.append(p)
    pieces = pieces[:want]
    tokens += pieces
    types += [TOKEN_NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def synth_gguf(path: str | os.PathLike, preset: str = "stories15M", weight_type: str = "F32",
               seed: int = 0, context_length: int | None = None, extra_tokens: tuple = ()) -> str:
    """Write a GGUF with random weights in ``preset``'s shapes; returns the path.
    ``extra_tokens``: (piece, token type) pairs that end the vocabulary (a vision model's
    markers, which llama.cpp's ``mtmd`` looks up by their text)."""
    import gguf

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    weight_type = weight_type.upper()
    if weight_type in LLAMA_CPP_TYPES:
        path = os.fspath(path)
        src = synth_gguf(path + ".f32.part", preset, "F32", seed, context_length, extra_tokens)
        try:
            quantize_gguf(src, path + ".part", weight_type)
        finally:
            os.remove(src)
        os.replace(path + ".part", path)
        return path
    if weight_type not in TYPES:
        raise ValueError(f"unknown weight type {weight_type!r}; choose one of {', '.join(TYPES + LLAMA_CPP_TYPES)}")
    shape = PRESETS[preset]
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".part"

    w = gguf.GGUFWriter(tmp, shape.arch)
    w.add_name(f"dualpath-synth-{preset}-{weight_type}-seed{seed}")
    w.add_description("random weights with real shapes, written by `dualpath synth`; its text is noise")
    ctx = context_length or shape.context_length
    if shape.arch in ENCODER_ARCHES:
        add_encoder_keys(w, shape, _FILE_TYPE[weight_type], ctx)
        add_encoder_vocabulary(w, shape, seed)
        add_encoder_rank_keys(w, shape)
        tensors = encoder_tensor_list(replace(shape, context_length=ctx))
    else:
        _add_hyperparameters(w, shape, weight_type, ctx)
        _add_vocabulary(w, shape, seed, extra_tokens)
        add_decoder_rank_keys(w, shape)
        tensors = _tensor_list(shape)
    tensors += head_tensor_list(shape)
    _write_tensors(w, tensors, weight_type, seed)
    w.close()
    os.replace(tmp, path)
    log.info("wrote %s (%s, %s)", path, preset, weight_type)
    return path


def _add_hyperparameters(w, shape: Shape, weight_type: str, ctx: int) -> None:
    """``shape``'s hyper-parameters as the GGUF keys llama.cpp reads for its family."""
    arch, head_dim = shape.arch, shape.hd
    w.add_context_length(ctx)
    w.add_embedding_length(shape.dim)
    w.add_feed_forward_length(shape.hidden_dim)
    w.add_block_count(shape.num_layers)
    w.add_head_count(shape.num_heads)
    w.add_head_count_kv(shape.num_kv_heads)
    if shape.head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.vocab_size)
    w.add_file_type(_FILE_TYPE[weight_type])
    if shape.sliding_window:
        w.add_sliding_window(shape.sliding_window)
    if shape.swa_pattern:
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", shape.swa_pattern)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    if shape.rope_factors:
        w.add_string(f"{arch}.rope.scaling.type", "longrope")
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", ctx // 2)
        w.add_float32(f"{arch}.rope.scaling.attn_factor", 1.19)


def _add_vocabulary(w, shape: Shape, seed: int, extra_tokens: tuple = ()) -> None:
    """A ``synth_vocab`` SentencePiece vocabulary of ``shape.vocab_size`` tokens, ending in
    ``extra_tokens`` ((piece, type) pairs)."""
    tokens, scores, types = synth_vocab(shape.vocab_size, seed)
    if extra_tokens:
        n = len(extra_tokens)
        tokens[-n:], types[-n:] = [p for p, _ in extra_tokens], [t for _, t in extra_tokens]
    if shape.arch == "phi3":  # llama.cpp looks these up by name in a Phi-3 vocabulary
        from ..tokenizer.spec import TOKEN_CONTROL

        tokens[-2:], types[-2:] = ["<|end|>", "<|endoftext|>"], [TOKEN_CONTROL, TOKEN_CONTROL]
    if shape.arch == "qwen3" and shape.classifier_labels:  # what the rerank template names
        n = len(QWEN3_SPECIAL_PIECES)
        tokens[-n:], types[-n:] = [p for p, _ in QWEN3_SPECIAL_PIECES], [t for _, t in QWEN3_SPECIAL_PIECES]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _tensor_list(shape: Shape) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, (out, in) or (n,), init std) per tensor; names in llama.cpp's order. std 0: a
    norm (around 1); std < 0: positive factors (RoPE frequency factors, 1 .. 1 + |std|)."""
    arch, head_dim, std = shape.arch, shape.hd, shape.init_std
    q_dim, kv_dim = head_dim * shape.num_heads, head_dim * shape.num_kv_heads
    tensors: list[tuple[str, tuple[int, ...], float]] = [("token_embd.weight", (shape.vocab_size, shape.dim), std)]
    if shape.rope_freqs:
        tensors.append(("rope_freqs.weight", (head_dim // 2,), -8.0))
    if shape.rope_factors:
        tensors += [("rope_factors_long.weight", (head_dim // 2,), -4.0),
                    ("rope_factors_short.weight", (head_dim // 2,), -0.5)]
    for i in range(shape.num_layers):
        p = f"blk.{i}."
        tensors.append((p + "attn_norm.weight", (shape.dim,), 0.0))
        if arch == "phi3":
            tensors.append((p + "attn_qkv.weight", (q_dim + 2 * kv_dim, shape.dim), std))
        else:
            tensors += [(p + "attn_q.weight", (q_dim, shape.dim), std),
                        (p + "attn_k.weight", (kv_dim, shape.dim), std),
                        (p + "attn_v.weight", (kv_dim, shape.dim), std)]
        if arch == "qwen2":
            tensors += [(p + "attn_q.bias", (q_dim,), 0.5), (p + "attn_k.bias", (kv_dim,), 0.5),
                        (p + "attn_v.bias", (kv_dim,), 0.5)]
        if arch in ("qwen3", "gemma3"):
            tensors += [(p + "attn_q_norm.weight", (head_dim,), 0.0), (p + "attn_k_norm.weight", (head_dim,), 0.0)]
        tensors.append((p + "attn_output.weight", (shape.dim, q_dim), std))
        if arch in ("gemma2", "gemma3"):
            tensors.append((p + "post_attention_norm.weight", (shape.dim,), 0.0))
        tensors.append((p + "ffn_norm.weight", (shape.dim,), 0.0))
        if arch == "phi3":
            tensors += [(p + "ffn_down.weight", (shape.dim, shape.hidden_dim), std),
                        (p + "ffn_up.weight", (2 * shape.hidden_dim, shape.dim), std)]
        else:
            tensors += [(p + "ffn_gate.weight", (shape.hidden_dim, shape.dim), std),
                        (p + "ffn_down.weight", (shape.dim, shape.hidden_dim), std),
                        (p + "ffn_up.weight", (shape.hidden_dim, shape.dim), std)]
        if arch in ("gemma2", "gemma3"):
            tensors.append((p + "post_ffw_norm.weight", (shape.dim,), 0.0))
    tensors.append(("output_norm.weight", (shape.dim,), 0.0))
    if not shape.tied:
        tensors.append(("output.weight", (shape.vocab_size, shape.dim), std))
    return tensors


def _write_tensors(w, tensors: list[tuple[str, tuple[int, ...], float]], weight_type: str, seed: int) -> None:
    """The header, then ``tensors``' random data in ``weight_type`` (norms stay F32).

    Pass 1 writes the tensor infos (shapes and byte sizes); pass 2 streams the data with
    the same seed, so the whole model is never in memory at once."""
    import gguf

    rng = np.random.default_rng(seed)
    qtype = getattr(gguf.GGMLQuantizationType, weight_type)

    def make(shp, std):
        if std == 0.0:  # norm weights: around 1, as trained models have
            return (1.0 + 0.1 * rng.standard_normal(shp, dtype=np.float32)).astype(np.float32)
        if std < 0.0:  # frequency factors: 1 .. 1 + |std|, rising with the dimension
            return (1.0 - std * np.linspace(0, 1, shp[0]) ** 2).astype(np.float32)
        return rng.standard_normal(shp, dtype=np.float32) * np.float32(std)

    def encode(arr, name):
        if arr.ndim == 1 or weight_type == "F32" or name in ALWAYS_F32:  # as llama.cpp writes them
            return arr, gguf.GGMLQuantizationType.F32
        if weight_type == "F16":
            return arr.astype(np.float16), gguf.GGMLQuantizationType.F16
        return gguf.quants.quantize(arr, qtype), qtype

    for name, shp, _std in tensors:
        nbytes, raw = _encoded_size(shp, weight_type if len(shp) == 2 and name not in ALWAYS_F32 else "F32")
        dtype: np.dtype
        if raw in ("F32", "F16"):
            dtype, info_shape = np.dtype(np.float32 if raw == "F32" else np.float16), shp
        else:  # quantized tensors are described by their byte shape
            dtype, info_shape = np.dtype(np.uint8), (shp[0], nbytes // shp[0])
        w.add_tensor_info(name, info_shape, dtype, nbytes, raw_dtype=getattr(gguf.GGMLQuantizationType, raw))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, std in tensors:
        data, _ = encode(make(shp, std), name)
        w.write_tensor_data(data)


def _encoded_size(shape: tuple[int, ...], type_name: str) -> tuple[int, str]:
    n = int(np.prod(shape))
    if type_name == "F32":
        return 4 * n, "F32"
    if type_name == "F16":
        return 2 * n, "F16"
    block_bytes = {"Q8_0": 34, "Q4_0": 18}[type_name]
    return n // 32 * block_bytes, type_name


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, file_type: str, pure: bool = False,
                  num_threads: int = 2) -> str:
    """Quantize the GGUF ``src`` into ``dst`` with llama.cpp (llama-cpp-python's
    ``llama_model_quantize``) as ``LLAMA_FTYPE_MOSTLY_<file_type>``, e.g. "Q4_K_M".
    ``pure``: every matrix in that one type (llama.cpp's ``--pure``), instead of its
    per-tensor mix. Raises ValueError for an unknown type, RuntimeError without
    llama-cpp-python or when llama.cpp fails."""
    try:
        import llama_cpp
    except ImportError as e:
        raise RuntimeError(f"quantizing to {file_type} needs llama-cpp-python (pip install llama-cpp-python)") from e
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type.upper()}", None)
    if ftype is None:
        raise ValueError(f"llama.cpp has no file type {file_type!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = num_threads
    params.pure = pure
    # llama-cpp-python prints llama.cpp's log (a line per tensor here) unless its logger
    # is raised; keep it only when our own log is verbose.
    peer_log = logging.getLogger("llama-cpp-python")
    level = peer_log.level
    if not log.isEnabledFor(logging.DEBUG):
        peer_log.setLevel(logging.ERROR)
    try:
        status = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dst), params)
    finally:
        peer_log.setLevel(level)
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {file_type} (status {status})")
    return os.fspath(dst)


DEFAULT_PRESET = "stories15M"
"""The benchmarks' default synthetic shape (``--model synth:stories15M``): F32, seed 0."""


def synth_model_path(context_length: int | None = None, preset: str = DEFAULT_PRESET) -> str:
    """Where a synthetic model of ``preset`` (F32, seed 0) lives, in the user's cache.
    One file per recorded context length; the preset's own is the plain file."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    ctx = "" if context_length in (None, PRESETS[preset].context_length) else f"-ctx{context_length}"
    return os.path.join(root, "dualpath", f"synth-{preset}-F32-seed0{ctx}.gguf")


def ensure_synth_model(context_length: int | None = None, preset: str = DEFAULT_PRESET) -> tuple[str, bool]:
    """Path of the synthetic model of ``preset`` recording ``context_length`` (default:
    the preset's), synthesizing it on first use. Returns (path, created)."""
    path = synth_model_path(context_length, preset)
    if os.path.isfile(path):
        return path, False
    from .private_files import make_dirs

    make_dirs(os.path.dirname(path))  # ~/.cache/dualpath: 0700 where this makes it
    synth_gguf(path, preset, "F32", seed=0, context_length=context_length)
    return path, True
