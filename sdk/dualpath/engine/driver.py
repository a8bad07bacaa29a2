"""The driver: one scheduler and one runner, stepped together, and the power governor's
choices handed down to both.

Every step goes ``schedule`` (or ``plan_sequence``) -> ``run`` -> ``update_from_output``:
the scheduler owns the cache and lays the plan out, the runner runs it, the scheduler
applies the outcome. The engine steps its requests through a driver; one-sequence work
(a server's warm-up, the single-sequence ``begin``/``forward`` API, a draft model's
sequence per request) is the same three calls for one sequence, here.

``build_driver`` makes the three of them for a model: the cache (cache/geometry.py sizes
it), the scheduler over it, the runner over the cache's arena and the scheduler's arrays.
"""

from __future__ import annotations

import numpy as np

from ..cache.geometry import fitted_page_tokens
from ..cache.manager import KVCacheManager, NoRoom
from ..cache.policy import PathPolicy
from ..config import Config
from ..errors import CacheFullError
from ..executor.session import ModelRunner, prefix_salt
from ..models.spec import ModelSpec
from ..scheduler.batch import BatchScheduler, attention_tokens
from ..scheduler.step import StepArrays, StepPlan


class Driver:
    """Steps ``scheduler``'s plans through ``runner`` (see the module docstring).

    Reads of the runner's own state (``spec``, ``sessions``, ``load_stats``, ...) fall
    through to it: the driver is what callers hold, the runner what it runs on."""

    def __init__(self, scheduler: BatchScheduler, runner: ModelRunner, governor=None):
        self.scheduler = scheduler
        self.runner = runner
        self.governor = governor
        self.seq_id: int | None = None
        """The single-sequence API's sequence (``begin``/``forward``), None until it starts."""

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("runner", "scheduler"):  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.runner, name)

    @property
    def cache(self) -> KVCacheManager:
        """The scheduler's cache, to read (stats, checks); only the scheduler changes it."""
        return self.scheduler.cache

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the KV cache holds (all sequences together)."""
        return self.scheduler.cache.capacity_tokens

    # -- every step --------------------------------------------------------------
    def choose_power(self) -> int:
        """Before each step: ask the governor once (it may switch profile between steps,
        never within one), hand its path policy to the scheduler and its session sets to
        the runner; return the prompt tokens a prefill chunk may have (the plan's chunk,
        smaller in low_power)."""
        if self.governor is None:
            return self.runner.max_step_tokens
        plan = self.governor.choose()
        self.scheduler.use_profile(plan.profile)
        self.runner.use_power_plan(plan)
        return max(1, min(self.runner.max_step_tokens, plan.prefill_chunk_tokens))

    def run(self, plan: StepPlan, session_spec=None) -> np.ndarray:
        """The model run of a laid-out plan (``ModelRunner.run``)."""
        return self.runner.run(plan, session_spec=session_spec)

    # -- one sequence ------------------------------------------------------------------
    def step(self, seq_id: int, token_ids: list[int], all_rows: bool = False,
             embeds: tuple = ()) -> np.ndarray | NoRoom:
        """Run ``token_ids`` after the sequence's (``embeds``: ``SeqStep.embeds``): logits (R,
        vocab), or NoRoom."""
        self.choose_power()
        plan = self.scheduler.plan_sequence(seq_id, token_ids, all_rows, embeds)
        if isinstance(plan, NoRoom):
            return plan
        logits = self.run(plan)
        self.scheduler.update_from_output(plan)
        return logits

    def extend(self, seq_id: int, tokens) -> np.ndarray | None:
        """Run ``tokens`` after the sequence's, in steps of at most max_step_tokens; the last
        one's logits (vocab,), or None when the cache is full (a draft model's proposals)."""
        n = self.runner.max_step_tokens
        logits: np.ndarray | None = None
        for i in range(0, len(tokens), n):
            out = self.step(seq_id, [int(t) for t in tokens[i:i + n]])
            if isinstance(out, NoRoom):
                return None
            logits = out
        if logits is None:
            raise ValueError("extend needs at least one token")
        return logits[0]

    def open(self, prompt_ids=()) -> tuple[int, int]:
        """A new sequence: (its id, leading prompt tokens reused from the cache)."""
        return self.scheduler.open_sequence(prompt_ids)

    def rollback(self, seq_id: int, num_tokens: int) -> None:
        self.scheduler.rollback(seq_id, num_tokens)

    def close(self, seq_id: int) -> None:
        self.scheduler.close_sequence(seq_id)

    def warm_up(self, sp=None) -> None:
        """One one-token step on session set ``sp`` (None: the default one) for a scratch
        sequence (closed after: a partial page is never cached), its caller pinned as that
        set's steps pin it; then one job on our pool. The weights are paged in and ONNX
        Runtime's first-run allocations made here, not in the first request (a server calls
        it before it listens)."""
        seq_id, _ = self.open()
        try:
            plan = self.scheduler.plan_sequence(seq_id, [0])
            if not isinstance(plan, NoRoom):
                self.run(plan, session_spec=sp)
        finally:
            self.close(seq_id)
        self.runner.wake_pool(sp)

    # -- the single-sequence API (benchmarks, tests) ---------------------------------
    @property
    def num_tokens(self) -> int:
        """Positions of the current sequence held in the cache."""
        return 0 if self.seq_id is None else self.scheduler.sequence_tokens(self.seq_id)

    def begin(self, prompt_ids) -> int:
        """Start a new sequence for ``prompt_ids``; the previous one is closed (its full
        pages stay cached). Returns how many leading prompt tokens are reused from the
        cache: the caller runs only the rest."""
        self.reset()
        self.seq_id, cached = self.open(prompt_ids)
        return cached

    def forward(self, token_ids, all_logits: bool = False, embeds: tuple = ()) -> np.ndarray:
        """Append ``token_ids`` (at most max_step_tokens) at the end of the sequence (a new
        one when none is open) and return logits (R, vocab): the last position only, or
        every position. ``embeds``: ((offset, rows), ...), tokens whose embeddings are
        ``rows`` (an image's: ``SeqStep.embeds``)."""
        n = len(token_ids)
        if not 1 <= n <= self.runner.max_step_tokens:
            raise ValueError(f"a step takes 1..{self.runner.max_step_tokens} tokens, got {n}")
        if self.num_tokens + n > self.runner.max_context_tokens:
            raise ValueError(f"positions {self.num_tokens}..{self.num_tokens + n - 1} exceed the context "
                             f"of {self.runner.max_context_tokens}")
        if self.seq_id is None:
            self.begin([])
        assert self.seq_id is not None  # begin opened one
        out = self.step(self.seq_id, list(token_ids), all_logits, embeds)
        if isinstance(out, NoRoom):
            raise CacheFullError(f"KV cache full: {out.needed_pages} more pages needed, {out.free_pages} free")
        return out

    def reset(self) -> None:
        """Forget the current sequence (cached pages stay reusable)."""
        if self.seq_id is not None:
            self.close(self.seq_id)
            self.seq_id = None


def path_policies(config: Config, governor=None) -> dict[str, PathPolicy]:
    """The path policy of every profile the governor can choose, built once: a step only
    swaps which one the cache applies. Without a governor the configured profile holds
    for good ("auto" then has nothing to choose and overrides nothing)."""
    names = governor.plans if governor is not None else (config.power.profile,)
    return {name: PathPolicy.from_config(config.kv_cache, config.power, name) for name in names}


def build_driver(spec: ModelSpec, config: Config, *, max_context_tokens: int, max_step_tokens: int,
                 max_batch_tokens: int, kv_cache_tokens: int, governor=None, progress=None,
                 disk=None) -> Driver:
    """The cache, scheduler and runner of ``spec`` at a context, stepped by one driver
    (``kv_cache_tokens`` 0: the context twice over; ``disk``: the prefix pages' store)."""
    rt, dp = config.runtime, config.kv_cache
    num_seqs = max(1, rt.max_num_seqs)
    # What grows with the context first: a context memory cannot hold fails here,
    # before its graphs are built and written into the converted-model cache.
    m = spec.config
    arrays = StepArrays(max_step_tokens, num_seqs, max_context_tokens,
                        fitted_page_tokens(dp, m.num_kv_heads, m.head_dim))
    cache = KVCacheManager.for_model(dp, spec.config, max_context_tokens=max_context_tokens,
                                     kv_cache_tokens=kv_cache_tokens, salt=prefix_salt(spec), disk=disk)
    scheduler = BatchScheduler(cache, max_num_seqs=num_seqs, max_batch_tokens=min(max_batch_tokens, max_step_tokens),
                               attention_tokens=attention_tokens(spec.config), arrays=arrays,
                               policies=path_policies(config, governor))
    runner = ModelRunner(spec, arena=cache.arena, arrays=arrays, num_threads=rt.effective_num_threads(),
                         max_context_tokens=max_context_tokens, prefetch_degree=dp.prefetch_degree,
                         accuracy_level=rt.quantized_matmul_accuracy, spinning=rt.intra_op_spinning,
                         ort_pools=rt.ort_thread_pools, kernel=None if rt.kernel_isa == "auto" else rt.kernel_isa,
                         governor=governor, max_num_seqs=num_seqs, progress=progress)
    driver = Driver(scheduler, runner, governor)
    runner.check_placement(driver.warm_up)
    return driver
