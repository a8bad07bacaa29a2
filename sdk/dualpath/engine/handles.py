"""What a request's consumer receives: ``Delta``s, the ``Completion`` they end with, and
the handles that read them.

The stepping thread calls a request's sink with one item per delta, ``(delta, None)``,
or ``(None, error)`` when the request failed; the last delta carries a
``finish_reason`` and the completion. ``RequestHandle`` reads the items on an asyncio
event loop, ``SyncStream`` in the caller's thread (stepping the engine itself unless its
background loop runs).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..completion import Completion, Timings, Usage
from ..errors import DualPathError
from ..sampling_params import SamplingParams

if TYPE_CHECKING:  # imported where a handle is made: memory the synchronous API never needs
    import asyncio

    from .request import EngineRequest


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


def completion_of(req, finish: str, stop_reason, now: float) -> Completion:
    """The completion of an engine request (engine/request.py) that ended at ``now``
    (``time.perf_counter()``), its text stream finished."""
    first = req.first_token_time or now
    cached = req.cached_tokens or 0
    return Completion(
        text=req.stream.text,
        token_ids=tuple(req.generated),
        prompt_token_ids=tuple(req.prompt_ids),
        finish_reason=finish,
        usage=Usage(len(req.prompt_ids), len(req.generated), cached),
        timings=Timings((first - req.arrival) * 1e3, (now - first) * 1e3, len(req.prompt_ids) - cached,
                        req.decode_steps),
        stop_reason=stop_reason,
        logprobs=tuple(req.logprobs) if req.logprobs is not None else None,
        embedding=_pooled(req) if req.embedding and finish == "stop" else None,
        prompt_logprobs=tuple(req.prompt_logprobs) if req.prompt_logits else None,
    )


def _pooled(req) -> np.ndarray:
    """An embedding request's vector: L2-normalised, except a reranker's raw state (pooling rank)."""
    return req.pooled.astype(np.float32) if req.pooling == "rank" else _normalised(req.pooled)


def _normalised(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v).astype(np.float32)


class _Consumer:
    """What a request's consumer shares: turning sink items into deltas."""

    done = False

    def _receive(self, delta: Delta | None, error: BaseException | None) -> Delta:
        """The delta of one sink item (raising the error it carries); ``done`` after the last."""
        if error is not None:
            self.done = True
            raise error
        assert delta is not None  # a sink item carries a delta or an error
        self.done = delta.finish_reason is not None
        return delta


class RequestHandle(_Consumer):
    """An async iterator of one request's ``Delta``s; ``completion`` once it ends."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        import asyncio

        self.engine = engine
        self.request: EngineRequest | None = None
        """The engine request (engine/request.py), set once it is queued."""
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    @property
    def request_id(self) -> str:
        if self.request is None:
            raise AttributeError("request_id: the request is not queued yet")
        return self.request.request_id

    @property
    def completion(self) -> Completion | None:
        return self.request.completion if self.request else None

    def sink(self, delta: Delta | None, error: BaseException | None) -> None:
        """The request's sink (called from the stepping thread)."""
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
    the background loop runs. Several threads may read one stream (one iterates while
    another closes it): each delta goes to one of them, and once the last has been read
    every reader sees the end, and ``completion``."""

    def __init__(self, engine, prompt_ids: Sequence[int], params: SamplingParams, grammar=None, embeds=()):
        self.engine = engine
        self.completion: Completion | None = None
        """Set with the last delta, before any reader sees the end."""
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._reading = threading.Lock()  # one reader waits on the queue; the others wait here
        self.request = engine.add_request(prompt_ids, params, sink=lambda d, e: self._q.put((d, e)), grammar=grammar,
                                          embeds=embeds)

    def next_delta(self) -> Delta | None:
        """The next delta; None once the request has ended."""
        with self._reading:
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
            out = self._receive(delta, error)
            if out.completion is not None:
                self.completion = out.completion
            return out
