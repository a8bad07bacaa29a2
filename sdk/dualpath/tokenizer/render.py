"""Chat templates rendered where they cannot hurt the caller: ``TemplateRenderer``.

A template runs in a worker process (``template_worker.py``, started on first use) with a
deadline and a cap on its output, checked by its sandbox as it runs, and an address-space
limit; a worker that does not answer by the deadline (a loop the sandbox cannot see into)
is killed, and the next render starts a fresh one. A thread could be neither stopped nor
held to a memory limit. The caller's thread only waits on a pipe, so Ctrl-C interrupts it
and the worker is killed then too.

Where no worker can be started (no usable ``sys.executable``, as in some embedded Pythons,
or no ``select`` on pipes, as on Windows) templates render in the calling thread with the
sandbox's own checks only; that is logged once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

from ..errors import ChatTemplateError
from . import template_worker as _worker

log = logging.getLogger(__name__)

MEMORY_HEADROOM_BYTES = 256 << 20
"""Address space a worker may map beyond what it maps at start, plus room for a few copies
of the largest output (``memory_headroom``): enough for any real template."""
KILL_GRACE_S = 1.0
"""How long past the deadline the worker may take to report it before it is killed."""


def memory_headroom(max_chars: int) -> int:
    # A str of max_chars takes up to 4 bytes a character; the output is joined once and
    # encoded to JSON once.
    return MEMORY_HEADROOM_BYTES + 16 * max_chars


class TemplateRenderer:
    """Renders Jinja chat templates with ``timeout_s`` and ``max_chars`` as hard limits
    (runtime.chat_template_timeout_s, runtime.chat_template_max_chars). Thread-safe: one
    render at a time; ``close()`` ends the worker."""

    def __init__(self, timeout_s: float, max_chars: int, name: str = "the chat template"):
        self.timeout_s, self.max_chars, self.name = timeout_s, max_chars, name
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._in_process: _worker.LimitedSandbox | None = None  # the sandbox, where no worker can run
        self.num_started = 0
        """Workers started so far (one more after each one killed at the deadline)."""

    # -- the worker ---------------------------------------------------------------
    def _can_spawn(self) -> bool:
        return bool(sys.executable) and os.name == "posix"

    def _start(self) -> subprocess.Popen:
        # Run by path, so the worker imports jinja2 and the standard library, not dualpath.
        args = [sys.executable, _worker.__file__, str(self.max_chars), repr(self.timeout_s),
                str(memory_headroom(self.max_chars))]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                bufsize=0, close_fds=True)
        self.num_started += 1
        try:
            if self._read(proc, time.monotonic() + 30.0) != b"":
                raise OSError("the template worker did not start")
        except BaseException:
            _kill(proc)
            raise
        return proc

    def _read(self, proc: subprocess.Popen, deadline: float) -> bytes | None:
        """One frame from the worker, or None at the deadline (or if it died)."""
        header = _read_until(proc.stdout, _worker.HEADER.size, deadline)
        if header is None:
            return None
        return _read_until(proc.stdout, _worker.HEADER.unpack(header)[0], deadline)

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                _kill(self._proc)
                self._proc = None

    def start(self) -> None:
        """Start the worker now (else on the first render), so a first request does not wait for it."""
        with self._lock:
            if self._proc is None and self._in_process is None:
                self._ensure()

    def _ensure(self):
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = None
        if self._can_spawn():
            try:
                self._proc = self._start()
                return self._proc
            except OSError as e:
                log.warning("chat templates render in this process, without a memory limit or a hard "
                            "deadline: no worker process could start (%s)", e)
        else:
            log.warning("chat templates render in this process, without a memory limit or a hard deadline: "
                        "this platform cannot run a worker process")
        self._in_process = _worker.LimitedSandbox(self.max_chars, self.timeout_s)
        return None

    # -- rendering ----------------------------------------------------------------
    def render(self, source, variables: dict) -> str:
        """``source`` rendered with ``variables`` (JSON-able); ChatTemplateError for a
        template that fails or passes a limit (the message names the limit's key)."""
        if not isinstance(source, str):
            raise ChatTemplateError(f"{self.name} is a {type(source).__name__}, not a string")
        with self._lock:
            proc = self._ensure() if self._in_process is None else None
            if proc is None:
                return self._render_here(source, variables)
            data = json.dumps({"template": source, "variables": variables}).encode()
            deadline = time.monotonic() + self.timeout_s + KILL_GRACE_S
            try:
                proc.stdin.write(_worker.HEADER.pack(len(data)) + data)
                proc.stdin.flush()
                reply = self._read(proc, deadline)
            except BaseException:  # Ctrl-C, or the worker gone: it may be mid-render, start afresh
                _kill(proc)
                self._proc = None
                raise
            if reply is None:
                _kill(proc)
                self._proc = None
                if proc.returncode is not None and proc.returncode < 0 and time.monotonic() < deadline:
                    raise ChatTemplateError(f"{self.name} failed to render: its worker process died "
                                            f"(signal {-proc.returncode})")
                raise ChatTemplateError(f"{self.name} took over {self.timeout_s:g} s to render "
                                        "(runtime.chat_template_timeout_s)")
        answer = json.loads(reply)
        if "error" in answer:
            raise ChatTemplateError(self._message(answer["error"], answer.get("limit")))
        return answer["text"]

    def _render_here(self, source: str, variables: dict) -> str:
        try:
            assert self._in_process is not None  # made when no worker can run
            return self._in_process.render(source, variables)
        except Exception as e:  # every failure of a template is the template's
            message, limit = _worker.describe(e)
            raise ChatTemplateError(self._message(message, limit)) from e

    def _message(self, error: str, limit: str | None) -> str:
        if limit == "memory":
            return (f"{self.name} failed to render: it asked for more than the "
                    f"{memory_headroom(self.max_chars) >> 20} MiB its worker may take")
        if error.startswith("the chat template"):
            error = error[len("the chat template"):].lstrip()
            return f"{self.name} {error}" + (f" ({limit})" if limit else "")
        return f"{self.name} failed to render: {error}" + (f" ({limit})" if limit else "")


def _read_until(stream, n: int, deadline: float) -> bytes | None:
    """``n`` bytes from a pipe, or None at the deadline or at its end."""
    import select

    fd = stream.fileno()
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for f in (proc.stdin, proc.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
