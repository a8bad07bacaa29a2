"""Byte-level BPE: a tiny vocabulary trained in the test, compared with llama.cpp through a vocab-only GGUF."""

from __future__ import annotations

import json
import logging

import pytest

from dualpath.tokenizer import StreamDecoder, TokenizerSpec, build_tokenizer
from dualpath.tokenizer.spec import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED

ENDOFTEXT, IM_END, USER = "<|endoftext|>", "<|im_end|>", "<|user|>"

TRAINING_TEXT = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.",
    "It's 2024 and we'll see 1,234,567 stars; they've counted 42 of them!",
    "def main():\n    print('hello world')\n    return 0\n\n",
    "Zoë saw a café 🐶 and said «bonjour». Привет, мир! 日本語のテキスト。 مرحبا",
    "    indented   spaces\t\ttabs\r\nwindows newlines\n\n\nmany newlines",
    "HELLO WORLD. I'M SHOUTING. Don't you think? You're right, I'd agree.",
]

# llama.cpp tokenizer.ggml.pre names, one per regex family we implement.
PRE_TYPES = ["gpt-2", "llama-bpe", "qwen2", "smollm", "default"]


@pytest.fixture(scope="module")
def bpe_spec() -> TokenizerSpec:
    """A ~700-token byte-level BPE vocabulary with merges, trained on TRAINING_TEXT."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=[ENDOFTEXT, IM_END, USER], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(TRAINING_TEXT * 3, trainer)
    model = json.loads(hf.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for piece, token_id in vocab.items():
        tokens[token_id] = piece
    merges = tuple(m if isinstance(m, str) else " ".join(m) for m in model["merges"])
    types = tuple(TOKEN_CONTROL if t in (ENDOFTEXT, IM_END) else TOKEN_USER_DEFINED if t == USER else TOKEN_NORMAL
                  for t in tokens)
    assert len(merges) > 200 and len(tokens) == 256 + 3 + len(merges)
    return TokenizerSpec(model="gpt2", tokens=tuple(tokens), token_types=types, merges=merges,
                         bos_id=vocab[ENDOFTEXT], eos_id=vocab[ENDOFTEXT], eot_id=vocab[IM_END],
                         add_bos=True, add_space_prefix=False, pre="gpt-2")


def write_vocab_only_gguf(path, spec: TokenizerSpec) -> None:
    """A GGUF that llama.cpp loads with vocab_only=True: general.architecture, a gpt2 tokenizer, no tensors.

    llama.cpp reads no hyper-parameters for a vocab_only load (checked with llama-cpp-python 0.3.36).
    ``tokenizer.ggml.pre`` must be a name llama.cpp knows ("gpt-2", not "gpt2") or it refuses the file.
    """
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(spec.model)
    writer.add_tokenizer_pre(spec.pre)
    writer.add_token_list(list(spec.tokens))
    writer.add_token_types(list(spec.token_types))
    writer.add_token_merges(list(spec.merges))
    writer.add_bos_token_id(spec.bos_id)
    writer.add_eos_token_id(spec.eos_id)
    writer.add_eot_token_id(spec.eot_id)
    writer.add_add_bos_token(spec.add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def llama_cpp_module():
    return pytest.importorskip("llama_cpp")


def with_pre(spec: TokenizerSpec, pre: str) -> TokenizerSpec:
    import dataclasses
    return dataclasses.replace(spec, pre=pre)


@pytest.mark.parametrize("pre", PRE_TYPES)
def test_ids_match_llama_cpp_for_each_pre_tokenizer(tmp_path, bpe_spec, llama_cpp_module, corpus, pre):
    spec = with_pre(bpe_spec, pre)
    path = tmp_path / f"bpe-{pre}.gguf"
    write_vocab_only_gguf(path, spec)
    vocab = llama_cpp_module.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = build_tokenizer(spec)
    strings = corpus + TRAINING_TEXT + [f"a{ENDOFTEXT}b", f"{USER}hi{IM_END}", "x <|user|> y"]
    mismatches = []
    for s in strings:
        for special in (False, True):
            ours = tok.encode(s, parse_special=special)
            theirs = vocab.tokenize(s.encode("utf-8"), add_bos=True, special=special)
            if ours != theirs:
                mismatches.append((s, special, ours, theirs))
    assert not mismatches, mismatches[:3]


def test_decode_round_trips_every_corpus_string(bpe_spec, corpus):
    tok = build_tokenizer(bpe_spec)
    for s in corpus + TRAINING_TEXT:
        ids = tok.encode(s)
        assert ids[0] == bpe_spec.bos_id
        assert tok.decode(ids) == s, repr(s)
        dec = StreamDecoder(tok)
        assert "".join(dec.feed(i) for i in ids) + dec.flush() == s


def test_control_tokens_are_plain_text_unless_parse_special(bpe_spec):
    tok = build_tokenizer(bpe_spec)
    eot = bpe_spec.eot_id
    assert eot not in tok.encode(f"hi{IM_END}")
    assert tok.encode(f"hi{IM_END}", add_bos=False, parse_special=True)[-1] == eot
    assert tok.decode(tok.encode(f"hi{IM_END}", parse_special=True)) == "hi"
    assert tok.decode(tok.encode(f"hi{IM_END}", parse_special=True), skip_special=False) == f"{ENDOFTEXT}hi{IM_END}"


def test_user_defined_tokens_are_always_whole_tokens(bpe_spec):
    # As in llama.cpp and Hugging Face tokenizers: that is what user-defined tokens are for.
    tok = build_tokenizer(bpe_spec)
    user = bpe_spec.tokens.index(USER)
    assert user in tok.encode(f"say {USER} hi")
    assert tok.decode(tok.encode(f"say {USER} hi")) == f"say {USER} hi"


def test_stop_ids_include_eos_and_eot(bpe_spec):
    tok = build_tokenizer(bpe_spec)
    assert tok.stop_ids == frozenset({bpe_spec.eos_id, bpe_spec.eot_id, bpe_spec.bos_id})


def test_token_bytes_undo_the_gpt2_byte_alphabet(bpe_spec):
    tok = build_tokenizer(bpe_spec)
    assert tok.token_bytes(bpe_spec.tokens.index("Ġa")) == b" a"  # "Ġ" stands for the space byte
    newline = bpe_spec.tokens.index("Ċ")
    assert tok.token_bytes(newline) == b"\n"
    assert tok.token_bytes(bpe_spec.eos_id) == b""
    e_acute = tok.encode("é", add_bos=False)
    assert b"".join(tok.token_bytes(i) for i in e_acute) == "é".encode()


def test_unknown_pre_tokenizer_warns_and_uses_gpt2_regex(bpe_spec, corpus, caplog):
    with caplog.at_level(logging.WARNING):
        unknown = build_tokenizer(with_pre(bpe_spec, "no-such-pre"))
    assert "unknown pre-tokenizer 'no-such-pre'" in caplog.text
    gpt2 = build_tokenizer(with_pre(bpe_spec, "gpt-2"))
    assert all(unknown.encode(s) == gpt2.encode(s) for s in corpus)


def test_merges_outside_the_vocabulary_are_dropped_with_a_warning(bpe_spec, caplog):
    import dataclasses
    spec = dataclasses.replace(bpe_spec, merges=bpe_spec.merges + ("zz qq",))
    with caplog.at_level(logging.WARNING):
        tok = build_tokenizer(spec)
    assert "dropped 1 of" in caplog.text
    assert tok.encode("Once upon a time") == build_tokenizer(bpe_spec).encode("Once upon a time")
