"""Each request's output from its rows of a step: pooling, prompt log-probabilities,
sampling under a grammar, stop tokens and strings, text deltas, speculative decoding's
verification and next proposals, and the last delta when the request ends.

The engine (engine/engine.py) schedules and runs the step, then hands every sequence
its rows; ``OutputMaker`` runs in the stepping thread without the engine's lock (it
touches only the request's own sampler, tokens and stream) and returns what the cache
must do next (``StepResults``: rollbacks, forks to start, requests that ended), which the
scheduler's ``update_from_output`` does under the engine's lock. Nothing here calls the
cache.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..errors import InternalError
from ..sampling.sampler import SamplerScratch
from ..scheduler.step import StepResults
from .handles import Delta, completion_of
from .request import EngineRequest, internal_error

log = logging.getLogger(__name__)


class OutputMaker:
    """Makes requests' outputs for an engine: one per engine, used by its stepping thread."""

    def __init__(self, tokenizer, scratch: SamplerScratch, metrics):
        self.tokenizer = tokenizer
        self.scratch = scratch
        """The engine's sampler buffers: a grammar's token mask is filled into its ``bias``."""
        self.metrics = metrics

    def make(self, s, rows: np.ndarray, hidden: np.ndarray, now: float, results: StepResults) -> int:
        """Use one sequence's rows of a step's output (logits (R, vocab), final hidden
        states (R, dim)): pool an embedding, keep the prompt's log-probabilities, sample
        (after forking, when the prompt was just computed; each proposal's row while the
        samples agree with them). What the cache must do next goes into ``results`` (the
        scheduler's ``update_from_output`` does it): requests that end as ``(request,
        finish_reason, Engine._end keywords)``, forks to start as ``(parent, fork)``,
        rejected proposals to roll back. Returns the tokens sampled."""
        req = s.request
        ended = results.ended
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
                    results.forked.append((req, fork))
                    sampled += 1
                    if self._sample(fork, rows[-1], now, ended) and fork.proposer is not None:
                        self._propose(fork)
        if s.draft:
            going, rows_sampled = self._verify(req, s.token_ids[-s.draft:], rows, now, results)
        else:
            going, rows_sampled = self._sample(req, rows[-1], now, ended), 1  # the chunk's last row samples
        if going and req.proposer is not None:
            self._propose(req)
        return sampled + rows_sampled

    def _verify(self, req: EngineRequest, draft: list[int], rows: np.ndarray, now: float,
                results: StepResults) -> tuple[bool, int]:
        """Sample the rows of a step that ran proposals (engine/speculative.py), in order,
        as plain decoding would: row i's sample is kept, and the next row sampled, while it
        equals proposal i. The proposals after the last one kept are rolled back
        (``results.rollbacks``). Returns whether the request goes on, and the rows sampled."""
        known = req.n  # the last known token's KV was computed in this step, with the proposals'
        kept, going = 0, True
        for i in range(len(draft) + 1):
            if not self._sample(req, rows[i], now, results.ended):
                going = False  # the request ended; its cache goes with it
                break
            if i == len(draft) or req.ids[req.n - 1] != draft[i]:
                break
            kept += 1
        req.proposer.update(len(draft), kept)
        self.metrics.on_proposals(len(draft), kept)
        if going:
            results.rollbacks.append((req, known + kept))
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
            end = (req, "abort", {"error": internal_error(req, e)})
        if end is not None:
            ended.append(end)
            return False
        return True

    def _advance(self, req: EngineRequest, logits: np.ndarray, now: float):
        """Sample the request's next token and deliver its delta (not holding the engine's lock).
        Returns ``(request, finish_reason, Engine._end keywords)`` when the request ends."""
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.on_first_token(now - req.arrival)
        else:
            req.decode_steps += 1
        m = req.matcher  # the sampler computes its mask into the scratch bias when it must
        token = req.sampler.sample(logits, req.ids[:req.n], self.scratch.bias if m is not None else None, m)
        if m is not None:
            m.accept(token)  # the mask only let through what the grammar accepts
            if token in self.tokenizer.stop_ids:  # the grammar allowed an end: it is complete (even with ignore_eos)
                return req, "stop", {"stop_reason": token}
        if token in req.stop_ids:
            return req, "stop", {"stop_reason": token}
        req.append(token)
        if req.logprobs is not None:
            last = req.sampler.last_logprobs
            assert last is not None  # the sampler keeps them whenever params.logprobs is set
            req.logprobs.append((token, *last))
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
            req.sink(Delta(text, (token,), logprobs=tuple(req.logprobs[-1:]) if req.logprobs is not None else ()), None)
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
        pooled = req.pooled  # (dim,) updated in place
        assert pooled is not None  # set with ``embedding`` (engine.py's _new_request)
        if pos0 == 0:  # the first chunk (again, after a preemption)
            pooled[:] = 0.0
        if req.pooling == "mean":
            pooled += rows.sum(axis=0, dtype=np.float64)
        elif req.pooling == "cls" and pos0 == 0:
            pooled[:] = rows[0]
        if req.computed < req.n:
            return None
        if req.pooling in ("last", "rank"):
            pooled[:] = rows[-1]
        elif req.pooling == "mean":
            pooled /= req.n
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        return req, "stop", {}

    def end(self, req: EngineRequest, finish: str, stop_reason, text: str, token: int | None,
            error: BaseException | None) -> None:
        """Deliver the end of a request the engine has just removed: the error, or the last
        delta with the completion (see ``Engine._end``)."""
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
            req.completion = completion_of(req, finish, stop_reason, now)
            self.metrics.on_finish(req, now)
        except Exception as e:  # its last delta cannot be made: its consumer alone gets the error
            log.exception("request %s failed as it ended", req.request_id)
            req.completion = None
            self.metrics.failed_requests += 1
            if req.sink is not None:
                req.sink(None, internal_error(req, e))
            return
        if req.sink is not None:
            last = tuple(req.logprobs[-1:]) if req.logprobs is not None and token is not None else ()
            req.sink(Delta(text, () if token is None else (token,), finish, req.completion, last), None)
