"""What a client can hold open: connections, and the time their headers may take.

uvicorn bounds neither an idle connection before its first request nor a request whose
headers trickle in a byte at a time (slowloris), and when the process runs out of file
descriptors asyncio logs every refused ``accept``. Here:

- ``guarded_protocol``: uvicorn's h11 protocol with a header deadline (a request's headers
  must arrive within ``server.header_timeout_s`` of its first byte or of the connection's
  opening), a body deadline (its body within ``server.body_timeout_s`` of its headers) and a
  cap on open connections (``server.max_connections``, held below the file limit): past the
  cap, the connection idle the longest (no request in progress) is closed to make room, so a
  flood of idle sockets can never lock out a new client. A request h11 cannot parse gets
  an OpenAI error object, as every other refusal does, not uvicorn's plain text.
- ``raise_file_limit``: the soft RLIMIT_NOFILE raised to the hard one at start.
- ``quiet_accept_errors``: a refused ``accept`` logged once per interval, with a count.
- ``uvicorn_config``: the uvicorn config ``dualpath serve`` runs with, and the tests too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

log = logging.getLogger(__name__)

FILE_RESERVE = 64
"""Descriptors kept free beyond those open at start: model files, the template worker's
pipes, the prefix store's writes, the log."""
BACKLOG = 128
"""The listening socket's backlog, which is also how many connections asyncio accepts in
one go before any of them is seen (and the cap can close one): kept free as well."""
ACCEPT_LOG_INTERVAL_S = 10.0
"""At most one log line per this many seconds about refused accepts."""


def raise_file_limit() -> int:
    """Raise the soft limit on open files to the hard one; the soft limit now (0 where
    the platform has no such limit)."""
    try:
        import resource
    except ImportError:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 0
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, e)
    return soft


def connection_cap(max_connections: int) -> int:
    """``max_connections``, held below the file limit less what is open and a reserve."""
    soft = raise_file_limit()
    if not soft:
        return max_connections
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 32
    room = soft - in_use - FILE_RESERVE - BACKLOG
    if room < max_connections:
        log.warning("server.max_connections=%d lowered to %d: the open-file limit is %d", max_connections,
                    max(room, 8), soft)
    return max(8, min(max_connections, room))


def guarded_protocol(max_connections: int, header_timeout_s: float, body_timeout_s: float = 60.0):
    """uvicorn's h11 protocol class with the header and body deadlines and the connection cap."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self.idle_since = time.monotonic()
            self.header_timer = self.body_timer = None
            self._arm()
            if len(self.connections) > max_connections:
                self._make_room()

        def _busy(self) -> bool:
            """A request's headers have arrived and its response is not complete."""
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            if self.header_timer is None:
                self.header_timer = self.loop.call_later(header_timeout_s, self._header_deadline)

        def _disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _header_deadline(self) -> None:
            self.header_timer = None
            if not self._busy() and not self.transport.is_closing():
                self.transport.close()

        def _make_room(self) -> None:
            # Every connection of this server is one of these (uvicorn types the set as its base).
            others = [c for c in self.connections if isinstance(c, GuardedH11Protocol)]
            idle = [c for c in others if c is not self and not c._busy() and not c.transport.is_closing()]
            victim = min(idle, key=lambda c: c.idle_since) if idle else self
            _note_eviction()
            victim.transport.close()

        def _reading_body(self) -> bool:
            return self._busy() and self.cycle.more_body

        def _body_deadline(self) -> None:
            self.body_timer = None
            if self._reading_body() and not self.transport.is_closing():
                self.transport.close()  # the app's receive() sees the disconnect

        def data_received(self, data: bytes) -> None:
            if not self._busy():  # the first bytes of a request: its headers' clock starts
                self._arm()
            super().data_received(data)
            if self._busy():
                self._disarm()
            if self._reading_body():
                if self.body_timer is None:
                    self.body_timer = self.loop.call_later(body_timeout_s, self._body_deadline)
            elif self.body_timer is not None:
                self.body_timer = self.body_timer.cancel()  # None

        def send_400_response(self, msg: str) -> None:
            try:
                for event in _json_400(h11, msg):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # h11 cannot answer in this state: uvicorn's own way
                return super().send_400_response(msg)
            finally:
                self.transport.close()

        def on_response_complete(self) -> None:
            self.idle_since = time.monotonic()
            super().on_response_complete()

        def connection_lost(self, exc):
            self._disarm()
            self.body_timer = self.body_timer and self.body_timer.cancel()  # None either way
            super().connection_lost(exc)

    return GuardedH11Protocol


def _json_400(h11, msg: str) -> tuple:
    """h11's events of a 400 whose body is an OpenAI error object naming ``msg``."""
    body = json.dumps({"error": {"message": f"malformed HTTP request: {msg}", "type": "invalid_request_error",
                                 "param": None, "code": None}}).encode("ascii")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    response = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
    return response, h11.Data(data=body), h11.EndOfMessage()


_evictions = {"count": 0, "logged": 0.0}


def _note_eviction() -> None:
    _evictions["count"] += 1
    now = time.monotonic()
    if now - _evictions["logged"] >= ACCEPT_LOG_INTERVAL_S:
        log.warning("%d connection(s) closed to stay under server.max_connections (idle the longest first)",
                    _evictions["count"])
        _evictions["count"], _evictions["logged"] = 0, now


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log asyncio's refused-accept errors (out of descriptors or memory) once per
    interval with a count, instead of a traceback each; pass everything else on."""
    state = {"count": 0, "logged": 0.0}
    previous = loop.get_exception_handler()

    def handler(loop, context):
        message = context.get("message", "")
        if message.startswith("socket.accept() out of system resource"):
            state["count"] += 1
            now = time.monotonic()
            if now - state["logged"] >= ACCEPT_LOG_INTERVAL_S:
                exc = context.get("exception")
                log.error("refused %d connection(s): %s (raise the open-file limit or lower "
                          "server.max_connections)", state["count"], exc)
                state["count"], state["logged"] = 0, now
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def uvicorn_config(app, server_config, *, host: str | None = None, port: int | None = None, **kwargs):
    """The uvicorn.Config to serve ``app`` with ``server_config`` (a ServerConfig)."""
    import uvicorn

    sc = server_config
    cap = connection_cap(sc.max_connections)
    kwargs.setdefault("timeout_keep_alive", 75)
    kwargs.setdefault("backlog", BACKLOG)
    return uvicorn.Config(app, host=sc.host if host is None else host, port=sc.port if port is None else port,
                          http=guarded_protocol(cap, sc.header_timeout_s, sc.body_timeout_s), **kwargs)
