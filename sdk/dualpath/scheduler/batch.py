"""Iteration-level scheduling: which requests run in the next step, with how many tokens.

Every step mixes decode tokens and prefill chunks under a token budget
(``runtime.max_batch_tokens``):

1. Decoding requests, oldest first: one token each.
2. Prompt chunks (at most the step's ``chunk_tokens``, cut shorter to fit the budget,
   where, beside decoding requests, a prompt token counts for more at long context,
   see ``attention_tokens``), fewest remaining chunks first (each second in the
   queue counts as one chunk less; first come first served among equals): running
   requests continue their prompt, waiting ones start while a sequence slot and
   the cache allow. A short chat is never stuck behind a long document's prefill,
   and the document still moves on with the budget the chats leave. A request
   starts by looking its prompt up in the prefix cache; the cache's path policy
   (cache/policy.py) picks its path from its length.

When the cache has no room for a running request, the newest running request not
yet scheduled in this step is *preempted by recompute*: its cache pages are
released (full pages stay in the prefix cache, so much of the recompute is often
a cache hit), and it goes back to the front of the queue with its prompt plus
the tokens generated so far. Prompt chunks never preempt; they wait for room.

A request holds one sequence slot of ``max_num_seqs`` while it runs, plus one for each
fork it will start (``n`` > 1: the forks start when its prompt is computed), reserved
when it is admitted: a step never carries more sequences than the runner holds.

The scheduler is the one owner of the cache's changes (scheduler/sequences.py has the
rule): it talks to the cache only through its facade (``start``, ``allocate``,
``free``, ``fork``, ``commit``, ``truncate``, ``free_page_count``, ``evict_all``,
``new_seq_id``), lays each ``StepPlan`` out in the step's arrays for the runner, and
after the run applies what the outputs ask (``update_from_output``). Nothing here
knows about ONNX Runtime.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..cache.manager import Allocation, KVCacheManager, NoRoom
from ..cache.policy import PathPolicy
from ..models.spec import ModelConfig
from .request import Request, Status
from .sequences import SequenceSteps
from .step import Ended, RequestT, SeqStep, StepArrays, StepPlan, StepResults

__all__ = ["BatchScheduler", "SeqStep", "Status", "StepPlan", "StepResults", "attention_tokens"]

_MIN_CHUNK = 32
"""A prompt chunk cut short by the step's budget is at least this many tokens."""


def attention_tokens(c: ModelConfig) -> float:
    """Context length at which a prompt token's attention costs as much as its dense
    math (multiply-adds: QK and PV per context position against the projections and
    MLP). A prompt chunk at position p costs n * (1 + (p + n / 2) / this) budget
    tokens: at long context a chunk gets fewer tokens, so a step stays short and the
    requests decoding beside it keep their pace."""
    dense = c.num_layers * (2 * c.dim * c.q_dim + 2 * c.dim * c.kv_dim + 3 * c.dim * c.hidden_dim)
    return dense / (2 * c.num_layers * c.q_dim)


@dataclass
class _Step:
    """One ``schedule()`` call in progress: the plan so far and what is left of the budget."""

    plan: StepPlan
    budget: float
    """Budget tokens left (see ``attention_tokens``)."""
    chunk: int
    """Most prompt tokens in one chunk."""
    taken: set[int] = field(default_factory=set)
    """``id()`` of the requests already in the plan."""
    weighted: bool = False
    """Prompt chunks cost more at long context (someone is decoding in this step)."""


