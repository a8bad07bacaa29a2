"""WordPiece (GGUF ``tokenizer.ggml.model`` ``bert``), as llama.cpp tokenizes it.

llama.cpp's converter rewrites a BERT vocabulary into "phantom space" pieces: a word-initial
piece ``foo`` becomes ``▁foo``, a continuation ``##bar`` becomes ``bar``, and control tokens
(``[CLS]``, ``[SEP]`` ...) stay as they are. Tokenizing a text (``llm_tokenizer_wpm_session``):

1. Normalize code point by code point. With ``strip_accents`` each code point becomes the
   first code point of its NFD decomposition and combining marks (\\p{M}) are dropped; with
   ``lowercase`` it takes its simple lowercase mapping. NUL, U+FFFD and \\p{C} are dropped.
2. Split into words at whitespace; punctuation (\\p{P}), ASCII symbols and CJK ideographs are
   words of one code point.
3. For each word, ``"▁" + word`` is cut greedily into the longest pieces of the vocabulary,
   compared as UTF-8 bytes; a word with a piece that matches nothing becomes one unknown
   token.

With special tokens (``add_bos``), [CLS] (the BOS id) comes first and [SEP] last. llama.cpp's
Unicode tables come from a newer Unicode version than Python's ``unicodedata``: code points
assigned since may be classified differently.
"""

from __future__ import annotations

import functools
import unicodedata

from ..errors import TokenizerError
from .base import Tokenizer
from .spec import TokenizerSpec

SPACE_PIECE = "\u2581"

_WHITESPACE = frozenset(list(range(0x09, 0x0E)) + list(range(0x2000, 0x200B)) +
                        [0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
"""llama.cpp's whitespace set (Unicode's White_Space property)."""

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
"""The ideograph ranges llama.cpp splits one by one (including its 0x2B920 lower bound, as
Hugging Face's BERT tokenizer has it)."""

# What one code point does in step 1-2: dropped, ends a word, is a word of its own, or is
# appended (with its normalized text).
_DROP, _SPACE, _ALONE, _APPEND = range(4)


@functools.lru_cache(maxsize=1 << 16)
def _classify(ch: str, lowercase: bool, strip_accents: bool) -> tuple[int, str]:
    cpt = ord(ch)
    if strip_accents:
        ch = unicodedata.normalize("NFD", ch)[0]
        cpt = ord(ch)
    if cpt in _WHITESPACE:
        return _SPACE, ""
    category = unicodedata.category(ch)
    if cpt in (0, 0xFFFD) or category[0] == "C" and category != "Cn":
        return _DROP, ""
    if strip_accents and category[0] == "M":
        return _DROP, ""
    if lowercase:
        ch = ch.lower()[0]  # the simple mapping: U+0130's full one is two code points
    if category[0] == "P" or (cpt < 0x7F and category[0] == "S") or any(a <= cpt <= b for a, b in _CJK):
        return _ALONE, ch
    return _APPEND, ch


class WpmTokenizer(Tokenizer):
    """WordPiece over a phantom-space vocabulary (see the module docstring)."""

    def __init__(self, spec: TokenizerSpec):
        super().__init__(spec)
        if spec.unk_id is None or spec.bos_id is None or spec.extra.get("sep_id") is None:
            raise TokenizerError("a WordPiece vocabulary needs unk_id, bos_id ([CLS]) and extra['sep_id'] ([SEP])")
        self._sep_id = int(spec.extra["sep_id"])
        self._lowercase = bool(spec.extra.get("lowercase", True))
        self._strip_accents = bool(spec.extra.get("strip_accents", self._lowercase))
        # UTF-8 text -> id; a text twice keeps its last id, as llama.cpp's token_to_id does.
        self._bytes_to_id = {t.encode("utf-8"): i for i, t in enumerate(spec.tokens)}
        self._max_len = max(len(b) for b in self._bytes_to_id)
        self._build_byte_tables()

    @property
    def sep_id(self) -> int:
        return self._sep_id

    def _normal_piece_bytes(self, piece: str) -> bytes:
        return piece.replace(SPACE_PIECE, " ").encode("utf-8")

    def encode(self, text: str, add_bos: bool | None = None, *,
               add_eos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``: [CLS] words [SEP] with special tokens (``add_bos``, the
        default), the words alone without."""
        if add_bos is None:
            add_bos = self._spec.add_bos
        ids = super().encode(text, add_bos, add_eos=add_eos, parse_special=parse_special)
        if add_bos:
            ids.append(self._sep_id)
        return ids

    def words(self, text: str) -> list[str]:
        """Steps 1 and 2 of the module docstring: the normalized words of ``text``."""
        words: list[str] = []
        current: list[str] = []
        for ch in text:
            kind, out = _classify(ch, self._lowercase, self._strip_accents)
            if kind == _APPEND:
                current.append(out)
            elif kind == _SPACE or kind == _ALONE:
                if current:
                    words.append("".join(current))
                    current = []
                if kind == _ALONE:
                    words.append(out)
        if current:
            words.append("".join(current))
        return words

    def _encode_fragment(self, text: str, after_special: bool) -> list[int]:
        ids: list[int] = []
        lookup, max_len, unk = self._bytes_to_id.get, self._max_len, self._spec.unk_id
        for word in self.words(text):
            data = (SPACE_PIECE + word).encode("utf-8")
            n, start, i = len(data), len(ids), 0
            while i < n:
                for j in range(min(n, i + max_len), i, -1):
                    token_id = lookup(data[i:j])
                    if token_id is not None:
                        ids.append(token_id)
                        i = j
                        break
                else:  # no piece starts here: the whole word is unknown
                    del ids[start:]
                    break
            if len(ids) == start:
                ids.append(unk)  # type: ignore[arg-type]  # checked in __init__
        return ids
