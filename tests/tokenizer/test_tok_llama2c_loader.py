"""load_llama2c_tokenizer: the tok512.bin layout, and every way a file can be malformed."""

from __future__ import annotations

import logging
import random
import struct

import pytest

from dualpath.errors import ModelLoadError, TokenizerError
from dualpath.tokenizer import TokenizerSpec, build_tokenizer, load_llama2c_tokenizer
from dualpath.tokenizer.spec import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN


def record_offsets(data: bytes) -> list[int]:
    """Byte offset of each token record in a llama2.c tokenizer file."""
    offsets, pos = [], 4
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack_from("<i", data, pos + 4)
        pos += 8 + length
    return offsets


def write_tokenizer(path, records, max_token_length=7) -> None:
    """Write a llama2.c tokenizer file from (score, piece bytes) records."""
    out = [struct.pack("<i", max_token_length)]
    for score, piece in records:
        out.append(struct.pack("<fi", score, len(piece)) + piece)
    path.write_bytes(b"".join(out))


def test_tok512_bin_becomes_a_llama_spec_with_typed_tokens(tok512_spec, tok512_bin):
    spec = tok512_spec
    assert spec.model == "llama" and spec.vocab_size == 512
    assert spec.tokens[:4] == ("<unk>", "<s>", "</s>", "<0x00>")
    assert list(spec.token_types[:3]) == [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    assert spec.token_types.count(TOKEN_BYTE) == 256 and spec.token_types[258] == TOKEN_BYTE
    assert spec.token_types.count(TOKEN_NORMAL) == 253
    assert spec.tokens[410] == "\u2581" and spec.tokens[403] == "\u2581Once"  # ' ' -> '▁'
    assert (spec.bos_id, spec.eos_id, spec.unk_id, spec.add_bos, spec.add_space_prefix) == (1, 2, 0, True, True)
    assert spec.scores[259] == 0.0 and spec.scores[511] == -252.0
    assert spec.extra["max_token_length"] == 7
    assert load_llama2c_tokenizer(tok512_bin) == spec  # vocab_size=None reads to the end of the file


def test_truncated_file_names_the_file_and_the_token(tmp_path, tok512_bin):
    data = tok512_bin.read_bytes()
    cut = record_offsets(data)[37] + 10  # inside the piece of token 37
    path = tmp_path / "tok_truncated.bin"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelLoadError, match=r"tok_truncated\.bin: truncated at token 37 of 512") as info:
        load_llama2c_tokenizer(path, vocab_size=512)
    assert info.value.path == str(path)
    with pytest.raises(ModelLoadError, match="truncated at token 37"):
        load_llama2c_tokenizer(path)


def test_file_shorter_than_vocab_size_is_truncated(tmp_path, tok512_bin):
    with pytest.raises(ModelLoadError, match="truncated at token 512 of 600"):
        load_llama2c_tokenizer(tok512_bin, vocab_size=600)


@pytest.mark.parametrize("size", [0, 3])
def test_missing_header_is_reported(tmp_path, size):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\x07" * size)
    with pytest.raises(ModelLoadError, match=r"short\.bin: truncated header"):
        load_llama2c_tokenizer(path)


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_raise_model_load_error_naming_the_file(tmp_path, seed):
    path = tmp_path / f"garbage{seed}.bin"
    path.write_bytes(random.Random(seed).randbytes(6227))
    with pytest.raises(ModelLoadError, match=f"garbage{seed}.bin"):
        load_llama2c_tokenizer(path, vocab_size=512)
    with pytest.raises(ModelLoadError, match=f"garbage{seed}.bin"):
        load_llama2c_tokenizer(path)


def test_missing_file_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.bin: cannot read"):
        load_llama2c_tokenizer(tmp_path / "nope.bin")


def test_piece_longer_than_max_token_length_is_rejected(tmp_path):
    path = tmp_path / "long.bin"
    write_tokenizer(path, [(0.0, b"<unk>"), (0.0, b"<s>"), (0.0, b"</s>"), (0.0, b"abcdefgh")])
    with pytest.raises(ModelLoadError, match="token 3: length 8 is not in"):
        load_llama2c_tokenizer(path)


def test_non_finite_score_is_rejected(tmp_path):
    path = tmp_path / "nan.bin"
    write_tokenizer(path, [(0.0, b"<unk>"), (0.0, b"<s>"), (float("nan"), b"</s>")])
    with pytest.raises(ModelLoadError, match="token 2: score nan is not finite"):
        load_llama2c_tokenizer(path)


def test_invalid_utf8_piece_is_rejected(tmp_path):
    path = tmp_path / "utf8.bin"
    write_tokenizer(path, [(0.0, b"<unk>"), (0.0, b"<s>"), (0.0, b"</s>"), (0.0, b"\xff\xfe")])
    with pytest.raises(ModelLoadError, match="token 3: piece is not valid UTF-8"):
        load_llama2c_tokenizer(path)


def test_too_few_tokens_is_rejected(tmp_path):
    path = tmp_path / "two.bin"
    write_tokenizer(path, [(0.0, b"<unk>"), (0.0, b"<s>")])
    with pytest.raises(ModelLoadError, match="only 2 tokens"):
        load_llama2c_tokenizer(path)


def test_trailing_bytes_after_vocab_size_tokens_are_logged(tmp_path, tok512_bin, caplog):
    path = tmp_path / "trailing.bin"
    path.write_bytes(tok512_bin.read_bytes() + b"junk")
    with caplog.at_level(logging.WARNING):
        spec = load_llama2c_tokenizer(path, vocab_size=512)
    assert spec.vocab_size == 512
    assert "4 bytes after the 512 tokens" in caplog.text


def test_spec_problems_raise_tokenizer_error():
    with pytest.raises(TokenizerError, match="duplicate token in vocabulary: 'a' has ids 0 and 1"):
        build_tokenizer(TokenizerSpec(model="llama", tokens=("a", "a")))
    with pytest.raises(TokenizerError, match=r"bos_id=5 is outside the vocabulary \[0, 2\)"):
        build_tokenizer(TokenizerSpec(model="llama", tokens=("a", "b"), bos_id=5))
    with pytest.raises(TokenizerError, match="scores has 1 entries"):
        build_tokenizer(TokenizerSpec(model="llama", tokens=("a", "b"), scores=(0.0,)))
    with pytest.raises(TokenizerError, match="'wpm' is not supported"):
        build_tokenizer(TokenizerSpec(model="wpm", tokens=("a",)))
    with pytest.raises(TokenizerError, match="empty"):
        build_tokenizer(TokenizerSpec(model="llama", tokens=()))
