"""SentencePiece-style BPE: parity with the SentencePiece library and with llama.cpp on stories260K."""

from __future__ import annotations

import dataclasses
import time

import pytest

from dualpath.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def sp_processor(tok512_model):
    spm = pytest.importorskip("sentencepiece")
    return spm.SentencePieceProcessor(model_file=str(tok512_model))


@pytest.fixture(scope="module")
def llama_vocab(gguf_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)


def test_corpus_is_large_and_varied(corpus):
    assert len(corpus) >= 200
    assert "" in corpus and any(len(s) > 5000 for s in corpus)
    assert any("\t" in s for s in corpus) and any("  " in s for s in corpus) and any("🐶" in s for s in corpus)


def test_ids_match_sentencepiece_with_its_whitespace_normalization(tok512_spec, sp_processor, corpus):
    # tok512.model keeps SentencePiece's default normalizer_spec.remove_extra_whitespaces=true
    # (strip and collapse spaces), which llama.cpp and run.c do not do; the spec flag turns it on.
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp_processor.serialized_model_proto())
    assert proto.normalizer_spec.remove_extra_whitespaces and proto.normalizer_spec.add_dummy_prefix
    spec = dataclasses.replace(tok512_spec, extra={"remove_extra_whitespaces": True})
    tok = build_tokenizer(spec)
    mismatches = [(s, tok.encode(s), [1] + sp_processor.encode(s)) for s in corpus
                  if tok.encode(s) != [1] + sp_processor.encode(s)]
    assert not mismatches, mismatches[:3]


def test_ids_match_sentencepiece_where_no_space_normalization_applies(stories_tok, sp_processor, corpus):
    plain = [s for s in corpus if "  " not in s and "\u2581" not in s and s.strip(" ") == s]
    assert len(plain) >= 80
    for s in plain:
        assert stories_tok.encode(s) == [1] + sp_processor.encode(s), repr(s)


def test_ids_match_llama_cpp_on_stories260k_gguf(gguf_spec, llama_vocab, corpus):
    tok = build_tokenizer(gguf_spec)
    mismatches = []
    for s in corpus:
        ours = tok.encode(s)
        theirs = llama_vocab.tokenize(s.encode("utf-8"), add_bos=True, special=False)
        if ours != theirs:
            mismatches.append((s, ours, theirs))
    assert not mismatches, mismatches[:3]


@pytest.mark.parametrize("text", ["<s>Once</s>", "a<unk>b", "<s><s>", "Lily</s> <s>Max", "</s>"])
def test_special_token_text_is_parsed_like_llama_cpp_only_when_asked(gguf_spec, llama_vocab, text):
    tok = build_tokenizer(gguf_spec)
    assert tok.encode(text, parse_special=True) == llama_vocab.tokenize(text.encode(), add_bos=True, special=True)
    plain = tok.encode(text)
    assert plain == llama_vocab.tokenize(text.encode(), add_bos=True, special=False)
    assert not set(plain[1:]) & {0, 1, 2}  # as plain text, "<s>" is characters, never BOS


def test_whitespace_runs_are_kept_by_default_like_llama_cpp(stories_tok):
    # llama.cpp / run.c keep every space; only the SentencePiece library collapses them.
    assert stories_tok.encode(" ") == [1, 410, 410]
    assert stories_tok.decode(stories_tok.encode("a  b")) == "a  b"


def test_long_prompt_encodes_in_near_linear_time(stories_tok):
    unit = "Once upon a time, Zoë saw a café 🐶 and 42 cats.\n"
    short, long = unit * 125, unit * 2000
    start = time.perf_counter()
    stories_tok.encode(short)
    t_short = time.perf_counter() - start
    start = time.perf_counter()
    ids = stories_tok.encode(long)
    t_long = time.perf_counter() - start
    assert len(long) > 80_000 and len(ids) > 20_000
    assert t_long < 5.0
    assert t_long < 16 * 8 * max(t_short, 1e-3)  # 16x the input: far from the 256x of a quadratic rescan
