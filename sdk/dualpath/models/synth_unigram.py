"""A SentencePiece Unigram vocabulary for synthetic XLM-RoBERTa encoders (bge-m3, multilingual-e5).

A real model is trained with the ``sentencepiece`` package (a test dependency) on a small
multilingual corpus made here from a fixed seed: English words, accented Latin, CJK ideographs,
kana and hangul, emoji (some with skin tones and joiners), digits and punctuation. Its
normalisation is ``nmt_nfkc``, so the file carries a real precompiled charsmap (NFKC plus
SentencePiece's whitespace and control-character rules).

It is written as llama.cpp's converter writes XLM-R (``conversion/bert.py``
``_xlmroberta_set_vocab`` on a ``sentencepiece.bpe.model``): fairseq's ids, ``<s>`` 0,
``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3 and SentencePiece's id ``k`` at ``k + 1``; ids past the
SentencePiece vocabulary are ``[PAD{k}]`` placeholders of type UNUSED and score -10000. The
real models' SentencePiece vocabulary has 250,000 pieces; training that many takes a large
corpus, so a vocabulary larger than ``TRAINED_PIECES`` is padded with syllable compounds
scored below every trained piece (real pieces, which the Viterbi may pick, not placeholders).
"""

from __future__ import annotations

import functools
import io
import itertools

import numpy as np

TRAINED_PIECES = 1000
"""SentencePiece pieces trained (the tiny preset's whole vocabulary, and the start of a real-size one)."""

_WORDS = """the of and to in is was for on that with as by at from his it an were are which this be or had not
but first one their its new after who they have her she two been other when there all during into school time
may years more most only over city some world would where later up such used many can state about search note
file answer token embed vector query document read write open close data model text hello language multilingual
retrieval passage rerank score question people family music river house night light sound power story study""".split()
_ACCENTED = """café naïve résumé déjà straße smørrebrød über ångström façade jalapeño niño señor crème brûlée élève
forêt garçon zürich köln münchen äpfel größe fjord ærø øre città perché più cosìação coração não são ñandú
İstanbul çiçek şehir ağaç Ελλάδα λόγος Москва язык поиск""".split()
_CJK = list("中文字日本語東京学生大学检索向量模型文件回答問題私人大小上下山川日月水火木金土天地")
_KANA_HANGUL = list("あいうえおかきくけこさしすせそたちつてとなにぬねのひらがなカタカナアイウエオ"
                    "한국어검색문서질문답변")
_EMOJI = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F389", "\u2764\ufe0f", "\U0001F680",
          "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F1EF\U0001F1F5", "\u2615"]
_EXTRA = ["１２３", "ＡＢＣ", "ｶﾀｶﾅ", "①②", "ﬁﬂ", "™", "½", "…", "—", "«»", "3.14", "2,000", "10%", "(x)", "[a]"]
"""Characters NFKC changes (full-width, ligatures, circled digits) and punctuation."""
_SYLLABLES = ("ka ri to na me lo su pe ta mi ra no ve sa de li mo ne ko ba ti ga re do lu po fe ha ce "
              "bi cu zo an in on er es or ar al en el is it at ou ea st th ch sh qu ph tr pr gr").split()


