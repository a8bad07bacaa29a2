"""Encoder work as step work: the texts of every client's embeddings request, gathered and
run together through one ``EncoderRunner`` (executor/encoder.py), a slice per engine step.

A request is a ``Job``: its items (token-id lists) and what is made of them. ``step`` takes
items from the queued jobs in arrival order, texts of several requests in one runner call,
and hands each job its results; a job ends when its last item has run. No KV cache is
kept: an encoder pass is one prefill, thrown away.

Two ways to drive it:

* beside a chat model, by the engine (engine/engine.py): after each decode step the queue
  runs ``step(beside_s)``, given a share of that step's time (``runtime.encoder_share``):
  a credit in seconds, spent as a token budget at the encoder's measured rate (tokens per
  second), and a batch that overran it is paid back by the next steps. Chats then decode
  at least ``1 / (1 + share)`` as fast as alone, however much embedding work waits; with no
  chat running the encoder takes whole batches (``max_batch_tokens``);
* alone (an embedding-only server): ``start()`` steps it from its own thread.

A reranker's pairs (``/v1/rerank``) are another kind of job (``RankJob``): its ``key`` keeps
them out of embedding batches, its ``run`` gives each pair's first-token row; the queue, its
budget and its metrics are shared.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

from ..errors import InternalError, QueueFullError

log = logging.getLogger(__name__)


class Job:
    """One request's items (token-id lists), run in slices; ``on_done(results, error)`` is
    called once, from the stepping thread, when the last item has run or the job failed."""

    def __init__(self, items: Sequence[Sequence[int]], on_done: Callable[[list | None, BaseException | None], None]):
        self.items = [list(t) for t in items]
        self.results: list = [None] * len(self.items)
        self.next = 0          # the first item not yet taken
        self.remaining = len(self.items)
        self.on_done = on_done
        self.cancelled = False

    def key(self) -> tuple:
        """Jobs with equal keys share a runner call."""
        raise NotImplementedError

    def run(self, runner, items: list[list[int]]) -> list:
        """The results of ``items`` (of jobs with this job's key), in order."""
        raise NotImplementedError

    def tokens(self, i: int) -> int:
        return len(self.items[i])


class EmbedJob(Job):
    """Texts to embed: ``EncoderRunner.embed(items, pooling, normalize)``, a vector (dim,) each."""

    def __init__(self, items, on_done, pooling: str, normalize: bool = True):
        super().__init__(items, on_done)
        self.pooling, self.normalize = pooling, normalize

    def key(self) -> tuple:
        return ("embed", self.pooling, self.normalize)

    def run(self, runner, items):
        return runner.embed(items, self.pooling, self.normalize)


class RankJob(Job):
    """A reranker's (query, document) pair texts: each one's first-token row (dim,), which the
    reranker's head (executor/rank_head.py) turns into scores."""

    def key(self) -> tuple:
        return ("rank",)

    def run(self, runner, items):
        return [h[0] for h in runner.hidden(items)]


class EncoderQueue:
    """Jobs waiting for ``runner`` and the slices that run them (see the module docstring)."""

    def __init__(self, runner, *, share: float = 0.3, max_batch_tokens: int = 2048, max_jobs: int | None = None):
        self.runner = runner
        self.max_jobs = max_jobs
        """Jobs waiting at most beside the one in progress; another is refused (QueueFullError: a 429)."""
        self.share = share
        """Of the time a step beside chats takes, the share the encoder may add."""
        self.max_batch_tokens = max_batch_tokens
        """Tokens one slice takes at most (the first item of a slice is always taken)."""
        self._jobs: collections.deque[Job] = collections.deque()
        self._mu = threading.Lock()
        self.wake: Callable[[], None] | None = None
        """Called after a submit: the engine's loop (or our own thread) is woken by it."""
        self._credit_s = 0.0   # encoder time allowed beside chats; negative: a slice overran it
        self._rate = 0.0       # tokens per second of recent slices (0: none measured yet)
        self._thread: threading.Thread | None = None
        self._cv = threading.Condition(self._mu)
        self._stopping = False
        # Counters for /metrics.
        self.batches = self.items_run = self.tokens_run = 0
        self.shared_batches = 0   # slices holding items of two requests or more
        self.most_jobs_in_batch = 0
        self.busy_s = 0.0
        self.failed_jobs = 0

    # -- submitting ------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        with self._mu:
            if self._stopping:
                raise InternalError("the encoder queue has stopped")
            if self.max_jobs is not None and len(self._jobs) > self.max_jobs:  # the first is in progress
                raise QueueFullError(len(self._jobs), self.max_jobs)
            if job.remaining == 0:
                job.on_done(job.results, None)
                return job
            self._jobs.append(job)
            self._cv.notify()
        if self.wake is not None:
            self.wake()
        return job

    def cancel(self, job: Job) -> None:
        """Items of ``job`` not yet taken are dropped (its client is gone); ``on_done`` is not called."""
        with self._mu:
            job.cancelled = True
            if job in self._jobs:
                self._jobs.remove(job)

    def has_work(self) -> bool:
        return bool(self._jobs)

    @property
    def num_jobs(self) -> int:
        """Jobs waiting or in progress."""
        return len(self._jobs)

    # -- stepping --------------------------------------------------------------------
    def step(self, beside_s: float | None = None) -> int:
        """Run one slice; returns the items run (0: none queued, or no credit left).
        ``beside_s``: the seconds the engine's step beside chats took (None: no chat runs,
        take a whole batch)."""
        if beside_s is None:
            self._credit_s = 0.0  # nothing waits on us: no debt, no credit
            budget = self.max_batch_tokens
        else:
            self._credit_s = min(self._credit_s + self.share * beside_s, self.share * max(beside_s, 0.05))
            if self._credit_s <= 0:
                return 0
            budget = int(self._credit_s * self._rate) if self._rate else 1
        taken = self._take(max(1, min(budget, self.max_batch_tokens)))
        if not taken:
            return 0
        t0 = time.perf_counter()
        self._run(taken)
        took = time.perf_counter() - t0
        tokens = sum(job.tokens(i) for job, i in taken)
        if beside_s is not None:
            self._credit_s -= took
        rate = tokens / max(took, 1e-6)
        self._rate = rate if not self._rate else 0.7 * self._rate + 0.3 * rate
        with self._mu:
            self.batches += 1
            self.items_run += len(taken)
            self.tokens_run += tokens
            self.busy_s += took
            jobs = len({id(job) for job, _ in taken})
            self.shared_batches += jobs > 1
            self.most_jobs_in_batch = max(self.most_jobs_in_batch, jobs)
        return len(taken)

    def _take(self, budget: int) -> list[tuple[Job, int]]:
        """(job, item index) pairs from the oldest jobs on, while their tokens fit ``budget``
        (at least one); a job whose items are all taken leaves the queue."""
        taken: list[tuple[Job, int]] = []
        used = 0
        with self._mu:
            while self._jobs:
                job = self._jobs[0]
                n = job.tokens(job.next)
                if taken and used + n > budget:
                    break
                taken.append((job, job.next))
                used += n
                job.next += 1
                if job.next == len(job.items):
                    self._jobs.popleft()
        return taken

    def _run(self, taken: list[tuple[Job, int]]) -> None:
        """The runner calls of a slice, one per job key; results to their jobs."""
        groups: dict[tuple, list[tuple[Job, int]]] = {}
        for job, i in taken:
            groups.setdefault(job.key(), []).append((job, i))
        for pairs in groups.values():
            first = pairs[0][0]
            try:
                out = first.run(self.runner, [job.items[i] for job, i in pairs])
            except Exception as e:  # these jobs fail; the queue and the others go on
                log.exception("encoder batch of %d items failed", len(pairs))
                for job in dict.fromkeys(job for job, _ in pairs):
                    self._fail(job, e)
                continue
            for (job, i), result in zip(pairs, out):
                job.results[i] = result
                job.remaining -= 1
                if job.remaining == 0 and not job.cancelled:
                    job.on_done(job.results, None)

    def _fail(self, job: Job, error: BaseException) -> None:
        with self._mu:
            if job in self._jobs:
                self._jobs.remove(job)
            self.failed_jobs += 1
        if not job.cancelled and job.remaining > 0:
            job.remaining = 0
            err = error if isinstance(error, InternalError) else InternalError(
                "the server failed to compute these embeddings; they may be retried")
            err.__cause__ = error
            job.on_done(None, err)

    # -- alone: our own thread ----------------------------------------------------------
    def start(self) -> None:
        """Step in a thread of our own whenever jobs wait (no engine steps us)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dualpath-encoder", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._mu:
                while not self._stopping and not self._jobs:
                    self._cv.wait()
                if self._stopping:
                    return
            self.step()

    def shutdown(self) -> None:
        """Stop taking jobs; the jobs still queued fail, our thread (if any) ends."""
        with self._mu:
            self._stopping = True
            left = list(self._jobs)
            self._cv.notify_all()
        for job in left:
            self._fail(job, InternalError("the server is stopping; these embeddings were not computed"))
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- metrics -------------------------------------------------------------------------
    def metrics_lines(self) -> list[str]:
        """Prometheus lines of the queue's counters."""
        with self._mu:
            rows = [
                ("dualpath_encoder_batches_total", "counter", "Encoder runs (one slice of queued texts each).",
                 self.batches),
                ("dualpath_encoder_shared_batches_total", "counter",
                 "Encoder runs that held texts of two requests or more.", self.shared_batches),
                ("dualpath_encoder_most_requests_per_batch", "gauge",
                 "The most requests whose texts one encoder run held.", self.most_jobs_in_batch),
                ("dualpath_encoder_texts_total", "counter", "Texts the encoder ran.", self.items_run),
                ("dualpath_encoder_tokens_total", "counter", "Tokens the encoder ran.", self.tokens_run),
                ("dualpath_encoder_seconds_total", "counter", "Seconds the encoder ran.", f"{self.busy_s:.6f}"),
                ("dualpath_encoder_failed_requests_total", "counter", "Encoder requests that failed.",
                 self.failed_jobs),
                ("dualpath_encoder_queue_depth", "gauge", "Encoder requests waiting or in progress.",
                 len(self._jobs)),
            ]
        out = []
        for name, kind, help_text, value in rows:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return out
