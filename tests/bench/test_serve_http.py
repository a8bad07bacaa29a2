"""``dualpath bench serve --http`` and ``--peer llama-server=PATH``: the mixed schedule
goes over HTTP, from one streaming client, to ``dualpath serve`` (and to llama.cpp's
``llama-server`` beside it) on the built-in stories260K, with tiny settings. No
figure is asserted (2 shared cores); what is asserted is that every server got the
same requests, took every prompt as the same token ids and generated exactly
``max_tokens`` for each. The llama-server run needs a binary: set
``DUALPATH_LLAMA_SERVER`` to its path."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dualpath.bench.serve import llama_server_argv
from dualpath.cli import main
from dualpath.models import embedded_model_path

TINY = ["--requests", "4", "--rate", "100", "--ctx", "256", "--system-tokens", "16", "--doc-tokens", "96",
        "--doc-share", "0.5", "--max-num-seqs", "4", "-t", "1", "--set", "runtime.prefill_chunk_tokens=64"]


def llama_server_binary() -> str:
    path = os.environ.get("DUALPATH_LLAMA_SERVER") or shutil.which("llama-server")
    if not path:
        pytest.skip("no llama-server: set DUALPATH_LLAMA_SERVER to a llama-server binary (cmake -B build "
                    "-DLLAMA_BUILD_SERVER=ON && cmake --build build --target llama-server in llama.cpp)")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"DUALPATH_LLAMA_SERVER={path} is not an executable file")
    return path


def check_every_request_complete(runs: list[dict], num_requests: int) -> None:
    for run in runs:
        assert run["requests"] == num_requests and run["failures"] == 0, run["failure_examples"]
        assert run["short_outputs"] == 0 and run["prompt_mismatches"] == 0
        for r in run["per_request"]:
            assert r["error"] is None and r["tokens"] == r["max_tokens"] and r["prompt_tokens"] == r["prompt_len"]
            assert r["ttft"] > 0 and r["tpot"] > 0


def test_serve_over_http_streams_the_schedule_to_dualpath_serve(tmp_path, capsys):
    out = tmp_path / "serve.json"
    logs = tmp_path / "logs"
    assert main(["bench", "serve", "--http", "-m", embedded_model_path(), *TINY, "--json", str(out),
                 "--server-logs", str(logs)]) == 0
    assert [p.name for p in logs.iterdir()] == ["dualpath-dual-run1.log"]
    res = json.loads(out.read_text())
    assert res["transport"] == "http" and list(res["runs"]) == ["dualpath:dual"]
    check_every_request_complete(res["runs"]["dualpath:dual"], 4)
    command = res["commands"]["dualpath:dual"]
    for fragment in ("-m dualpath.cli serve", "-t 1", "runtime.max_num_seqs=4", "runtime.max_context_tokens=256",
                     "runtime.kv_cache_tokens=1024", "kv_cache.path_mode=dual",
                     "runtime.prefill_chunk_tokens=64"):
        assert fragment in command
    text = capsys.readouterr().out
    assert command in text and "over HTTP from one streaming client" in text


def test_peer_llama_server_gets_the_same_requests_and_generates_as_many_tokens(tmp_path, capsys):
    binary = llama_server_binary()
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--peer", f"llama-server={binary}", "-m", embedded_model_path(), *TINY,
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert list(res["runs"]) == ["dualpath:dual", "llama-server"]
    ours, peer = res["runs"]["dualpath:dual"], res["runs"]["llama-server"]
    check_every_request_complete(ours, 4)
    check_every_request_complete(peer, 4)

    def sent(run):
        return [(r["at"], r["kind"], r["prompt_len"], r["max_tokens"]) for r in run[0]["per_request"]]

    assert sent(ours) == sent(peer)
    command = res["commands"]["llama-server"]
    assert command.startswith(binary) and "-t 1 -tb 1 --parallel 4 -cb -c 1024" in command
    assert "dualpath:dual vs llama-server" in capsys.readouterr().out


def test_llama_server_command_has_the_same_model_threads_slots_and_kv_tokens():
    params = {"threads": 2, "max_num_seqs": 8, "kv_cache_tokens": 131072, "peer_args": ["-fa", "off"]}
    argv = llama_server_argv("/opt/llama-server", "/m.gguf", 8123, params, kv_unified=True)
    assert argv == ["/opt/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "8123", "-t", "2",
                    "-tb", "2", "--parallel", "8", "-cb", "-c", "131072", "--kv-unified", "-fa", "off"]
    assert "--kv-unified" not in llama_server_argv("/opt/llama-server", "/m.gguf", 1, params, kv_unified=False)
    # A file recording a shorter context than --ctx: llama-server would cap its slots there.
    longer = llama_server_argv("/opt/llama-server", "/m.gguf", 1, params, kv_unified=True,
                               context_override="llama.context_length=int:16384")
    assert longer[-4:] == ["--override-kv", "llama.context_length=int:16384", "-fa", "off"]


@pytest.mark.parametrize("peer, fragment", [
    ("llama-server", "expected NAME=PATH"),
    ("ollama=/bin/true", "expected NAME=PATH with NAME one of llama-server"),
    ("llama-server=/no/such/llama-server", "/no/such/llama-server is not an executable file"),
], ids=["no-path", "unknown-peer", "missing-binary"])
def test_a_bad_peer_is_an_error_naming_it_before_anything_starts(peer, fragment, tmp_path, capsys):
    never_read = tmp_path / "no-model-needed.gguf"
    assert main(["bench", "serve", "-m", str(never_read), "--peer", peer]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("dualpath: error: --peer ") and fragment in captured.err
    assert captured.out == ""
