"""The thinking budget at the sampler (sampling/reasoning_budget.py): after N tokens of
thinking the closing marker's tokens are taken instead of draws; a close the model
writes itself, in one token or cut across several, ends the count."""

from __future__ import annotations

import numpy as np

from dualpath.sampling.reasoning_budget import ReasoningBudget
from dualpath.sampling.sampler import Sampler
from dualpath.sampling_params import SamplingParams

# token id -> the bytes it decodes to
TABLE = [b"a", b"<think>", b"</think>", b"<", b"/think>", b" ", b"\n", b"<th", b"ink>", b"b"]
A, OPEN, CLOSE, LT, SLASH_THINK, SPACE, NL, TH, INK, B = range(len(TABLE))
FORCED = [NL, CLOSE, NL, NL]


def _run(budget: ReasoningBudget, favourite: list[int], logprobs=None) -> tuple[list[int], Sampler]:
    """Greedy tokens, the i-th step's logits favouring ``favourite[i]``."""
    sampler = Sampler(SamplingParams(temperature=0, logprobs=logprobs), len(TABLE), budget=budget)
    out = []
    for tok in favourite:
        logits = np.zeros(len(TABLE), np.float32)
        logits[tok] = 5.0
        out.append(sampler.sample(logits))
    return out, sampler


def test_after_n_tokens_of_thinking_the_close_is_forced_then_sampling_resumes():
    budget = ReasoningBudget(3, FORCED, TABLE, opened=True)
    out, _ = _run(budget, [A] * 9)
    assert out == [A, A, A, *FORCED, A, A]
    assert budget.state == budget.DONE and budget.used_tokens == 3


def test_a_forced_token_reports_the_models_own_log_probability():
    out, sampler = _run(ReasoningBudget(0, [CLOSE], TABLE, opened=True), [A], logprobs=1)
    assert out == [CLOSE]
    logprob, top = sampler.last_logprobs
    assert logprob < top[0][1] and top[0][0] == A  # what the model wanted, not what it was given


def test_the_models_own_opening_starts_the_count_and_its_own_close_ends_it():
    budget = ReasoningBudget(4, FORCED, TABLE)
    out, _ = _run(budget, [SPACE, TH, INK, A, LT, SLASH_THINK, A, A, A, A])
    assert out == [SPACE, TH, INK, A, LT, SLASH_THINK, A, A, A, A]  # closed within 3 tokens: nothing forced
    assert budget.state == budget.DONE
    budget = ReasoningBudget(2, FORCED, TABLE)
    out, _ = _run(budget, [OPEN, A, B, A, A, A, A, A])
    assert out == [OPEN, A, B, *FORCED, A]


def test_a_reply_that_does_not_open_with_thinking_is_never_forced():
    budget = ReasoningBudget(0, FORCED, TABLE)
    out, _ = _run(budget, [A, OPEN, A, A])
    assert out == [A, OPEN, A, A] and budget.state == budget.DONE
