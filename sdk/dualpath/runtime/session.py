"""The model runner: steps over many sequences through the ONNX parts and our attention.

ONNX Runtime's sessions and their process-wide state are in ``ort_sessions``, a step's
buffers and bindings in ``runner_step``, a governed runner's session sets per profile
in ``placement_sets``; their public names are importable from here too.
"""

from __future__ import annotations

import functools
import shutil
import time
import weakref

import numpy as np

from ..cache.manager import KVCacheManager, NoRoom
from ..cache.policy import PathPolicy
from ..config import DualPathConfig, PowerConfig
from ..errors import CacheFullError
from ..graph.parts import graph_parts
from ..kernels import ThreadPool
from ..models.spec import ModelSpec
from ..models.store import Progress, temporary_entry
from ..scheduler.batch import SeqStep
from . import ort_sessions
from .ort_sessions import (NBITS8_SINCE, ORT_VERSION, SessionSet, create_sessions, graphs_for_runtime,
                           nbits8_graphs)
from .placement_sets import ProfileSets
from .runner_step import Classifier, StepBinding, StepBuffers, TokenEmbedding, kernel_stepper

__all__ = ["NBITS8_SINCE", "ORT_VERSION", "CacheFullError", "ModelRunner", "SessionSet", "build_kv_cache",
           "create_sessions", "graphs_for_runtime", "nbits8_graphs"]


def __getattr__(name: str):
    # ORT's global pool is made by the first model that asks for it: read its size then.
    if name == "_global_pool_threads":
        return ort_sessions.global_pool_threads()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _prefix_salt(spec: ModelSpec) -> bytes:
    """What the prefix hashes of this model's pages are salted with: its converted-model
    cache key (the file's identity, not its path: the same file found through another path
    still matches the pages it wrote to disk)."""
    return (spec.entry.key if spec.entry is not None else spec.path).encode()


def build_kv_cache(spec: ModelSpec, dp: DualPathConfig, max_context_tokens: int,
                   kv_cache_tokens: int) -> KVCacheManager:
    """The KV cache of ``spec``'s runner: ``kv_cache_tokens`` (0: the context twice over, the
    live sequence plus cached prefixes) in whole blocks (cache/geometry.py)."""
    return KVCacheManager.for_model(dp, spec.config, max_context_tokens=max_context_tokens,
                                    kv_cache_tokens=kv_cache_tokens, salt=_prefix_salt(spec))


