"""The continuous-batching engine: many requests, one model, one KV cache.

Each ``step()`` asks the scheduler (scheduler/batch.py) for a batch of decode
tokens and prefill chunks, runs it through the model in one pass (one attention
call per layer covers every sequence), samples one token for every request whose
known tokens are all computed, and hands each request its text delta.

Three ways to drive it:

* ``LLM.generate/stream`` (synchronous): the caller's thread steps the engine
  until its request ends, unless the background loop runs;
* ``await engine.submit(prompt, params)``: an async iterator of ``Delta``s, the
  background loop (a thread, started on first use) doing the steps;
* ``engine.step()`` by hand (tests, benchmarks).

``abort(request_id)`` ends a request and frees its cache before the next step
(at once when no step is running). A failing step never fails the engine: an error
while one request's output is made (sampling, grammar, text) ends that request
alone; a model run that raises sends every request in it back to be recomputed
once (as a preemption does), and a request in a second failed run ends with an
``InternalError``. Either way the consumer gets the error and the others go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

import numpy as np

from ..errors import DualPathError, InternalError
from ..scheduler.batch import BatchScheduler, attention_tokens
from ..scheduler.request import Request, Status
from .generate import Completion, TextStream, Timings, Usage, check_prompt
from .metrics import EngineMetrics
from .sampler import Sampler, SamplerScratch, SamplingParams
from .speculative import DraftProposer, NgramProposer

log = logging.getLogger(__name__)


class QueueFullError(DualPathError):
    """The engine's queue of waiting requests is full; retry later."""

    def __init__(self, waiting: int, limit: int):
        super().__init__(f"{waiting} requests are already waiting (limit {limit}); retry later")
        self.waiting, self.limit = waiting, limit


@dataclass(frozen=True)
class Delta:
    """What one step produced for a request."""

    text: str
    """New text (may be empty: held back for a possible stop string, or a partial
    UTF-8 character)."""
    token_ids: tuple[int, ...]
    """New generated token ids (empty on the final delta of a stop token)."""
    finish_reason: str | None = None
    """Set on the last delta: ``stop``, ``length``, ``context_full`` or ``abort``."""
    completion: Completion | None = None
    """Set on the last delta."""
    logprobs: tuple = ()
    """With ``SamplingParams.logprobs``: one entry per token of ``token_ids``,
    ``(token_id, logprob, ((id, logprob), ...))`` (see ``Sampler.last_logprobs``)."""


def _normalised(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float32)


class EngineRequest(Request):
    """A scheduler Request plus what generating text needs: sampler, text stream and
    the sink its deltas go to."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, tokenizer,
                 context_tokens: int, scratch: SamplerScratch, sink, grammar=None, proposer=None):
        super().__init__(request_id, prompt_ids, context_tokens, reserve_tokens=params.max_tokens)
        self.proposer = proposer
        """Speculative decoding's proposals for this request (runtime/speculative.py), or None."""
        self.grammar = grammar
        self.matcher = grammar.new_matcher() if grammar is not None else None
        """Structured output (runtime/grammar.py): this sequence's walk through the grammar."""
        self.params = params
        self.sampler = Sampler(params, scratch.vocab_size, scratch)
        self.stream = TextStream(tokenizer, prompt_ids, params)
        self.stop_ids = frozenset() if params.ignore_eos else tokenizer.stop_ids
        self.sink = sink
        self.first_token_time: float | None = None
        self.decode_steps = 0
        self.completion: Completion | None = None
        self.logprobs: list | None = [] if params.logprobs is not None else None
        """Per generated token: (token_id, logprob, top alternatives), with params.logprobs."""
        self.forks: list[EngineRequest] = []
        """Further samples of this prompt (``n`` > 1): requests that start, when this one's
        prompt is computed, from a fork of its cache sequence (sharing its pages), each
        sampling its own first token from the same logits."""
        self.fork_of: EngineRequest | None = None
        """For such a fork: the request it is waiting to be forked from (None once forked)."""


def _internal(req: Request, cause: BaseException) -> InternalError:
    """The error a request's consumer gets when the engine failed it: no internals in the
    message (the cause is logged, and chained for callers in-process)."""
    err = InternalError(f"request {req.request_id} failed inside the engine; it may be retried")
    err.__cause__ = cause
    return err


