"""The chat-template sandbox, and the worker process that runs it (``render.py`` starts it).

A model file's template is code from wherever the file came from. Jinja's
``ImmutableSandboxedEnvironment`` refuses attribute escapes, but neither time nor memory:
two nested ``range(100000)`` loops run for hours and ``'a' * 10**10`` asks for 10 GB. The
environment here refuses the cheap blow-ups itself (a ``*``, ``+`` or ``**`` whose result
would be over the output cap, output past the cap, time past the deadline, checked at every
call, range step and output chunk); what it cannot see (a filter that allocates inside C,
a loop over a long string) is bounded by the process around it: an address-space limit
(RLIMIT_AS), and a parent that kills it at the deadline.

This module imports nothing from dualpath, so that the worker, run by path
(``python -I template_worker.py``), starts with jinja2 and the standard library only. It
reads length-prefixed JSON requests on stdin and writes one reply per request on stdout:
``{"text": ...}`` or ``{"error": ..., "limit": name-or-null}``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HEADER = struct.Struct("<I")
"""A frame's length prefix: little-endian uint32 bytes of JSON."""


class TemplateLimit(Exception):
    """A template went past one of its limits; ``limit`` names the config key."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


class RaisedByTemplate(Exception):
    """The template's own ``raise_exception(message)``: its message is the error."""


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with a deadline and an output cap, both checked as it runs."""

    intercepted_binops = frozenset(["*", "+", "**"])

    def __init__(self, max_chars: int, timeout_s: float):
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.max_chars, self.timeout_s = max_chars, timeout_s
        self.deadline = float("inf")
        self._compiled: dict[str, jinja2.Template] = {}  # source -> template: a model renders one or two
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["range"] = self._range

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"the chat template took over {self.timeout_s:g} s to render",
                                "runtime.chat_template_timeout_s")

    def _too_long(self, size: int, what: str, unit: str = "characters") -> TemplateLimit:
        return TemplateLimit(f"the chat template made {what} of {size:,} {unit}, over the cap of "
                             f"{self.max_chars:,}", "runtime.chat_template_max_chars")

    def _range(self, *args):
        r = range(*args)
        if len(r) > self.max_chars:
            raise self._too_long(len(r), "a range", "items")
        return _CheckedRange(r, self)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        __self.check_time()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        self.check_time()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.max_chars:
                    raise self._too_long(len(seq) * n, "a repeated value", _unit(seq))
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            if len(left) + len(right) > self.max_chars:
                raise self._too_long(len(left) + len(right), "a joined value", _unit(left))
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * abs(left).bit_length() > 8 * self.max_chars:
                raise self._too_long(right * abs(left).bit_length() // 3, "a number", "digits")
        return super().call_binop(context, operator, left, right)

    def render(self, source: str, variables: dict) -> str:
        """``source`` rendered with ``variables``; TemplateLimit past a limit, any other
        exception for a template that fails."""
        self.deadline = time.monotonic() + self.timeout_s
        template = self._compiled.get(source)
        if template is None:
            template = self.from_string(source)
            if len(self._compiled) >= 8:
                self._compiled.clear()
            self._compiled[source] = template
        out, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > self.max_chars:
                raise self._too_long(size, "an output")
            self.check_time()
            out.append(chunk)
        return "".join(out)


class _CheckedRange:
    """A range whose iteration checks the deadline: a loop over it may have an empty body,
    which no other hook sees."""

    def __init__(self, r: range, env: LimitedSandbox):
        self._r, self._env = r, env

    def __len__(self):
        return len(self._r)

    def __getitem__(self, i):
        v = self._r[i]
        return _CheckedRange(v, self._env) if isinstance(v, range) else v

    def __contains__(self, v):
        return v in self._r

    def __iter__(self):
        return self._walk(self._r)

    def __reversed__(self):
        return self._walk(reversed(self._r))

    def _walk(self, values):
        for i, v in enumerate(values):
            if not i & 1023:
                self._env.check_time()
            yield v


def _unit(value) -> str:
    return "characters" if isinstance(value, str) else "items"


def _raise_exception(message):
    raise RaisedByTemplate(message)


def _strftime_now(fmt):
    """The local time now, formatted (what Llama 3.x templates call for "Today Date")."""
    if not isinstance(fmt, str) or len(fmt) > 256:
        raise ValueError("strftime_now takes a format string of at most 256 characters")
    return time.strftime(fmt)


def describe(exc: BaseException) -> tuple[str, str | None]:
    """(message, limit) of a failed render: every exception a template can cause is an
    error of the template, named by its kind where Jinja's message alone is unclear."""
    if isinstance(exc, TemplateLimit):
        return str(exc), exc.limit
    if isinstance(exc, RaisedByTemplate):
        return str(exc), None
    if isinstance(exc, MemoryError):
        return "the chat template ran out of memory", "memory"
    if isinstance(exc, RecursionError):
        return "the chat template recursed too deeply", None
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error on line {exc.lineno}: {exc.message}", None
    if isinstance(exc, jinja2.TemplateError):
        return f"{type(exc).__name__}: {exc}", None
    if isinstance(exc, TypeError) and "no loader" in str(exc):
        return "the chat template includes or imports another template, which a chat template may not", None
    # an oversized or bad argument (OverflowError, ValueError),
    # a division by zero...: the template's fault all the same
    return f"{type(exc).__name__}: {exc}", None


def limit_memory(headroom_bytes: int) -> None:
    """Cap this process's address space at what it maps now plus ``headroom_bytes``,
    where the platform has RLIMIT_AS and /proc (a template then gets MemoryError)."""
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, OSError, ValueError):
        pass


def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def serve(max_chars: int, timeout_s: float, headroom_bytes: int) -> None:
    """Answer requests until stdin closes (the parent went away)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the parent's to handle
    env = LimitedSandbox(max_chars, timeout_s)
    limit_memory(headroom_bytes)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(HEADER.pack(0))  # ready
    stdout.flush()
    while True:
        header = _read_exact(stdin, HEADER.size)
        if header is None:
            return
        payload = _read_exact(stdin, HEADER.unpack(header)[0])
        if payload is None:
            return
        try:
            request = json.loads(payload)
            reply = {"text": env.render(request["template"], request["variables"])}
        except BaseException as e:  # noqa: BLE001 (every failure is the template's, and answered)
            message, limit = describe(e)
            reply = {"error": message, "limit": limit}  # type: ignore[dict-item]  # limit may be None
        try:
            data = json.dumps(reply).encode()
        except MemoryError:
            data = json.dumps({"error": "the chat template ran out of memory", "limit": "memory"}).encode()
        stdout.write(HEADER.pack(len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