class ModelRunner:
    """Runs steps over many sequences at once: our embedding kernel, the ONNX parts,
    and our attention over the dual-path KV cache between them. A step's rows are
    the sequences' new tokens back to back; one attention call per layer covers
    every sequence. Buffers are allocated once; a step allocates no Python objects
    per layer.

    The single-sequence API (``begin`` / ``forward``) is the same machinery with
    one sequence, for benchmarks and tests; the engine calls ``plan_step`` and then
    ``run`` with the scheduler's ``StepPlan``.
    """

    def __init__(self, spec: ModelSpec, *, num_threads: int, max_context_tokens: int,
                 max_step_tokens: int, cache_config: DualPathConfig | None = None,
                 accuracy_level: int = 4, spinning: bool = True, ort_pools: str = "shared",
                 kernel: str | None = None,
                 governor=None, max_num_seqs: int = 1, kv_cache_tokens: int = 0,
                 power_config: PowerConfig | None = None, progress: Progress | None = None):
        cfg = spec.config
        self.spec = spec
        self.num_layers = cfg.num_layers
        self.max_context_tokens = max_context_tokens
        self.max_step_tokens = max_step_tokens
        self.max_num_seqs = max(1, max_num_seqs)
        self.governor = governor
        self._profiles = ProfileSets(governor) if governor is not None else None
        self.load_stats: dict = {}
        """Seconds of each stage of building this runner (``graphs``, ``sessions``)."""
        self._kernel = kernel
        self._int8_act = accuracy_level == 4  # our products' activations, as MatMulNBits' at that level
        self.cache_config = dp = cache_config or DualPathConfig()
        # What grows with the context first: a context memory cannot hold fails here,
        # before its graphs are built and written into the converted-model cache.
        self.buffers = StepBuffers(cfg, max_step_tokens, self.max_num_seqs, max_context_tokens, dp.page_tokens)
        self.cache = build_kv_cache(self.spec, dp, max_context_tokens, kv_cache_tokens)
        parts, session_sets, remove = self._load(accuracy_level, num_threads, spinning, ort_pools, progress)
        self._embed = TokenEmbedding(self.spec.weights["token_embd"], cfg.embed_scale, max_step_tokens,
                                     self.spec.entry)
        self._classifier = (Classifier(self.spec, self.buffers, accuracy_level, kernel)
                            if self.spec.classifier_in_kernels else None)
        self.kv_cache_tokens = self.cache.capacity_tokens
        """Tokens the KV cache holds (all sequences together)."""
        self._policies = self._path_policies(dp, power_config)
        self.cache.policy = next(iter(self._policies.values()))
        make_stepper = functools.partial(kernel_stepper, self.buffers, self.cache.arena, cfg,
                                         dp.prefetch_degree, kernel)
        if self._profiles is None:
            self.kv = make_stepper(ThreadPool(num_threads), self.sessions)
        else:
            self._profiles.attach(session_sets, make_stepper)
            self.kv = next(iter(self._sets.values()))[1]
        self._bindings: dict[int, StepBinding] = {}  # id(session set) -> its bindings
        self.last_plan = None
        """The governor's plan of the last ``plan_step`` (None without a governor)."""
        self.seq_id = self.cache.new_seq_id()
        self.cache.start(self.seq_id, [])
        if self._profiles is not None:
            try:
                self._check_placement(parts, progress)
            finally:
                if remove is not None:
                    remove()

    def _load(self, accuracy_level: int, num_threads: int, spinning: bool, ort_pools: str,
              progress: Progress | None) -> tuple:
        """The graph parts and their sessions (timed in ``load_stats``). Returns the parts,
        a governed runner's session sets (SessionSpec -> SessionSet, else empty), and what
        removes a temporary entry's folder once the placement check no longer needs the
        parts (None when there is nothing left to remove)."""
        t0 = time.perf_counter()
        spec, remove, session_sets = self.spec, None, {}
        temporary = spec.entry is None
        if temporary:  # converted in memory: a private entry in a temporary folder, removed below
            spec = self.spec = temporary_entry(spec)
        try:
            parts = graph_parts(spec, accuracy_level, self.max_context_tokens, nbits8_graphs(spec))
            t1 = time.perf_counter()
            if self._profiles is None:
                self.sessions = create_sessions(parts, num_threads, spinning, progress=progress, entry=spec.entry,
                                                prepack_float=True, ort_pools=ort_pools)
            else:
                session_sets = self._profiles.create(parts, progress, spec.entry)
                self.sessions = next(iter(session_sets.values()))
            spec.entry.verify()  # what no part reads (an untied embedding: our kernel reads it)
            self.load_stats.update(spec.entry.page_in())
        finally:
            if temporary:  # the mappings keep the files alive; nothing else needs the folder
                # (but a placement fallback may build another session set from the parts: then
                # it goes after the placement check, or with this runner if that never comes)
                remove = weakref.finalize(self, shutil.rmtree, spec.entry.store.root, ignore_errors=True)
                if self._profiles is None:
                    remove()
        self.load_stats.update(graphs_s=t1 - t0, sessions_s=time.perf_counter() - t1)
        self.load_seconds = time.perf_counter() - t0
        return parts, session_sets, remove

    def _path_policies(self, dp: DualPathConfig, power_config: PowerConfig | None) -> dict[str, PathPolicy]:
        """The path policy of every profile the governor can choose, built once: a step
        only swaps which one the cache applies. Without a governor the configured profile
        holds for good ("auto" then has nothing to choose and overrides nothing)."""
        gov = self.governor
        names = gov.plans if gov is not None else (power_config.profile if power_config else "",)
        return {name: PathPolicy.from_config(dp, power_config, name) for name in names}

    @property
    def session_sets(self) -> dict:
        """SessionSpec -> SessionSet of a governed runner: one per distinct (cores, threads)
        of every reachable profile (empty without a governor)."""
        return {sp: sessions for sp, (sessions, _) in self._sets.items()}

    @property
    def _sets(self) -> dict:
        # SessionSpec -> (SessionSet, kernel stepper); empty without a governor
        return self._profiles.sets if self._profiles is not None else {}

    @property
    def hidden(self) -> np.ndarray:
        """(R, dim) the final-normed hidden states of the last step's rows (``run``)."""
        return self.buffers.hidden

    def _check_placement(self, parts, progress) -> None:
        """Once, when built: check every session set's placement (``ProfileSets``) and
        swap in the fallback sets the governor's plans now need."""
        if not self._profiles.check_placement(self.warm_up):
            return
        self._bindings.clear()  # keyed by id(sessions): no binding may outlive its set
        self._profiles.rebuild(parts, progress, self.spec.entry)
        self.sessions, self.kv = next(iter(self._sets.values()))

    def warm_up(self, sp=None) -> None:
        """One one-token step on session set ``sp`` (None: the default one) for a scratch
        sequence (freed after: a partial page is never cached), its caller pinned as that
        set's steps pin it; then one job on our pool, whose workers apply their affinity at
        their next job. The weights are paged in and ONNX Runtime's first-run allocations
        made here, not in the first request (a server calls it before it listens)."""
        cache = self.cache
        seq_id = cache.new_seq_id()
        cache.start(seq_id, [])
        try:
            alloc = cache.allocate(seq_id, [0])
            if not isinstance(alloc, NoRoom):
                self.run([SeqStep(None, seq_id, [0], alloc, True)], session_spec=sp)
        finally:
            cache.free(seq_id)
        pool = self._sets[sp][1].pool if sp is not None else self.kv.pool
        pool.read(np.zeros(64 * pool.num_threads, np.uint64))  # (64 * threads,) one job for every worker

    # -- batched steps (the engine) ---------------------------------------------
    def plan_step(self) -> int:
        """Before each step: consult the governor once (it may switch profile between
        steps, never within one), hand its path policy to the cache, and return the
        prompt tokens a prefill chunk may have (the plan's chunk, smaller in low_power)."""
        if self.governor is None:
            return self.max_step_tokens
        plan = self.last_plan = self.governor.choose()
        self.cache.policy = self._policies[plan.profile]
        return max(1, min(self.max_step_tokens, plan.prefill_chunk_tokens))

    def run(self, steps: list[SeqStep], all_rows: bool = False, *, session_spec=None) -> np.ndarray:
        """One step over ``steps`` (allocated, at most max_num_seqs, at most
        max_step_tokens tokens together). Returns logits (R, vocab): ``SeqStep.num_rows``
        rows per step (one with ``logits``, plus one per proposal it carries; one per token
        with ``hidden``), in step order, or with
        ``all_rows`` one per token of the step; ``self.hidden[:R]`` holds the same rows'
        final hidden states. The cache commits every sequence after. ``session_spec``: run on that session
        set instead of the plan's (the warm-up of each set)."""
        S = len(steps)
        if not 1 <= S <= self.max_num_seqs:
            raise ValueError(f"a step takes 1..{self.max_num_seqs} sequences, got {S}")
        T, R, prefill, num_seqs, num_spans = self.buffers.fill(steps, self.cache, all_rows)
        logits = self._execute(T, max(R, 1), prefill, num_seqs, num_spans, session_spec)
        for e in steps:
            self.cache.commit(e.seq_id)
        return logits[:R]

    def _binding(self, T: int, R: int, sessions, pool) -> StepBinding:
        """The session set's bindings, sized for a step of T tokens and R rows; our products
        run on ``pool``."""
        b = self._bindings.get(id(sessions))
        if b is None or b.sessions is not sessions:  # first use (a stored binding keeps its set alive)
            b = self._bindings[id(sessions)] = StepBinding(self.buffers, self.num_layers, sessions, self.spec,
                                                           pool, self._kernel, self._int8_act)
        b.resize(T, R)
        return b

    def _execute(self, T: int, R: int, prefill: bool, num_seqs: int, num_spans: int, sp=None) -> np.ndarray:
        kv_stepper, sessions = self.kv, self.sessions
        plan = self.last_plan
        if sp is None and plan is not None:
            # The plan_step() plan: a step never changes session set midway.
            sp = plan.prefill_spec if prefill else plan.decode_spec
        if sp is not None:
            sessions, kv_stepper = self._profiles.select(sp)
        binding = self._binding(T, R, sessions, kv_stepper.pool)
        self._embed(binding.ids, binding.h0)
        kv_step = kv_stepper.step_batch
        for run, b, layer in binding.plan:
            run(b)
            if layer >= 0:
                kv_step(layer, T, num_seqs, num_spans)
        if self._classifier is not None:  # on the pool where a decode's attention runs on it
            self._classifier(R, kv_stepper.pool if prefill or not kv_stepper.decode_on_caller else None)
        return self.buffers.logits

    # -- one sequence (benchmarks, tests) -----------------------------------------
    @property
    def num_tokens(self) -> int:
        """Positions of the current sequence held in the cache."""
        return self.cache.num_tokens(self.seq_id)

    def begin(self, prompt_ids) -> int:
        """Start a new sequence for ``prompt_ids``; the previous one is freed (its full
        pages stay cached). Returns how many leading prompt tokens are reused from
        the cache: the caller runs only the rest."""
        self.cache.free(self.seq_id)
        self.seq_id = self.cache.new_seq_id()
        return self.cache.start(self.seq_id, prompt_ids)

    def forward(self, token_ids, all_logits: bool = False) -> np.ndarray:
        """Append ``token_ids`` (at most max_step_tokens) at the end of the sequence and
        return logits (R, vocab): the last position only, or every position."""
        n = len(token_ids)
        if not 1 <= n <= self.max_step_tokens:
            raise ValueError(f"a step takes 1..{self.max_step_tokens} tokens, got {n}")
        if self.num_tokens + n > self.max_context_tokens:
            raise ValueError(f"positions {self.num_tokens}..{self.num_tokens + n - 1} exceed the context "
                             f"of {self.max_context_tokens}")
        self.plan_step()
        alloc = self.cache.allocate(self.seq_id, token_ids)
        if isinstance(alloc, NoRoom):
            raise CacheFullError(f"KV cache full: {alloc.needed_pages} more pages needed, {alloc.free_pages} free")
        return self.run([SeqStep(None, self.seq_id, token_ids, alloc, True)], all_rows=all_logits)

    def reset(self) -> None:
        """Forget the current sequence (cached pages stay reusable)."""
        self.begin([])
