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

from ..errors import CacheFullError
from ..graph.parts import graph_parts
from ..kernels import KVArena, ThreadPool
from ..models.spec import ModelSpec
from ..models.store import Progress, temporary_entry
from ..scheduler.step import StepArrays, StepPlan
from . import ort_sessions
from .ort_sessions import NBITS8_SINCE, ORT_VERSION, SessionSet, create_sessions, graphs_for_runtime, nbits8_graphs
from .placement_sets import ProfileSets
from .runner_step import Classifier, StepBinding, StepBuffers, TokenEmbedding, kernel_stepper

__all__ = ["NBITS8_SINCE", "ORT_VERSION", "CacheFullError", "ModelRunner", "SessionSet", "create_sessions",
           "graphs_for_runtime", "nbits8_graphs", "prefix_salt"]


def __getattr__(name: str):
    # ORT's global pool is made by the first model that asks for it: read its size then.
    if name == "_global_pool_threads":
        return ort_sessions.global_pool_threads()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def prefix_salt(spec: ModelSpec) -> bytes:
    """What the prefix hashes of this model's pages are salted with: its converted-model
    cache key (the file's identity, not its path: the same file found through another path
    still matches the pages it wrote to disk)."""
    return (spec.entry.key if spec.entry is not None else spec.path).encode()


