"""SentencePiece-style BPE with scores and byte fallback (GGUF ``tokenizer.ggml.model == "llama"``).

The algorithm is llama.cpp's ``llm_tokenizer_spm`` and llama2.c ``run.c`` ``encode``:

1. spaces become U+2581 ("▁"); a leading "▁" (the dummy prefix) is added to non-empty
   text when ``spec.add_space_prefix`` (llama.cpp adds it again after each special token);
2. the text is split into code points;
3. the adjacent pair whose concatenation is a vocabulary piece with the highest score
   is merged, leftmost first on ties, until no pair is a piece;
4. a code point that is not a piece becomes its UTF-8 bytes as ``<0xNN>`` tokens.

Step 3 uses a heap of candidate pairs over a doubly linked list of symbols, so a
prompt of n code points costs O(n log n), not O(n^2).

This is llama.cpp's ``llm_tokenizer_spm_session``, with one deliberate difference: pieces
of type CONTROL and UNKNOWN are never produced by merging (as in SentencePiece), so the text
``<s>`` in a prompt stays plain characters and never becomes BOS. llama.cpp looks merged text
up among all tokens, so in a vocabulary that also has a piece such as ``<s`` its plain-text
``<s>`` becomes BOS (pinned by test_tok_spm_parity.py). That would break our invariant that
special tokens come from text only with ``parse_special``. The two behaviours agree wherever no
such path exists, which includes llama.cpp's own Llama 2 (also TinyLlama's) and Phi-3
vocabularies over the whole test corpus. BYTE and UNUSED pieces merge like NORMAL ones, as in
llama.cpp.

Byte fallback looks up ``<0xNN>`` by text, then the one-character piece for ASCII bytes, as
llama.cpp's ``byte_to_token`` does; a byte with neither becomes ``unk_id``.

``spec.extra["remove_extra_whitespaces"]`` (GGUF ``tokenizer.ggml.remove_extra_whitespaces``,
SentencePiece ``normalizer_spec.remove_extra_whitespaces``) makes the encoder strip leading and
trailing spaces and collapse runs of spaces first, as the SentencePiece library does. It is off
unless the spec sets it, because llama.cpp (which ignores that key for SPM vocabularies) and
run.c never do it.
"""

from __future__ import annotations

import heapq
import logging
import operator
import re
from array import array
from collections.abc import Sequence

from ..errors import TokenizerError
from .base import Tokenizer, ids_where
from .spec import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TokenizerSpec

logger = logging.getLogger(__name__)

SPACE_PIECE = "\u2581"  # "▁", SentencePiece's visible space
_SPACE_RUNS = re.compile(" {2,}")


