"""Engine metrics, rendered in Prometheus' text exposition format (version 0.0.4)."""

from __future__ import annotations

import bisect
import collections
import threading

import numpy as np

STEP_LOG = 65536
"""Steps whose time ``EngineMetrics.step_log`` keeps."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        acc = 0
        for le, c in zip(self.buckets, self.counts):
            acc += c
            lines.append(f'{name}_bucket{{le="{le:g}"}} {acc}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.sum:.6f}")
        lines.append(f"{name}_count {self.count}")
        return lines


class EngineMetrics:
    """Counters and histograms the engine updates; ``render`` adds the gauges."""

    def __init__(self, rate_window_s: float = 10.0):
        self._lock = threading.Lock()
        self.ttft = Histogram(_LATENCY_BUCKETS)
        self.tpot = Histogram(_TPOT_BUCKETS)
        self.e2e = Histogram(_LATENCY_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        self.finished: collections.Counter[str] = collections.Counter()
        self.rate_window_s = rate_window_s
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, generated)
        # (seconds, tokens) of the last STEP_LOG steps, for benchmarks: preallocated arrays,
        # since a tuple per step would grow a long-running server by megabytes.
        self._step_seconds = np.zeros(STEP_LOG, np.float32)
        self._step_tokens = np.zeros(STEP_LOG, np.int32)
        self.retried_requests = 0
        """Requests sent back to be recomputed because a model run with them in it raised."""
        self.failed_requests = 0
        """Requests ended by an error of the engine's (InternalError)."""
        self.peak_kv_bytes_held = 0
        """Most KV cache bytes held by requests after any step (extents counted whole)."""
        self.proposed_tokens = self.accepted_tokens = 0
        """Speculative decoding: tokens proposed, and those the samples agreed with."""

    def on_step(self, now: float, seconds: float, tokens: int, generated: int) -> None:
        with self._lock:
            i = self.steps % STEP_LOG
            self._step_seconds[i] = seconds
            self._step_tokens[i] = tokens
            self.steps += 1
            self.generation_tokens += generated
            self._recent.append((now, generated))
            while self._recent and self._recent[0][0] < now - self.rate_window_s:
                self._recent.popleft()

    def step_log(self) -> tuple[np.ndarray, np.ndarray]:
        """Seconds and tokens of the last (at most STEP_LOG) steps, oldest first."""
        with self._lock:
            n = min(self.steps, STEP_LOG)
            order = (np.arange(self.steps - n, self.steps) % STEP_LOG)
            return self._step_seconds[order].astype(np.float64), self._step_tokens[order].copy()

    def on_proposals(self, proposed: int, accepted: int) -> None:
        with self._lock:
            self.proposed_tokens += proposed
            self.accepted_tokens += accepted

    def on_first_token(self, ttft_s: float) -> None:
        with self._lock:
            self.ttft.observe(ttft_s)

    def on_finish(self, req, now: float) -> None:
        with self._lock:
            self.finished[req.completion.finish_reason] += 1
            self.prompt_tokens += len(req.prompt_ids)
            self.e2e.observe(now - req.arrival)
            if req.first_token_time is not None and len(req.generated) > 1:
                self.tpot.observe((now - req.first_token_time) / (len(req.generated) - 1))

    def tokens_per_s(self, now: float) -> float:
        with self._lock:
            recent = [(t, n) for t, n in self._recent if t >= now - self.rate_window_s]
        if len(recent) < 2:
            return 0.0
        span = now - recent[0][0]
        return sum(n for _, n in recent) / span if span > 0 else 0.0

    def render(self, *, waiting: int, running: int, cache, preemptions: int, profile: str, disk=None) -> str:
        import time

        now = time.perf_counter()
        g = []

        def gauge(name, help_text, value, kind="gauge", labels=""):
            g.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{labels} {value}"])

        gauge("dualpath_queue_depth", "Requests waiting for a slot.", waiting)
        gauge("dualpath_running_requests", "Requests being run (prefill or decode).", running)
        gauge("dualpath_generation_tokens_per_second", "Generated tokens per second over the last 10 s.",
              f"{self.tokens_per_s(now):.3f}")
        with self._lock:
            gauge("dualpath_prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens, "counter")
            gauge("dualpath_generation_tokens_total", "Generated tokens.", self.generation_tokens, "counter")
            gauge("dualpath_steps_total", "Engine steps run.", self.steps, "counter")
            gauge("dualpath_step_retries_total", "Requests recomputed because a model run with them in it failed.",
                  self.retried_requests, "counter")
            gauge("dualpath_requests_failed_total", "Requests ended by an internal error of the engine.",
                  self.failed_requests, "counter")
            gauge("dualpath_spec_proposed_tokens_total", "Tokens proposed by speculative decoding.",
                  self.proposed_tokens, "counter")
            gauge("dualpath_spec_accepted_tokens_total", "Proposed tokens the samples agreed with (kept).",
                  self.accepted_tokens, "counter")
            g.append("# HELP dualpath_requests_finished_total Finished requests by finish reason.")
            g.append("# TYPE dualpath_requests_finished_total counter")
            for reason in ("stop", "length", "context_full", "abort"):
                g.append(f'dualpath_requests_finished_total{{reason="{reason}"}} {self.finished[reason]}')
            g += self.ttft.render("dualpath_time_to_first_token_seconds", "Time to first token (queueing included).")
            g += self.tpot.render("dualpath_time_per_output_token_seconds",
                                  "Mean time per output token after the first, per request.")
            g += self.e2e.render("dualpath_request_latency_seconds", "Submission to last token.")
        gauge("dualpath_preemptions_total", "Requests preempted (recomputed later) for lack of cache.",
              preemptions, "counter")
        g.append("# HELP dualpath_kv_cache_bytes KV cache bytes by use (all layers).")
        g.append("# TYPE dualpath_kv_cache_bytes gauge")
        for use, value in (("sequential", cache.bytes_used_sequential), ("random", cache.bytes_used_random),
                           ("cached", cache.bytes_cached), ("free", cache.bytes_free)):
            g.append(f'dualpath_kv_cache_bytes{{use="{use}"}} {value}')
        gauge("dualpath_kv_cache_capacity_bytes", "KV cache size (all layers).", cache.bytes_total)
        used = cache.bytes_used_sequential + cache.bytes_used_random
        gauge("dualpath_kv_cache_usage_ratio", "Share of the KV cache held by running requests.",
              f"{used / cache.bytes_total if cache.bytes_total else 0.0:.6f}")
        gauge("dualpath_prefix_cache_hit_rate", "Prompt pages found in the prefix cache / pages looked up.",
              f"{cache.prefix_hit_rate:.6f}")
        gauge("dualpath_kv_forks_total", "Sequences forked from another's cache (n > 1 samples of a prompt).",
              cache.forks, kind="counter")
        gauge("dualpath_kv_forked_pages_total", "KV pages those forks share with their parent instead of copying.",
              cache.forked_pages, kind="counter")
        if disk is not None:  # the prefix cache on disk (cache/disk.py StoreStats)
            g.append("# HELP dualpath_prefix_disk_pages_total Prompt pages looked up on disk, by result.")
            g.append("# TYPE dualpath_prefix_disk_pages_total counter")
            g.append(f'dualpath_prefix_disk_pages_total{{result="hit"}} {disk.hit_pages}')
            g.append(f'dualpath_prefix_disk_pages_total{{result="miss"}} {disk.miss_pages}')
            g.append("# HELP dualpath_prefix_disk_bytes_total Bytes of KV pages read from and written to disk.")
            g.append("# TYPE dualpath_prefix_disk_bytes_total counter")
            g.append(f'dualpath_prefix_disk_bytes_total{{op="read"}} {disk.bytes_read}')
            g.append(f'dualpath_prefix_disk_bytes_total{{op="write"}} {disk.bytes_written}')
            gauge("dualpath_prefix_disk_dropped_total", "Page files found damaged and removed.", disk.dropped,
                  kind="counter")
            gauge("dualpath_prefix_disk_write_errors_total", "Page writes that failed (full disk, permissions).",
                  disk.write_errors, kind="counter")
        gauge("dualpath_power_profile", "The power profile in use (label).", 1, labels=f'{{profile="{profile}"}}')
        return "\n".join(g) + "\n"
