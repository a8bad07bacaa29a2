"""The tokenizer facade shared by every vocabulary type.

A ``Tokenizer`` turns text into token ids and back. Subclasses only say how one
fragment of plain text becomes ids (``_encode_fragment``) and what bytes a
NORMAL piece stands for (``_normal_piece_bytes``); everything else lives here so
that SentencePiece-style and byte-level vocabularies behave the same way:

* special-token partitioning of the input (llama.cpp ``tokenizer_st_partition``),
* BOS/EOS handling,
* the per-token byte tables used by ``decode``, ``token_bytes`` and ``StreamDecoder``.

Token types are the file's, corrected the way llama.cpp corrects them at load
(``llama_vocab::impl::load``), because they decide which text is split out as a special token:

* a token whose text is one of llama.cpp's end-of-generation or fill-in-the-middle texts
  (``_LLAMA_CPP_CONTROL_TEXTS``: ``</s>``, ``<|im_end|>``, ``<|fim_prefix|>`` ...) is CONTROL even
  when the file says NORMAL or USER_DEFINED. Qwen2's vocabulary has a NORMAL ``</s>``: with
  ``parse_special`` it becomes that one token, as in llama.cpp. (llama.cpp skips the
  fill-in-the-middle texts for a role whose id the file sets; we carry no such ids, so we
  always apply them.)
* gpt-oss's ``<|channel|>``, ``<|message|>``, ``<|start|>``, ``<|constrain|>`` are USER_DEFINED, and
  so is ``<|end|>`` in vocabularies with ``<|return|>`` and ``<|call|>``.
* With a ``spec.name`` containing "phi-3" or "phi3", special tokens other than ``<unk>``, ``<s>``
  and ``<|endoftext|>`` (and ``</s>``) drop the whitespace that follows them (llama.cpp's RSTRIP,
  which copies Phi-3's ``tokenizer.json``): ``"<|user|>\nHi"`` encodes as ``<|user|>`` + ``Hi``.
  llama.cpp's other name-keyed attribute, LSTRIP on ``<mask>``/``[MASK]`` of a few embedding
  models (jina-v2, nomic-bert-moe, modern-bert), is not copied.
"""

from __future__ import annotations

import itertools
import logging
import re
from array import array
from collections.abc import Iterable, Sequence

from ..errors import TokenizerError
from .spec import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    TokenizerSpec,
)

