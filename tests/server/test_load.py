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


def test_a_mixed_load_with_n_samples_gets_no_5xx_and_leaves_the_cache_consistent(gguf_path):
    # 16 clients over 4 sequence slots for 30 s: n = 2 chats (forks), streams cut mid-way,
    # embeddings, json_schema, malformed JSON and prompts over the context, at random.
    from dualpath.bench.load import mixed_load_test

    pytest.importorskip("llguidance")
    r = mixed_load_test(str(gguf_path), clients=16, duration_s=30, max_tokens=32,
                        server_args=("--set", "runtime.max_num_seqs=4", "--set", "runtime.max_context_tokens=256",
                                     "--set", "server.max_queued_requests=64", "--chat-template", "chatml",
                                     "-t", "2"))
    print(f"\nmixed load, 16 clients, 30 s: {r['requests']} requests {r['sent']}; statuses {r['statuses']}; "
          f"RSS {r['rss_warm_mb']:.0f} -> {r['rss_end_mb']:.0f} MiB")
    assert r["server_errors"] == 0 and r["failures"] == 0, r["failure_examples"]
    assert all(r["sent"].get(kind, 0) > 10 for kind in ("chat_n", "chat_n_stream", "cut", "embed", "json_schema"))
    assert r["statuses"].get("400", 0) >= r["sent"]["bad_json"] + r["sent"]["too_long"]
    assert r["tracebacks_in_log"] == 0
    assert r["greedy_unchanged"], (r["greedy_before"], r["greedy_after"])
    assert r["invariants_ok"], r["invariants"]
    assert r["running_after"] == 0 and r["waiting_after"] == 0 and r["kv_bytes_held_after"] == 0
