"""Byte-level BPE: our ids equal llama.cpp's (``vocab_only``) for every pre-tokenizer we implement.

Three layers of evidence:

* the table: every ``tokenizer.ggml.pre`` name llama.cpp accepts is in ``_PRE_RULES`` with
  llama.cpp's regex strings and ``ignore_merges`` verbatim, or listed as not implemented;
* a vocabulary trained in the test (tok_vocabs.py), written as a vocab-only GGUF once per
  distinct rule, over the whole corpus, with and without special-token parsing;
* llama.cpp's own vocab-only test files (real Llama 3, Qwen2, GPT-2, StarCoder ... vocabularies),
  when its source folder is present.
"""

from __future__ import annotations

import dataclasses

import pytest
from tok_gguf import spec_from_gguf, write_vocab_only_gguf
from tok_llama_cpp_source import llama_cpp_source_dir, read_pre_tokenizers, vocab_file
from tok_parity import describe, mismatches

from dualpath.tokenizer import build_tokenizer
from dualpath.tokenizer.bpe import _NOT_IMPLEMENTED, _PRE_RULES
from dualpath.tokenizer.spec import default_add_bos

llama_cpp = pytest.importorskip("llama_cpp")


def _one_name_per_rule() -> list[str]:
    """The first name (in table order) of each distinct rule: what the parity runs cover."""
    seen, names = set(), []
    for name, rule in _PRE_RULES.items():
        if rule not in seen:
            seen.add(rule)
            names.append(name)
    return names


RULE_NAMES = _one_name_per_rule()
EXTRA = ["<|endoftext|>hi<|im_end|>", "<|user|>hi<|im_end|>\n", "x <|user|> y", "<|fim_prefix|>a", "a</s>b",
         "<|channel|>x<|channel|>", "[INST]x[INST]", "<|im_start|><|user|>[INST]</s>"]


@pytest.fixture(scope="module")
def llama_vocab_for(tmp_path_factory, bpe_spec):
    """``llama_vocab_for(pre)``: llama.cpp's vocab-only model of the trained vocabulary with that ``pre``."""
    folder = tmp_path_factory.mktemp("bpe-gguf")

    def load(pre: str):
        path = write_vocab_only_gguf(folder / f"bpe-{pre}.gguf", dataclasses.replace(bpe_spec, pre=pre))
        return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return load


@pytest.mark.parametrize("pre", RULE_NAMES)
def test_ids_match_llama_cpp_over_the_corpus(bpe_spec, llama_vocab_for, corpus, pre):
    tok = build_tokenizer(dataclasses.replace(bpe_spec, pre=pre))
    found = mismatches(tok, llama_vocab_for(pre), corpus + EXTRA)
    assert not found, describe(found)


def test_corpus_has_at_least_300_varied_strings(corpus):
    assert len(corpus) >= 300 and len(set(corpus)) >= 300
    joined = "".join(corpus)
    for needle in ("\u3000", "\u00a0", "\r\n", "\n\n\n", "\t", "👨‍👩‍👧‍👦", "👍🏽", "e\u0301", "日本", "مرحبا", "नमस्ते",
                   "<|endoftext|>", "<|im_", "[INST]", "</s>", "IT'S", "1234567890", "def ", "fn main"):
        assert needle in joined, needle
    assert "" in corpus and any(len(s) == 1 for s in corpus)


def test_trained_vocabulary_merges_across_scripts(bpe_spec):
    # Multi-character tokens in several scripts: the parity runs exercise merges, not just bytes.
    tok = build_tokenizer(bpe_spec)
    for text in ("Привет", "日本", "नमस्ते", "مرحبا", "12345", "    ", "don't", "\n\n"):
        assert len(tok.encode(text, add_bos=False)) < len(text.encode("utf-8")), text


def test_fim_text_is_plain_unless_parse_special_like_llama_cpp(bpe_spec):
    # The file says USER_DEFINED (always split); llama.cpp overrides fill-in-the-middle texts to CONTROL.
    tok = build_tokenizer(bpe_spec)
    fim = bpe_spec.tokens.index("<|fim_prefix|>")
    assert fim not in tok.encode("<|fim_prefix|>x")
    assert tok.encode("<|fim_prefix|>x", add_bos=False, parse_special=True)[0] == fim


