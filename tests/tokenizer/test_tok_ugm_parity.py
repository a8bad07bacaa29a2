"""SentencePiece Unigram (``tokenizer.ggml.model`` ``t5``) token ids against llama.cpp's on the same files.

``dualpath synth --preset xlmr-tiny`` trains a real SentencePiece Unigram model (``nmt_nfkc``,
so the file carries a real precompiled charsmap) and writes it as llama.cpp's converter writes
XLM-R. Copies of the file switch the keys llama.cpp reads (``add_space_prefix``,
``remove_extra_whitespaces``, no charsmap, a USER_DEFINED piece); both sides add ``<s>`` and
``</s>`` as llama.cpp's ``tokenize(add_bos=True)`` does, with and without special-token
parsing. llama.cpp's own vocabulary file of nomic-embed-text-v2-moe
(``models/ggml-vocab-nomic-bert-moe.gguf``: XLM-R's real 250,000-piece vocabulary and charsmap)
is checked the same way where its source is found.
"""

from __future__ import annotations

import base64

import gguf
import pytest
from tok_corpus import parity_corpus
from tok_llama_cpp_source import llama_cpp_source_dir, vocab_file
from tok_parity import describe, mismatches

from dualpath.errors import ModelLoadError, TokenizerError
from dualpath.models.gguf import load_gguf, read_tokenizer
from dualpath.models.synth import synth_gguf
from dualpath.tokenizer import build_tokenizer
from dualpath.tokenizer.spec import TOKEN_USER_DEFINED
from tests_shared import copy_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")
pytest.importorskip("sentencepiece", reason="the t5 vocabulary of the synthetic file is trained with sentencepiece")

SENTENCES = [
    "The school is in the north of the city.", "Search my notes and answer from my files!",
    "Café, naïve résumé: déjà vu; Straße, smørrebrød.", "ÉCOLE Über ÅNGSTRÖM", "İstanbul ΣΊΣΥΦΟΣ Москва",
    "中文字日本語 東京の学生", "ひらがな カタカナ 한국어 검색", "emoji 😀👍🏽 here 👨\u200d👩\u200d👧 🇯🇵",
    "tabs\tand\nnew lines\r\n", "  lead  and   runs  of\u3000spaces  ", "ＡＢＣ１２３ ｶﾀｶﾅ ﬁﬂ ½ ① ™ …",
    "<s> </s> <pad> <unk> <mask>", "unknownword xyzzy qwertyuiop Ω ∑", "a" * 300, "3.14159 2,000 10%",
    "combining e\u0301 a\u0308 n\u0303", "zero\u200bwidth\u200djoiner\ufeff", "\x00nul\x01ctl\x7f", "▁ ▁▁ spiece",
]

VARIANTS = {
    "as converted": {},
    "no space prefix": {"tokenizer.ggml.add_space_prefix": (False, gguf.GGUFValueType.BOOL)},
    "keep extra whitespace": {"tokenizer.ggml.remove_extra_whitespaces": (False, gguf.GGUFValueType.BOOL)},
    "no BOS, no EOS": {"tokenizer.ggml.add_bos_token": (False, gguf.GGUFValueType.BOOL),
                       "tokenizer.ggml.add_eos_token": (False, gguf.GGUFValueType.BOOL)},
}


@pytest.fixture(scope="module")
def xlmr_file(tmp_path_factory):
    return synth_gguf(tmp_path_factory.mktemp("ugm") / "xlmr-tiny.gguf", "xlmr-tiny", "F32")


def _check(path):
    tok = build_tokenizer(load_gguf(path).tokenizer)
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    found = mismatches(tok, vocab, SENTENCES + parity_corpus())
    assert not found, describe(found)
    return tok, vocab


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_unigram_ids_equal_llama_cpp(xlmr_file, tmp_path, variant):
    path = copy_gguf(xlmr_file, tmp_path / "v.gguf", VARIANTS[variant]) if VARIANTS[variant] else xlmr_file
    tok, _ = _check(path)
    assert tok.spec.model == "t5" and tok.vocab_size == 1002


def test_unigram_decode_equals_llama_cpp_detokenize(xlmr_file):
    """Pieces joined, U+2581 as a space, the dummy prefix's space dropped, <s> and </s> skipped."""
    tok = build_tokenizer(load_gguf(xlmr_file).tokenizer)
    vocab = llama_cpp.Llama(str(xlmr_file), vocab_only=True, verbose=False)
    for s in SENTENCES + parity_corpus():
        ids = tok.encode(s)
        assert tok.decode(ids) == vocab.detokenize(ids).decode("utf-8", errors="replace"), s


def test_unigram_without_charsmap_equals_llama_cpp(xlmr_file, tmp_path):
    path = copy_gguf(xlmr_file, tmp_path / "raw.gguf", drop=frozenset({"tokenizer.ggml.precompiled_charsmap"}))
    tok, _ = _check(path)
    # without NFKC the full-width letters are no longer the ASCII ones
    assert tok.encode("ＡＢＣ") != build_tokenizer(load_gguf(xlmr_file).tokenizer).encode("ＡＢＣ")


