"""decode, token_bytes and StreamDecoder on the stories260K SentencePiece vocabulary."""

from __future__ import annotations

import random

import pytest

from dualpath.errors import TokenizerError
from dualpath.tokenizer import StreamDecoder

BOS, EOS, UNK, SPACE = 1, 2, 0, 410  # SPACE is the piece "▁"


def byte_ids(text: str) -> list[int]:
    """The byte-fallback token of every UTF-8 byte of ``text`` (tok512: byte b -> id b + 3)."""
    return [b + 3 for b in text.encode("utf-8")]


def stream(tok, ids, skip_special=True) -> list[str]:
    dec = StreamDecoder(tok, skip_special=skip_special)
    return [dec.feed(i) for i in ids] + [dec.flush()]


def test_decode_round_trips_every_corpus_string(stories_tok, corpus):
    # U+2581 is SentencePiece's escaped space, so a literal "▁" comes back as " " (as in
    # llama.cpp and SentencePiece); every other string comes back unchanged.
    for s in corpus:
        assert stories_tok.decode(stories_tok.encode(s)) == s.replace("\u2581", " "), repr(s)
    assert stories_tok.decode(stories_tok.encode("a\u2581b")) == "a b"


def test_decode_strips_only_the_dummy_prefix_space(stories_tok):
    once = stories_tok.encode("Once", add_bos=False)
    assert stories_tok.decode([BOS] + once) == "Once"
    assert stories_tok.decode(once) == "Once"
    assert stories_tok.decode([BOS] + stories_tok.encode(" Once", add_bos=False)) == " Once"
    assert stories_tok.decode([BOS, SPACE, SPACE]) == " "
    # Only the first piece that produces text loses its space.
    assert stories_tok.decode(once + once) == "Once Once"
    # A byte token for a space is text the user wrote, not the dummy prefix.
    assert stories_tok.decode(byte_ids(" ") + once) == "  Once"


def test_decode_skips_control_tokens_unless_asked(stories_tok):
    ids = [BOS] + stories_tok.encode("Once", add_bos=False) + [EOS]
    assert stories_tok.decode(ids) == "Once"
    assert stories_tok.decode(ids, skip_special=False) == "<s> Once</s>"
    assert stories_tok.decode([BOS]) == ""
    assert stories_tok.decode([UNK]) == "" and stories_tok.decode([UNK], skip_special=False) == "<unk>"


def test_decode_joins_byte_tokens_before_utf8_decoding(stories_tok):
    assert stories_tok.decode(byte_ids("é🐶")) == "é🐶"
    assert stories_tok.decode(byte_ids("é")[:1]) == "\ufffd"  # incomplete at the end
    assert stories_tok.decode([0xFF + 3, 0x41 + 3]) == "\ufffdA"  # invalid byte


def test_token_bytes_gives_the_raw_bytes_of_each_token_type(stories_tok):
    assert stories_tok.token_bytes(0x41 + 3) == b"A"
    assert stories_tok.token_bytes(0xC3 + 3) == b"\xc3"
    assert stories_tok.token_bytes(SPACE) == b" "
    assert stories_tok.token_bytes(403) == b" Once"
    assert stories_tok.token_bytes(BOS) == b"" and stories_tok.token_bytes(EOS) == b""


@pytest.mark.parametrize("bad", [-1, 512, 10**9])
def test_out_of_range_ids_raise_tokenizer_error_naming_the_id(stories_tok, bad):
    with pytest.raises(TokenizerError, match=str(bad)):
        stories_tok.decode([BOS, bad])
    with pytest.raises(TokenizerError, match=str(bad)):
        stories_tok.token_bytes(bad)
    with pytest.raises(TokenizerError, match=str(bad)):
        StreamDecoder(stories_tok).feed(bad)


def test_stream_holds_e_acute_until_both_bytes_arrived(stories_tok):
    assert stream(stories_tok, byte_ids("é")) == ["", "é", ""]


def test_stream_holds_dog_emoji_until_all_four_bytes_arrived(stories_tok):
    assert stream(stories_tok, byte_ids("🐶")) == ["", "", "", "🐶", ""]


def test_stream_emits_replacement_once_a_sequence_cannot_become_valid(stories_tok):
    c3, a = byte_ids("é")[0], 0x41 + 3
    assert stream(stories_tok, [c3, a]) == ["", "\ufffdA", ""]
    assert stream(stories_tok, [0xFF + 3]) == ["\ufffd", ""]
    # F0 9F is a valid start of a 4-byte character: held, and U+FFFD only at flush.
    assert stream(stories_tok, byte_ids("🐶")[:2]) == ["", "", "\ufffd"]


def test_stream_applies_the_leading_space_rule_once(stories_tok):
    ids = stories_tok.encode("Once upon a time")
    deltas = stream(stories_tok, ids)
    assert deltas[:3] == ["", "Once", " upon"]
    assert "".join(deltas) == "Once upon a time"


def test_stream_concatenation_equals_decode_on_corpus(stories_tok, corpus):
    for s in corpus[:120]:
        ids = stories_tok.encode(s)
        assert "".join(stream(stories_tok, ids)) == stories_tok.decode(ids) == s.replace("\u2581", " ")


@pytest.mark.parametrize("skip_special", [True, False])
def test_stream_concatenation_equals_decode_on_random_id_sequences(stories_tok, skip_special):
    rng = random.Random(7)
    byte_tokens = list(range(3, 259))
    for _ in range(2000):
        pool = byte_tokens if rng.random() < 0.5 else range(512)
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        deltas = stream(stories_tok, ids, skip_special)
        assert "".join(deltas) == stories_tok.decode(ids, skip_special=skip_special), ids


def test_stream_decoder_starts_afresh_after_flush(stories_tok):
    dec = StreamDecoder(stories_tok)
    ids = stories_tok.encode("Once", add_bos=False)
    first = "".join(dec.feed(i) for i in ids) + dec.flush()
    second = "".join(dec.feed(i) for i in ids) + dec.flush()
    assert first == second == "Once"


def test_stream_after_a_prompt_keeps_the_space_of_the_first_generated_piece(stories_tok, reference_runs):
    run = next(r for r in reference_runs if r["name"] == "greedy_once_upon_a_time")
    prompt, generated = run["prompt_ids"], run["generated_ids"]
    dec = StreamDecoder(stories_tok, prompt_ids=prompt)
    deltas = [dec.feed(i) for i in generated] + [dec.flush()]
    assert deltas[0] == ","  # 432 is ",", and the next piece " there" keeps its space
    assert deltas[1].startswith(" ")
    assert stories_tok.decode(prompt) + "".join(deltas) == stories_tok.decode(prompt + generated)


def test_stream_with_a_prompt_of_only_bos_still_strips_the_dummy_prefix(stories_tok):
    ids = stories_tok.encode("Once upon", add_bos=False)
    dec = StreamDecoder(stories_tok, prompt_ids=[BOS])
    assert "".join(dec.feed(i) for i in ids) + dec.flush() == "Once upon"
