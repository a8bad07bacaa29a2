"""WordPiece (``tokenizer.ggml.model`` ``bert``) token ids against llama.cpp's on the same files.

``dualpath synth`` writes a BERT vocabulary in llama.cpp's phantom-space form (ASCII, accented
letters, CJK ideographs and kana as word starts and continuations, words, suffixes, syllable
compounds); copies of the file switch the BertNormalizer options llama.cpp reads
(``tokenizer.ggml.normalizer.lowercase`` / ``strip_accents``). Both sides add [CLS] and [SEP]
as llama.cpp's ``tokenize(add_bos=True)`` does, with and without special-token parsing.
llama.cpp's own vocabulary file of BAAI's bge models (``models/ggml-vocab-bert-bge.gguf``, the
real 30,522-piece BERT uncased vocabulary) is checked the same way where its source is found.
"""

from __future__ import annotations

import gguf
import pytest
from tok_corpus import parity_corpus
from tok_llama_cpp_source import llama_cpp_source_dir, vocab_file
from tok_parity import describe, mismatches

from dualpath.models.gguf import load_gguf, read_tokenizer
from dualpath.models.synth import synth_gguf
from dualpath.tokenizer import build_tokenizer
from tests_shared import copy_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")

SENTENCES = [
    "The school is in the north of the city.", "Search my notes and answer from my files!",
    "Café, naïve résumé: déjà vu; Straße, smørrebrød.", "ÉCOLE Über ÅNGSTRÖM", "İstanbul ΣΊΣΥΦΟΣ",
    "中文字日本語 東京の学生", "ひらがな カタカナ", "emoji 😀👍🏽 here", "tabs\tand\nnew lines\r\n",
    "snake_case and kebab-case, (parens) [brackets] {braces} <tags>", "[CLS] [SEP] [MASK] [UNK] [PAD]",
    "unknownword xyzzy qwertyuiop", "a" * 300, "model text search embedding vectors", "3.14159 2,000 10%",
    "combining e\u0301 a\u0308 n\u0303", "\u00a0nbsp\u3000ideographic", "zero\u200bwidth\u200djoiner\ufeff",
]

NORMALIZERS = {"default": {}, "cased": {"lowercase": False}, "lower-keep-accents": {"strip_accents": False},
               "cased-strip-accents": {"lowercase": False, "strip_accents": True}}


@pytest.fixture(scope="module")
def bert_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("wpm")
    return synth_gguf(root / "bert-tiny.gguf", "bert-tiny", "F32")


@pytest.mark.parametrize("normalizer", list(NORMALIZERS))
def test_wordpiece_ids_equal_llama_cpp(bert_file, tmp_path, normalizer):
    path = bert_file
    if NORMALIZERS[normalizer]:
        fields = {f"tokenizer.ggml.normalizer.{k}": (v, gguf.GGUFValueType.BOOL)
                  for k, v in NORMALIZERS[normalizer].items()}
        path = copy_gguf(bert_file, tmp_path / f"{normalizer}.gguf", fields)
    tok = build_tokenizer(load_gguf(path).tokenizer)
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    found = mismatches(tok, vocab, SENTENCES + parity_corpus())
    assert not found, describe(found)


def test_wordpiece_ids_equal_llama_cpp_on_the_real_bge_vocabulary():
    source = llama_cpp_source_dir()
    path = vocab_file(source, "bert-bge") if source is not None else None
    if path is None or not path.is_file():
        pytest.skip("llama.cpp vocab file ggml-vocab-bert-bge.gguf not found (set DUALPATH_LLAMA_CPP_SRC)")
    tok = build_tokenizer(read_tokenizer(path))
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    found = mismatches(tok, vocab, SENTENCES + parity_corpus())
    assert not found, describe(found)
    assert tok.encode("Résumé, NAÏVE!") == tok.encode("resume , naive !")  # lowercased, accents stripped
    assert 100 not in tok.encode("Résumé, NAÏVE!")


def test_wordpiece_frames_text_with_cls_and_sep_and_unknown_words(bert_file):
    tok = build_tokenizer(load_gguf(bert_file).tokenizer)
    ids = tok.encode("xyzzy")
    assert ids[0] == 101 and ids[-1] == 102 and 100 not in ids  # cut into single-letter pieces
    assert tok.encode("", add_bos=True) == [101, 102]
    assert tok.encode("", add_bos=False) == []
    assert tok.encode("\u0394\u0394") == [101, 100, 102]  # Greek: no piece starts it, one [UNK]
    assert tok.words("Hello, World! 中文 e\u0301") == ["hello", ",", "world", "!", "中", "文", "e"]