def test_user_defined_pieces_equal_llama_cpp(xlmr_file, tmp_path):
    """A USER_DEFINED piece is split out whole (score 0 in the Viterbi), and a prefix of one
    skips the charsmap, as llama.cpp's normalizer does."""
    spec = load_gguf(xlmr_file).tokenizer
    types = list(spec.token_types)
    names = ("▁search", "ＡＢ")  # a trained piece, and a new text in place of a rare piece
    tokens = list(spec.tokens)
    ids = [tokens.index("▁search"), len(tokens) - 50]
    tokens[ids[1]] = "ＡＢ"
    for i in ids:
        types[i] = TOKEN_USER_DEFINED
    path = copy_gguf(xlmr_file, tmp_path / "user.gguf", {
        "tokenizer.ggml.token_type": (types, gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.tokens": (tokens, gguf.GGUFValueType.ARRAY)})
    tok, _ = _check(path)
    assert ids[1] in tok.encode("xＡＢＣ") and ids[0] in tok.encode("a▁search")
    assert tok.encode("Ａx") != tok.encode("Ax")  # "Ａ" starts a user-defined piece: not NFKC-mapped
    assert all(n in tok.spec.tokens for n in names)


def test_unigram_frames_text_with_bos_and_eos_and_merges_unknowns(xlmr_file):
    tok = build_tokenizer(load_gguf(xlmr_file).tokenizer)
    assert tok.encode("") == [0, 2] and tok.encode("", add_bos=False, add_eos=False) == []
    ids = tok.encode("hello world")
    assert ids[0] == 0 and ids[-1] == 2 and 3 not in ids
    assert tok.decode(ids) == "hello world"
    # no piece covers these: one <unk> for the run, as SentencePiece and llama.cpp merge them
    assert tok.encode("\u0f00\u0f01\u0f02").count(3) == 1
    assert tok.encode("a b", parse_special=True) == tok.encode("  a   b  ")  # whitespace runs merged
    assert tok.encode("<s>", parse_special=True) == [0, 0, 2]
    assert tok.sep_id == 2 and tok.spec.extra["add_sep"]  # for a reranker's query/document pair
    assert 0 not in tok.encode("<s>", add_bos=False)


def test_unigram_ids_equal_llama_cpp_on_the_real_xlm_r_vocabulary():
    source = llama_cpp_source_dir()
    path = vocab_file(source, "nomic-bert-moe") if source is not None else None
    if path is None or not path.is_file():
        pytest.skip("llama.cpp vocab file ggml-vocab-nomic-bert-moe.gguf not found (set DUALPATH_LLAMA_CPP_SRC)")
    spec = read_tokenizer(path)
    assert spec.model == "t5" and spec.vocab_size == 250048 and spec.extra["precompiled_charsmap"]
    tok = build_tokenizer(spec)
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    found = mismatches(tok, vocab, SENTENCES + parity_corpus())
    assert not found, describe(found)


def test_random_unicode_equals_llama_cpp(xlmr_file):
    """Hypothesis: any text of printable and whitespace code points, across scripts."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    tok = build_tokenizer(load_gguf(xlmr_file).tokenizer)
    vocab = llama_cpp.Llama(str(xlmr_file), vocab_only=True, verbose=False)
    alphabet = st.characters(blacklist_categories=("Cs",))  # lone surrogates are not UTF-8
    text = st.text(alphabet=st.one_of(alphabet, st.sampled_from(" \t\n\u3000ＡéÉ中😀\u200d\u0301")), max_size=40)

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
    @hypothesis.given(text)
    def check(s):
        assert tok.encode(s) == vocab.tokenize(s.encode("utf-8"), add_bos=True, special=False)

    check()


# ----------------------------------------------------------------- bad files


def _charsmap(path) -> bytes:
    return base64.b64decode(load_gguf(path).tokenizer.extra["precompiled_charsmap"])


def _with_charsmap(src, dst, blob: bytes):
    return copy_gguf(src, dst, {"tokenizer.ggml.precompiled_charsmap":
                                (bytes(blob), gguf.GGUFValueType.ARRAY)})


def test_a_truncated_charsmap_names_the_key(xlmr_file, tmp_path):
    blob = _charsmap(xlmr_file)
    path = _with_charsmap(xlmr_file, tmp_path / "cut.gguf", blob[:len(blob) // 2])
    with pytest.raises(ModelLoadError, match=r"tokenizer.ggml.precompiled_charsmap is truncated or corrupt"):
        load_gguf(path)
    path = _with_charsmap(xlmr_file, tmp_path / "tiny.gguf", blob[:3])
    with pytest.raises(ModelLoadError, match=r"precompiled_charsmap has 3 bytes, too few"):
        load_gguf(path)


def test_a_charsmap_pointing_outside_itself_names_the_key(xlmr_file, tmp_path):
    blob = bytearray(_charsmap(xlmr_file))
    size = int.from_bytes(blob[:4], "little")
    blob[4 + size:] = b"x" * (len(blob) - 4 - size)  # the replacement strings lose their NULs
    tok = build_tokenizer(load_gguf(_with_charsmap(xlmr_file, tmp_path / "nonul.gguf", bytes(blob))).tokenizer)
    with pytest.raises(TokenizerError, match=r"precompiled_charsmap is corrupt: replacement string"):
        tok.encode("ＡＢＣ")


def test_a_charsmap_of_the_wrong_type_and_missing_scores_name_the_key(xlmr_file, tmp_path):
    path = copy_gguf(xlmr_file, tmp_path / "f32.gguf", {"tokenizer.ggml.precompiled_charsmap":
                                                        ([1.0, 2.0], gguf.GGUFValueType.ARRAY)})
    with pytest.raises(ModelLoadError, match=r"'tokenizer.ggml.precompiled_charsmap' must be an array of uint8"):
        load_gguf(path)
    path = copy_gguf(xlmr_file, tmp_path / "noscores.gguf", drop=frozenset({"tokenizer.ggml.scores"}))
    with pytest.raises(ModelLoadError, match=r"needs tokenizer.ggml.scores, which is missing"):
        load_gguf(path)
