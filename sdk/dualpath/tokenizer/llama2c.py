"""Reader for llama2.c tokenizer files (``tokenizer.bin``, ``tok512.bin``).

Layout, little-endian: ``int32 max_token_length``, then one record per token id in order:
``float32 score, int32 len, len bytes`` (UTF-8, not NUL-terminated). Pieces use a plain
space where SentencePiece uses U+2581, and BOS/EOS are stored as ``"\\n<s>\\n"`` and
``"\\n</s>\\n"``. The file does not store the token count: run.c takes it from the
checkpoint header, and so do we when ``vocab_size`` is given.
"""

from __future__ import annotations

import logging
import math
import re
import struct
from pathlib import Path

from ..errors import ModelLoadError
from .spec import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TokenizerSpec

logger = logging.getLogger(__name__)

_MAX_TOKEN_BYTES = 4096  # far above any real vocabulary (Llama 2: 27); rejects garbage headers
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")
_RECORD = struct.Struct("<fi")  # score, len
# SentencePiece's fixed special ids in every llama2.c export: (piece, type).
_SPECIALS = {0: ("<unk>", TOKEN_UNKNOWN), 1: ("<s>", TOKEN_CONTROL), 2: ("</s>", TOKEN_CONTROL)}


def load_llama2c_tokenizer(path: str | Path, vocab_size: int | None = None) -> TokenizerSpec:
    """Read a llama2.c tokenizer file into a ``TokenizerSpec`` of model ``"llama"``.

    ``vocab_size``: the checkpoint's vocabulary size; exactly that many records are read.
    None reads records up to the end of the file. Ids 0/1/2 become ``<unk>``/``<s>``/``</s>``
    (UNKNOWN/CONTROL), ``<0xNN>`` pieces are BYTE tokens, everything else NORMAL.
    Raises ``ModelLoadError`` naming the file and the problem for any malformed file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(path, f"cannot read tokenizer file: {e.strerror or e}") from e
    if vocab_size is not None and vocab_size < 3:
        raise ModelLoadError(path, f"vocab_size={vocab_size} must be at least 3 (<unk>, <s>, </s>)")
    if len(data) < 4:
        raise ModelLoadError(path, f"truncated header: {len(data)} bytes, expected 4 (int32 max_token_length)")
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    if not 1 <= max_token_length <= _MAX_TOKEN_BYTES:
        raise ModelLoadError(path, f"max_token_length={max_token_length} is not in [1, {_MAX_TOKEN_BYTES}]: "
                                   "not a llama2.c tokenizer file")

    of_total = f" of {vocab_size}" if vocab_size is not None else ""
    pieces: list[str] = []
    scores: list[float] = []
    pos = 4
    while (len(pieces) < vocab_size) if vocab_size is not None else (pos < len(data)):
        token_id = len(pieces)
        if pos + _RECORD.size > len(data):
            raise ModelLoadError(path, f"truncated at token {token_id}{of_total}: "
                                       f"{len(data) - pos} bytes left, a record header needs {_RECORD.size}")
        score, length = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        if not 1 <= length <= max_token_length:
            raise ModelLoadError(path, f"token {token_id}{of_total}: length {length} is not in "
                                       f"[1, max_token_length={max_token_length}]")
        if pos + length > len(data):
            raise ModelLoadError(path, f"truncated at token {token_id}{of_total}: "
                                       f"{len(data) - pos} bytes left, the piece needs {length}")
        if not math.isfinite(score):
            raise ModelLoadError(path, f"token {token_id}{of_total}: score {score} is not finite")
        try:
            text = data[pos:pos + length].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelLoadError(path, f"token {token_id}{of_total}: piece is not valid UTF-8 ({e.reason})") from e
        pos += length
        pieces.append(text)
        scores.append(score)
    if len(pieces) < 3:
        raise ModelLoadError(path, f"only {len(pieces)} tokens; need at least 3 (<unk>, <s>, </s>)")
    if pos < len(data):
        logger.warning("%s: %d bytes after the %d tokens of vocab_size are ignored", path, len(data) - pos, vocab_size)

    tokens: list[str] = []
    types: list[int] = []
    for token_id, text in enumerate(pieces):
        if token_id in _SPECIALS:
            piece, kind = _SPECIALS[token_id]
            if text.strip() != piece:
                logger.warning("%s: token %d is %r, expected %r; treating it as %s anyway",
                               path, token_id, text, piece, piece)
        elif _BYTE_PIECE.fullmatch(text):
            piece, kind = text, TOKEN_BYTE
        else:
            piece, kind = text.replace(" ", "\u2581"), TOKEN_NORMAL
        tokens.append(piece)
        types.append(kind)

    return TokenizerSpec(
        model="llama",
        tokens=tuple(tokens),
        scores=tuple(scores),
        token_types=tuple(types),
        bos_id=1,
        eos_id=2,
        unk_id=0,
        add_bos=True,
        add_space_prefix=True,
        extra={"source": str(path), "max_token_length": max_token_length},
    )
