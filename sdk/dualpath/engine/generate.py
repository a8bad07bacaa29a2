"""What one request produces: text deltas with stop strings held back, and the
final ``Completion``. The engine (engine/engine.py) samples the tokens; this
module turns them into text."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..completion import Completion, Timings, Usage
from ..errors import InvalidPromptError, PromptTooLongError
from ..sampling_params import SamplingParams

__all__ = ["Completion", "TextStream", "Timings", "Usage", "check_embeds", "check_prompt"]


def check_prompt(prompt_ids: list[int], vocab_size: int, context_tokens: int) -> None:
    """Raise InvalidPromptError / PromptTooLongError for a prompt no request can run."""
    if not prompt_ids:
        raise InvalidPromptError("prompt has no tokens; pass at least one token id (e.g. BOS)")
    bad = next((t for t in prompt_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidPromptError(f"prompt token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    if len(prompt_ids) >= context_tokens:
        raise PromptTooLongError(
            f"prompt has {len(prompt_ids)} tokens; the context window holds {context_tokens} "
            f"and needs room for at least one generated token")


def check_embeds(embeds, num_tokens: int, dim: int) -> tuple[tuple, tuple]:
    """``embeds`` ((prompt position, rows[, mutual]), ...) as ``Request.embeds`` and
    ``Request.mutual`` hold them: rows (k, dim) float32, in order within the prompt's
    ``num_tokens``, none overlapping; with ``mutual`` true, the rows' tokens attend to each
    other (Gemma 3's image). An InvalidPromptError names the first that is not so."""
    import numpy as np

    out, mutual, end = [], [], 0
    for i, item in enumerate(embeds):
        pos, rows = item[0], item[1]
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != dim or not len(rows):
            raise InvalidPromptError(f"embeddings {i} are {rows.shape}; the model takes rows of {dim} values")
        if not (isinstance(pos, int) and end <= pos and pos + len(rows) <= num_tokens):
            raise InvalidPromptError(f"embeddings {i} ({len(rows)} rows at position {pos}) lie outside the prompt's "
                                     f"{num_tokens} tokens or overlap the ones before")
        out.append((pos, np.ascontiguousarray(rows, np.float32)))
        end = pos + len(rows)
        if len(item) > 2 and item[2]:
            mutual.append((pos, end))
    return tuple(out), tuple(mutual)


class TextStream:
    """Generated tokens -> text deltas.

    Stop strings are held back: a delta never contains text that could still turn
    out to be the start of a stop string, and the stop string itself is not emitted.
    The generated text decodes as it would after the whole prompt (the leading-space
    rule and UTF-8 boundaries apply to the whole sequence), yet the prompt is not
    decoded: the engine makes a stream under its lock for every request and every
    sample, so the cost must not grow with the prompt.
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int], params: SamplingParams):
        from ..tokenizer import StreamDecoder

        # What the prompt leaves in the decoder: whether text has started (read from the
        # front, up to the first token with text) and the UTF-8 bytes of an unfinished
        # character (only the last UTF8_MAX_BYTES bytes decide those, so only the tokens
        # holding them are fed).
        tail = _tail_start(tokenizer, prompt_ids)
        self.decoder = StreamDecoder(tokenizer, prompt_ids=itertools.islice(prompt_ids, tail))
        for t in prompt_ids[tail:]:
            self.decoder.feed(t)
        self.stops = params.stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.emitted: list[str] = []

    def push(self, token: int) -> tuple[str, str | None]:
        """(delta, matched stop string or None) after one generated token."""
        self.pending += self.decoder.feed(token)
        if self.stops:
            cut = _find_stop(self.pending, self.stops)
            if cut is not None:
                self.pending = self.pending[:cut[0]]
                return self._take(len(self.pending)), cut[1]
            return self._take(len(self.pending) - self.hold), None
        return self._take(len(self.pending)), None

    def finish(self, flush: bool) -> str:
        """The last delta; ``flush`` decodes any incomplete byte sequence left."""
        if flush:
            self.pending += self.decoder.flush()
        return self._take(len(self.pending))

    @property
    def text(self) -> str:
        return "".join(self.emitted)

    def _take(self, n: int) -> str:
        if n <= 0:
            return ""
        out, self.pending = self.pending[:n], self.pending[n:]
        self.emitted.append(out)
        return out


UTF8_MAX_BYTES = 4
"""The longest UTF-8 sequence. An incremental UTF-8 decoder restarts at every byte that
is not a continuation byte, so its state after a byte string depends only on the last
this many bytes."""


def _tail_start(tokenizer, prompt_ids: Sequence[int]) -> int:
    """Where the prompt tokens begin whose bytes end the prompt with at least
    ``UTF8_MAX_BYTES`` bytes (0 for a shorter prompt). Tokens without text (BOS, control
    tokens) add no bytes, so the walk is as long as the prompt's trailing run of them."""
    start, num_bytes = len(prompt_ids), 0
    while start > 0 and num_bytes < UTF8_MAX_BYTES:
        start -= 1
        num_bytes += len(tokenizer.token_bytes(prompt_ids[start]))
    return start


def _find_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