class ModelRunner:
    """Runs steps over many sequences at once: our embedding kernel, the ONNX parts,
    and our attention over the KV arena between them. A step's rows are the sequences'
    new tokens back to back; one attention call per layer covers every sequence.
    Buffers are allocated once; a step allocates no Python objects per layer.

    The runner never sees the KV cache: it gets the arena's memory and the step's arrays
    (``StepArrays``, bound once), which the scheduler lays each plan out in; ``run``
    takes the laid-out plan. What the engine and one-sequence work drive it with is
    engine/driver.py.
    """

    def __init__(self, spec: ModelSpec, *, arena: KVArena, arrays: StepArrays, num_threads: int,
                 max_context_tokens: int, prefetch_degree: int = 4, accuracy_level: int = 4, spinning: bool = True,
                 ort_pools: str = "shared", kernel: str | None = None, governor=None, max_num_seqs: int = 1,
                 progress: Progress | None = None):
        cfg = spec.config
        self.spec = spec
        self.num_layers = cfg.num_layers
        self.max_context_tokens = max_context_tokens
        self.max_step_tokens = arrays.max_step_tokens
        self.max_num_seqs = max(1, max_num_seqs)
        self._profiles = ProfileSets(governor) if governor is not None else None
        self.load_stats: dict = {}
        """Seconds of each stage of building this runner (``graphs``, ``sessions``)."""
        self._kernel = kernel
        self._int8_act = accuracy_level == 4  # our products' activations, as MatMulNBits' at that level
        self.buffers = StepBuffers(cfg, arrays)
        self.sessions: SessionSet  # set by _load: the default session set
        parts, session_sets, remove = self._load(accuracy_level, num_threads, spinning, ort_pools, progress)
        self._embed = TokenEmbedding(self.spec.weights["token_embd"], cfg.embed_scale, self.max_step_tokens,
                                     self.spec.entry)
        self._classifier = (Classifier(self.spec, self.buffers, accuracy_level, kernel)
                            if self.spec.classifier_in_kernels else None)
        make_stepper = functools.partial(kernel_stepper, self.buffers, arena, cfg, prefetch_degree, kernel)
        if self._profiles is None:
            self.kv = make_stepper(ThreadPool(num_threads), self.sessions)
        else:
            self._profiles.attach(session_sets, make_stepper)
            self.kv = next(iter(self._sets.values()))[1]
        self._bindings: dict[int, StepBinding] = {}  # id(session set) -> its bindings
        self.power_plan = None
        """The governor's plan in force (``use_power_plan``; None without a governor): which
        session set each phase runs on."""
        self._placement = (parts, progress, remove) if self._profiles is not None else None

    def check_placement(self, warm_up) -> None:
        """Once, after building a governed runner (nothing to do without a governor): check
        every session set's placement (``ProfileSets``), ``warm_up(session_spec)`` running a
        step on each, and swap in the fallback sets the governor's plans now need."""
        profiles = self._profiles
        if self._placement is None or profiles is None:  # (a placement is kept only with profiles)
            return
        parts, progress, remove = self._placement
        self._placement = None
        try:
            if profiles.check_placement(warm_up):
                self._bindings.clear()  # keyed by id(sessions): no binding may outlive its set
                profiles.rebuild(parts, progress, self.spec.entry)
                self.sessions, self.kv = next(iter(self._sets.values()))
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

    @property
    def session_sets(self) -> dict:
        """SessionSpec -> SessionSet of a governed runner: one per distinct (cores, threads)
        of every reachable profile (empty without a governor)."""
        return {sp: sessions for sp, (sessions, _) in self._sets.items()}

    @property
    def _sets(self) -> dict:
        # SessionSpec -> (SessionSet, kernel stepper); empty without a governor
        return self._profiles.sets if self._profiles is not None else {}

    def pools(self) -> list:
        """Our kernels' pools: the default session set's, or one per governed session set."""
        return [stepper.pool for _, stepper in self._sets.values()] or [self.kv.pool]

    @property
    def hidden(self) -> np.ndarray:
        """(R, dim) the final-normed hidden states of the last step's rows (``run``)."""
        return self.buffers.hidden

    def wake_pool(self, sp=None) -> None:
        """One job on our pool of session set ``sp`` (None: the default one), whose workers
        apply their affinity at their next job (a warm-up's last part)."""
        pool = self._sets[sp][1].pool if sp is not None else self.kv.pool
        pool.read(np.zeros(64 * pool.num_threads, np.uint64))  # (64 * threads,) one job for every worker

    def use_power_plan(self, plan) -> None:
        """The governor's plan for the next steps (it switches between steps, never within one)."""
        self.power_plan = plan

    @property
    def last_plan(self):
        """The governor's plan in force (None without a governor)."""
        return self.power_plan

    def run(self, plan: StepPlan, *, session_spec=None) -> np.ndarray:
        """One step of ``plan``, laid out in the step's arrays (``StepArrays.fill``: at most
        max_num_seqs sequences, at most max_step_tokens tokens together). Returns logits
        (R, vocab): ``SeqStep.num_rows`` rows per sequence in step order (or one per token
        where the plan was laid out with every row); ``self.hidden[:R]`` holds the same rows'
        final hidden states. ``session_spec``: run on that session set instead of the power
        plan's (the warm-up of each set)."""
        S = len(plan.seqs)
        if not 1 <= S <= self.max_num_seqs:
            raise ValueError(f"a step takes 1..{self.max_num_seqs} sequences, got {S}")
        if plan.layout is None:
            raise ValueError("the plan is not laid out (StepArrays.fill)")
        T, R, prefill, num_seqs, num_spans, embeds = plan.layout
        logits = self._execute(T, max(R, 1), prefill, num_seqs, num_spans, session_spec, embeds)
        return logits[:R]

    def _binding(self, T: int, R: int, sessions, pool) -> StepBinding:
        """The session set's bindings, sized for a step of T tokens and R rows; our products
        run on ``pool``."""
        b = self._bindings.get(id(sessions))
        if b is None or b.sessions is not sessions:  # first use (a stored binding keeps its set alive)
            b = self._bindings[id(sessions)] = StepBinding(self.buffers, self.num_layers, sessions, self.spec,
                                                           pool, self._kernel, self._int8_act)
            b.read_ahead_around(self._classifier)
        b.resize(T, R)
        return b

    def _execute(self, T: int, R: int, prefill: bool, num_seqs: int, num_spans: int, sp=None,
                 embeds: tuple = ()) -> np.ndarray:
        kv_stepper, sessions = self.kv, self.sessions
        plan = self.power_plan
        if sp is None and plan is not None:
            # The power plan's set: a step never changes session set midway.
            sp = plan.prefill_spec if prefill else plan.decode_spec
        if sp is not None:
            if self._profiles is None:
                raise ValueError(f"session set {sp} named, but this runner has no governor")
            sessions, kv_stepper = self._profiles.select(sp)
        binding = self._binding(T, R, sessions, kv_stepper.pool)
        self._embed(binding.ids, binding.h0)
        for row, rows in embeds:  # an image's rows: the text model reads them as they are (no embed_scale)
            binding.h0[row:row + len(rows)] = rows
        kv_step = kv_stepper.step_batch
        for run, b, layer in binding.plan:
            run(b)
            if layer >= 0:
                kv_step(layer, T, num_seqs, num_spans)
        if self._classifier is not None:  # on the pool where a decode's attention runs on it
            self._classifier(R, kv_stepper.pool if prefill or not kv_stepper.decode_on_caller else None)
        return self.buffers.logits
