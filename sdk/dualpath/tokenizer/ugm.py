"""SentencePiece Unigram (GGUF ``tokenizer.ggml.model`` ``t5``), as llama.cpp tokenizes it.

T5 and the XLM-RoBERTa encoders (bge-m3, multilingual-e5, bge-reranker-v2-m3) carry this
vocabulary. llama.cpp's ``llm_tokenizer_ugm_session`` does, per plain-text fragment:

1. Normalize, left to right over the UTF-8 bytes. At each offset the longest prefix that
   starts some USER_DEFINED token is kept as it is (llama.cpp's trie walk: the prefix of such
   a token counts too); else the longest prefix the precompiled charsmap knows is replaced by
   its replacement string; else one code point is kept (a byte that starts none, which only
   a user-defined prefix ending inside a code point leaves, becomes U+FFFD). Of the result, every byte other than
   a space is copied, a space becomes U+2581 ("▁"). With ``add_space_prefix`` a "▁" goes
   before the first non-space byte; with ``remove_extra_whitespaces`` spaces are dropped and
   one "▁" goes before every run of non-space bytes instead (the first included).
2. Viterbi over the normalized bytes, one code point at a time: every NORMAL, USER_DEFINED
   or UNUSED piece that starts there is a candidate edge scored with its score (USER_DEFINED:
   0), summed in double precision; a code point that no one-code-point piece covers also gets
   the unknown token at the lowest NORMAL score minus 10 (float32 arithmetic). The best
   path wins, the first one found on ties; runs of unknown tokens become one. The pieces
   starting at a position are found by bisection in the sorted pieces, one byte longer at a
   time until none starts so (llama.cpp walks a trie): a text costs O(length x longest piece).

With special tokens (``add_bos``/``add_eos``, the file's ``add_bos_token``/``add_eos_token``;
llama.cpp's defaults are no BOS and EOS), an XLM-R file gives ``<s> text </s>``.

The charsmap (``normalizer_spec.precompiled_charsmap`` of a SentencePiece model) is a
uint32 byte count, then an XOR-compressed compact double array (XCDA) over the input bytes,
then NUL-terminated replacement strings that the XCDA's leaves point into.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import struct
import sys
from array import array

from ..errors import TokenizerError
from .base import Tokenizer, ids_where
from .spec import TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_USER_DEFINED, TokenizerSpec

SPACE_PIECE = "\u2581"
_ESCAPED_SPACE = SPACE_PIECE.encode("utf-8")
CHARSMAP_KEY = "tokenizer.ggml.precompiled_charsmap"
_UNKNOWN_PENALTY = 10.0
_UTF8_LEN = (1,) * 12 + (2, 2, 3, 4)
"""Code units of a UTF-8 sequence by its first byte's high nibble (llama.cpp's
``unicode_len_utf8``: a stray continuation byte counts as one)."""
_REPLACEMENT = "\ufffd".encode("utf-8")


def _utf8_width(data: bytes, offset: int) -> int:
    """Bytes of the well-formed UTF-8 sequence at ``offset``, 0 when it is not one (llama.cpp's
    ``unicode_cpt_from_utf8``: the lead byte and the continuation bytes' top bits)."""
    lead = data[offset]
    if lead < 0x80:
        return 1
    if lead < 0xC0 or lead >= 0xF8:
        return 0
    width = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    if offset + width > len(data) or any(b & 0xC0 != 0x80 for b in data[offset + 1:offset + width]):
        return 0
    return width


class Charsmap:
    """A precompiled charsmap: ``longest(data, offset)`` finds the replacement of the longest
    input prefix it knows (see the module docstring)."""

    __slots__ = ("_xcda", "_replacements")

    def __init__(self, blob: bytes):
        """Raises TokenizerError naming the key when ``blob`` cannot be a charsmap (llama.cpp's
        load-time checks: a 4-byte header, an XCDA that leaves room for replacements)."""
        if len(blob) < 4:
            raise TokenizerError(f"{CHARSMAP_KEY} has {len(blob)} bytes, too few for its 4-byte size header")
        (xcda_bytes,) = struct.unpack_from("<I", blob, 0)
        if xcda_bytes + 4 >= len(blob) or xcda_bytes % 4:
            raise TokenizerError(f"{CHARSMAP_KEY} is truncated or corrupt: its header claims {xcda_bytes} bytes of "
                                 f"double array, and the whole charsmap has {len(blob)}")
        xcda = array("I", blob[4:4 + xcda_bytes])
        if sys.byteorder == "big":
            xcda.byteswap()
        self._xcda = xcda.tolist()  # list indexing is the walk's inner step: faster than array's
        self._replacements = blob[4 + xcda_bytes:]

    def longest(self, data: bytes, offset: int) -> tuple[bytes, int] | None:
        """(replacement, input bytes it replaces) for the longest prefix of ``data[offset:]``
        the charsmap maps, or None."""
        xcda = self._xcda
        size = len(xcda)
        if not size:  # llama.cpp skips an empty double array
            return None
        try:
            node = _base(xcda[0])
            matched, value = 0, 0
            for i in range(offset, len(data)):
                c = data[i]
                if c == 0:
                    break
                node ^= c
                if node >= size:
                    raise IndexError
                packed = xcda[node]
                if packed & 0x800000FF != c:  # LCHECK: not a child of the previous node
                    break
                node ^= _base(packed)
                if packed & 0x100:  # a leaf: BASE points at the node holding the replacement's offset
                    if node >= size:
                        raise IndexError
                    matched, value = i - offset + 1, xcda[node] & 0x7FFFFFFF
        except IndexError:
            raise TokenizerError(f"{CHARSMAP_KEY} is corrupt: its double array points past its end") from None
        if not matched:
            return None
        end = self._replacements.find(b"\0", value)
        if value >= len(self._replacements) or end < 0:
            raise TokenizerError(f"{CHARSMAP_KEY} is corrupt: replacement string at offset {value} is "
                                 "outside the charsmap or not NUL-terminated")
        return self._replacements[value:end], matched


def _base(packed: int) -> int:
    return (packed >> 10) << ((packed & 0x200) >> 6)


def charsmap_from_spec(spec: TokenizerSpec) -> Charsmap | None:
    """The charsmap ``spec.extra["precompiled_charsmap"]`` holds (base64 text, so that the
    spec stays JSON), or None when the vocabulary has none."""
    encoded = spec.extra.get("precompiled_charsmap")
    if not encoded:
        return None
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, TypeError, ValueError) as e:
        raise TokenizerError(f"{CHARSMAP_KEY}: not valid base64 in the tokenizer spec ({e})") from None
    return Charsmap(blob)


