"""llama2.c checkpoints (Karpathy's ``run.c`` format).

Legacy ("version 0") layout, little-endian: 7 x int32
``dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len`` then float32
arrays, row-major ``(out, in)``, each stacked over layers::

    token_embedding (vocab, dim)          rms_att (L, dim)
    wq (L, dim, dim)  wk (L, kv_dim, dim)  wv (L, kv_dim, dim)  wo (L, dim, dim)
    rms_ffn (L, dim)  w1 (L, hidden, dim)  w2 (L, dim, hidden)  w3 (L, hidden, dim)
    rms_final (dim)   freq_cis_real/imag (seq_len, head_dim / 2) each, unused
    wcls (vocab, dim) only when vocab_size < 0 (classifier not shared)

``export.py`` version 1 (magic ``ak42``, 256-byte header, fp32) is read too.
Weights are zero-copy views of the memory-mapped file. RoPE theta is 10000 and
the RMSNorm epsilon 1e-5, as in run.c.
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np

from ..errors import ModelLoadError
from .files import read_magic
from .spec import ModelConfig, ModelSpec, Weight, check_config, check_weights

MAGIC_V1 = 0x616B3432  # "ak42"


def load_llama2c(path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
                 sink=None) -> ModelSpec:
    from ..tokenizer import load_llama2c_tokenizer

    path = os.fspath(path)
    read_magic(path)
    size = os.path.getsize(path)
    cfg, version, offset = _read_header(path)
    order = _layout(cfg, version)
    num_floats = sum(math.prod(s) for _, s in order)  # Python ints: np.prod wraps around past 2**63
    expected = offset + 4 * num_floats
    if size < expected:
        raise ModelLoadError(path, f"truncated: {size} bytes, the header (dim={cfg.dim}, n_layers={cfg.num_layers}, "
                                   f"vocab={cfg.vocab_size}) needs {expected}")
    if size > expected:
        raise ModelLoadError(path, f"{size - expected} unexpected trailing bytes after {expected}: "
                                   "wrong header or an unsupported llama2.c export version")
    flat = np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=(num_floats,))
    arrays = {}
    pos = 0
    for name, shape in order:
        n = math.prod(shape)
        arrays[name] = flat[pos:pos + n].reshape(shape)
        pos += n
    weights = _weights(arrays, cfg, sink)
    check_weights(path, cfg, weights)

    tok_path = _find_tokenizer(path, tokenizer_path, cfg.vocab_size)
    tok = load_llama2c_tokenizer(tok_path, vocab_size=cfg.vocab_size)
    return ModelSpec(path=path, format="llama2c", config=cfg, tokenizer=tok, weights=weights,
                     metadata={"name": os.path.basename(path), "file_type": "F32",
                               "tensor_types": ["F32"], "tokenizer_path": tok_path},
                     header_bytes=offset)


def _read_header(path: str) -> tuple[ModelConfig, int, int]:
    """(the checked hyper-parameters, the export version (0 or 1), the first weight's offset)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read: {e.strerror or e}") from e
    if len(head) < 28:
        raise ModelLoadError(path, f"truncated: {len(head)} bytes, a llama2.c header needs 28")
    magic, version = struct.unpack_from("<Ii", head, 0)
    if magic == MAGIC_V1:
        if version != 1:
            raise ModelLoadError(path, f"llama2.c export version {version} is not supported (supported: 0 and 1)")
        if len(head) < 256:
            raise ModelLoadError(path, "truncated version-1 header (needs 256 bytes)")
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", head, 8)
        shared = bool(head[36])
        version, offset = 1, 256
    else:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", head, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        version, offset = 0, 28
    for name, value in (("dim", dim), ("hidden_dim", hidden), ("n_layers", n_layers), ("n_heads", n_heads),
                        ("n_kv_heads", n_kv), ("vocab_size", vocab), ("seq_len", seq_len)):
        if not 0 < value < (1 << 24):
            raise ModelLoadError(path, f"header field {name}={value} is out of range: not a llama2.c checkpoint?")
    if dim % n_heads:
        raise ModelLoadError(path, f"dim={dim} is not a multiple of n_heads={n_heads}")
    cfg = ModelConfig(arch="llama", dim=dim, hidden_dim=hidden, num_layers=n_layers, num_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=dim // n_heads, vocab_size=vocab, context_length=seq_len,
                      tied_output=shared)
    check_config(path, cfg)
    return cfg, version, offset


def _layout(cfg: ModelConfig, version: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of each float32 array in file order (the module docstring's layout)."""
    dim, hidden, kv_dim, L = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.num_layers
    vocab, seq_len, head_dim = cfg.vocab_size, cfg.context_length, cfg.head_dim
    if version == 1:
        order = [("rms_att", (L, dim)), ("rms_ffn", (L, dim)), ("rms_final", (dim,)), ("tok", (vocab, dim)),
                 ("wq", (L, dim, dim)), ("wk", (L, kv_dim, dim)), ("wv", (L, kv_dim, dim)),
                 ("wo", (L, dim, dim)), ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)),
                 ("w3", (L, hidden, dim))]
    else:
        order = [("tok", (vocab, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)), ("wk", (L, kv_dim, dim)),
                 ("wv", (L, kv_dim, dim)), ("wo", (L, dim, dim)), ("rms_ffn", (L, dim)),
                 ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)), ("w3", (L, hidden, dim)),
                 ("rms_final", (dim,)), ("freq_cis", (2, seq_len, head_dim // 2))]
    if not cfg.tied_output:
        order.append(("wcls", (vocab, dim)))
    return order


def _weights(arrays: dict[str, np.ndarray], cfg: ModelConfig, sink) -> dict[str, Weight]:
    """The file's arrays under GGUF tensor names, each handed to ``sink``."""
    weights: dict[str, Weight] = {}

    def put(name, arr):
        w = Weight(name, "f32", tuple(arr.shape), arr)
        weights[name] = sink(w, arr.nbytes) if sink is not None else w

    put("token_embd", arrays["tok"])
    put("output_norm", arrays["rms_final"])
    if not cfg.tied_output:
        put("output", arrays["wcls"])
    for i in range(cfg.num_layers):
        for name, key in (("attn_norm", "rms_att"), ("attn_q", "wq"), ("attn_k", "wk"), ("attn_v", "wv"),
                          ("attn_output", "wo"), ("ffn_norm", "rms_ffn"), ("ffn_gate", "w1"),
                          ("ffn_down", "w2"), ("ffn_up", "w3")):
            put(f"blk.{i}.{name}", arrays[key][i])
    return weights


def _find_tokenizer(path: str, tokenizer_path, vocab: int) -> str:
    if tokenizer_path is not None:
        tokenizer_path = os.fspath(tokenizer_path)
        if not os.path.isfile(tokenizer_path):
            raise ModelLoadError(tokenizer_path, "tokenizer file not found")
        return tokenizer_path
    folder = os.path.dirname(os.path.abspath(path))
    candidates = [os.path.join(folder, f"tok{vocab}.bin"), os.path.join(folder, "tokenizer.bin")]
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise ModelLoadError(path, "llama2.c checkpoints carry no tokenizer: pass tokenizer_path= "
                               f"(looked for {', '.join(os.path.basename(c) for c in candidates)} beside the model)")


def read_layout(path: str) -> tuple[ModelConfig, dict[str, tuple[str, tuple[int, ...]]], int]:
    """``models.read_layout`` of a checkpoint: every tensor F32, named as in a GGUF file."""
    cfg, _, _ = _read_header(path)
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.dim), "output_norm.weight": (cfg.dim,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (cfg.vocab_size, cfg.dim)
    for i in range(cfg.num_layers):
        shapes.update({f"blk.{i}.attn_norm.weight": (cfg.dim,), f"blk.{i}.ffn_norm.weight": (cfg.dim,),
                       f"blk.{i}.attn_q.weight": (q, cfg.dim), f"blk.{i}.attn_k.weight": (kv, cfg.dim),
                       f"blk.{i}.attn_v.weight": (kv, cfg.dim), f"blk.{i}.attn_output.weight": (cfg.dim, q),
                       f"blk.{i}.ffn_gate.weight": (cfg.hidden_dim, cfg.dim),
                       f"blk.{i}.ffn_up.weight": (cfg.hidden_dim, cfg.dim),
                       f"blk.{i}.ffn_down.weight": (cfg.dim, cfg.hidden_dim)})
    return cfg, {name: ("F32", shape) for name, shape in shapes.items()}, 0