def corpus(num_lines: int = 3000, seed: int = 0) -> list[str]:
    """The training text: ``num_lines`` lines of 4 to 13 words drawn from the lists above."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(num_lines):
        words = []
        for _ in range(int(rng.integers(4, 14))):
            r = rng.random()
            if r < 0.45:
                words.append(_WORDS[int(rng.zipf(1.4)) % len(_WORDS)])
            elif r < 0.65:
                words.append(_ACCENTED[int(rng.integers(len(_ACCENTED)))])
            elif r < 0.8:
                words.append("".join(_CJK[int(rng.integers(len(_CJK)))] for _ in range(int(rng.integers(1, 5)))))
            elif r < 0.88:
                words.append("".join(_KANA_HANGUL[int(rng.integers(len(_KANA_HANGUL)))]
                                     for _ in range(int(rng.integers(1, 4)))))
            elif r < 0.95:
                words.append(_EMOJI[int(rng.integers(len(_EMOJI)))])
            else:
                words.append(_EXTRA[int(rng.integers(len(_EXTRA)))])
        lines.append(" ".join(words))
    return lines


@functools.lru_cache(maxsize=2)
def trained_model(num_pieces: int = TRAINED_PIECES, seed: int = 0) -> bytes:
    """A serialized SentencePiece Unigram model (``nmt_nfkc``) of ``num_pieces`` pieces or
    fewer, trained on ``corpus(seed=seed)``; one thread, so the same bytes every time.
    Raises RuntimeError without the ``sentencepiece`` package."""
    try:
        import sentencepiece as spm
    except ImportError as e:
        raise RuntimeError("a t5 (SentencePiece Unigram) vocabulary is trained with the sentencepiece package: "
                           "pip install sentencepiece") from e
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(seed=seed)), model_writer=out, model_type="unigram", vocab_size=num_pieces,
        normalization_rule_name="nmt_nfkc", character_coverage=1.0, num_threads=1, hard_vocab_limit=False,
        minloglevel=2)
    return out.getvalue()


def xlmr_vocabulary(vocab_size: int, seed: int = 0) -> dict:
    """The GGUF tokenizer of an XLM-R model with ``vocab_size`` ids (at least
    ``TRAINED_PIECES`` + 2): ``tokens``, ``scores``, ``types``, ``charsmap`` (bytes),
    ``add_space_prefix``, ``remove_extra_whitespaces`` and ``num_pieces`` (SentencePiece's
    vocabulary size before the converter's realignment)."""
    from ..tokenizer.spec import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_UNUSED

    if vocab_size < TRAINED_PIECES + 2:
        raise ValueError(f"an XLM-R vocabulary needs at least {TRAINED_PIECES + 2} tokens, got {vocab_size}")
    blob = trained_model(TRAINED_PIECES, seed)  # first: it says what to install when sentencepiece is missing
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf
    proto.ParseFromString(blob)
    sp = spm.SentencePieceProcessor(model_proto=blob)
    pieces = [sp.IdToPiece(i) for i in range(sp.vocab_size())]
    scores = [sp.GetScore(i) for i in range(sp.vocab_size())]
    # 250,000 SentencePiece pieces in the real models (bge-m3 250,002 ids, multilingual-e5 250,037)
    num_pieces = min(vocab_size - 2, max(len(pieces), 250000))
    lowest = min(scores[3:])
    seen = set(pieces)
    fill = (("\u2581" if i % 3 else "") + "".join(p) for n in (2, 3, 4) for i, p in
            enumerate(itertools.product(_SYLLABLES, repeat=n)))
    extra = list(itertools.islice((p for p in fill if p not in seen), num_pieces - len(pieces)))
    pieces += extra
    scores += np.linspace(lowest - 1.0, lowest - 20.0, len(extra), dtype=np.float32).tolist()
    # the converter's realignment: fairseq's four specials, then SentencePiece ids 3.. moved up by one
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + pieces[3:] + [f"[PAD{i}]" for i in range(num_pieces, vocab_size - 1)]
    types = [TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_UNKNOWN] + [TOKEN_NORMAL] * (num_pieces - 3)
    types += [TOKEN_UNUSED] * (vocab_size - len(types))
    scores = [0.0] * 4 + scores[3:] + [-10000.0] * (vocab_size - num_pieces - 1)
    assert len(tokens) == len(types) == len(scores) == vocab_size
    spec = proto.normalizer_spec
    return {"tokens": tokens, "scores": scores, "types": types, "charsmap": spec.precompiled_charsmap,
            "add_space_prefix": spec.add_dummy_prefix, "remove_extra_whitespaces": spec.remove_extra_whitespaces,
            "num_pieces": num_pieces}


def add_xlmr_vocabulary(w, vocab_size: int, token_types: int, seed: int) -> None:
    """``xlmr_vocabulary`` and XLM-R's special ids, in the keys and order llama.cpp's converter
    writes (its SpecialVocab reads RobertaProcessing: BOS, EOS and SEP are added)."""
    v = xlmr_vocabulary(vocab_size, seed)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(v["tokens"])
    w.add_token_scores(v["scores"])
    w.add_token_types(v["types"])
    w.add_add_space_prefix(v["add_space_prefix"])
    w.add_token_type_count(token_types)
    w.add_remove_extra_whitespaces(v["remove_extra_whitespaces"])
    w.add_precompiled_charsmap(v["charsmap"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_unk_token_id(3)
    w.add_sep_token_id(2)
    w.add_pad_token_id(1)
    w.add_uint32("tokenizer.ggml.cls_token_id", 0)
    w.add_mask_token_id(v["num_pieces"] + 1)  # <mask>, after the last SentencePiece piece
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_bool("tokenizer.ggml.add_sep_token", True)
