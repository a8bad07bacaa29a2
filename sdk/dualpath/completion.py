"""What a generation returns (public: importable from ``dualpath``): ``Completion``, with its
``Usage`` and ``Timings``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Completion", "Timings", "Usage"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    """Prompt tokens whose KV was reused from the cache (no prefill)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    prefill_ms: float
    """From submission to the first token (queueing included)."""
    decode_ms: float
    prefill_tokens: int
    decode_tokens: int
    image_ms: float = 0.0
    """Making the prompt's images ready before it was submitted (decoding them, and encoding
    them or finding their embeddings in the cache); not part of ``prefill_ms``."""

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
    """``stop`` (end-of-sequence token or stop string), ``length`` (max_tokens),
    ``context_full`` (no position left in the context window) or ``abort``."""
    usage: Usage
    timings: Timings
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended generation, if any."""
    logprobs: tuple | None = None
    """With ``SamplingParams.logprobs``: per generated token ``(token_id, logprob,
    ((id, logprob), ...))``, the alternatives most likely first."""
    prompt_logprobs: tuple | None = None
    """When asked for (``echo`` with logprobs): per prompt token after the first, as ``logprobs``."""
    embedding: np.ndarray | None = None
    """For an embedding request: the pooled, L2-normalised final hidden state (dim,); with
    pooling rank the last token's state as it is (a reranker's head reads it)."""
    reasoning_content: str | None = None
    """From ``LLM.chat`` with ``reasoning.format`` deepseek: the reply's thinking
    (``<think>...</think>``), ``text`` then holding the answer alone; None when the reply
    did not think (or the format is none)."""
