"""Iteration-level scheduling: which requests run in the next step, with how many tokens.

Every step mixes decode tokens and prefill chunks under a token budget
(``runtime.max_batch_tokens``):

1. Running requests, oldest first: a decoding request gets its one token; one in
   prefill gets its next chunk of ``prefill_chunk_tokens`` (chunk boundaries are
   fixed per request, so a prompt is cut the same way alone or in a batch).
2. Waiting requests, first come first served, while a sequence slot, the budget
   and the cache allow. A request starts by looking its prompt up in the prefix
   cache; the router (cache/routing.py) picks its path from its length.

When the cache has no room for a running request, the newest running request not
yet scheduled in this step is *preempted by recompute*: its cache pages are
released (full pages stay in the prefix cache, so much of the recompute is often
a cache hit), and it goes back to the front of the queue with its prompt plus
the tokens generated so far. Its sampler keeps its state, so it resumes with the
same output. New requests never preempt running ones; they wait.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING

from ..cache.manager import NoRoom

if TYPE_CHECKING:
    from ..runtime.engine import Request
    from ..runtime.session import ModelRunner


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Scheduled:
    """One request's part of a step."""

    __slots__ = ("request", "num_tokens", "logits", "entry")

    def __init__(self, request: Request, num_tokens: int, logits: bool, entry):
        self.request = request
        self.num_tokens = num_tokens
        self.logits = logits   # the chunk ends the known tokens: sample after it
        self.entry = entry     # runtime.session.StepEntry


class BatchScheduler:
    def __init__(self, runner: ModelRunner, *, max_num_seqs: int, max_batch_tokens: int):
        self.runner = runner
        self.cache = runner.cache
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self._next_seq = 1 << 20  # seq ids above the runner's own single-sequence ids

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        from ..runtime.session import StepEntry

        budget = self.max_batch_tokens
        chunk = self.runner.prefill_chunk_tokens
        out: list[Scheduled] = []
        taken: set[int] = set()
        i = 0
        while i < len(self.running):
            req = self.running[i]
            todo = req.n - req.computed
            n = min(todo, chunk)
            if n > budget:
                if not out:  # never an empty step: the first request may use a smaller chunk
                    n = budget
                else:
                    i += 1
                    continue
            tokens = req.ids[req.computed:req.computed + n].tolist()
            alloc = self.runner.allocate(req.seq_id, tokens, prefill=todo > 1)
            while isinstance(alloc, NoRoom):
                victim = next((r for r in reversed(self.running) if id(r) not in taken and r is not req), None)
                if victim is None:
                    break
                if self.running.index(victim) < i:
                    i -= 1
                self.preempt(victim)
                alloc = self.runner.allocate(req.seq_id, tokens, prefill=todo > 1)
            if isinstance(alloc, NoRoom):
                self.preempt(req)  # wait until the scheduled requests let go of memory
                continue
            req.computed += n
            logits = req.computed == req.n
            out.append(Scheduled(req, n, logits, StepEntry(req.seq_id, tokens, alloc.slots, logits)))
            taken.add(id(req))
            budget -= n
            i += 1
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            seq_id = self._next_seq
            self._next_seq += 1
            prompt = req.ids[:req.n].tolist()
            cached = self.cache.start(seq_id, prompt)
            n = min(req.n - cached, chunk)
            if n > budget and out:  # the whole chunk next step (fixed chunk boundaries)
                self.cache.free(seq_id)
                break
            n = min(n, budget)
            tokens = prompt[cached:cached + n]
            alloc = self.runner.allocate(seq_id, tokens, prefill=True)
            if isinstance(alloc, NoRoom):
                self.cache.free(seq_id)
                break
            self.waiting.popleft()
            req.seq_id, req.status = seq_id, Status.RUNNING
            req.path = self.cache.seqs[seq_id].path
            if req.cached_tokens is None:
                req.cached_tokens = cached
            req.computed = cached + n
            self.running.append(req)
            logits = req.computed == req.n
            out.append(Scheduled(req, n, logits, StepEntry(seq_id, tokens, alloc.slots, logits)))
            budget -= n
        return out

    def preempt(self, req: Request) -> None:
        """Release the request's cache and queue it first, to be recomputed."""
        self.running.remove(req)
        self.cache.free(req.seq_id)
        req.seq_id = None
        req.computed = 0
        req.status = Status.WAITING
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def remove(self, req: Request) -> None:
        """The request ended (finished or aborted): free its cache at once."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self.cache.free(req.seq_id)
            req.seq_id = None
        elif req.status is Status.WAITING:
            self.waiting.remove(req)
        req.status = Status.FINISHED
