"""The generation loop for one sequence: prefill, then sample / step until a stop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..errors import InvalidPromptError, PromptTooLongError
from .sampler import Sampler, SamplingParams


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    """Prompt tokens whose KV was reused from the previous request (no prefill)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    prefill_ms: float
    decode_ms: float
    prefill_tokens: int
    decode_tokens: int

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / (self.prefill_ms / 1e3) if self.prefill_ms > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / (self.decode_ms / 1e3) if self.decode_ms > 0 else 0.0


@dataclass(frozen=True)
class Completion:
    """The result of one generation."""

    text: str
    """Generated text (the prompt is not repeated)."""
    token_ids: tuple[int, ...]
    """Generated token ids, without a final stop token."""
    prompt_token_ids: tuple[int, ...]
    finish_reason: str
    """``stop`` (end-of-sequence token or stop string), ``length`` (max_tokens) or
    ``context_full`` (no position left in the context window)."""
    usage: Usage
    timings: Timings
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended generation, if any."""


@dataclass
class _State:
    text_parts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


class Generation:
    """Iterates text deltas of one generation; ``completion`` is set once it ends.

    Stop strings are held back: a delta never contains text that could still turn
    out to be the start of a stop string, and the stop string itself is not emitted.
    """

    def __init__(self, runner, tokenizer, prompt_ids: list[int], params: SamplingParams):
        self.runner = runner
        self.tokenizer = tokenizer
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.completion: Completion | None = None
        self._it: Iterator[str] | None = None
        ctx = runner.max_context_tokens
        if not self.prompt_ids:
            raise InvalidPromptError("prompt has no tokens; pass at least one token id (e.g. BOS)")
        vocab_size = runner.spec.config.vocab_size
        bad = next((t for t in self.prompt_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidPromptError(f"prompt token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
        if len(prompt_ids) >= ctx:
            raise PromptTooLongError(
                f"prompt has {len(prompt_ids)} tokens; the context window holds {ctx} "
                f"and needs room for at least one generated token")

    def __iter__(self) -> Iterator[str]:
        """The deltas; iterating again continues the same generation, never restarts it."""
        if self._it is None:
            self._it = self._run()
        return self._it

    def close(self) -> None:
        """Stop early. The KV cache keeps what was computed (and stays consistent)."""
        if self._it is not None:
            self._it.close()

    def _run(self) -> Iterator[str]:
        from ..tokenizer import StreamDecoder

        runner, params = self.runner, self.params
        sampler = Sampler(params, runner.spec.config.vocab_size)
        stop_ids = frozenset() if params.ignore_eos else self.tokenizer.stop_ids
        decoder = StreamDecoder(self.tokenizer)

        t0 = time.perf_counter()
        logits, cached = self._prefill()
        t1 = time.perf_counter()
        ids = np.zeros(runner.max_context_tokens, np.int64)  # (context,) every token so far
        n = len(self.prompt_ids)
        ids[:n] = self.prompt_ids
        # The prompt is decoded through the stream decoder silently so that the
        # leading-space rule and UTF-8 boundaries apply to the whole sequence.
        for t in self.prompt_ids:
            decoder.feed(t)
        generated: list[int] = []
        pending = ""
        emitted: list[str] = []
        finish, stop_reason = "length", None
        decode_steps = 0
        stops = params.stop
        hold = max((len(s) for s in stops), default=1) - 1
        while True:
            token = sampler.sample(logits, ids[:n])
            if token in stop_ids:
                finish, stop_reason = "stop", token
                break
            generated.append(token)
            ids[n] = token
            n += 1
            pending += decoder.feed(token)
            if stops:
                cut = _find_stop(pending, stops)
                if cut is not None:
                    pending, stop_reason = pending[:cut[0]], cut[1]
                    finish = "stop"
                    break
                if len(pending) > hold:
                    safe = len(pending) - hold
                    emitted.append(pending[:safe])
                    yield pending[:safe]
                    pending = pending[safe:]
            elif pending:
                emitted.append(pending)
                yield pending
                pending = ""
            if len(generated) >= params.max_tokens:
                break
            if n >= runner.max_context_tokens:
                finish = "context_full"
                break
            logits = runner.forward((token,))[0]
            decode_steps += 1
        if finish != "stop" or stop_reason in stop_ids:
            pending += decoder.flush()
        if pending:
            emitted.append(pending)
            yield pending
        t2 = time.perf_counter()
        self.completion = Completion(
            text="".join(emitted),
            token_ids=tuple(generated),
            prompt_token_ids=tuple(self.prompt_ids),
            finish_reason=finish,
            usage=Usage(len(self.prompt_ids), len(generated), cached),
            timings=Timings((t1 - t0) * 1e3, (t2 - t1) * 1e3, len(self.prompt_ids) - cached, decode_steps),
            stop_reason=stop_reason,
        )

    def _prefill(self) -> tuple[np.ndarray, int]:
        """Run the prompt through the model, reusing cached prefix pages."""
        runner, prompt = self.runner, self.prompt_ids
        cached = runner.begin(prompt)
        chunk = runner.prefill_chunk_tokens
        logits = None
        for start in range(cached, len(prompt), chunk):
            logits = runner.forward(prompt[start:start + chunk], prefill=True)[0]
        return logits, cached


def _find_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
