"""The encoder parts of ``synth.py``: a WordPiece vocabulary, BERT / nomic-bert keys and tensors
(an XLM-R vocabulary comes from synth_unigram.py).

Written as llama.cpp's converter writes an encoder (``conversion/bert.py``): the vocabulary in
phantom-space form (word-initial pieces ``▁word``, continuations without their ``##``,
control tokens as they are), the special ids of Hugging Face's BERT vocabulary
([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103), ``token_type_count`` and the
pooling type.
"""

from __future__ import annotations

import numpy as np

ENCODER_ARCHES = ("bert", "nomic-bert")

_WORDS = """the of and to in is was for on that with as by at from his he it an were are which this be or
had not but first one their its new after who they have her she two been other when there all during into
school time may years more most only over city some world would where later up such used many can state about
national out known university united then made these first three water house north south east west day night
city river music film game team world war play life people family work part number group area book high small
large long great little old right left good best last next early late year home word name line end point case
fact hand place week company system program question government night light sound power story study child
learn model text search note file answer token embed vector query document read write open close data cafe""".split()
_SUFFIXES = "s ing ed er est ly tion ment ness able ful less ity ize al ic ous ive en ish".split()
_SYLLABLES = ("ka ri to na me lo su pe ta mi ra no ve sa de li mo ne ko ba ti ga re do lu po fe ha ce "
              "bi cu zo an in on er es or ar al en el is it at ou ea st th ch sh qu ph tr pr gr").split()
_CHARS = ("abcdefghijklmnopqrstuvwxyz0123456789" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" +
          "éèàçñüöäßø" + "中文字日本語東京学生" + "ひらがなカタ")
"""Characters the vocabulary has as word starts and continuations: ASCII, a few accented
letters (kept when the file does not strip accents), CJK ideographs and kana."""

ALWAYS_F32 = frozenset(("position_embd.weight", "token_types.weight"))
"""Matrices llama.cpp's converter and quantizer keep in F32 (its BERT graph adds them as such)."""

SPECIALS = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}


def wordpiece_vocab(vocab_size: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """A BERT-style vocabulary of ``vocab_size`` (at least 400) in llama.cpp's phantom-space
    form, and its GGUF token types: the special tokens at their usual ids, ``[unused{i}]``
    between them, then every character as a word start and as a continuation, common words,
    suffixes, and syllable compounds until the size is reached."""
    from ..tokenizer.spec import TOKEN_CONTROL, TOKEN_NORMAL

    if vocab_size < 400:
        raise ValueError(f"a WordPiece vocabulary needs at least 400 tokens, got {vocab_size}")
    space = "\u2581"
    tokens = [SPECIALS.get(i, f"{space}[unused{i}]") for i in range(104)]
    types = [TOKEN_CONTROL if i in SPECIALS else TOKEN_NORMAL for i in range(104)]
    seen = set(tokens)

    def add(piece: str) -> None:
        if piece not in seen and len(tokens) < vocab_size:
            seen.add(piece)
            tokens.append(piece)
            types.append(TOKEN_NORMAL)

    for c in _CHARS:
        add(space + c)
        add(c)
    for word in _WORDS:
        add(space + word)
    for suffix in _SUFFIXES:
        add(suffix)
    rng = np.random.default_rng(seed)
    while len(tokens) < vocab_size:
        n = 1 + int(rng.integers(1, 4))
        piece = "".join(_SYLLABLES[int(rng.zipf(1.5)) % len(_SYLLABLES)] for _ in range(n))
        add(space + piece if rng.random() < 0.6 else piece)
    return tokens, types


def add_encoder_keys(w, shape, weight_type_code: int, ctx: int) -> None:
    """``shape``'s hyper-parameters as llama.cpp's converter writes an encoder's."""
    import gguf

    w.add_context_length(ctx)
    w.add_embedding_length(shape.dim)
    w.add_feed_forward_length(shape.hidden_dim)
    w.add_block_count(shape.num_layers)
    w.add_head_count(shape.num_heads)
    w.add_layer_norm_eps(shape.rms_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(shape.pooling))
    w.add_file_type(weight_type_code)
    if shape.arch == "nomic-bert":
        w.add_rope_freq_base(shape.rope_theta)


def add_encoder_vocabulary(w, shape, seed: int) -> None:
    if shape.vocab == "t5":
        from .synth_unigram import add_xlmr_vocabulary

        add_xlmr_vocabulary(w, shape.vocab_size, shape.token_types, seed)
        return
    tokens, types = wordpiece_vocab(shape.vocab_size, seed)
    w.add_token_type_count(shape.token_types)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_unk_token_id(100)
    w.add_sep_token_id(102)
    w.add_pad_token_id(0)
    w.add_uint32("tokenizer.ggml.cls_token_id", 101)
    w.add_mask_token_id(103)


def encoder_tensor_list(shape) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, (out, in) or (n,), init std) per tensor in the converter's order; std 0: a
    LayerNorm weight (around 1)."""
    d, ff, std = shape.dim, shape.hidden_dim, shape.init_std
    bert = shape.arch == "bert"
    tensors: list[tuple[str, tuple[int, ...], float]] = [("token_embd.weight", (shape.vocab_size, d), std),
                                                          ("token_types.weight", (shape.token_types, d), std)]
    if bert:
        tensors.append(("position_embd.weight", (shape.context_length, d), std))
    tensors += [("token_embd_norm.weight", (d,), 0.0), ("token_embd_norm.bias", (d,), std)]
    for i in range(shape.num_layers):
        p = f"blk.{i}."
        if bert:
            for n in ("attn_q", "attn_k", "attn_v"):
                tensors += [(p + n + ".weight", (d, d), std), (p + n + ".bias", (d,), std)]
        else:
            tensors.append((p + "attn_qkv.weight", (3 * d, d), std))
        tensors.append((p + "attn_output.weight", (d, d), std))
        if bert:
            tensors.append((p + "attn_output.bias", (d,), std))
        tensors += [(p + "attn_output_norm.weight", (d,), 0.0), (p + "attn_output_norm.bias", (d,), std)]
        if bert:
            tensors += [(p + "ffn_up.weight", (ff, d), std), (p + "ffn_up.bias", (ff,), std),
                        (p + "ffn_down.weight", (d, ff), std), (p + "ffn_down.bias", (d,), std)]
        else:
            tensors += [(p + "ffn_up.weight", (ff, d), std), (p + "ffn_gate.weight", (ff, d), std),
                        (p + "ffn_down.weight", (d, ff), std)]
        tensors += [(p + "layer_output_norm.weight", (d,), 0.0), (p + "layer_output_norm.bias", (d,), std)]
    return tensors
