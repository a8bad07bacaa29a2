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
* alone (an embedding-only server): ``start()`` steps it from its own thread;
* beside a chat model on cores of its own (``CoreSplit``, images): from its own thread too,
  with some of the threads while chats run, the chats' kernels on the others.

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

    def pieces(self, runner):
        """A generator that runs every item a piece at a time, yielding between pieces, and
        returns the results; None for a job whose items run whole (``run``)."""
        return None


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


class ImageJob(Job):
    """An image's squares (S, S, 3) uint8 for a ``VisionEncoder``: one result, the embeddings
    (squares, tokens, width), made a piece at a time (``VisionEncoder.pieces``), so that no
    chat waits longer than the queue's slice for a square's whole encode."""

    def __init__(self, squares, on_done):
        super().__init__([[0]], on_done)
        self.squares = squares

    def key(self) -> tuple:
        return ("image",)

    def tokens(self, i: int) -> int:
        return len(self.squares)

    def pieces(self, runner):
        return _listed(runner.pieces(self.squares))


def _listed(pieces):
    return [(yield from pieces)]


def _cancelled():
    """A piecewise job's generator once the job is cancelled: it ends at once."""
    return None
    yield


IDLE_SLICE_S = 0.05
"""With no chat running, the longest a piecewise job runs before the engine looks for new
requests (a request that arrives then starts within this)."""


class EncoderQueue:
    """Jobs waiting for ``runner`` and the slices that run them (see the module docstring)."""

    def __init__(self, runner, *, share: float = 0.3, max_batch_tokens: int = 2048, max_jobs: int | None = None,
                 metric_prefix: str = "dualpath_encoder", what: tuple[str, str] = ("texts", "Texts")):
        self.runner = runner
        self.metric_prefix, self.what = metric_prefix, what
        """Its /metrics names' prefix, and what an item is (plural, and capitalised)."""
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
        self._piecewise: tuple | None = None  # (job, its generator): the job run a piece at a time
        self._cv = threading.Condition(self._mu)
        self._stopping = False
        self.cores: CoreSplit | None = None
        """Where the queue runs on its own thread beside an engine's chats: how the two share
        the threads (set before ``start``)."""
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
            if self._piecewise is not None and self._piecewise[0] is job:  # (the stepping thread closes it)
                self._piecewise = (job, _cancelled())

    def has_work(self) -> bool:
        return bool(self._jobs) or self._piecewise is not None

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
        if self._piecewise is None:
            with self._mu:
                job = self._jobs[0] if self._jobs else None
                pieces = job.pieces(self.runner) if job is not None else None
                if pieces is not None:
                    self._jobs.popleft()
                    self._piecewise = (job, pieces)
        if self._piecewise is not None:
            return self._step_pieces(IDLE_SLICE_S if beside_s is None else self._credit_s, beside_s is not None)
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

    def _step_pieces(self, seconds: float, beside: bool) -> int:
        """Pieces of the piecewise job for ``seconds`` (at least one); 1 when it ended."""
        assert self._piecewise is not None  # step() set it
        job, pieces = self._piecewise
        t0 = time.perf_counter()
        done, error, results = False, None, None
        try:
            while True:
                next(pieces)
                if time.perf_counter() - t0 >= seconds:
                    break
        except StopIteration as end:
            done, results = True, end.value
        except Exception as e:  # this job fails; the queue goes on
            log.exception("encoder job failed")
            done, error = True, e
        took = time.perf_counter() - t0
        if beside:
            self._credit_s -= took
        with self._mu:
            self.busy_s += took
            if done:
                self._piecewise = None
                self.batches += 1
                self.items_run += len(job.items)
                self.tokens_run += sum(job.tokens(i) for i in range(len(job.items)))
        if not done:
            return 0
        if error is not None:
            self._fail(job, error)
        elif not job.cancelled:
            job.results, job.remaining = results, 0
            job.on_done(results, None)
        return len(job.items)

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
                while not self._stopping and not self.has_work():
                    self._cv.wait()
                if self._stopping:
                    return
            if self.cores is not None:
                self.cores.slice()
            self.step()
            if self.cores is not None and not self.has_work():
                self.cores.release()

    def shutdown(self) -> None:
        """Stop taking jobs; the jobs still queued fail, our thread (if any) ends."""
        with self._mu:
            self._stopping = True
            left = list(self._jobs)
            self._cv.notify_all()
        if self._piecewise is not None:
            left.append(self._piecewise[0])
            self._piecewise = None
        for job in left:
            self._fail(job, InternalError("the server is stopping; these embeddings were not computed"))
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- metrics -------------------------------------------------------------------------
    def metrics_lines(self) -> list[str]:
        """Prometheus lines of the queue's counters."""
        few, many = self.what
        with self._mu:
            rows = [
                ("batches_total", "counter", f"Encoder runs (one slice of queued {few} each).", self.batches),
                ("shared_batches_total", "counter",
                 f"Encoder runs that held {few} of two requests or more.", self.shared_batches),
                ("most_requests_per_batch", "gauge",
                 f"The most requests whose {few} one encoder run held.", self.most_jobs_in_batch),
                (f"{few}_total", "counter", f"{many} the encoder ran.", self.items_run),
                ("tokens_total", "counter", "Tokens the encoder ran.", self.tokens_run),
                ("seconds_total", "counter", "Seconds the encoder ran.", f"{self.busy_s:.6f}"),
                ("failed_requests_total", "counter", "Encoder requests that failed.", self.failed_jobs),
                ("queue_depth", "gauge", "Encoder requests waiting or in progress.",
                 len(self._jobs) + (self._piecewise is not None)),
            ]
        out = []
        for name, kind, help_text, value in rows:
            name = f"{self.metric_prefix}_{name}"
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return out


class CoreSplit:
    """An encoder on its own thread beside ``engine``'s chats, sharing the cores by threads
    rather than by time: while it has work, the chats' kernels run on all but ``threads`` of
    their pools' threads; while chats run, the encoder's pool runs on ``threads``; either
    takes all of its pool when the other has nothing to do. Interleaved with an encode's
    pieces, a chat waits for a piece to end at every step, and its own step ran about twice
    as long after one (docs/performance.md); side by side, the chat keeps its cores."""

    def __init__(self, engine, pool, threads: int):
        self.engine, self.pool, self.threads = engine, pool, threads

    def slice(self) -> None:
        """Before a slice of encoder work."""
        for p in self.engine.runner.pools():
            p.active = max(1, p.num_threads - self.threads)
        s = self.engine.scheduler
        self.pool.active = self.threads if s.running or s.waiting else self.pool.num_threads

    def release(self) -> None:
        """The encoder has nothing left: the chats take every thread again."""
        for p in self.engine.runner.pools():
            p.active = p.num_threads
