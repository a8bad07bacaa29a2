"""The continuous-batching engine: many requests, one model, one KV cache.

Each ``step()`` is three calls through the driver (engine/driver.py): the scheduler's
``schedule()`` (scheduler/batch.py: a batch of decode tokens and prefill chunks, laid
out in the step's arrays), the runner's ``run()`` (one pass through the model; one
attention call per layer covers every sequence), and, once every request's rows are
sampled, the scheduler's ``update_from_output()``, the one place the outcome changes
the KV cache. Each request then gets its text delta. The engine never calls the cache.

The engine owns scheduling and the step loop; what a request's rows of a step turn
into (sampling, grammar, stop strings, text, speculative verification) is
engine/outputs.py, the request itself engine/request.py, and what its consumer reads
(``Delta``, ``RequestHandle``, ``SyncStream``) engine/handles.py.

Three ways to drive it:

* ``LLM.generate/stream`` (synchronous): the caller's thread steps the engine
  until its request ends, unless the background loop runs;
* ``await engine.submit(prompt, params)``: an async iterator of ``Delta``s, the
  background loop (a thread, started on first use) doing the steps;
* ``engine.step()`` by hand (tests, benchmarks).

An embedding model served beside the chats (``attach_encoder``) is stepped here too: after
each step its queue (engine/encoder_queue.py) runs a slice of the texts waiting, within a
share of that step's time; with no chat running, whole slices.

``abort(request_id)`` ends a request and frees its cache before the next step
(at once when no step is running). A failing step never fails the engine: an error
while one request's output is made (sampling, grammar, text) ends that request
alone; a model run that raises sends every request in it back to be recomputed
once (as a preemption does), and a request in a second failed run ends with an
``InternalError``. Either way the consumer gets the error and the others go on.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import CacheFullError, QueueFullError
from ..sampling.sampler import SamplerScratch
from ..sampling_params import SamplingParams
from ..scheduler.request import Status
from ..scheduler.step import SeqStep, StepResults
from .async_api import AsyncAPI
from .encoder_queue import EncoderQueue
from .generate import check_embeds, check_prompt
from .handles import Delta, RequestHandle, SyncStream
from .metrics import EngineMetrics
from .outputs import OutputMaker
from .request import EngineRequest, internal_error
from .speculative import DraftProposer, NgramProposer

__all__ = ["Delta", "Engine", "EngineRequest", "QueueFullError", "RequestHandle", "SyncStream"]
"""Delta, EngineRequest, RequestHandle and SyncStream live in engine/handles.py and
engine/request.py; they are importable from here as they always were."""

log = logging.getLogger(__name__)


class Engine(AsyncAPI):
    """Schedules and runs many requests over one driver: a scheduler and a runner (see module doc)."""

    def __init__(self, driver, tokenizer, *, max_queued_requests: int | None = None, profile_name: str = "",
                 speculative: str = "off", speculative_tokens: int = 16, draft=None):
        self.driver = driver
        """The scheduler and the runner, stepped together (engine/driver.py); it asks the
        power governor at every step."""
        self.runner = driver.runner
        self.scheduler = driver.scheduler
        self.tokenizer = tokenizer
        self.speculative_tokens = speculative_tokens if speculative != "off" else 0
        """Most tokens proposed per decode step (0: speculative decoding off)."""
        self.draft = draft
        """The draft model (runtime/speculative.DraftModel) with ``speculative: draft``, else None."""
        self.max_queued_requests = max_queued_requests
        self.metrics = EngineMetrics()
        self._scratch = SamplerScratch(self.runner.spec.config.vocab_size)
        """Every request's sampler works in these (only the stepping thread samples)."""
        self.outputs = OutputMaker(tokenizer, self._scratch, self.metrics)
        self._profile_name = profile_name
        self._ids = itertools.count()
        self._requests: dict[str, EngineRequest] = {}
        self._aborts: set[str] = set()
        self._mu = threading.Lock()             # queue, requests, aborts (held briefly: never
        #                                         across the model run or sampling)
        self._step_lock = threading.Lock()      # one step at a time
        self._wake = threading.Condition(self._mu)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.encoder_queues: list[EncoderQueue] = []
        """Encoder work (an embedding model's texts, a projector's images), run beside the
        chats a slice per step (``attach_encoder``)."""

    # -- requests --------------------------------------------------------------
    @property
    def context_tokens(self) -> int:
        return self.runner.max_context_tokens

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, sink=None, fork_sinks: Sequence = (),
                    pooling: str | None = None, prompt_logprobs: bool = False, grammar=None,
                    check_queue: bool = True, embeds: Sequence = ()) -> EngineRequest:
        """Queue a request; ``sink(delta: Delta | None, error: BaseException | None)`` gets
        its output from the stepping thread. Raises for a prompt no request can run,
        and QueueFullError when ``max_queued_requests`` are already waiting.

        ``fork_sinks``: one more sample of the same prompt per sink (``n`` - 1 of them), as
        forks of this request's cache sequence once its prompt is computed (seeds
        ``seed + 1``, ``seed + 2``, ... when the params have a seed); ``forks`` holds them.

        ``pooling`` ("mean", "last" or "cls"): an embedding request instead: its prompt is
        run (batched with the others, never from the prefix cache) and its completion
        carries the pooled, L2-normalised final hidden state; nothing is sampled. "rank":
        the last token's state as it is, what a reranker's head reads (rerank.py).
        ``prompt_logprobs``: the completion also carries the log-probability of every prompt
        token after the first (``params.logprobs`` alternatives each), for ``echo``.
        ``grammar`` (sampling/grammar.py): every sample follows it (each fork its own walk), and
        the request ends when the grammar is complete. ``check_queue`` False: part of a
        request already admitted (``embed``), never refused for a full queue. ``embeds``:
        ((prompt position, rows (k, dim)[, mutual]), ...), prompt tokens whose embeddings are
        given (an image's: ``Request.embeds``; with ``mutual``, they attend to each other)."""
        ids = [int(t) for t in prompt_ids]
        check_prompt(ids, self.runner.spec.config.vocab_size, self.context_tokens)
        embeds, mutual = check_embeds(embeds, len(ids), self.runner.spec.config.dim)
        # Made before the lock is taken: a request's token array and text stream, one per
        # sample, grow with the prompt (a refused request's are dropped).
        req = _new_request(self, request_id or f"req-{next(self._ids)}", ids, params or SamplingParams(), sink,
                                fork_sinks, pooling, prompt_logprobs, grammar)
        for r in (req, *req.forks):
            r.embeds, r.mutual = embeds, mutual
        with self._mu:
            # Queued beyond the free sequence slots (those start at the next step).
            sch = self.scheduler
            waiting = len(sch.waiting) - max(0, sch.max_num_seqs - sch.num_seqs())
            if check_queue and self.max_queued_requests is not None and waiting >= self.max_queued_requests:
                raise QueueFullError(waiting, self.max_queued_requests)
            if req.request_id in self._requests:
                raise ValueError(f"request id {req.request_id!r} is already in use")
            if 1 + len(fork_sinks) > self.scheduler.max_num_seqs:
                raise ValueError(f"{1 + len(fork_sinks)} samples of one prompt need as many sequences at once; "
                                 f"this engine runs at most {self.scheduler.max_num_seqs} (runtime.max_num_seqs)")
            if pooling is not None and pooling not in ("mean", "last", "cls", "rank"):
                raise ValueError(f"pooling {pooling!r} must be mean, last, cls or rank")
            for r in [req] + req.forks:
                self._requests[r.request_id] = r
            self.scheduler.reserve(req, len(req.forks))  # a slot for each fork, taken when it starts
            self.scheduler.add(req)
            self._wake.notify()
        return req

    def attach_encoder(self, queue: EncoderQueue) -> None:
        """Step ``queue`` (engine/encoder_queue.py) after every step, its share of the time beside
        chats; one that shares the cores by threads (``queue.cores``) runs on its own thread."""
        self.encoder_queues.append(queue)
        if queue.cores is not None:
            queue.start()
        else:
            queue.wake = self._notify

    def _notify(self) -> None:  # encoder work queued: the background loop runs it (started on first use)
        self.start()
        with self._mu:
            self._wake.notify()

    def abort(self, request_id: str) -> bool:
        """End a request (finish_reason ``abort``); its cache is freed before the next
        step, or now when no step is running. False when it is unknown or done."""
        with self._mu:
            if request_id not in self._requests:
                return False
            self._aborts.add(request_id)
        if self._step_lock.acquire(blocking=False):
            try:
                self._apply_aborts()
            finally:
                self._step_lock.release()
        return True

    def has_work(self) -> bool:
        with self._mu:
            return self.scheduler.has_work()

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- stepping ----------------------------------------------------------------
    def step(self) -> int:
        """Run one iteration. Returns how many requests were in it (0 = nothing to do).

        ``_mu`` is held only to schedule and to finish requests: the event loop's
        submits and ``/metrics`` never wait for the model run or for sampling. Only this
        thread touches a running request's sampler, tokens and stream."""
        with self._step_lock:
            t_step = time.perf_counter()
            self._apply_aborts()
            chunk_tokens = self.driver.choose_power()
            with self._mu:
                plan = self.scheduler.schedule(chunk_tokens)
                for req, why in plan.failed:
                    self._end(req, error=CacheFullError(why))
            if not plan:  # no chat runs: the encoder, if it has work, takes a whole batch
                return self._encoder_step(None)
            t0 = time.perf_counter()
            try:
                logits = self.driver.run(plan)
            except Exception as e:  # recompute these requests once, keep serving the others
                log.exception("engine step of %d sequences failed", len(plan.seqs))
                with self._mu:
                    for s in plan.seqs:
                        self._retry_or_fail(s.request, e)
                return len(plan.seqs)
            now = time.perf_counter()
            for s in plan.seqs:  # a run went through: a later failure is a new one, retried again
                s.request.failed_steps = 0
            results = self._make_outputs(plan.seqs, logits, now)
            with self._mu:
                ended = self.scheduler.update_from_output(plan, results)
                for _, fork in results.forked:
                    fork.fork_of = None
                for req, finish, kwargs in ended:
                    self._end(req, finish, **kwargs)
            m = self.metrics
            m.peak_kv_bytes_held = max(m.peak_kv_bytes_held, self.scheduler.cache.bytes_held())
            m.on_step(now, now - t0, plan.num_tokens, results.generated)
            self._encoder_step(time.perf_counter() - t_step)
            return len(plan.seqs)

    def _encoder_step(self, beside_s: float | None) -> int:
        return sum(q.step(beside_s) for q in self._stepped_queues() if q.has_work())

    def _stepped_queues(self) -> list[EncoderQueue]:
        """The encoder queues this engine steps (not those on threads of their own)."""
        return [q for q in self.encoder_queues if q.cores is None]

    def _make_outputs(self, seqs: list[SeqStep], logits: np.ndarray, now: float) -> StepResults[EngineRequest]:
        """Every sequence's output from its rows of the run (not holding _mu): the tokens
        sampled, and what the scheduler does next (``OutputMaker.make``)."""
        results: StepResults[EngineRequest] = StepResults()
        for s, rows, hidden in rows_by_seq(seqs, logits, self.runner.hidden):
            try:
                results.generated += self.outputs.make(s, rows, hidden, now, results)
            except Exception as e:  # this request's output failed: it alone ends
                req = s.request
                if not isinstance(req, EngineRequest):  # not a request's sequence: nothing to end but the step
                    raise
                log.exception("request %s failed while its output was made", req.request_id)
                results.ended.append((req, "abort", {"error": internal_error(req, e)}))
        return results

    def _retry_or_fail(self, req: EngineRequest, error: BaseException) -> None:
        """A model run with ``req`` in it raised (holding _mu): the first time, recompute it
        from its known tokens (the run's KV was never committed); the second, end it."""
        if req.status is not Status.RUNNING:
            return
        if req.failed_steps == 0:
            req.failed_steps = 1
            self.scheduler.preempt(req, for_room=False)
            self.metrics.retried_requests += 1
        else:
            self._end(req, error=internal_error(req, error))

    def run_until_done(self) -> None:
        while self.step():
            pass

    def _end(self, req: EngineRequest, finish: str = "abort", stop_reason=None, *, text: str = "",
             token: int | None = None, error: BaseException | None = None) -> None:
        """Finish a request (holding _mu): free its cache, deliver the last delta."""
        if req.fork_of is not None:  # a fork that never started: nothing scheduled, no cache
            self.scheduler.drop_fork(req.fork_of)
            req.fork_of = None
            req.status = Status.FINISHED
        else:
            self.scheduler.remove(req)
        for fork in req.forks:  # the parent failed or was aborted before forking: they cannot start
            if fork.fork_of is req and (finish == "abort" or error is not None):
                self._end(fork, "abort", error=error)
        self._requests.pop(req.request_id, None)
        self._aborts.discard(req.request_id)
        if req.proposer is not None:
            req.proposer.close()  # a draft model's sequence for it
        self.outputs.end(req, finish, stop_reason, text, token, error)

    def _apply_aborts(self) -> None:
        with self._mu:
            for rid in list(self._aborts):
                req = self._requests.get(rid)
                if req is not None:
                    self._end(req, "abort")
            self._aborts.clear()

    # -- background loop -----------------------------------------------------------
    @property
    def running_in_background(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Step in a background thread whenever there is work (idempotent)."""
        with self._mu:
            if self.running_in_background:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="dualpath-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Stop the background loop, aborting what is left."""
        with self._mu:
            self._stopping = True
            self._aborts.update(self._requests)
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for q in self.encoder_queues:
            if q.cores is not None:  # (its own thread ends)
                q.shutdown()
        with self._step_lock:
            self._apply_aborts()

    def _loop(self) -> None:
        while True:
            with self._mu:
                while not (self._stopping or self.scheduler.has_work() or self._aborts
                           or any(q.has_work() for q in self._stepped_queues())):
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception as e:  # a bug outside the model run: fail what is in flight, keep serving
                log.exception("engine step failed outside the model run")
                with self._mu:
                    for req in list(self._requests.values()):
                        if req.status is not Status.FINISHED:
                            self._end(req, error=internal_error(req, e))

    # -- metrics ---------------------------------------------------------------------
    @property
    def power_profile(self) -> str:
        plan = self.runner.power_plan
        if plan is not None:
            return getattr(plan, "profile", None) or self._profile_name
        return self._profile_name

    def metrics_text(self) -> str:
        """Prometheus text exposition of the engine's state."""
        with self._mu:
            stats = self.scheduler.cache.stats()
            disk = self.scheduler.cache.disk
            text = self.metrics.render(waiting=len(self.scheduler.waiting), running=len(self.scheduler.running),
                                       cache=stats, preemptions=self.scheduler.preemptions,
                                       profile=self.power_profile, disk=disk.stats if disk else None)
        return text + "".join("\n".join(q.metrics_lines()) + "\n" for q in self.encoder_queues)


def _new_request(engine: Engine, rid: str, ids: list[int], params: SamplingParams, sink, fork_sinks: Sequence,
                 pooling: str | None, prompt_logprobs: bool, grammar) -> EngineRequest:
    """The request ``Engine.add_request`` queues, its forks in ``forks`` (not holding _mu)."""
    spec = pooling is None and not prompt_logprobs and engine.speculative_tokens > 0

    def proposer():
        if engine.draft is not None:
            return DraftProposer(engine.draft, engine.speculative_tokens)
        return NgramProposer(engine.speculative_tokens)

    ctx, scratch = engine.context_tokens, engine._scratch
    req = EngineRequest(rid, ids, params, engine.tokenizer, ctx, scratch, sink, grammar, proposer() if spec else None)
    if prompt_logprobs:
        req.prompt_logits = True
        req.prompt_logprobs = []
    if pooling is not None:
        req.embedding, req.pooling = True, pooling
        req.pooled = np.zeros(engine.runner.spec.config.dim, np.float64)  # (dim,) running sum or pick
    for i, fork_sink in enumerate(fork_sinks, 1):
        fork_params = params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
        fork = EngineRequest(f"{rid}.{i}", ids, fork_params, engine.tokenizer, ctx, scratch, fork_sink, grammar,
                             proposer() if spec else None)
        fork.fork_of = req
        req.forks.append(fork)
    return req


def rows_by_seq(seqs: list[SeqStep], logits: np.ndarray,
                hidden: np.ndarray) -> Iterator[tuple[SeqStep, np.ndarray, np.ndarray]]:
    """Each sequence of a step with its rows of the run's output (logits (R, vocab), final
    hidden states (R, dim)): the plan says whose they are, ``SeqStep.num_rows`` each in
    step order, as ``ModelRunner.run`` returns them."""
    bounds, row = [], 0
    for s in seqs:
        bounds.append((s, row, row + s.num_rows))
        row += s.num_rows
    if row != len(logits):
        raise RuntimeError(f"the model run returned {len(logits)} logits rows; the step's plan has {row}")
    for s, start, end in bounds:
        yield s, logits[start:end], hidden[start:end]
