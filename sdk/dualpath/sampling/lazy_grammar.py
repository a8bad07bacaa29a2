"""A lazy grammar: free text until the model opens a tool call, then the call's grammar.

llama.cpp's lazy grammars work this way (``llama_sampler_init_grammar_lazy_patterns``): the
mask is a no-op while the model writes prose; once the text it has written holds one of the
format's triggers (``<tool_call>``, ``[TOOL_CALLS]``, ``{"name"`` ...), the grammar of the
call (its arguments valid for the tool's schema, then the closing marker) is fed the text
from the trigger on and constrains every token until the call ends. A format whose calls
may follow one another (Hermes) returns to free text after each call when parallel calls
are allowed; otherwise the end of the call ends the turn.

The trigger is matched on the bytes the tokens write, special tokens included, so a
trigger written in several tokens, or in one special token, or ending inside a token, is
found all the same; what a token writes past the trigger's end is fed to the call grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dualpath.tokenizer.tool_formats import ToolFormat

__all__ = ["LazyMatcher", "LazySpec"]


@dataclass(frozen=True, eq=False)
class LazySpec:
    """What every lazy matcher of one grammar shares."""

    fmt: ToolFormat
    parallel: bool
    pattern: re.Pattern[bytes]
    """The format's triggers (tool_formats.trigger_pattern), over the bytes written."""
    fed: tuple[bool, ...]
    """Per trigger: it is the start of the call's JSON, which the call grammar then reads too."""
    token_bytes: Any
    """Sequence (vocab,) of the bytes each token writes, special tokens as their text."""
    encode: Any
    """text -> token ids, continuing earlier text (to feed the grammar what follows a trigger)."""
    new_call: Any
    """() -> a ``Matcher`` at the start of the call grammar."""
    tail_bytes: int
    """How much written text to keep to find a trigger that spans tokens."""


class LazyMatcher:
    """One sequence's walk: free text, a call under its grammar, free text again (parallel
    calls), or done. The same methods as ``Matcher``; ``fill_bias`` returns False while the
    text is free (the sampler then adds no mask at all)."""

    __slots__ = ("_spec", "_call", "_tail", "_done", "num_calls")

    def __init__(self, spec: LazySpec):
        self._spec = spec
        self._call = None  # the call's Matcher while a call is written
        self._tail = b""  # the last bytes written outside a call
        self._done = False
        self.num_calls = 0
        """Calls written to their end under the grammar."""

    @property
    def in_call(self) -> bool:
        """True while a call is being written (the grammar constrains)."""
        return self._call is not None

    def fill_bias(self, bias: np.ndarray) -> bool:
        if self._call is None:
            return False
        self._call.fill_bias(bias)
        return True

    def allows(self, token_id: int) -> bool:
        return self._call is None or self._call.allows(token_id)

    def fill_mask(self, allowed: np.ndarray) -> None:
        if self._call is None:
            allowed.fill(True)
        else:
            self._call.fill_mask(allowed)

    def accept(self, token_id: int) -> bool:
        if self._call is not None:
            ok = self._call.accept(token_id)
            if ok and self._call.is_finished():
                self._end_call()
            return ok
        if self._done:
            return True
        spec = self._spec
        token_id = int(token_id)
        written = spec.token_bytes[token_id] if 0 <= token_id < len(spec.token_bytes) else b""
        self._tail = (self._tail + written)[-spec.tail_bytes:]
        self._look_for_trigger()
        return True

    def _look_for_trigger(self) -> None:
        spec = self._spec
        m = spec.pattern.search(self._tail)
        if m is None:
            return
        fed = spec.fed[int((m.lastgroup or "t0")[1:])]  # every alternative is a named group
        after = self._tail[m.start() if fed else m.end():]
        self._tail = b""
        call = spec.new_call()
        text = after.decode("utf-8", errors="ignore")
        for t in spec.encode(text) if text else ():
            if not call.accept(t):  # the model wrote past the trigger what no call can hold
                return
        self._call = call
        if call.is_finished():
            self._end_call()

    def _end_call(self) -> None:
        self._call = None
        self.num_calls += 1
        fmt = self._spec.fmt
        if not (self._spec.parallel and fmt.close and not fmt.is_list):
            self._done = True

    def is_finished(self) -> bool:
        """True once the turn's calls are written (nothing may follow)."""
        return self._done

    def is_accepting(self) -> bool:
        return self._call is None or self._call.is_accepting()

    @property
    def error(self) -> str | None:
        return self._call.error if self._call is not None else None
