"""A thinking budget: once a reply has thought for ``SamplingParams.reasoning_budget``
tokens, the closing marker is written for the model (forced tokens, as llama.cpp's
reasoning budget does) and the answer follows.

``ReasoningBudget`` is one sequence's count. Its ``Sampler`` asks it before each draw
(``forced``: the tokens still to write, last first) and tells it each token chosen
(``observe``). It watches the reply's bytes, not token ids, so a marker the model writes
as one special token (Qwen3's ``<think>``) or as several pieces is seen alike. Only
requests with a budget have one: the others pay one ``is None`` test per token.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sampling_params import SamplingParams
from ..tokenizer.reasoning import FORCED_CLOSE, THINK_CLOSE, THINK_OPEN, prompt_opens_thinking

__all__ = ["ReasoningBudget", "reasoning_budget_for"]

_OPEN, _CLOSE = THINK_OPEN.encode(), THINK_CLOSE.encode()


class ReasoningBudget:
    """The thinking budget of one sequence (see module doc).

    States: waiting for the reply's first text to show whether it thinks; thinking
    (counting); forcing the close; done (no thinking, closed, or forced closed)."""

    WAITING, THINKING, FORCING, DONE = range(4)
    __slots__ = ("budget_tokens", "state", "used_tokens", "forced", "_close_ids", "_bytes", "_text")

    def __init__(self, budget_tokens: int, close_ids: Sequence[int], token_bytes: Sequence[bytes],
                 opened: bool = False):
        self.budget_tokens = budget_tokens
        self._close_ids = tuple(close_ids)
        self._bytes = token_bytes  # the tokenizer's table (shared), special tokens' text included
        self.state = self.WAITING
        self.used_tokens = 0
        """Tokens of thinking so far (the opening marker not counted)."""
        self.forced: list[int] = []
        """Tokens to write instead of sampling, the next one last (the sampler pops it)."""
        self._text = b""  # waiting: the reply so far; thinking: its last bytes, for the closing marker
        if opened:
            self._start_thinking(b"")

    def _start_thinking(self, text: bytes) -> None:
        self.state, self._text = self.THINKING, b""
        if text:
            self._think(text)
        elif self.budget_tokens == 0:
            self._force()

    def _force(self) -> None:
        self.state = self.FORCING
        self.forced = list(reversed(self._close_ids))

    def _think(self, piece: bytes) -> None:
        text = self._text + piece
        if _CLOSE in text:
            self.state = self.DONE
            return
        self._text = text[-(len(_CLOSE) - 1):]
        if self.used_tokens >= self.budget_tokens:
            self._force()

    def observe(self, token: int) -> None:
        """The token chosen for the sequence (sampled or forced)."""
        state = self.state
        if state == self.THINKING:
            self.used_tokens += 1
            self._think(self._bytes[token])
        elif state == self.WAITING:
            text = self._text + self._bytes[token]
            body = text.lstrip()
            if body.startswith(_OPEN):
                self._start_thinking(body[len(_OPEN):])
            elif _OPEN.startswith(body):
                self._text = text
            else:
                self.state, self._text = self.DONE, b""
        elif state == self.FORCING and not self.forced:
            self.state = self.DONE


def reasoning_budget_for(params: SamplingParams, tokenizer, prompt_ids: Sequence[int]) -> ReasoningBudget | None:
    """The budget of a request under ``params``, None without one."""
    if params.reasoning_budget is None:
        return None
    close_ids = tokenizer.encode(FORCED_CLOSE, add_bos=False, parse_special=True)
    table, _ = tokenizer.decode_tables(skip_special=False)
    return ReasoningBudget(params.reasoning_budget, close_ids, table, prompt_opens_thinking(tokenizer, prompt_ids))