def test_normal_end_of_sequence_text_becomes_one_token_with_parse_special(bpe_spec):
    # Qwen2's vocabulary has a NORMAL "</s>"; llama.cpp treats it as CONTROL.
    tok = build_tokenizer(bpe_spec)
    eos_text = bpe_spec.tokens.index("</s>")
    assert tok.encode("a</s>", add_bos=False, parse_special=True)[-1] == eos_text
    assert eos_text not in tok.encode("a</s>", add_bos=False)
    assert tok.decode([eos_text]) == "" and tok.decode([eos_text], skip_special=False) == "</s>"


def test_gpt_oss_channel_token_is_always_split_out(bpe_spec):
    tok = build_tokenizer(bpe_spec)
    channel = bpe_spec.tokens.index("<|channel|>")
    assert tok.encode("a<|channel|>b", add_bos=False)[1] == channel


# ---------------------------------------------------------------- the table, against llama.cpp's source

@pytest.fixture(scope="module")
def llama_cpp_pres():
    source = llama_cpp_source_dir()
    if source is None or not (source / "src" / "llama-vocab.cpp").is_file():
        pytest.skip("llama.cpp sources not found (set DUALPATH_LLAMA_CPP_SRC to a llama.cpp checkout)")
    return read_pre_tokenizers(source)


def test_every_llama_cpp_name_is_implemented_or_listed_as_not(llama_cpp_pres):
    missing = sorted(set(llama_cpp_pres) - set(_PRE_RULES) - _NOT_IMPLEMENTED)
    assert not missing, f"llama.cpp names neither implemented nor listed in _NOT_IMPLEMENTED: {missing}"
    unknown = sorted((set(_PRE_RULES) | _NOT_IMPLEMENTED) - set(llama_cpp_pres))
    assert not unknown, f"names llama.cpp does not accept: {unknown}"


def test_pre_tokenizer_table_is_llama_cpps_verbatim(llama_cpp_pres):
    for name, rule in _PRE_RULES.items():
        theirs = llama_cpp_pres[name]
        assert rule.regexes == theirs.regexes, name
        assert rule.ignore_merges == theirs.ignore_merges, name
        assert theirs.byte_encode, name


def test_default_add_bos_is_llama_cpps(llama_cpp_pres):
    for name, theirs in llama_cpp_pres.items():
        assert default_add_bos("gpt2", name) == theirs.add_bos, name
    assert default_add_bos("llama", "default") and not default_add_bos("gpt2", None)


def test_every_name_loads_in_llama_cpp_with_the_same_ids(bpe_spec, llama_vocab_for):
    # Names share rules (whose corpus runs are above); llama.cpp accepts each name and splits as its rule says.
    sample = ["Hello, WORLD's 12345 日本語 e\u0301!\n\n  x", "<|user|> a\u3000b  \t", "camelCase приВет ١٢٣ ok"]
    rule_tokenizers = {}
    for name, rule in _PRE_RULES.items():
        tok = rule_tokenizers.get(rule)
        if tok is None:
            tok = rule_tokenizers[rule] = build_tokenizer(dataclasses.replace(bpe_spec, pre=name))
        assert not mismatches(tok, llama_vocab_for(name), sample), name


# ---------------------------------------------------------------- llama.cpp's own vocabulary files

# One file per rule llama.cpp ships a vocabulary for (refact and command-r share starcoder's rule).
REAL_VOCABS = ["llama-bpe", "qwen2", "qwen35", "gpt-2", "starcoder", "mpt", "falcon", "deepseek-llm", "deepseek-coder"]


@pytest.mark.parametrize("name", REAL_VOCABS)
def test_ids_match_llama_cpp_on_its_real_vocabulary_files(corpus, name):
    source = llama_cpp_source_dir()
    path = vocab_file(source, name) if source is not None else None
    if path is None or not path.is_file():
        pytest.skip(f"llama.cpp vocab file ggml-vocab-{name}.gguf not found (set DUALPATH_LLAMA_CPP_SRC)")
    tok = build_tokenizer(spec_from_gguf(path))
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    found = mismatches(tok, vocab, corpus + EXTRA)
    assert not found, describe(found)
