"""Soak: a live ``dualpath serve`` on loopback under the mixed load for a bounded time.

``dualpath bench load --mix`` makes the load (bench/load.py's ``MIX``): streams read to the
end or cut mid-way, chats given up before their answer, ``n`` = 2 whole and streamed,
json_schema, embeddings, prompts over the context and malformed JSON. About 90 s by
default so CI stays short; ``DUALPATH_SOAK_SECONDS`` sets it, up to 600.

Afterwards: no 5xx and no unexpected answer, no traceback in the server's log, the cache's
``check_invariants`` clean at shutdown with no sequence held and every page free or
cached, and the server's RSS after warm-up grown by at most 5%. The figures are printed
(``-s``) so that a run can be quoted.
"""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

DEFAULT_S = 90.0
MAX_S = 600.0


def soak_seconds() -> float:
    raw = os.environ.get("DUALPATH_SOAK_SECONDS")
    if raw is None:
        return DEFAULT_S
    value = float(raw)
    if not 0 < value <= MAX_S:
        raise ValueError(f"DUALPATH_SOAK_SECONDS={raw} must be a number of seconds in (0, {MAX_S:g}]")
    return value


def test_a_soak_under_the_mixed_load_ends_clean_without_5xx_leaks_or_growth(gguf_path):
    from dualpath.bench.load import mixed_load_test

    pytest.importorskip("llguidance")
    seconds = soak_seconds()
    r = mixed_load_test(str(gguf_path), clients=16, duration_s=seconds, max_tokens=32,
                        server_args=("--set", "runtime.max_num_seqs=4", "--set", "runtime.max_context_tokens=256",
                                     "--set", "server.max_queued_requests=64", "--chat-template", "chatml",
                                     "-t", "2"))
    sent = ", ".join(f"{k} {v}" for k, v in sorted(r["sent"].items()))
    statuses = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
    growth = r["rss_growth_after_warmup"]
    print(f"\nsoak, 16 clients, {seconds:g} s ({r['wall_s']:.1f} s of sending): {r['requests']} requests ({sent})"
          f"\n  statuses: {statuses}; 5xx {r['server_errors']}; unexpected answers {r['failures']}; "
          f"tracebacks in the server's log {r['tracebacks_in_log']}"
          f"\n  server RSS {r['rss_warm_mb']:.1f} MiB after warm-up, {r['rss_end_mb']:.1f} MiB at the end "
          f"({growth * 100:+.2f}%); without the KV arena {r['rss_growth_after_warmup_without_kv'] or 0:+.2%}"
          f"\n  RSS over the run (s: MiB): {', '.join(f'{t:.0f}: {m:.1f}' for t, m, _ in r['rss_mb'][::15])}"
          f"\n  greedy output {'unchanged' if r['greedy_unchanged'] else 'CHANGED'}; step retries "
          f"{r['step_retries']:.0f}; at shutdown: {r['invariants']}")
    assert r["server_errors"] == 0 and r["failures"] == 0, r["failure_examples"]
    assert r["tracebacks_in_log"] == 0
    assert all(r["sent"].get(kind, 0) > 0 for kind in ("stream", "cut", "cancel", "chat_n", "chat_n_stream",
                                                       "embed", "json_schema", "bad_json", "too_long"))
    assert r["statuses"].get("400", 0) >= r["sent"]["bad_json"] + r["sent"]["too_long"]
    assert r["greedy_unchanged"], (r["greedy_before"], r["greedy_after"])
    assert r["running_after"] == 0 and r["waiting_after"] == 0 and r["kv_bytes_held_after"] == 0
    assert r["invariants_ok"], r["invariants"]
    held = re.search(r"\((\d+) sequences held, (\d+) of (\d+) pages free or cached\)", r["invariants"])
    assert held is not None, r["invariants"]
    sequences, free_pages, pages = map(int, held.groups())
    assert sequences == 0 and free_pages == pages, r["invariants"]  # no page leaked
    assert growth is not None and growth <= 0.05, [m for _, m, _ in r["rss_mb"]]