class _SortedPieces:
    """Byte strings, sorted, to ask "does any of them start with p?" (llama.cpp walks a trie;
    a sorted list of the vocabulary's own strings costs no extra memory)."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = sorted(items)

    def starts_any(self, prefix: bytes, lo: int = 0) -> int:
        """The index of the first item >= ``prefix`` when one starts with it, else -1."""
        items = self.items
        i = bisect.bisect_left(items, prefix, lo)
        return i if i < len(items) and items[i].startswith(prefix) else -1


class UgmTokenizer(Tokenizer):
    """SentencePiece Unigram over a scored vocabulary (see the module docstring)."""

    def __init__(self, spec: TokenizerSpec):
        super().__init__(spec)
        if spec.scores is None:
            raise TokenizerError("a Unigram (t5) vocabulary needs scores (tokenizer.ggml.scores is missing)")
        if spec.unk_id is None:
            raise TokenizerError("a Unigram (t5) vocabulary needs an unknown token "
                                 "(tokenizer.ggml.unknown_token_id is missing or outside the vocabulary)")
        self._charsmap = charsmap_from_spec(spec)
        self._remove_extra_whitespaces = bool(spec.extra.get("remove_extra_whitespaces", False))
        # llama.cpp reads no key for this; SentencePiece's option, off in every converted model.
        self._whitespace_suffix = bool(spec.extra.get("treat_whitespace_as_suffix", False))
        types = self._types
        normal = ids_where(types, TOKEN_NORMAL.__eq__)
        user = ids_where(types, TOKEN_USER_DEFINED.__eq__)
        matchable = sorted(normal + user + ids_where(types, TOKEN_UNUSED.__eq__))
        # A piece's UTF-8 text -> id (the base class refused a vocabulary with a text twice).
        self._ids = {spec.tokens[i].encode("utf-8"): i for i in matchable if spec.tokens[i]}
        self._pieces = _SortedPieces(self._ids)
        self._user = _SortedPieces(spec.tokens[i].encode("utf-8") for i in user if spec.tokens[i])
        self._has_user = bool(user)
        self._scores = array("d", spec.scores)  # summed in double precision, as llama.cpp does
        for i in user:
            self._scores[i] = 0.0  # llama.cpp: user-defined pieces always beat log probabilities
        # min over NORMAL scores minus the penalty, in float32 as llama.cpp computes it
        lowest = min((self._scores[i] for i in normal), default=3.4028234663852886e38)
        self._unknown_score = array("f", [array("f", [lowest])[0] - _UNKNOWN_PENALTY])[0]
        self._build_byte_tables()

    @property
    def sep_id(self) -> int | None:
        """The separator (GGUF ``seperator_token_id``; XLM-R's is ``</s>``), None when the file has none."""
        value = self._spec.extra.get("sep_id")
        return None if value is None else int(value)

    @property
    def strips_leading_space(self) -> bool:
        return self._spec.add_space_prefix

    def _normal_piece_bytes(self, piece: str) -> bytes:
        return piece.replace(SPACE_PIECE, " ").encode("utf-8")

    def _encode_fragment(self, text: str, after_special: bool) -> list[int]:
        return self.viterbi(self.normalize(text.encode("utf-8")))

    def normalize(self, data: bytes) -> bytes:
        """Step 1 of the module docstring: the normalized bytes of UTF-8 ``data``."""
        out = bytearray()
        prepend = self._spec.add_space_prefix and not self._whitespace_suffix
        merge = self._remove_extra_whitespaces
        prepended = in_word = False
        offset, n = 0, len(data)
        while offset < n:
            chunk, used = self._normalize_prefix(data, offset)
            offset += used
            for c in chunk:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend and not prepended) or merge:
                            out += _ESCAPED_SPACE
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:
                        out += _ESCAPED_SPACE
        if self._whitespace_suffix and self._spec.add_space_prefix:
            out += _ESCAPED_SPACE
        return bytes(out)

    def _normalize_prefix(self, data: bytes, offset: int) -> tuple[bytes, int]:
        """(normalized text, input bytes consumed) at ``offset``."""
        if self._has_user:
            length, lo = 0, 0
            while offset + length < len(data):
                lo = self._user.starts_any(data[offset:offset + length + 1], lo)
                if lo < 0:
                    break
                length += 1
            if length:
                return data[offset:offset + length], length
        if self._charsmap is not None:
            found = self._charsmap.longest(data, offset)
            if found is not None:
                return found
        # One code point as it is. The text is valid UTF-8, but a user-defined prefix (above)
        # may have stopped inside a code point: llama.cpp then makes each stray byte U+FFFD.
        used = _utf8_width(data, offset)
        return (data[offset:offset + used], used) if used else (_REPLACEMENT, 1)

    def viterbi(self, data: bytes) -> list[int]:
        """Step 2 of the module docstring: the best token ids of normalized ``data``."""
        n = len(data)
        if n == 0:
            return []
        unk, unknown_score = self._spec.unk_id, self._unknown_score
        ids_get, scores = self._ids.get, self._scores
        pieces, num_pieces, bisect_left = self._pieces.items, len(self._pieces.items), bisect.bisect_left
        best = [-float("inf")] * (n + 1)   # (n + 1,) best score of a path ending at each byte
        best[0] = 0.0
        token = [unk] * (n + 1)            # (n + 1,) last token of that path
        start = [0] * (n + 1)              # (n + 1,) where that token starts
        offset = 0
        while offset < n:
            width = min(_UTF8_LEN[data[offset] >> 4], n - offset)
            here = best[offset]
            covered = False
            end, lo = offset + 1, 0
            while end <= n:  # _SortedPieces.starts_any, inlined: this is the inner loop
                prefix = data[offset:end]
                lo = bisect_left(pieces, prefix, lo)
                if lo == num_pieces or not pieces[lo].startswith(prefix):
                    break
                token_id = ids_get(prefix)
                if token_id is not None:
                    covered = covered or end - offset == width
                    score = here + scores[token_id]
                    if score > best[end]:
                        best[end], token[end], start[end] = score, token_id, offset
                end += 1
            if not covered:
                end = offset + width
                score = here + unknown_score
                if score > best[end]:
                    best[end], token[end], start[end] = score, unk, offset
            offset += width
        out: list[int] = []
        pos, prev_unknown = n, False
        while True:
            is_unknown = token[pos] == unk
            if not (prev_unknown and is_unknown):
                out.append(token[pos])  # type: ignore[arg-type]  # unk_id checked in __init__
            if start[pos] == 0:
                break
            prev_unknown, pos = is_unknown, start[pos]
        out.reverse()
        return out
