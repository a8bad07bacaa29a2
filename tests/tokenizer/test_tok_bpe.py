"""Byte-level BPE behaviour on the trained vocabulary (parity with llama.cpp: test_tok_bpe_parity.py)."""

from __future__ import annotations

import logging

from dualpath.tokenizer import StreamDecoder, TokenizerSpec, build_tokenizer

ENDOFTEXT, IM_END, USER = "<|endoftext|>", "<|im_end|>", "<|user|>"


def with_pre(spec: TokenizerSpec, pre: str) -> TokenizerSpec:
    import dataclasses
    return dataclasses.replace(spec, pre=pre)


def test_decode_round_trips_every_corpus_string(bpe_spec, corpus):
    tok = build_tokenizer(bpe_spec)
    for s in corpus:
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
    from dualpath.tokenizer.base import _LLAMA_CPP_EOG_TEXTS

    tok = build_tokenizer(bpe_spec)
    by_text = {i for i, t in enumerate(bpe_spec.tokens) if t in _LLAMA_CPP_EOG_TEXTS}  # trained look-alikes
    assert tok.stop_ids == frozenset({bpe_spec.eos_id, bpe_spec.eot_id, bpe_spec.bos_id} | by_text)


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


def test_llama_cpp_pre_tokenizer_we_do_not_implement_warns_that_ids_will_differ(bpe_spec, caplog):
    with caplog.at_level(logging.WARNING):
        tok = build_tokenizer(with_pre(bpe_spec, "kimi-k2"))
    assert "'kimi-k2' (tokenizer.ggml.pre) is not implemented" in caplog.text
    assert tok.encode("Hello world") == build_tokenizer(with_pre(bpe_spec, "gpt-2")).encode("Hello world")


def test_missing_pre_tokenizer_uses_llama_cpps_default_with_a_warning(bpe_spec, caplog):
    with caplog.at_level(logging.WARNING):
        tok = build_tokenizer(with_pre(bpe_spec, None))
    assert "no tokenizer.ggml.pre" in caplog.text
    default = build_tokenizer(with_pre(bpe_spec, "default"))
    assert tok.encode("1234 $+<=> x") == default.encode("1234 $+<=> x")


def test_end_of_generation_tokens_stop_by_text_as_llama_cpp(bpe_spec):
    """A chat model's turn ends at llama.cpp's end-of-generation texts whatever its EOS
    (Gemma's <end_of_turn>, Llama 3's <|eot_id|>), and at no other control token."""
    import dataclasses

    tokens = list(bpe_spec.tokens)
    for text in ("<end_of_turn>", "<start_of_turn>"):  # the trained vocabulary may hold them
        if text not in tokens:
            tokens[max(i for i, t in enumerate(tokens) if len(t) > 3 and not t.startswith("<"))] = text
    eot_turn, other = tokens.index("<end_of_turn>"), tokens.index("<start_of_turn>")
    spec = dataclasses.replace(bpe_spec, tokens=tuple(tokens), eot_id=None)
    tok = build_tokenizer(spec)
    assert eot_turn in tok.stop_ids and other not in tok.stop_ids
    im_end = bpe_spec.tokens.index(IM_END)  # "<|im_end|>" stops even when it is not eot_id
    assert im_end in tok.stop_ids and spec.eos_id in tok.stop_ids
