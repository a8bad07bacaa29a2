"""The scheduler's hold on its cache, and its one-sequence steps.

**One owner.** Only the scheduler changes the KV cache: it starts, allocates, commits,
rolls back, forks and frees sequences, and swaps in the power profile's path policy
(``use_profile``). The engine, the runner, the output maker and the draft model get
plans and results, never the cache (tests/test_layers.py counts the calls outside
cache/ and scheduler/: none). The runner reads the arena's memory and the step's arrays
the scheduler laid out (scheduler/step.py).

**One-sequence work** (a server's warm-up, the single-sequence ``begin``/``forward`` API
of tests and benchmarks, a draft model's sequence per request) goes through the same
scheduler as the requests: a sequence is opened, each run of tokens is planned and
laid out like a request's step (``plan_sequence``), and its pages are committed by the
same ``update_from_output`` after the run.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..cache.manager import KVCacheManager, NoRoom
from ..cache.policy import PathPolicy
from .step import SeqStep, StepArrays, StepPlan


class SequenceSteps:
    """A cache and the arrays its steps are laid out in; sequences driven one at a time."""

    def __init__(self, cache: KVCacheManager, arrays: StepArrays | None = None,
                 policies: dict[str, PathPolicy] | None = None):
        self.cache = cache
        self.arrays = arrays
        """Where plans are laid out for the runner (None: plans are not laid out, tests)."""
        self.policies = policies or {cache.policy.profile: cache.policy}
        """Power profile name -> the path policy the cache routes by under it, built once
        (the first is in force until ``use_profile``)."""
        cache.use_policy(next(iter(self.policies.values())))

    def use_profile(self, profile: str) -> None:
        """The governor chose ``profile`` for the next step: route by its path policy (new
        requests and the next decode step of running ones)."""
        policy = self.policies[profile]
        if self.cache.policy is not policy:
            self.cache.use_policy(policy)

    def open_sequence(self, prompt_ids: Iterable[int] = ()) -> tuple[int, int]:
        """A new sequence for ``prompt_ids``: (its id, leading prompt tokens already cached)."""
        seq_id = self.cache.new_seq_id()
        return seq_id, self.cache.start(seq_id, list(prompt_ids))

    def plan_sequence(self, seq_id: int, token_ids: list[int], all_rows: bool = False,
                      embeds: tuple[tuple[int, np.ndarray], ...] = ()) -> StepPlan | NoRoom:
        """A step of ``token_ids`` appended to the sequence, laid out (its last row's logits,
        or every row's with ``all_rows``; ``embeds``: ``SeqStep.embeds``), or NoRoom when the
        cache cannot hold them."""
        alloc = self.cache.allocate(seq_id, token_ids)
        if isinstance(alloc, NoRoom):
            return alloc
        plan = StepPlan([SeqStep(None, seq_id, token_ids, alloc, True, embeds=embeds)])
        if self.arrays is not None:  # None: plans are not laid out (see __init__)
            self.arrays.fill(plan, self.cache, all_rows)
        return plan

    def sequence_tokens(self, seq_id: int) -> int:
        """Positions of the sequence held in the cache."""
        return self.cache.num_tokens(seq_id)

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        """Keep the sequence's first ``num_tokens`` positions (a draft model's proposals
        the target did not keep)."""
        self.cache.truncate(seq_id, num_tokens)

    def close_sequence(self, seq_id: int) -> None:
        """Release the sequence (its full pages stay cached)."""
        self.cache.free(seq_id)