logger = logging.getLogger(__name__)

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """Encode text to token ids and decode ids to text, for one vocabulary.

    Invariants:

    * ``decode(ids) == "".join(StreamDecoder(tok).feed(i) for i in ids) + flush()``.
    * Special-token text in user input is plain text unless ``parse_special=True``;
      USER_DEFINED tokens are always matched as whole tokens, as llama.cpp and
      Hugging Face ``tokenizers`` do (that is what they exist for).
    * Build one with ``build_tokenizer(spec)``, not with this class directly.
    """

    def __init__(self, spec: TokenizerSpec):
        self._spec = spec
        num_tokens = len(spec.tokens)
        if num_tokens == 0:
            raise TokenizerError("tokenizer vocabulary is empty")
        for name in ("scores", "token_types"):
            values = getattr(spec, name)
            if values is not None and len(values) != num_tokens:
                raise TokenizerError(
                    f"tokenizer {name} has {len(values)} entries, expected one per token ({num_tokens})")
        for name in ("bos_id", "eos_id", "unk_id", "eot_id"):
            value = getattr(spec, name)
            if value is not None and not 0 <= value < num_tokens:
                raise TokenizerError(f"tokenizer {name}={value} is outside the vocabulary [0, {num_tokens})")

        self._piece_to_id: dict[str, int] = dict(zip(spec.tokens, range(num_tokens)))
        if len(self._piece_to_id) != num_tokens:  # a piece twice: name the first one
            first: dict[str, int] = {}
            for token_id, piece in enumerate(spec.tokens):
                other = first.setdefault(piece, token_id)
                if other != token_id:
                    raise TokenizerError(f"duplicate token in vocabulary: {piece!r} has ids {other} and {token_id}")
        self._types: Sequence[int] = _llama_cpp_token_types(spec, self._piece_to_id)

        # Tokens split out of the input before BPE, longest UTF-8 text first (llama.cpp order).
        # (text, id, rstrip) triples; the first list applies always, the second with parse_special.
        kinds = frozenset((TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED))
        special = sorted((i for i in ids_where(self._types, kinds.__contains__) if spec.tokens[i]),
                         key=lambda i: (-len(spec.tokens[i].encode("utf-8")), i))
        rstrip = _rstrip_ids(spec, special, self._piece_to_id)
        self._split_always = [(spec.tokens[i], i, i in rstrip) for i in special
                              if self._types[i] == TOKEN_USER_DEFINED]
        self._split_special = [(spec.tokens[i], i, i in rstrip) for i in special]

        # Per-token byte tables, indexed by token id (see _build_byte_tables).
        self._bytes_plain: Sequence[bytes] = ()       # skip_special=True: control/unknown -> b""
        self._bytes_special: Sequence[bytes] = ()     # skip_special=False: control text included
        self._bytes_first: Sequence[bytes] = ()       # _bytes_plain with the dummy-prefix space removed
        self._bytes_first_special: Sequence[bytes] = ()

        stop = {spec.eos_id, spec.eot_id, spec.bos_id}
        stop.update(self._piece_to_id[t] for t in _LLAMA_CPP_EOG_TEXTS if t in self._piece_to_id)
        self._stop_ids = frozenset(i for i in stop if i is not None)

    # ------------------------------------------------------------------ properties

    @property
    def spec(self) -> TokenizerSpec:
        return self._spec

    @property
    def vocab_size(self) -> int:
        return len(self._spec.tokens)

    @property
    def bos_id(self) -> int | None:
        return self._spec.bos_id

    @property
    def eos_id(self) -> int | None:
        return self._spec.eos_id

    @property
    def eot_id(self) -> int | None:
        return self._spec.eot_id

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that end generation: EOS, EOT (when the model has one) and BOS.

        BOS is included on purpose: llama2.c-trained models (e.g. stories260K) emit BOS to
        start the next story instead of EOS, and llama2.c ``run.c`` stops generating there.
        Chat models never emit BOS mid-sequence, so stopping on it costs them nothing.
        """
        return self._stop_ids

    @property
    def strips_leading_space(self) -> bool:
        """Whether decode drops the space that the SentencePiece dummy prefix introduced."""
        return False

    def piece(self, token_id: int) -> str:
        """The vocabulary text of ``token_id`` (for logs and debugging)."""
        self.check_id(token_id)
        return self._spec.tokens[token_id]

    # ------------------------------------------------------------------ encode

    def encode(self, text: str, add_bos: bool | None = None, *,
               add_eos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``.

        ``add_bos``/``add_eos``: None means the model's default (``spec.add_bos``/``add_eos``).
        Empty text with BOS gives just ``[bos_id]`` (as llama2.c run.c and llama.cpp do).
        ``parse_special``: match CONTROL tokens such as ``<|im_start|>`` in the text; by
        default their text is tokenized as plain text.
        """
        if add_bos is None:
            add_bos = self._spec.add_bos
        if add_eos is None:
            add_eos = self._spec.add_eos
        text = _valid_unicode(text)
        ids: list[int] = []
        if add_bos:
            if self._spec.bos_id is None:
                raise TokenizerError("add_bos is set, but the tokenizer has no bos_id")
            ids.append(self._spec.bos_id)
        after_special = True  # llama.cpp: the first fragment counts as "after a special token"
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            else:
                ids.extend(self._encode_fragment(fragment, after_special))
                after_special = False
        if add_eos:
            if self._spec.eos_id is None:
                raise TokenizerError("add_eos is set, but the tokenizer has no eos_id")
            ids.append(self._spec.eos_id)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split ``text`` into plain-text fragments and special-token ids.

        Same order as llama.cpp: one pass per special token, longest text first, each pass
        splitting every remaining text fragment at that token's non-overlapping occurrences,
        left to right. An rstrip token drops the C-locale whitespace that follows it.
        """
        if not text:
            return []
        fragments: list[str | int] = [text]
        for piece, token_id, rstrip in (self._split_special if parse_special else self._split_always):
            if not any(isinstance(f, str) and piece in f for f in fragments):
                continue
            out: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or piece not in fragment:
                    out.append(fragment)
                    continue
                start = 0
                while (match := fragment.find(piece, start)) >= 0:
                    if match > start:
                        out.append(fragment[start:match])
                    out.append(token_id)
                    start = match + len(piece)
                    if rstrip:
                        while start < len(fragment) and fragment[start] in _C_SPACE:
                            start += 1
                if start < len(fragment):
                    out.append(fragment[start:])
            fragments = out
        return fragments

    def _encode_fragment(self, text: str, after_special: bool) -> list[int]:
        """Ids of one non-empty fragment of plain text."""
        raise NotImplementedError

    # ------------------------------------------------------------------ decode

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes ``token_id`` contributes to decoded text.

        Byte tokens give their one byte, U+2581 becomes a space, CONTROL/UNKNOWN give b"".
        No leading-space rule is applied here.
        """
        self.check_id(token_id)
        return self._bytes_plain[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``: pieces joined as bytes, then decoded as UTF-8 (errors="replace").

        ``skip_special``: CONTROL/UNKNOWN tokens (BOS, EOS, ...) produce no text.
        For SentencePiece vocabularies the first piece that produces text loses one
        leading space: the one the dummy prefix put there (as run.c, SentencePiece and
        llama-cpp-python's ``detokenize`` do).
        """
        table, first = self.decode_tables(skip_special)
        num_tokens = len(table)
        parts: list[bytes] = []
        started = False
        for token_id in ids:
            if not 0 <= token_id < num_tokens:
                self.check_id(token_id)
            if started:
                parts.append(table[token_id])
            elif table[token_id]:
                parts.append(first[token_id])
                started = True
        return b"".join(parts).decode("utf-8", errors="replace")

    def decode_tables(self, skip_special: bool) -> tuple[Sequence[bytes], Sequence[bytes]]:
        """(bytes per token id, the same for the first text-producing token): what ``decode``
        joins, for callers that decode incrementally (``StreamDecoder``) or match bytes
        (the grammar's vocabulary). Shared, not copied: do not modify them."""
        if skip_special:
            return self._bytes_plain, self._bytes_first
        return self._bytes_special, self._bytes_first_special

    def check_id(self, token_id: int) -> None:
        """Raise TokenizerError unless ``token_id`` is in the vocabulary."""
        if not 0 <= token_id < len(self._spec.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary [0, {len(self._spec.tokens)})")

    def _normal_piece_bytes(self, piece: str) -> bytes:
        """Bytes of a NORMAL piece."""
        raise NotImplementedError

    def _build_byte_tables(self) -> None:
        """Fill the per-token byte tables. Subclasses call this once in __init__.

        What each token type contributes mirrors llama.cpp ``token_to_piece``:
        NORMAL -> its text (``_normal_piece_bytes``); BYTE ``<0xNN>`` -> that byte;
        USER_DEFINED -> its text, always; CONTROL/UNKNOWN -> its text only when
        special tokens are not skipped; UNUSED and undefined types -> nothing.
        """
        # Whole-list comprehensions over the NORMAL tokens (nearly all of a vocabulary: this
        # runs at every load), then a loop over the few of other types.
        tokens, types = self._spec.tokens, self._types
        plain = self._normal_pieces_bytes(tokens, types)
        special: dict[int, bytes] = {}
        for token_id in ids_where(types, TOKEN_NORMAL.__ne__):
            piece, kind = tokens[token_id], types[token_id]
            if kind == TOKEN_BYTE:
                match = _BYTE_PIECE.fullmatch(piece)
                if match is None:
                    raise TokenizerError(f"token {token_id} {piece!r} has type BYTE but is not of the form <0xNN>")
                plain[token_id] = bytes((int(match.group(1), 16),))
            elif kind == TOKEN_USER_DEFINED:
                plain[token_id] = piece.encode("utf-8")
            elif kind in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                special[token_id] = piece.encode("utf-8")
        # One bytes object and its offsets, not a list of bytes objects (12 MiB for Gemma 3's
        # 262,144 tokens, against 3). The other three tables are views of this one: three
        # more lists (and a stripped copy of every piece that starts with a space) were 11
        # MiB, and they are read once per decoded text at most.
        plain = _PackedBytes(plain)  # type: ignore[assignment]  # read only from here on
        self._bytes_plain = plain
        self._bytes_special = _WithSpecial(plain, special)  # control/unknown ids: plain is b""
        strip = self.strips_leading_space
        self._bytes_first = _FirstPiece(plain, types) if strip else plain
        self._bytes_first_special = _FirstPiece(self._bytes_special, types) if strip else self._bytes_special

    def _normal_pieces_bytes(self, pieces, types) -> list[bytes]:
        """``_normal_piece_bytes`` of every NORMAL piece, b"" for the others."""
        f = self._normal_piece_bytes
        return [f(p) if k == TOKEN_NORMAL else b"" for p, k in zip(pieces, types, strict=True)]



def ids_where(types: Sequence[int], test) -> list[int]:
    """The ids whose type passes ``test`` (a C callable: ``frozenset.__contains__``,
    ``int.__ne__``), in order: a scan in C (map and compress), not a Python loop over a
    vocabulary of 262,144 tokens at every load."""
    return list(itertools.compress(range(len(types)), map(test, types)))


class _PackedBytes(Sequence):
    """A list of bytes held as one bytes object and the offsets between them."""

    __slots__ = ("_blob", "_ends")

    def __init__(self, items: list[bytes]):
        self._blob = b"".join(items)
        self._ends = array("q", [0])
        self._ends.extend(itertools.accumulate(map(len, items)))

    def __len__(self) -> int:
        return len(self._ends) - 1

    def __getitem__(self, token_id):
        if isinstance(token_id, slice):
            return [self[i] for i in range(*token_id.indices(len(self)))]
        if token_id < 0:  # as a list indexes
            token_id += len(self)
            if token_id < 0:
                raise IndexError("token id out of range")
        ends = self._ends
        return self._blob[ends[token_id]:ends[token_id + 1]]

    def __iter__(self):
        blob, ends = self._blob, self._ends
        return (blob[a:b] for a, b in zip(ends, itertools.islice(ends, 1, None)))


class _TableView(Sequence):
    """A per-token byte table computed from another on lookup (see ``_build_byte_tables``)."""

    __slots__ = ("_table",)
    _table: Sequence[bytes]

    def __len__(self) -> int:
        return len(self._table)

    def __getitem__(self, token_id):
        if isinstance(token_id, slice):
            return [self._item(i) for i in range(*token_id.indices(len(self)))]
        return self._item(token_id)


class _WithSpecial(_TableView):
    """The plain byte table with the text of control and unknown tokens (a few ids) in
    place of their b"" (``decode(skip_special=False)``)."""

    __slots__ = ("_special",)

    def __init__(self, plain: Sequence[bytes], special: dict[int, bytes]):
        self._table, self._special = plain, special

    def _item(self, token_id: int) -> bytes:
        text = self._special.get(token_id)
        return self._table[token_id] if text is None else text


class _FirstPiece(_TableView):
    """A byte table as the first text-producing token gives it: a NORMAL piece loses the
    leading space the dummy prefix put there (SentencePiece)."""

    __slots__ = ("_types",)

    def __init__(self, table: Sequence[bytes], types: Sequence[int]):
        self._table, self._types = table, types

    def _item(self, token_id: int) -> bytes:
        text = self._table[token_id]
        return text[1:] if text[:1] == b" " and self._types[token_id] == TOKEN_NORMAL else text


_C_SPACE = frozenset(" \t\n\v\f\r")  # C isspace() in the "C" locale, which llama.cpp's strip uses

# Texts llama.cpp makes CONTROL whatever their file type (llama_vocab::impl::load): its
# end-of-generation list, and its fill-in-the-middle lists (prefix, suffix, middle, pad, repo, sep).
_LLAMA_CPP_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
))
"""llama.cpp's end-of-generation tokens by text (``special_eog_ids``): a chat model's turn
ends there whatever its ``eos_token_id`` (Gemma's ``<end_of_turn>``, Llama 3's ``<|eot_id|>``)."""
_LLAMA_CPP_CONTROL_TEXTS = _LLAMA_CPP_EOG_TEXTS | frozenset((
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
))
# gpt-oss: llama.cpp always renders these, so they are USER_DEFINED.
_LLAMA_CPP_USER_DEFINED_TEXTS = frozenset(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"))


def _llama_cpp_token_types(spec: TokenizerSpec, piece_to_id: dict[str, int]) -> array:
    """``spec.token_types`` with llama.cpp's load-time corrections (see the module docstring)."""
    types = array("i", spec.token_types) if spec.token_types is not None else \
        array("i", [TOKEN_NORMAL]) * len(spec.tokens)
    for text in _LLAMA_CPP_CONTROL_TEXTS:
        token_id = piece_to_id.get(text)
        if token_id is not None:
            types[token_id] = TOKEN_CONTROL
    for text in _LLAMA_CPP_USER_DEFINED_TEXTS:
        token_id = piece_to_id.get(text)
        if token_id is not None:
            types[token_id] = TOKEN_USER_DEFINED
    # o200k_harmony and solar-open: "<|end|>" is not end-of-generation there, and llama.cpp renders it.
    has_call = "<|call|>" in piece_to_id or "<|calls|>" in piece_to_id
    if "<|end|>" in piece_to_id and has_call and ("<|return|>" in piece_to_id or "<|flush|>" in piece_to_id):
        types[piece_to_id["<|end|>"]] = TOKEN_USER_DEFINED
    return types


def _rstrip_ids(spec: TokenizerSpec, special_ids: list[int], piece_to_id: dict[str, int]) -> frozenset[int]:
    """Ids of the special tokens that swallow the whitespace after them (llama.cpp's RSTRIP attribute)."""
    name = (spec.name or "").lower()
    if "phi-3" not in name and "phi3" not in name:
        return frozenset()
    ids = set(special_ids)
    if "</s>" in piece_to_id:
        ids.add(piece_to_id["</s>"])
    ids.difference_update(piece_to_id[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in piece_to_id)
    return frozenset(ids)


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (not encodable as UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        logger.warning("tokenizer input contains lone surrogates; they are replaced by U+FFFD")
        text = text.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
    return text
