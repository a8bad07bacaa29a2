"""What several benchmarks share: interleaved repeats and their medians,
percentiles, prompts, peak memory, the default model, JSON output, and the
helpers of a benchmark that talks to a live server (a free port, /metrics)."""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

FIRST_ORDINARY_ID = 3
"""Ids below it are <unk>, <s>, </s> in the llama vocabularies (and the synthetic one)."""


# -- repeats -------------------------------------------------------------------

def interleaved(variants: Sequence[str], repeats: int, measure: Callable[[str], dict],
                on_result: Callable[[int, str, dict], None] | None = None) -> dict[str, list[dict]]:
    """``measure(variant)`` ``repeats`` times for every variant, the variants taking
    turns run by run: drift in this machine's speed hits every variant alike.
    ``on_result(run_index, variant, row)`` is called after each measurement."""
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(repeats):
        for v in variants:
            row = measure(v)
            runs[v].append(row)
            if on_result is not None:
                on_result(r, v, row)
    return runs


def ms_per_call(fn: Callable[[], Any], inner: int) -> float:
    """Milliseconds per call of ``fn``: one call to warm, then the mean of ``inner``."""
    fn()
    t = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t) / inner * 1e3


def ort_session(model, threads: int):
    """An ONNX Runtime session of ``model`` (a ModelProto) on ``threads`` threads: on ORT's
    global pool where the process has one, as a model's graphs run (and once it exists
    ORT refuses any other)."""
    import onnxruntime as ort

    from ..executor.ort_sessions import use_global_pool

    so = ort.SessionOptions()
    if use_global_pool(threads):
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def median_of(rows: Iterable[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def medians(rows: Sequence[dict], keys: Iterable[str]) -> dict[str, float]:
    """The median over ``rows`` of each of ``keys``."""
    return {k: median_of(rows, k) for k in keys}


def best_of(settings: Mapping[str, Mapping[str, float]], higher: Iterable[str] = (),
            lower: Iterable[str] = ()) -> dict:
    """One engine at its best over several settings of its own (``settings``: setting ->
    figures, e.g. the medians with flash attention off and on): each key of ``higher`` the
    largest, each of ``lower`` the smallest, with ``best[key]`` naming the setting it came
    from. The settings may differ from figure to figure; a tie goes to the first setting."""
    if not settings:
        raise ValueError("best_of: no settings to choose from")
    out: dict[str, Any] = {"best": {}}
    for keys, better in ((higher, max), (lower, min)):
        for key in keys:
            name = better(settings, key=lambda s: settings[s][key])  # max/min keep the first of equals
            out[key], out["best"][key] = settings[name][key], name
    return out


def percentile_ms(seconds: Sequence[float], q: float, empty: float | None = None) -> float | None:
    """The ``q``-th percentile of durations given in seconds, in milliseconds;
    ``empty`` when there are none."""
    if len(seconds) == 0:
        return empty
    return float(np.percentile(seconds, q) * 1e3)


# -- inputs --------------------------------------------------------------------

def random_ids(rng: np.random.Generator, vocab_size: int, num_tokens: int) -> list[int]:
    """``num_tokens`` ordinary token ids (no control token), drawn from ``rng``."""
    return rng.integers(FIRST_ORDINARY_ID, vocab_size, num_tokens).tolist()


def random_prompt(vocab_size: int, num_tokens: int, seed: int = 1234, bos: int = 1) -> list[int]:
    """A seeded prompt of ``num_tokens`` ids: BOS, then random ordinary ids."""
    return [bos] + random_ids(np.random.default_rng(seed), vocab_size, num_tokens - 1)


def model_or_default(model: str | None, context_length: int | None = None) -> str:
    """``model``, or the benchmarks' default, synth:stories15M (random weights, real speed;
    synthesized on first use, said on stderr)."""
    if model:
        return model
    from ..models.synth import ensure_synth_model

    path, created = ensure_synth_model(context_length)
    if created:
        print(f"synthesized {path} (stories15M shape, RANDOM weights)", file=sys.stderr, flush=True)
    return path


# -- measurements --------------------------------------------------------------

def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (VmHWM on Linux, else ru_maxrss)."""
    peak = process_peak_rss_mb("self")  # getrusage's ru_maxrss carries the parent's peak over fork and exec
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (every thread)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- output --------------------------------------------------------------------

def write_json(path: str | None, data: Any) -> None:
    """Write ``data`` to ``path`` (a ``--json`` flag) when it is given."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)


# -- a live server -------------------------------------------------------------

def free_port() -> int:
    """A TCP port on loopback nobody listens on (right now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text: ``name`` or ``name{labels}``."""
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    raise KeyError(prefix.strip())


def process_peak_rss_mb(pid: int | str, field: str = "VmHWM") -> float | None:
    """Peak resident memory of a live process, or of this one with pid "self" (``VmHWM`` of
    /proc/PID/status; ``VmRSS``: its resident memory now), in MiB; None where /proc does
    not say (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


class LiveServer:
    """A server process started by ``live_server``: its ``argv``, ``base`` URL and ``proc``."""

    def __init__(self, name: str, argv: Sequence[str], base: str, proc, stderr_file):
        self.name, self.argv, self.base, self.proc = name, list(argv), base, proc
        self._stderr_file = stderr_file

    def stderr_tail(self) -> str:
        from .harness import stderr_tail

        self._stderr_file.flush()
        self._stderr_file.seek(0)
        return stderr_tail(self._stderr_file.read())

    def stderr_text(self) -> str:
        self._stderr_file.flush()
        self._stderr_file.seek(0)
        return self._stderr_file.read()

    def stop(self, timeout_s: float = 30.0) -> str:
        """Stop the server as an operator would (SIGTERM: it shuts down cleanly), SIGKILL
        after ``timeout_s``; returns its whole stderr."""
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.stderr_text()

    def check_alive(self) -> None:
        """Raise ``BenchProcessError`` (with the tail of its stderr) if the server has exited."""
        from .harness import BenchProcessError

        if self.proc.poll() is not None:
            raise BenchProcessError(f"{self.name} exited with status {self.proc.returncode}; "
                                    f"its stderr ends:\n{self.stderr_tail()}")


@contextlib.contextmanager
def live_server(name: str, argv: Sequence[str], base: str, startup_s: float = 120.0,
                log_path: str | None = None) -> Iterator[LiveServer]:
    """Start the server ``argv`` (stdout discarded, stderr kept in ``log_path``, else in a temporary file),
    wait until ``GET base/health`` answers 200 (llama-server answers 503 while it
    loads), yield it as a ``LiveServer``; on exit terminate it (SIGKILL after 30 s).
    A server that exits, or does not answer within ``startup_s``, raises
    ``BenchProcessError`` naming it and quoting the end of its stderr."""
    import subprocess
    import tempfile

    import httpx

    from .harness import BenchProcessError

    log = open(log_path, "w+", errors="replace") if log_path else tempfile.TemporaryFile("w+", errors="replace")
    with log as stderr_file:
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=stderr_file, text=True)
        server = LiveServer(name, argv, base, proc, stderr_file)
        try:
            deadline = time.monotonic() + startup_s
            while True:
                server.check_alive()
                try:
                    if httpx.get(base + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise BenchProcessError(f"{name} did not answer {base}/health in {startup_s:g} s; "
                                            f"its stderr ends:\n{server.stderr_tail()}")
                time.sleep(0.2)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def stream_completion(base: str, prompt: list[int], max_tokens: int, **extra) -> dict:
    """One streamed greedy ``/v1/completions`` request (``extra``: more body fields):
    ``ttft_ms`` (first text), ``decode_tps`` (text chunks after the first over the time
    from the first to the last; None under two), ``text``, ``usage``, and llama-server's
    ``timings``."""
    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    out: dict[str, Any] = {"ttft_ms": None, "decode_tps": None, "text": "", "usage": None, "timings": None}
    t0 = time.perf_counter()
    first: float | None = None
    last: float = 0.0
    chunks = 0
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            out["usage"] = chunk.get("usage") or out["usage"]
            out["timings"] = chunk.get("timings") or out["timings"]
            for choice in chunk.get("choices") or ():
                if choice.get("text"):
                    last = time.perf_counter()
                    first = first or last
                    chunks += 1
                    out["text"] += choice["text"]
    if first is not None:
        out["ttft_ms"] = (first - t0) * 1e3
        if last > first:
            out["decode_tps"] = (chunks - 1) / (last - first)
    return out
