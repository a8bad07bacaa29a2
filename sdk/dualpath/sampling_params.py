"""``SamplingParams``: how a request picks each next token, and when it stops (public:
importable from ``dualpath``; the sampler, sampling/sampler.py, applies them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .config import check_settings, setting
from .errors import SamplingParamsError

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop."""

    max_tokens: int = setting(256, int, lambda v: v >= 1, ">= 1")
    """Most tokens to generate."""
    temperature: float = setting(0.8, float, lambda v: v >= 0, ">= 0 (0 = greedy)")
    """Divides logits before the draw; 0 = greedy (argmax, lowest id on ties)."""
    top_k: int = setting(40, int, lambda v: v >= 0, ">= 0 (0 = off)")
    """Keep the k most likely tokens; 0 = off."""
    top_p: float = setting(0.95, float, lambda v: 0 < v <= 1, "> 0 and <= 1 (1 = off)")
    """Nucleus: keep the smallest most-likely set whose probability mass is >= top_p."""
    min_p: float = setting(0.05, float, lambda v: 0 <= v <= 1, "between 0 and 1 (0 = off)")
    """Drop tokens whose probability is below min_p times the top token's."""
    repetition_penalty: float = setting(1.0, float, lambda v: v > 0, "> 0 (1 = off)")
    """CTRL-style: a recent token's logit is divided by this if positive, else multiplied."""
    repetition_window: int = setting(64, int, lambda v: v >= 0, ">= 0 (0 = off)")
    """Tokens of history (the most recent) that the repetition penalty looks at."""
    seed: int | None = setting(None, int, lambda v: v >= 0, "None or an integer >= 0", optional=True)
    """Seed of the PCG64 generator; None = fresh OS entropy. Same seed, same tokens."""
    stop: tuple[str, ...] = setting((), tuple, lambda v: all(isinstance(s, str) and s for s in v),
                                    "a string or a sequence of non-empty strings")
    """Stop generating when the output ends with one of these (a single str is wrapped)."""
    ignore_eos: bool = setting(False, bool, None, "True or False")
    """Keep generating past the end-of-sequence token."""
    presence_penalty: float = setting(0.0, float, lambda v: -2 <= v <= 2, "between -2 and 2 (0 = off)")
    """OpenAI's: subtracted once from the logit of every token generated so far."""
    frequency_penalty: float = setting(0.0, float, lambda v: -2 <= v <= 2, "between -2 and 2 (0 = off)")
    """OpenAI's: subtracted from a token's logit once per time it was generated so far."""
    logit_bias: tuple = setting((), tuple, lambda v: all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 and isinstance(b, (int, float))
        and -100 <= b <= 100 for t, b in v), "token id -> bias between -100 and 100")
    """``(token_id, bias)`` pairs (a dict is converted) added to those logits."""
    logprobs: int | None = setting(None, int, lambda v: 0 <= v <= 20, "None or between 0 and 20",
                                   optional=True)
    """Report each sampled token's log-probability and this many most likely alternatives."""
    reasoning_budget: int | None = setting(None, int, lambda v: v >= 0, "None (no limit) or an integer >= 0",
                                           optional=True)
    """Most tokens a reply may think (``<think>...</think>``) before the closing marker is
    written for it and the answer follows; 0 = close the thinking at once; None = no limit."""

    def __post_init__(self) -> None:
        bias = self.logit_bias
        if isinstance(bias, dict):
            try:
                bias = tuple(sorted((int(t), float(b)) for t, b in bias.items()))
            except (TypeError, ValueError):
                raise SamplingParamsError(f"logit_bias={self.logit_bias!r} must map token ids to numbers") from None
            object.__setattr__(self, "logit_bias", bias)
        stop = self.stop
        if isinstance(stop, str):
            object.__setattr__(self, "stop", (stop,))
        elif isinstance(stop, Sequence):
            object.__setattr__(self, "stop", tuple(stop))
        check_settings(self, "", SamplingParamsError)
