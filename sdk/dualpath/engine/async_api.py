"""The engine's async API: ``submit``, ``submit_n`` and ``embed`` queue requests whose
``RequestHandle``s are async iterators of ``Delta``s, stepped by the engine's background
loop (engine/engine.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..sampling_params import SamplingParams
from .handles import RequestHandle

if TYPE_CHECKING:
    from .request import EngineRequest


class _SchedulerLimits(Protocol):
    @property
    def max_num_seqs(self) -> int: ...


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


class EngineCore(Protocol):
    """What ``AsyncAPI`` needs of the engine it is mixed into (engine/engine.py)."""

    @property
    def scheduler(self) -> _SchedulerLimits: ...

    @property
    def tokenizer(self) -> _Encoder: ...

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, sink: Callable[..., Any] | None = None,
                    fork_sinks: Sequence[Callable[..., Any]] = (), pooling: str | None = None,
                    prompt_logprobs: bool = False, grammar: Any = None,
                    check_queue: bool = True, embeds: Sequence = ()) -> EngineRequest: ...

    def start(self) -> None: ...

    async def submit_n(self, prompt: str | Sequence[int], params: SamplingParams | None = None, n: int = 1, *,
                       request_id: str | None = None, prompt_logprobs: bool = False,
                       grammar: Any = None, embeds: Sequence = ()) -> list[RequestHandle]: ...


class AsyncAPI:
    """The async half of ``Engine`` (it supplies ``add_request``, ``start``, ``scheduler``
    and ``tokenizer``)."""

    async def submit(self: EngineCore, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                     request_id: str | None = None) -> RequestHandle:
        """Queue a request; the handle is an async iterator of ``Delta``s."""
        return (await self.submit_n(prompt, params, 1, request_id=request_id))[0]

    async def embed(self: EngineCore, prompts: Sequence[Sequence[int]],
                    pooling: str = "mean") -> list[np.ndarray | None]:
        """Embeddings of token-id prompts, batched by the scheduler: one request against
        ``max_queued_requests``, at most ``2 * max_num_seqs`` of its prompts queued at once.
        None for a prompt aborted before its end (the engine stopping)."""
        import asyncio  # here: resident memory the synchronous API never needs

        loop = asyncio.get_running_loop()
        window = 2 * self.scheduler.max_num_seqs  # enough queued to fill every slot at each step
        handles: list[RequestHandle] = []
        try:
            for i, ids in enumerate(prompts):
                if i >= window:  # the oldest in flight ends before another is queued
                    _ = [d async for d in handles[i - window]]
                h = RequestHandle(self, loop)
                h.request = self.add_request(list(ids), SamplingParams(max_tokens=1), sink=h.sink, pooling=pooling,
                                             check_queue=i == 0)
                handles.append(h)
                self.start()
            for h in handles:  # those drained above end at once
                _ = [d async for d in h]
        except BaseException:
            for h in handles:
                if h.completion is None:
                    h.abort()
            raise
        out = []
        for h in handles:
            c = h.completion
            assert c is not None  # every handle ran to its end (a failed one raised above)
            out.append(c.embedding)
        return out

    async def submit_n(self: EngineCore, prompt: str | Sequence[int], params: SamplingParams | None = None,
                       n: int = 1, *,
                       request_id: str | None = None, prompt_logprobs: bool = False,
                       grammar: Any = None, embeds: Sequence = ()) -> list[RequestHandle]:
        """Queue ``n`` samples of one prompt: the prompt is computed once and the other
        samples run on forks of its cache sequence (``add_request``'s ``fork_sinks``).
        One handle per sample. ``embeds``: as ``add_request``'s (an image's rows)."""
        import asyncio  # here: see embed

        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        loop = asyncio.get_running_loop()
        handles = [RequestHandle(self, loop) for _ in range(n)]
        req = self.add_request(ids, params, request_id=request_id, sink=handles[0].sink,
                               fork_sinks=[h.sink for h in handles[1:]], prompt_logprobs=prompt_logprobs,
                               grammar=grammar, embeds=embeds)
        for h, r in zip(handles, [req] + req.forks):
            h.request = r
        self.start()
        return handles
