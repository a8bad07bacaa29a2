"""Load: 64 concurrent streaming clients against a live ``dualpath serve`` on loopback.

About 60 s of sending. Zero failed requests, and afterwards no running or waiting
request and no KV cache byte held. The latencies are printed (``-s``), never
asserted: ``dualpath bench load`` is where they are measured.
"""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def test_64_streaming_clients_all_succeed_and_free_every_block(gguf_path):
    from dualpath.bench.load import load_test

    r = load_test(str(gguf_path), clients=64, duration_s=60, max_tokens=48,
                  server_args=("--set", "runtime.max_num_seqs=16", "--set", "server.max_queued_requests=64",
                               "-t", "2"))
    print(f"\n64 clients, 60 s: {r['requests']} requests; TTFT p50 {r['ttft_p50_ms']:.0f} ms "
          f"p99 {r['ttft_p99_ms']:.0f} ms; TPOT p50 {r['tpot_p50_ms']:.1f} ms p99 {r['tpot_p99_ms']:.1f} ms")
    assert r["failures"] == 0, r["failure_examples"]
    assert r["requests"] >= 64  # every client finished at least one request
    assert r["running_after"] == 0 and r["waiting_after"] == 0
    assert r["kv_bytes_held_after"] == 0
    assert r["kv_bytes_free_or_cached_after"] == r["kv_capacity_bytes"]  # no block leaked
    assert r["generated_tokens"] > 0