class Engine:
    """Schedules and runs many requests over one ``ModelRunner`` (see module doc)."""

    def __init__(self, runner, tokenizer, *, max_num_seqs: int, max_batch_tokens: int,
                 max_queued_requests: int | None = None, profile_name: str = "",
                 speculative: str = "off", speculative_tokens: int = 16, draft=None):
        self.runner = runner  # it consults the power governor at every step
        self.tokenizer = tokenizer
        self.speculative_tokens = speculative_tokens if speculative != "off" else 0
        """Most tokens proposed per decode step (0: speculative decoding off)."""
        self.draft = draft
        """The draft model (runtime/speculative.DraftModel) with ``speculative: draft``, else None."""
        self.max_queued_requests = max_queued_requests
        self.scheduler = BatchScheduler(runner.cache, max_num_seqs=max_num_seqs,
                                        max_batch_tokens=min(max_batch_tokens, runner.max_step_tokens),
                                        attention_tokens=attention_tokens(runner.spec.config))
        self.metrics = EngineMetrics()
        self._scratch = SamplerScratch(runner.spec.config.vocab_size)
        """Every request's sampler works in these (only the stepping thread samples)."""
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

    # -- requests --------------------------------------------------------------
    @property
    def context_tokens(self) -> int:
        return self.runner.max_context_tokens

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, sink=None, fork_sinks: Sequence = (),
                    pooling: str | None = None, prompt_logprobs: bool = False, grammar=None) -> EngineRequest:
        """Queue a request; ``sink(delta: Delta | None, error: BaseException | None)`` gets
        its output from the stepping thread. Raises for a prompt no request can run,
        and QueueFullError when ``max_queued_requests`` are already waiting.

        ``fork_sinks``: one more sample of the same prompt per sink (``n`` - 1 of them), as
        forks of this request's cache sequence once its prompt is computed (seeds
        ``seed + 1``, ``seed + 2``, ... when the params have a seed); ``forks`` holds them.

        ``pooling`` ("mean", "last" or "cls"): an embedding request instead: its prompt is
        run (batched with the others, never from the prefix cache) and its completion
        carries the pooled, L2-normalised final hidden state; nothing is sampled.
        ``prompt_logprobs``: the completion also carries the log-probability of every prompt
        token after the first (``params.logprobs`` alternatives each), for ``echo``.
        ``grammar`` (runtime/grammar.py): every sample follows it (each fork its own walk), and
        the request ends when the grammar is complete."""
        ids = [int(t) for t in prompt_ids]
        check_prompt(ids, self.runner.spec.config.vocab_size, self.context_tokens)
        params = params or SamplingParams()
        with self._mu:
            # Queued beyond the free sequence slots (those start at the next step).
            sch = self.scheduler
            waiting = len(sch.waiting) - max(0, sch.max_num_seqs - sch.num_seqs())
            if self.max_queued_requests is not None and waiting >= self.max_queued_requests:
                raise QueueFullError(waiting, self.max_queued_requests)
            rid = request_id or f"req-{next(self._ids)}"
            if rid in self._requests:
                raise ValueError(f"request id {rid!r} is already in use")
            if 1 + len(fork_sinks) > self.scheduler.max_num_seqs:
                raise ValueError(f"{1 + len(fork_sinks)} samples of one prompt need as many sequences at once; "
                                 f"this engine runs at most {self.scheduler.max_num_seqs} (runtime.max_num_seqs)")
            spec = pooling is None and not prompt_logprobs and self.speculative_tokens > 0
            req = EngineRequest(rid, ids, params, self.tokenizer, self.context_tokens, self._scratch, sink, grammar,
                                self._proposer() if spec else None)
            if prompt_logprobs:
                req.prompt_logits = True
                req.prompt_logprobs = []
            if pooling is not None:
                if pooling not in ("mean", "last", "cls"):
                    raise ValueError(f"pooling {pooling!r} must be mean, last or cls")
                req.embedding, req.pooling = True, pooling
                req.pooled = np.zeros(self.runner.spec.config.dim, np.float64)  # (dim,) running sum or pick
            self._requests[rid] = req
            for i, fork_sink in enumerate(fork_sinks, 1):
                fork_params = params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
                fork = EngineRequest(f"{rid}.{i}", ids, fork_params, self.tokenizer, self.context_tokens,
                                     self._scratch, fork_sink, grammar, self._proposer() if spec else None)
                fork.fork_of = req
                req.forks.append(fork)
                self._requests[fork.request_id] = fork
            self.scheduler.reserve(req, len(req.forks))  # a slot for each fork, taken when it starts
            self.scheduler.add(req)
            self._wake.notify()
        return req

    def _proposer(self):
        if self.draft is not None:
            return DraftProposer(self.draft, self.speculative_tokens)
        return NgramProposer(self.speculative_tokens)

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
            self._apply_aborts()
            chunk_tokens = self.runner.plan_step()
            with self._mu:
                plan = self.scheduler.schedule(chunk_tokens)
                for req, why in plan.failed:
                    self._end(req, error=DualPathError(why))
            if not plan:
                return 0
            t0 = time.perf_counter()
            try:
                logits = self.runner.run(plan.seqs)
            except Exception as e:  # recompute these requests once, keep serving the others
                log.exception("engine step of %d sequences failed", len(plan.seqs))
                with self._mu:
                    for s in plan.seqs:
                        self._retry_or_fail(s.request, e)
                return len(plan.seqs)
            now = time.perf_counter()
            for s in plan.seqs:  # a run went through: a later failure is a new one, retried again
                s.request.failed_steps = 0
            row = generated = 0
            ended = []
            forked = []
            hidden = self.runner.hidden
            for s in plan.seqs:
                n = s.num_rows  # the plan says which rows are whose: run() returns them in step order
                try:
                    generated += self._output(s, logits[row:row + n], hidden[row:row + n], now, ended, forked)
                except Exception as e:  # this request's output failed: it alone ends
                    log.exception("request %s failed while its output was made", s.request.request_id)
                    ended.append((s.request, "abort", {"error": _internal(s.request, e)}))
                row += n
            with self._mu:
                for fork in forked:  # before the parent's sequence grows (at the next step)
                    self._start_fork(fork)
                for req, finish, kwargs in ended:
                    if req.status is not Status.FINISHED:  # its output failed after it had ended
                        self._end(req, finish, **kwargs)
            m = self.metrics
            m.peak_kv_bytes_held = max(m.peak_kv_bytes_held, self.runner.cache.bytes_held())
            m.on_step(now, now - t0, plan.num_tokens, generated)
            return len(plan.seqs)

    def _output(self, s, rows: np.ndarray, hidden: np.ndarray, now: float, ended: list, forked: list) -> int:
        """Use one sequence's rows of a step's output (logits (R, vocab), final hidden
        states (R, dim)): pool an embedding, keep the prompt's log-probabilities, sample
        (after forking, when the prompt was just computed; each proposal's row while the
        samples agree with them). Requests that end go to ``ended``, forks to start to
        ``forked``. Returns the tokens sampled."""
        req = s.request
        if s.hidden and req.embedding:  # an embedding's chunk: pool its rows, end after the last
            end = self._pool(req, hidden, s.alloc.pos0)
            if end is not None:
                ended.append(end)
            return 0
        if s.hidden:  # a prompt chunk whose every position's log-probabilities are wanted
            self._prompt_logprobs(req, rows, s.alloc.pos0)
        if not s.logits:
            return 0
        sampled = 0
        if req.forks and req.first_token_time is None:  # its prompt is computed: fork now
            for fork in req.forks:
                if fork.fork_of is not None:  # not aborted while waiting
                    forked.append(fork)
                    sampled += 1
                    if self._sample(fork, rows[-1], now, ended) and fork.proposer is not None:
                        self._propose(fork)
        if s.draft:
            going, rows_sampled = self._verify(req, s.token_ids[-s.draft:], rows, now, ended)
        else:
            going, rows_sampled = self._sample(req, rows[-1], now, ended), 1  # the chunk's last row samples
        if going and req.proposer is not None:
            self._propose(req)
        return sampled + rows_sampled

    def _verify(self, req: EngineRequest, draft: list[int], rows: np.ndarray, now: float,
                ended: list) -> tuple[bool, int]:
        """Sample the rows of a step that ran proposals (runtime/speculative.py), in order,
        as plain decoding would: row i's sample is kept, and the next row sampled, while it
        equals proposal i. The cache rolls back the proposals after the last one kept.
        Returns whether the request goes on, and the rows sampled."""
        known = req.n  # the last known token's KV was computed in this step, with the proposals'
        kept, going = 0, True
        for i in range(len(draft) + 1):
            if not self._sample(req, rows[i], now, ended):
                going = False  # the request ended; its cache goes with it
                break
            if i == len(draft) or req.ids[req.n - 1] != draft[i]:
                break
            kept += 1
        req.proposer.update(len(draft), kept)
        self.metrics.on_proposals(len(draft), kept)
        if going:
            req.computed = known + kept
            self.runner.cache.truncate(req.seq_id, req.computed)
        return going, i + 1

    def _propose(self, req: EngineRequest) -> None:
        """The proposals the request's next decode step runs (the scheduler may cut them
        to its budget): no more than the tokens it may still generate and the context holds."""
        limit = min(req.params.max_tokens - len(req.generated) - 1, req.context_tokens - req.n)
        req.draft = req.proposer.propose(req.ids, req.n, limit) if limit > 0 else []

    def _sample(self, req: EngineRequest, logits: np.ndarray, now: float, ended: list) -> bool:
        """``_advance``, and the request's end (if any) into ``ended``; an error while it
        samples ends this request alone (a fork that failed its first sample never runs).
        True while the request goes on; then its next proposals are made."""
        try:
            end = self._advance(req, logits, now)
        except Exception as e:
            log.exception("request %s failed while it sampled", req.request_id)
            end = (req, "abort", {"error": _internal(req, e)})
        if end is not None:
            ended.append(end)
            return False
        return True

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
            self._end(req, error=_internal(req, error))

    def run_until_done(self) -> None:
        while self.step():
            pass

    def _advance(self, req: EngineRequest, logits: np.ndarray, now: float):
        """Sample the request's next token and deliver its delta (not holding _mu).
        Returns ``(request, finish_reason, _end keywords)`` when the request ends."""
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.on_first_token(now - req.arrival)
        else:
            req.decode_steps += 1
        m = req.matcher
        bias = None
        if m is not None:
            bias = self._scratch.bias
            m.fill_bias(bias)
        token = req.sampler.sample(logits, req.ids[:req.n], bias)
        if m is not None:
            m.accept(token)  # the mask only let through what the grammar accepts
            if token in self.tokenizer.stop_ids:  # the grammar allowed an end: it is complete (even with ignore_eos)
                return req, "stop", {"stop_reason": token}
        if token in req.stop_ids:
            return req, "stop", {"stop_reason": token}
        req.append(token)
        if req.logprobs is not None:
            req.logprobs.append((token, *req.sampler.last_logprobs))
        text, stop = req.stream.push(token)
        if stop is not None:
            return req, "stop", {"stop_reason": stop, "text": text, "token": token}
        if m is not None and m.is_finished():  # the grammar is complete: nothing may follow
            return req, "stop", {"text": text, "token": token}
        if len(req.generated) >= req.params.max_tokens:
            return req, "length", {"text": text, "token": token}
        if req.n >= req.context_tokens:
            return req, "context_full", {"text": text, "token": token}
        if req.sink is not None:
            req.sink(Delta(text, (token,), logprobs=req.logprobs[-1:] if req.logprobs is not None else ()), None)
        return None

    def _prompt_logprobs(self, req: EngineRequest, rows: np.ndarray, pos0: int) -> None:
        """Log-probabilities of the prompt tokens a chunk's logits rows (n, vocab) predict:
        row j predicts the token at pos0 + j + 1 (the raw model distribution)."""
        if pos0 == 0:
            req.prompt_logprobs.clear()  # the first chunk (again, after a preemption)
        m = min(len(rows), len(req.prompt_ids) - 1 - pos0)
        if m <= 0:
            return
        x = rows[:m].astype(np.float64)                                   # (m, vocab)
        top = x.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))            # (m,)
        nxt = np.asarray(req.prompt_ids[pos0 + 1:pos0 + 1 + m], np.int64)
        lp = x[np.arange(m), nxt] - lse
        k = min(req.params.logprobs or 0, x.shape[1])
        if k:
            ids = np.argpartition(x, x.shape[1] - k, axis=1)[:, -k:]       # (m, k)
            ids = np.take_along_axis(ids, np.argsort(-np.take_along_axis(x, ids, 1), axis=1, kind="stable"), 1)
            vals = np.take_along_axis(x, ids, 1) - lse[:, None]
            alts = [tuple(zip(map(int, a), map(float, v))) for a, v in zip(ids, vals)]
        else:
            alts = [()] * m
        req.prompt_logprobs.extend(zip(map(int, nxt), map(float, lp), alts))

    def _pool(self, req: EngineRequest, rows: np.ndarray, pos0: int):
        """Fold a chunk's hidden rows (n, dim) into an embedding request; at its last
        chunk return its end (as ``_advance`` does)."""
        if pos0 == 0:  # the first chunk (again, after a preemption)
            req.pooled[:] = 0.0
        if req.pooling == "mean":
            req.pooled += rows.sum(axis=0, dtype=np.float64)
        elif req.pooling == "cls" and pos0 == 0:
            req.pooled[:] = rows[0]
        if req.computed < req.n:
            return None
        if req.pooling == "last":
            req.pooled[:] = rows[-1]
        elif req.pooling == "mean":
            req.pooled /= req.n
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        return req, "stop", {}

    def _start_fork(self, fork: EngineRequest) -> None:
        """Run ``fork`` from now on, on a fork of its parent's cache sequence (holding _mu):
        it shares every page of the prompt, copy-on-write, and takes the sequence slot its
        parent reserved."""
        parent = fork.fork_of
        fork.fork_of = None
        cache = self.runner.cache
        fork.seq_id = cache.new_seq_id()
        cache.fork(parent.seq_id, fork.seq_id)
        fork.computed = parent.computed
        fork.cached_tokens = parent.cached_tokens
        fork.path = parent.path
        self.scheduler.start_fork(parent, fork)

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
        if error is not None:
            if isinstance(error, InternalError):
                self.metrics.failed_requests += 1
            if req.sink is not None:
                req.sink(None, error)
            return
        try:
            flush = finish != "stop" or stop_reason in req.stop_ids
            text += req.stream.finish(flush)
            now = time.perf_counter()
            first = req.first_token_time or now
            cached = req.cached_tokens or 0
            req.completion = Completion(
                text=req.stream.text,
                token_ids=tuple(req.generated),
                prompt_token_ids=tuple(req.prompt_ids),
                finish_reason=finish,
                usage=Usage(len(req.prompt_ids), len(req.generated), cached),
                timings=Timings((first - req.arrival) * 1e3, (now - first) * 1e3, len(req.prompt_ids) - cached,
                                req.decode_steps),
                stop_reason=stop_reason,
                logprobs=tuple(req.logprobs) if req.logprobs is not None else None,
                embedding=_normalised(req.pooled) if req.embedding and finish == "stop" else None,
                prompt_logprobs=tuple(req.prompt_logprobs) if req.prompt_logits else None,
            )
            self.metrics.on_finish(req, now)
        except Exception as e:  # its last delta cannot be made: its consumer alone gets the error
            log.exception("request %s failed as it ended", req.request_id)
            req.completion = None
            self.metrics.failed_requests += 1
            if req.sink is not None:
                req.sink(None, _internal(req, e))
            return
        if req.sink is not None:
            last = tuple(req.logprobs[-1:]) if req.logprobs is not None and token is not None else ()
            req.sink(Delta(text, () if token is None else (token,), finish, req.completion, last), None)

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
        with self._step_lock:
            self._apply_aborts()

    def _loop(self) -> None:
        while True:
            with self._mu:
                while not self._stopping and not self.scheduler.has_work() and not self._aborts:
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
                            self._end(req, error=_internal(req, e))

    # -- async API -----------------------------------------------------------------
    async def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                     request_id: str | None = None) -> "RequestHandle":
        """Queue a request; the handle is an async iterator of ``Delta``s."""
        return (await self.submit_n(prompt, params, 1, request_id=request_id))[0]

    async def embed(self, prompts: Sequence[Sequence[int]], pooling: str = "mean") -> list[np.ndarray]:
        """Embeddings of token-id prompts, submitted together (batched by the scheduler)."""
        loop = asyncio.get_running_loop()
        handles = []
        try:
            for ids in prompts:
                h = RequestHandle(self, loop)
                h.request = self.add_request(list(ids), SamplingParams(max_tokens=1), sink=h._sink, pooling=pooling)
                handles.append(h)
            self.start()
            for h in handles:
                async for _ in h:
                    pass
        except BaseException:
            for h in handles:
                if h.completion is None:
                    h.abort()
            raise
        return [h.completion.embedding for h in handles]

    async def submit_n(self, prompt: str | Sequence[int], params: SamplingParams | None = None, n: int = 1, *,
                       request_id: str | None = None, prompt_logprobs: bool = False,
                       grammar=None) -> list["RequestHandle"]:
        """Queue ``n`` samples of one prompt: the prompt is computed once and the other
        samples run on forks of its cache sequence (``add_request``'s ``fork_sinks``).
        One handle per sample."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        loop = asyncio.get_running_loop()
        handles = [RequestHandle(self, loop) for _ in range(n)]
        req = self.add_request(ids, params, request_id=request_id, sink=handles[0]._sink,
                               fork_sinks=[h._sink for h in handles[1:]], prompt_logprobs=prompt_logprobs,
                               grammar=grammar)
        for h, r in zip(handles, [req] + req.forks):
            h.request = r
        self.start()
        return handles

    # -- metrics ---------------------------------------------------------------------
    @property
    def power_profile(self) -> str:
        plan = getattr(self.runner, "last_plan", None)
        if plan is not None:
            return getattr(plan, "profile", None) or self._profile_name
        return self._profile_name

    def metrics_text(self) -> str:
        """Prometheus text exposition of the engine's state."""
        with self._mu:
            stats = self.runner.cache.stats()
            disk = self.runner.cache.disk
            return self.metrics.render(waiting=len(self.scheduler.waiting), running=len(self.scheduler.running),
                                       cache=stats, preemptions=self.scheduler.preemptions,
                                       profile=self.power_profile, disk=disk.stats if disk else None)


