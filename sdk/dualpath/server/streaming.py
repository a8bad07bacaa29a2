"""Answers as they are made: the choices of a request merged as they come, sent as
server-sent events or collected, and aborted when the client goes away.

A stream that fails after its status line went out cannot change its status: it sends
one ``data: {"error": ...}`` event, then ``data: [DONE]``, and ends cleanly.
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .errors import api_error

DONE = "data: [DONE]\n\n"
"""The last event of every stream, OpenAI's end marker."""


def sse(obj: dict) -> str:
    """One server-sent event holding ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def merged(handles):
    """``(choice index, Delta)`` from every handle, as they come."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, h):
        try:
            async for d in h:
                await q.put((i, d, None))
        except BaseException as e:  # delivered to the consumer, which raises it
            await q.put((i, None, e))
            return
        await q.put((i, None, None))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    left = len(tasks)
    try:
        while left:
            i, d, error = await q.get()
            if error is not None:
                raise error
            if d is None:
                left -= 1
                continue
            yield i, d
    finally:
        for t in tasks:
            t.cancel()


def event_stream(events, handles) -> StreamingResponse:
    """Send ``events`` (strings, ``DONE`` last); a failure among them as one error event and
    ``DONE``. The handles not yet ended are aborted however the stream ends."""

    async def guarded():
        # Starlette cancels this generator when the client disconnects: abort then.
        try:
            async for e in events:
                yield e
        except Exception as exc:  # the status line is sent: the error goes in the stream
            yield f"data: {json.dumps(api_error(exc).body())}\n\n"  # ASCII: it may quote the request
            yield DONE
        finally:
            for h in handles:
                if h.completion is None:
                    h.abort()

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def collect(request: Request, handles) -> list:
    """Wait for a non-streamed request's choices, aborting them if the client goes away
    (or one of them failed: the others have nobody to answer)."""

    async def watch():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                for h in handles:
                    h.abort()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        async for _ in merged(handles):
            pass
    finally:
        watcher.cancel()
        for h in handles:
            if h.completion is None:
                h.abort()
    return [h.completion for h in handles]
