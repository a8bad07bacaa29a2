"""Vocabularies trained in the tests, so parity runs need no downloaded model.

* ``train_bpe_spec``: byte-level BPE (Hugging Face ``tokenizers``) trained on
  ``tok_corpus.training_text()`` split only before whitespace, so merges cross what
  every pre-tokenizer splits (letter/punctuation, digit runs, case changes, marks, newlines):
  a wrong split shows up as different ids.
* ``train_spm_spec``: SentencePiece BPE with byte fallback, llama-style (dummy prefix) or
  gemma-style (no dummy prefix, pieces across spaces, whitespace-only pieces).

Both carry special tokens of every type llama.cpp treats differently.
"""

from __future__ import annotations

import io
import json

from tok_corpus import training_text

from dualpath.tokenizer import TokenizerSpec
from dualpath.tokenizer.spec import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED

# (text, GGUF type) of the byte-level vocabulary's added tokens, ids 0.. in this order.
BPE_SPECIAL_TOKENS = (
    ("<|endoftext|>", TOKEN_CONTROL),     # BOS and EOS
    ("<|im_start|>", TOKEN_CONTROL),
    ("<|im_end|>", TOKEN_CONTROL),        # EOT
    ("<|user|>", TOKEN_USER_DEFINED),     # always split out
    ("[INST]", TOKEN_USER_DEFINED),
    ("<|fim_prefix|>", TOKEN_USER_DEFINED),  # llama.cpp makes it CONTROL: plain text unless parse_special
    ("</s>", TOKEN_NORMAL),               # like Qwen2's: llama.cpp makes it CONTROL
    ("<|channel|>", TOKEN_CONTROL),       # gpt-oss: llama.cpp makes it USER_DEFINED
)


def train_bpe_spec(vocab_size: int = 6000, pre: str = "gpt-2") -> TokenizerSpec:
    """A byte-level BPE vocabulary (about ``vocab_size`` tokens) with merges and special tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s?\S+|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[t for t, _ in BPE_SPECIAL_TOKENS],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(training_text(), trainer)
    model = json.loads(hf.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for piece, token_id in model["vocab"].items():
        tokens[token_id] = piece
    merges = tuple(m if isinstance(m, str) else " ".join(m) for m in model["merges"])
    types = dict(BPE_SPECIAL_TOKENS)
    endoftext, im_end = tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")
    return TokenizerSpec(model="gpt2", tokens=tuple(tokens),
                         token_types=tuple(types.get(t, TOKEN_NORMAL) for t in tokens), merges=merges,
                         bos_id=endoftext, eos_id=endoftext, eot_id=im_end, add_bos=True, add_space_prefix=False,
                         pre=pre)


def train_spm_spec(style: str, vocab_size: int = 3000) -> TokenizerSpec:
    """A SentencePiece BPE vocabulary with byte fallback; ``style`` is "llama" or "gemma".

    llama: dummy prefix, pieces within words (Llama 2, TinyLlama, Mistral v1, Phi-3).
    gemma: no dummy prefix (GGUF ``add_space_prefix = false``), pieces may span spaces and be
    whitespace only, chat turn markers as CONTROL (Gemma 2/3).
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    if style not in ("llama", "gemma"):
        raise ValueError(f"style {style!r}: expected 'llama' or 'gemma'")
    gemma = style == "gemma"
    control = ["<start_of_turn>", "<end_of_turn>"] if gemma else ["<|endoftext|>", "<|end|>", "<|assistant|>"]
    user = ["<|user|>", "[INST]", "<h1>"] + (["\u2581\u2581"] if gemma else [])
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text()), model_writer=buf, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=not gemma,
        remove_extra_whitespaces=False, split_by_whitespace=not gemma, allow_whitespace_only_pieces=gemma,
        split_digits=False, character_coverage=1.0, max_sentence_length=1 << 20, control_symbols=control,
        user_defined_symbols=user, minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    tokens = tuple(p.piece for p in proto.pieces)
    return TokenizerSpec(
        model="llama", tokens=tokens, scores=tuple(p.score for p in proto.pieces),
        token_types=tuple(int(p.type) for p in proto.pieces),  # SentencePiece and GGUF number types alike
        bos_id=proto.trainer_spec.bos_id, eos_id=proto.trainer_spec.eos_id, unk_id=proto.trainer_spec.unk_id,
        eot_id=tokens.index("<end_of_turn>") if gemma else None, add_bos=True,
        add_space_prefix=not gemma, pre="default")