class _Consumer:
    """What a request's consumer shares: turning sink items into deltas."""

    done = False

    def _receive(self, delta: Delta | None, error: BaseException | None) -> Delta:
        """The delta of one sink item (raising the error it carries); ``done`` after the last."""
        if error is not None:
            self.done = True
            raise error
        self.done = delta.finish_reason is not None
        return delta


class RequestHandle(_Consumer):
    """An async iterator of one request's ``Delta``s; ``completion`` once it ends."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.request: EngineRequest | None = None
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def completion(self) -> Completion | None:
        return self.request.completion if self.request else None

    def _sink(self, delta: Delta | None, error: BaseException | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (delta, error))
        except RuntimeError:  # the event loop is closed: nobody is listening
            pass

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        if self.done:
            raise StopAsyncIteration
        return self._receive(*await self._queue.get())

    def abort(self) -> None:
        self.engine.abort(self.request_id)


class SyncStream(_Consumer):
    """Deltas of one request for a synchronous caller: steps the engine itself unless
    the background loop runs."""

    def __init__(self, engine: Engine, prompt_ids: Sequence[int], params: SamplingParams):
        self.engine = engine
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.request = engine.add_request(prompt_ids, params, sink=lambda d, e: self._q.put((d, e)))

    def next_delta(self) -> Delta | None:
        """The next delta; None once the request has ended."""
        if self.done:
            return None
        while True:
            try:
                delta, error = self._q.get_nowait()
                break
            except queue.Empty:
                pass
            if self.engine.running_in_background:
                delta, error = self._q.get()
                break
            if not self.engine.step() and self._q.empty():
                raise DualPathError(f"request {self.request.request_id} made no progress")
        return self._receive(delta, error)