class BatchScheduler(SequenceSteps):
    """Waiting and running requests over one cache (see the module docstring)."""

    def __init__(self, cache: KVCacheManager, *, max_num_seqs: int, max_batch_tokens: int,
                 attention_tokens: float, arrays: StepArrays | None = None,
                 policies: dict[str, PathPolicy] | None = None):
        super().__init__(cache, arrays, policies)
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.attention_tokens = attention_tokens
        """See ``attention_tokens()``: the context length at which a prompt token's
        attention costs as much as its dense math."""
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, chunk_tokens: int) -> StepPlan:
        """The next step's work, prompt chunks of at most ``chunk_tokens`` (the power
        plan's prefill chunk). Requests the cache can never hold go to ``failed``."""
        step = _Step(StepPlan(), self.max_batch_tokens, max(1, chunk_tokens))
        self._schedule_decodes(step)
        self._schedule_prompts(step)
        out = step.plan.seqs
        # The runner holds max_num_seqs sequences: a plan beyond that would fail the whole step.
        assert len(out) <= self.num_seqs() <= self.max_num_seqs, (len(out), self.num_seqs())
        if not out and self.running:
            self._unstick(step.plan)
        if out and self.arrays is not None:
            self.arrays.fill(step.plan, self.cache)
        return step.plan

    def update_from_output(self, plan: StepPlan,
                           results: StepResults[RequestT] | None = None) -> list[Ended[RequestT]]:
        """After a run of ``plan``: the one place its outcome changes the cache. Commits
        every sequence's pages (full ones become shareable), rolls back rejected
        proposals, starts the forks, and frees the requests that ended. Returns the
        ``results.ended`` entries of requests that had not ended before (the engine
        delivers their last delta)."""
        for s in plan.seqs:
            self.cache.commit(s.seq_id)
        if results is None:
            return []
        for req, computed in results.rollbacks:
            req.computed = computed
            self.cache.truncate(req.running_seq, computed)
        for parent, fork in results.forked:  # before the parent's sequence grows (at the next step)
            self.start_fork(parent, fork)
        ended = []
        for end in results.ended:
            if end[0].status is not Status.FINISHED:
                self.remove(end[0])
                ended.append(end)
        return ended

    def _allocate(self, step: _Step, req: Request, n: int, preempt_others: bool,
                  draft: Iterable[int] = ()) -> tuple[Allocation | NoRoom, list[int]]:
        """Room for the request's next n tokens and the proposals ``draft``: (Allocation
        or NoRoom, the tokens). The cache's policy picks the path (the prompt's path
        within the prompt). With ``preempt_others``, the newest running requests not in
        the step yet are preempted until there is room."""
        tokens = req.ids[req.computed:req.computed + n].tolist() + list(draft)
        alloc = self.cache.allocate(req.running_seq, tokens)
        while isinstance(alloc, NoRoom) and preempt_others:
            victim = next((r for r in reversed(self.running) if id(r) not in step.taken and r is not req), None)
            if victim is None:
                break
            self.preempt(victim)
            alloc = self.cache.allocate(req.running_seq, tokens)
        return alloc, tokens

    def _add(self, step: _Step, req: Request, alloc: Allocation, tokens: list[int], draft: int = 0) -> None:
        """The request's ``tokens`` (the last ``draft`` of them proposals) join the step."""
        every_row = req.embedding or (req.prompt_logits and req.computed < len(req.prompt_ids))
        start = req.computed
        req.computed += len(tokens) - draft  # proposals are not known tokens (yet)
        prompt = start < len(req.prompt_ids)
        embeds = req.chunk_embeds(start, req.computed) if req.embeds and prompt else ()
        mutual = req.chunk_mutual(start, req.computed) if req.mutual and prompt else ()
        step.plan.seqs.append(SeqStep(req, req.running_seq, tokens, alloc, req.computed == req.n and not req.embedding,
                                      every_row, draft, embeds, mutual))
        step.taken.add(id(req))

    def _schedule_decodes(self, step: _Step) -> None:
        """1. A token for every decoding request, oldest first, with its proposals while
        the budget lasts; one that finds no room preempts the newest request not yet
        scheduled (or waits itself). Proposals never preempt: they are dropped first."""
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.n - req.computed != 1 or step.budget < 1:
                continue
            draft = req.draft[:max(0, int(step.budget) - 1)]
            alloc, tokens = self._allocate(step, req, 1, not draft, draft)
            if isinstance(alloc, NoRoom) and draft:
                draft = []
                alloc, tokens = self._allocate(step, req, 1, True)
            if isinstance(alloc, NoRoom):
                self.preempt(req)
                continue
            self._add(step, req, alloc, tokens, len(draft))
            step.budget -= len(tokens)

    def _schedule_prompts(self, step: _Step) -> None:
        """2. Prompt chunks: running prompts continue, waiting requests start. With nobody
        decoding there is no pace to keep: chunks count plain tokens."""
        step.weighted = bool(step.plan.seqs)
        now = time.perf_counter()
        # Waiting requests are candidates only while a sequence slot is free (``running``
        # does not shrink in this phase: chunks never preempt), so a long queue behind
        # full slots costs nothing per step.
        seqs = self.num_seqs()
        waiting = list(self.waiting) if seqs < self.max_num_seqs else []
        candidates = [r for r in self.running if r.n - r.computed > 1] + waiting
        # Priority classes by prompt chunks still to run, first come first served within
        # a class. A second in the queue promotes a waiting request by one class (so a
        # long document gets a slot); a running prompt is not promoted, so it never
        # holds up the short prompts behind it, and moves on with what they leave.
        def priority(r: Request) -> tuple[int, float]:
            chunks = -(-(r.n - r.computed) // step.chunk)
            if r.status is Status.WAITING:
                chunks = max(1, chunks - int(now - r.arrival))
            return chunks, r.arrival

        candidates.sort(key=priority)
        held = False  # a waiting request was refused for want of sequence slots
        for req in candidates:
            if step.budget < 1:
                break
            if req.status is Status.RUNNING:
                if id(req) not in step.taken:
                    self._continue_prompt(step, req)
            elif held:
                continue
            elif seqs + 1 + req.reserved_seqs > self.max_num_seqs:
                # No slot for it and its forks: the requests behind it wait too, so that the
                # slots that free up gather for it (else n > 1 could starve behind n = 1).
                held = True
            elif self._admit(step, req):
                seqs += 1 + req.reserved_seqs

    def _continue_prompt(self, step: _Step, req: Request) -> None:
        """The next chunk of a running request's prompt, if a useful one fits the budget
        and the cache (else it waits for decoders to finish or be preempted)."""
        todo = req.n - req.computed
        n, cost = self._chunk(req.computed, min(todo, step.chunk), step.budget, step.weighted)
        if n < min(todo, step.chunk, _MIN_CHUNK):  # only a sliver of budget left
            return
        if req.mutual and req.chunk_tokens(req.computed, n) < n:  # a span of mutual attention starts the next
            n, cost = self._chunk(req.computed, req.chunk_tokens(req.computed, n), step.budget, step.weighted)
        alloc, tokens = self._allocate(step, req, n, False)
        if isinstance(alloc, NoRoom):
            return
        self._add(step, req, alloc, tokens)
        step.budget -= cost

    def _admit(self, step: _Step, req: Request) -> bool:
        """Start a waiting request with its first prompt chunk, if the cache has room to
        spare and a useful chunk fits the budget. True when it runs."""
        cache = self.cache
        # A certain refusal is decided before start() hashes the whole prompt (each
        # step, while the cache is full): the admission test below needs at least one
        # page for the prompt (its last token is never cached) plus one per running
        # request, and start() only ever lowers the free count.
        if cache.free_page_count() < 2 + len(self.running):
            return False
        seq_id = cache.new_seq_id()
        prompt = req.ids[:req.n].tolist()
        cached = cache.start(seq_id, [] if req.embedding or req.prompt_logits else prompt)
        todo = req.n - cached
        # Admit only with room to spare: the uncached prompt's pages plus a page for
        # every running request to grow into, or the newcomer is preempted next step.
        if cache.free_page_count() < -(-todo // cache.page_tokens) + 1 + len(self.running):
            cache.free(seq_id)
            return False
        n, cost = self._chunk(cached, min(todo, step.chunk), step.budget, step.weighted)
        if n < min(todo, step.chunk, _MIN_CHUNK):
            cache.free(seq_id)
            return False
        if req.mutual and req.chunk_tokens(cached, n) < n:  # a span of mutual attention starts the next
            n, cost = self._chunk(cached, req.chunk_tokens(cached, n), step.budget, step.weighted)
        req.seq_id, req.computed = seq_id, cached
        alloc, tokens = self._allocate(step, req, n, False)
        if isinstance(alloc, NoRoom):
            cache.free(seq_id)
            req.seq_id, req.computed = None, 0
            return False
        self.waiting.remove(req)
        req.status = Status.RUNNING
        req.path = cache.path_of(seq_id)
        if req.cached_tokens is None:
            req.cached_tokens = cached
        self.running.append(req)
        self._add(step, req, alloc, tokens)
        step.budget -= cost
        return True

    def _unstick(self, plan: StepPlan) -> None:
        """Nothing fits: every running request is mid-prompt and the cache is full. Let the
        newest go (recompute later) so the others can move on; a lone request the cache
        cannot hold even empty fails."""
        if len(self.running) > 1:
            self.preempt(self.running[-1])
        elif self.cache.evict_all() == 0:
            req = self.running[0]
            plan.failed.append((req, f"the KV cache ({self.cache.capacity_tokens} tokens) cannot hold "
                                     f"request {req.request_id} ({req.n} tokens)"))

    def num_seqs(self) -> int:
        """Sequence slots in use: the running requests and the forks they will start.
        Never above ``max_num_seqs`` (admission checks it; a fork takes its parent's slot)."""
        return len(self.running) + sum(r.reserved_seqs for r in self.running)

    def reserve(self, req: Request, num_seqs: int) -> None:
        """``req`` will start ``num_seqs`` more sequences (forks): it is admitted only with
        a slot for each."""
        if 1 + num_seqs > self.max_num_seqs:
            raise ValueError(f"{1 + num_seqs} sequences of one request; at most {self.max_num_seqs} run at once")
        req.reserved_seqs = num_seqs

    def start_fork(self, parent: Request, child: Request) -> None:
        """``child`` runs from now on, on a fork of its parent's cache sequence (it shares
        every page, copy-on-write), in a slot its parent reserved."""
        if parent.reserved_seqs < 1:
            raise ValueError(f"request {parent.request_id} has no slot reserved for a fork")
        child.seq_id = self.cache.new_seq_id()
        self.cache.fork(parent.running_seq, child.running_seq)
        child.computed = parent.computed
        child.cached_tokens = parent.cached_tokens
        child.path = parent.path
        parent.reserved_seqs -= 1
        child.status = Status.RUNNING
        self.running.append(child)

    def drop_fork(self, parent: Request) -> None:
        """A fork of ``parent`` ends before it started: its reserved slot is free."""
        parent.reserved_seqs = max(0, parent.reserved_seqs - 1)

    def _chunk(self, pos: int, want: int, budget: float, weighted: bool) -> tuple[int, float]:
        """(tokens, cost) of the largest chunk of at most ``want`` tokens from position
        ``pos`` whose cost fits ``budget`` (see ``attention_tokens``; unweighted, a
        token costs 1)."""
        if not weighted:
            n = int(min(want, budget))
            return n, float(n)
        K = self.attention_tokens

        def cost(n: int) -> float:
            return n * (1.0 + (pos + n / 2.0) / K)

        n = want
        if cost(n) > budget:
            # n * (1 + (pos + n/2) / K) = budget: the positive root of a quadratic
            a, b = 0.5 / K, 1.0 + pos / K
            n = min(want, int((-b + (b * b + 4 * a * budget) ** 0.5) / (2 * a)))
        return max(n, 0), cost(max(n, 0))

    def preempt(self, req: Request, for_room: bool = True) -> None:
        """Release the request's cache and queue it first, to be recomputed. ``for_room``:
        counted as a preemption (False: the engine retries a failed run this way)."""
        self.running.remove(req)
        self.cache.free(req.running_seq)
        req.seq_id = None
        req.computed = 0
        req.status = Status.WAITING
        if for_room:
            req.preemptions += 1
            self.preemptions += 1
        self.waiting.appendleft(req)

    def remove(self, req: Request) -> None:
        """The request ended (finished or aborted): free its cache at once."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self.cache.free(req.running_seq)
            req.seq_id = None
        elif req.status is Status.WAITING:
            self.waiting.remove(req)
        req.status = Status.FINISHED
