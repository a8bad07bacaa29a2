"""SentencePiece-style BPE rules on tiny hand-made vocabularies."""

from __future__ import annotations

import logging

import pytest

from dualpath.errors import TokenizerError
from dualpath.tokenizer import TokenizerSpec, build_tokenizer
from dualpath.tokenizer.spec import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN

SPECIALS = [("<unk>", 0.0, TOKEN_UNKNOWN), ("<s>", 0.0, TOKEN_CONTROL), ("</s>", 0.0, TOKEN_CONTROL)]


def spm(pieces, *, with_bytes=True, unk=True) -> tuple:
    """A tokenizer over SPECIALS + optional byte tokens + (piece, score) NORMAL pieces; returns (tok, id_of)."""
    entries = list(SPECIALS)
    if with_bytes:
        entries += [(f"<0x{b:02X}>", 0.0, TOKEN_BYTE) for b in range(256)]
    entries += [(p, s, TOKEN_NORMAL) for p, s in pieces]
    spec = TokenizerSpec(model="llama", tokens=tuple(e[0] for e in entries), scores=tuple(e[1] for e in entries),
                         token_types=tuple(e[2] for e in entries), bos_id=1, eos_id=2, unk_id=0 if unk else None)
    index = {e[0]: i for i, e in enumerate(entries)}
    return build_tokenizer(spec), index.__getitem__


def test_highest_score_pair_merges_first():
    tok, id_of = spm([("▁", -9), ("a", -9), ("b", -9), ("c", -9), ("ab", -2), ("bc", -1)])
    assert tok.encode("abc", add_bos=False) == [id_of("▁"), id_of("a"), id_of("bc")]


def test_equal_scores_merge_the_leftmost_pair():
    tok, id_of = spm([("▁", -9), ("a", -9), ("b", -9), ("c", -9), ("ab", -1), ("bc", -1)])
    assert tok.encode("abc", add_bos=False) == [id_of("▁"), id_of("ab"), id_of("c")]


def test_merges_continue_through_longer_pieces():
    tok, id_of = spm([("▁", -9), ("a", -9), ("b", -9), ("▁a", -3), ("▁ab", -4), ("bb", -1)])
    assert tok.encode("abb", add_bos=False) == [id_of("▁a"), id_of("bb")]
    assert tok.encode("ab", add_bos=False) == [id_of("▁ab")]


def test_control_token_text_is_never_formed_by_merging():
    tok, id_of = spm([("▁", -9), ("<", -9), ("s", -9), (">", -9), ("<s", -1), ("▁<", -5)])
    assert tok.encode("<s>", add_bos=False) == [id_of("▁"), id_of("<s"), id_of(">")]


def test_unknown_code_points_fall_back_to_byte_tokens():
    tok, id_of = spm([("▁", -9), ("a", -9)])
    assert tok.encode("aé", add_bos=False) == [id_of("▁"), id_of("a"), id_of("<0xC3>"), id_of("<0xA9>")]


def test_without_byte_tokens_unknown_code_points_become_unk(caplog):
    with caplog.at_level(logging.WARNING):
        tok, id_of = spm([("▁", -9), ("a", -9)], with_bytes=False)
    assert "lacks 255 of 256 byte tokens" in caplog.text  # byte 0x61 falls back to the piece "a"
    assert tok.encode("aé", add_bos=False) == [id_of("▁"), id_of("a"), 0, 0]


def test_without_byte_tokens_or_unk_an_unknown_code_point_is_an_error():
    tok, _ = spm([("▁", -9), ("a", -9)], with_bytes=False, unk=False)
    with pytest.raises(TokenizerError, match="'é' is not in the vocabulary"):
        tok.encode("aé")


def test_byte_typed_piece_that_is_not_hex_is_rejected():
    spec = TokenizerSpec(model="llama", tokens=("<unk>", "<0xZZ>"), scores=(0.0, 0.0),
                         token_types=(TOKEN_UNKNOWN, TOKEN_BYTE), unk_id=0)
    with pytest.raises(TokenizerError, match="token 1 '<0xZZ>' has type BYTE"):
        build_tokenizer(spec)


def test_no_dummy_prefix_when_add_space_prefix_is_off():
    tok, id_of = spm([("▁", -9), ("a", -9), ("▁a", -1)])
    import dataclasses
    plain = build_tokenizer(dataclasses.replace(tok.spec, add_space_prefix=False))
    assert plain.encode("a a", add_bos=False) == [id_of("a"), id_of("▁a")]
    assert plain.decode([id_of("▁a")]) == " a"  # nothing to strip without a dummy prefix
    assert tok.decode([id_of("▁a")]) == "a"