class SpmTokenizer(Tokenizer):
    """SentencePiece-style BPE tokenizer (Llama 1/2, Mistral v1, llama2.c models)."""

    def __init__(self, spec: TokenizerSpec):
        super().__init__(spec)
        scores = spec.scores
        if scores is None:
            logger.warning("SentencePiece vocabulary has no scores; every merge gets score 0 (leftmost wins)")
            scores = array("f", bytes(4 * len(spec.tokens)))
        # Merging (and the single code point lookup) may produce any piece but these. The
        # pieces' one dict (``_piece_to_id``) and the spec's scores serve the lookups: a
        # second dict of (score, id) pairs costs tens of MiB at Gemma 3's 262,144 pieces.
        self._scores: Sequence[float] = scores
        self._unmergeable = frozenset(ids_where(self._types, frozenset((TOKEN_CONTROL, TOKEN_UNKNOWN)).__contains__))
        self._build_byte_tables()  # also checks that BYTE pieces are <0xNN>
        # Byte fallback: byte value -> id of the token "<0xNN>" (or the ASCII character), None when missing.
        pieces = self._piece_to_id
        self._byte_ids: list[int | None] = [
            pieces.get(f"<0x{b:02X}>", pieces.get(chr(b)) if b < 0x80 else None) for b in range(256)]
        missing = sum(b is None for b in self._byte_ids)
        if missing:
            logger.warning("SentencePiece vocabulary lacks %d of 256 byte tokens; those bytes encode as unk_id=%s",
                           missing, spec.unk_id)
        self._remove_extra_whitespaces = bool(spec.extra.get("remove_extra_whitespaces", False))

    @property
    def strips_leading_space(self) -> bool:
        return self._spec.add_space_prefix

    def _normal_piece_bytes(self, piece: str) -> bytes:
        return piece.replace(SPACE_PIECE, " ").encode("utf-8")

    def _normal_pieces_bytes(self, pieces, types) -> list[bytes]:
        # The same, in C (map): every piece, then b"" for the few that are not NORMAL.
        if len(pieces) != len(types):
            raise ValueError(f"{len(pieces)} pieces but {len(types)} types")
        out = list(map(str.encode, map(operator.methodcaller("replace", SPACE_PIECE, " "), pieces)))
        for i in ids_where(types, TOKEN_NORMAL.__ne__):
            out[i] = b""
        return out

    def _encode_fragment(self, text: str, after_special: bool) -> list[int]:
        if self._remove_extra_whitespaces:
            # SentencePiece's normalizer: drop leading spaces and collapse runs before escaping,
            # drop trailing "▁" after escaping (so a literal "▁" at the end goes too).
            text = _SPACE_RUNS.sub(" ", text.lstrip(" "))
            if not text:
                return []
        if after_special and self._spec.add_space_prefix:
            text = " " + text
        text = text.replace(" ", SPACE_PIECE)
        if self._remove_extra_whitespaces:
            text = text.rstrip(SPACE_PIECE)
            if not text:
                return []
        syms = list(text)  # symbol text; "" once merged into its left neighbour
        num_syms = len(syms)
        nxt = list(range(1, num_syms + 1))   # next live symbol, -1 at the end
        nxt[-1] = -1
        prv = list(range(-1, num_syms - 1))  # previous live symbol, -1 at the start
        pieces, scores, unmergeable = self._piece_to_id, self._scores, self._unmergeable

        # Candidate merges: (-score, left index, merged text); the heap pops the highest
        # score first and, on equal scores, the leftmost pair (llama.cpp llm_bigram_spm).
        heap = []
        for i in range(num_syms - 1):
            merged = syms[i] + syms[i + 1]
            hit = pieces.get(merged)
            if hit is not None and hit not in unmergeable:
                heap.append((-scores[hit], i, merged))
        heapq.heapify(heap)
        while heap:
            _, left, merged = heapq.heappop(heap)
            if not syms[left]:
                continue  # the left symbol was merged away
            right = nxt[left]
            # Symbols only grow, so an unchanged concatenation means the pair is still current.
            if right < 0 or syms[left] + syms[right] != merged:
                continue
            syms[left] = merged
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                pair = syms[before] + merged
                hit = pieces.get(pair)
                if hit is not None and hit not in unmergeable:
                    heapq.heappush(heap, (-scores[hit], before, pair))
            if after >= 0:
                pair = merged + syms[after]
                hit = pieces.get(pair)
                if hit is not None and hit not in unmergeable:
                    heapq.heappush(heap, (-scores[hit], left, pair))

        ids: list[int] = []
        i = 0
        while i >= 0:
            hit = pieces.get(syms[i])
            if hit is not None and hit not in unmergeable:
                ids.append(hit)
            else:
                for byte in syms[i].encode("utf-8"):
                    token_id = self._byte_ids[byte]
                    if token_id is None:
                        token_id = self._unk_for(syms[i])
                    ids.append(token_id)
            i = nxt[i]
        return ids

    def _unk_for(self, symbol: str) -> int:
        if self._spec.unk_id is None:
            raise TokenizerError(
                f"{symbol!r} is not in the vocabulary, which has neither its byte tokens nor an unk_id")
        return self._spec.unk_id
