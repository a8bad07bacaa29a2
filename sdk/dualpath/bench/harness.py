"""The one isolated-process harness of the benchmarks.

A measurement that must not share a process with another (its peak resident
memory must be its own; ONNX Runtime's pinned per-session pools cannot share a
process with its global pool; one engine's threads must not linger in the next
one's run) runs as a *worker*: a module-level function of a bench module, called
with JSON keyword arguments in a fresh ``python`` and returning a JSON value.

    row = run_worker(worker, {"engine": "dualpath", "model": path}, timeout_s=1800)

The child is ``python -m dualpath.bench.harness MODULE:FUNCTION RESULT_PATH``
with the arguments on stdin. The result goes to ``RESULT_PATH``, not stdout, so
whatever the worker or a library prints cannot corrupt it. A child that exits
non-zero, is killed or runs past ``timeout_s`` raises ``BenchProcessError``
naming the worker and showing the tail of its stderr.

A *peer script* (``run_peer_script``) is the same protocol in another Python
environment, one that cannot import dualpath (onnxruntime-genai's, whose
onnxruntime pin and builder's torch are not ours): ``PYTHON SCRIPT FUNCTION
RESULT_PATH``, the arguments on stdin, the script run by path. Such a script
carries its own copy of ``_child`` (it cannot import this module).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import DualPathError

TAIL_LINES = 30
"""Lines of a failed child's stderr quoted in the error."""
ARGS_CHARS = 160
"""Characters of a failed worker's arguments quoted in the error."""


class BenchProcessError(DualPathError, RuntimeError):
    """A benchmark's child process (a worker or the server under load) failed."""


def worker_name(worker: Callable[..., Any] | str) -> str:
    """``module:function`` of a worker, the form the child imports it by."""
    if isinstance(worker, str):
        name = worker
    else:
        name = f"{worker.__module__}:{worker.__qualname__}"
    module, sep, function = name.partition(":")
    if not sep or not module or not function.isidentifier() or module == "__main__":
        raise ValueError(f"worker {name!r} must be a module-level function named as module:function "
                         "(the child process imports it by that name)")
    return name


def stderr_tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a child's stderr, indented, for an error message."""
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join("  | " + line for line in tail) if tail else "  (stderr was empty)"


def run_worker(worker: Callable[..., Any] | str, kwargs: Mapping[str, Any] | None = None, *,
               env: Mapping[str, str] | None = None, timeout_s: float = 1800.0) -> Any:
    """Call ``worker(**kwargs)`` in a fresh Python process; return what it returned.

    ``worker``: a module-level function (or its ``module:function`` name);
    ``kwargs``: JSON-serializable keyword arguments; ``env``: variables set on top
    of this process's environment; ``timeout_s``: wall-clock limit, after which the
    child is killed. Raises ``BenchProcessError`` when the child fails or times out.
    """
    name = worker_name(worker)
    return _run_child([sys.executable, "-m", "dualpath.bench.harness", name], name, kwargs,
                      {**os.environ, **(env or {})}, timeout_s)


def run_peer_script(python: str, script: str, function: str, kwargs: Mapping[str, Any] | None = None, *,
                    timeout_s: float = 1800.0) -> Any:
    """Call ``function(**kwargs)`` of the file ``script`` run by path in the interpreter
    ``python`` (another environment); return what it returned. The child gets this
    process's environment without ``PYTHONPATH``/``PYTHONHOME`` (they point into
    ours, not into the peer's). Errors as ``run_worker``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return _run_child([python, script, function], f"{os.path.basename(script)}:{function}", kwargs, env,
                      timeout_s)


def _run_child(cmd: list[str], name: str, kwargs: Mapping[str, Any] | None, env: Mapping[str, str],
               timeout_s: float) -> Any:
    """Run ``cmd + [RESULT_PATH]`` with ``kwargs`` as JSON on stdin; return the JSON it wrote there."""
    kwargs = dict(kwargs or {})
    payload = json.dumps(kwargs)
    call = f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    if len(call) > ARGS_CHARS:
        call = call[:ARGS_CHARS - 4] + " ...)"
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        try:
            proc = subprocess.run([*cmd, result_path], input=payload, capture_output=True, text=True,
                                  env=dict(env), timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
            raise BenchProcessError(f"bench worker {call} did not finish in {timeout_s:g} s (killed); "
                                    f"its stderr ends:\n{stderr_tail(err)}") from None
        except OSError as e:  # the interpreter itself cannot be started
            raise BenchProcessError(f"bench worker {call}: cannot run {cmd[0]}: {e.strerror or e}") from None
        if proc.returncode != 0:
            how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else \
                f"exited with status {proc.returncode}"
            raise BenchProcessError(f"bench worker {call} {how}; its stderr ends:\n{stderr_tail(proc.stderr)}")
        try:
            with open(result_path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise BenchProcessError(f"bench worker {call} exited 0 but wrote no JSON result ({e}); "
                                    f"its stderr ends:\n{stderr_tail(proc.stderr)}") from None


def _child(name: str, result_path: str) -> None:
    module, _, function = name.partition(":")
    fn = getattr(importlib.import_module(module), function)
    result = fn(**json.load(sys.stdin))
    with open(result_path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(result_path + ".part", result_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m dualpath.bench.harness MODULE:FUNCTION RESULT_PATH  (arguments as JSON on stdin)")
    _child(sys.argv[1], sys.argv[2])
