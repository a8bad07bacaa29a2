"""Incremental detokenization for the generation loop."""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from .base import Tokenizer


class StreamDecoder:
    """Turns generated token ids into text deltas, one token at a time.

    Invariant: ``"".join(feed(i) for i in ids) + flush() == tokenizer.decode(ids, skip_special)``,
    and with ``prompt_ids``: ``decode(prompt_ids + ids) == decode(prompt_ids) + deltas + flush()``
    (for a prompt from ``encode``, which always ends on a whole character).

    * A UTF-8 character split over several byte-fallback tokens is held back until it is
      complete; bytes that can no longer become valid UTF-8 are emitted as U+FFFD, exactly
      once, when that becomes certain (Python's incremental UTF-8 decoder does this).
    * The leading-space rule of ``decode`` applies to the first token that produces text,
      unless ``prompt_ids`` already produced text: a generated "▁there" after a prompt
      keeps its space.
    * Cost per token: one table lookup and an incremental decode of that token's bytes;
      the history is never decoded again.
    """

    __slots__ = ("_table", "_first", "_num_tokens", "_tokenizer", "_started", "_utf8")

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True, *, prompt_ids: Iterable[int] = ()):
        self._tokenizer = tokenizer
        self._table, self._first = tokenizer.decode_tables(skip_special)
        self._num_tokens = len(self._table)
        # Has a token produced text yet? Once it has, the leading-space rule is spent.
        self._started = False
        for token_id in prompt_ids:
            tokenizer.check_id(token_id)
            if self._table[token_id]:
                self._started = True
                break
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """The text that ``token_id`` completes (may be "" while a character is incomplete)."""
        if not 0 <= token_id < self._num_tokens:
            self._tokenizer.check_id(token_id)
        if self._started:
            return self._utf8.decode(self._table[token_id])
        if not self._table[token_id]:
            return ""
        self._started = True
        return self._utf8.decode(self._first[token_id])

    def flush(self) -> str:
        """End the sequence: U+FFFD for incomplete trailing bytes, then start afresh (no prompt)."""
        tail = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        self._started = False
        return tail
