"""``dualpath bench prefix-restart``: time to first token of a request whose long prefix
was seen before the server was killed and restarted.

Per repeat, for each server, one after the other (never two at once):

* **DualPath**: ``dualpath serve --prefix-cache DIR`` with an empty DIR gets the request
  (its *cold* TTFT: the whole prompt is computed, its pages go to disk), then
  ``POST /v1/warm`` with the same prompt (it answers once the pages are written), then
  SIGKILL. A new ``dualpath serve`` on the same DIR gets the same request: its *restored*
  TTFT, the prompt tokens it reports cached, and whether its text equals the cold run's.
* **llama-server** (``--peer llama-server=PATH``): started with ``--slot-save-path``,
  the same request, then ``POST /slots/0?action=save``, SIGKILL, a new llama-server,
  ``POST /slots/0?action=restore``, the same request: whether the restore worked
  (``n_restored``), how many prompt tokens it computed again (``timings.prompt_n``), and
  its TTFT, counted from the restore call (DualPath reads its pages inside the request).

The prompt is token ids (the same for both servers): ``--prefix-tokens`` of plain
English text, then a short question. Medians over ``--repeats``. Page files are read
back from the OS page cache (they were just written), as after an app restart on a
phone that has not evicted them.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from .common import free_port, live_server, stream_completion, write_json

WORDS = ("the old keeper of the lighthouse wrote in his book every evening what the sea had done that day "
         "which ships had passed and how the wind had turned while the gulls slept on the rocks below").split()
QUESTION = "\n\nQuestion: what did the keeper write in his book? Answer:"


def build_prompt(tokenizer, prefix_tokens: int) -> tuple[list[int], int]:
    """(prompt ids, length of the shared prefix): about ``prefix_tokens`` tokens of text, then a question."""
    words: list[str] = []
    ids = tokenizer.encode("", add_bos=True)
    i = 0
    while len(ids) < prefix_tokens:
        words.extend(WORDS[(i * 5 + j) % len(WORDS)] for j in range(len(WORDS)))
        i += 1
        ids = tokenizer.encode(" ".join(words), add_bos=True)
    ids = ids[:prefix_tokens]
    return ids + tokenizer.encode(QUESTION, add_bos=False), len(ids)


def _log(log_dir: str | None, name: str, tag: str) -> str | None:
    return os.path.join(log_dir, f"{name}-{tag}.log") if log_dir else None


def _kill(server) -> None:
    """SIGKILL, as Android's low-memory killer ends an app: no shutdown, no flush."""
    server.proc.kill()
    server.proc.wait()


def dualpath_trial(args, prompt: list[int], store: str, log_dir: str | None, r: int) -> dict:
    import httpx

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "dualpath.cli", "serve", "--model", args.model, "--port", str(port),
            "-t", str(args.threads), "--ctx-size", str(args.ctx), "--prefix-cache", store, "--no-webui"]
    if args.kv_dtype:
        argv += ["--kv-dtype", args.kv_dtype]
    with live_server("dualpath", argv, base, 600, _log(log_dir, "dualpath", f"{r}-cold")) as server:
        cold = stream_completion(base, prompt, args.max_tokens)
        httpx.post(base + "/v1/warm", json={"prompt": prompt}, timeout=600).raise_for_status()
        _kill(server)
    t0 = time.perf_counter()
    with live_server("dualpath", argv, base, 600, _log(log_dir, "dualpath", f"{r}-restored")) as server:
        start_ms = (time.perf_counter() - t0) * 1e3
        again = stream_completion(base, prompt, args.max_tokens)
        _kill(server)
    cached = ((again["usage"] or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"cold_ttft_ms": cold["ttft_ms"], "restored_ttft_ms": again["ttft_ms"], "restart_ms": start_ms,
            "restored_tokens": cached, "recomputed_tokens": len(prompt) - (cached or 0),
            "same_text": cold["text"] == again["text"], "restore_worked": bool(cached)}


def _slot(base: str, action: str) -> dict:
    import httpx

    r = httpx.post(f"{base}/slots/0?action={action}", json={"filename": "prefix.bin"}, timeout=600)
    return r.json() if r.status_code == 200 else {"error": f"HTTP {r.status_code}: {r.text[:200]}"}


def llama_server_trial(args, path: str, prompt: list[int], slot_dir: str, log_dir: str | None, r: int) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    os.makedirs(slot_dir, exist_ok=True)
    argv = [path, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
            "-tb", str(args.threads), "-c", str(args.ctx), "--parallel", "1", "--slot-save-path", slot_dir]
    with live_server("llama-server", argv, base, 600, _log(log_dir, "llama-server", f"{r}-cold")) as server:
        cold = stream_completion(base, prompt, args.max_tokens)
        saved = _slot(base, "save")
        _kill(server)
    t0 = time.perf_counter()
    with live_server("llama-server", argv, base, 600, _log(log_dir, "llama-server", f"{r}-restored")) as server:
        start_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        restored = _slot(base, "restore")
        restore_ms = (time.perf_counter() - t1) * 1e3
        again = stream_completion(base, prompt, args.max_tokens)
        _kill(server)
    # The restore is a call of its own before the request: its time counts with the TTFT.
    return {"cold_ttft_ms": cold["ttft_ms"], "restored_ttft_ms": restore_ms + again["ttft_ms"],
            "restore_call_ms": restore_ms, "restart_ms": start_ms, "restored_tokens": restored.get("n_restored"),
            "saved_tokens": saved.get("n_saved"),
            "recomputed_tokens": (again["timings"] or {}).get("prompt_n"), "same_text": cold["text"] == again["text"],
            "restore_worked": bool(restored.get("n_restored")), "restore_error": restored.get("error")}


def _median(rows, key):
    vals = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(vals) if vals else None


def cmd_bench_prefix_restart(args) -> int:
    from ..models.store import ModelStore
    from ..tokenizer import build_tokenizer
    from .serve import parse_peer

    peer = parse_peer(args.peer) if args.peer else None
    spec = ModelStore().load(args.model)
    prompt, prefix = build_prompt(build_tokenizer(spec.tokenizer), args.prefix_tokens)
    if len(prompt) + args.max_tokens > args.ctx:
        from ..errors import DualPathError

        raise DualPathError(f"--ctx {args.ctx} cannot hold the {len(prompt)}-token prompt and {args.max_tokens} "
                            "generated tokens: raise --ctx or lower --prefix-tokens")
    print(f"{os.path.basename(args.model)}: a {len(prompt)}-token prompt ({prefix} shared + the question), "
          f"{args.threads} threads, {args.repeats} repeats", flush=True)
    runs: dict[str, list[dict]] = {"dualpath": [], "llama-server": []}
    for r in range(args.repeats):
        work = tempfile.mkdtemp(prefix="dualpath-prefix-restart-")
        try:
            row = dualpath_trial(args, prompt, os.path.join(work, "store"), args.server_logs, r)
            runs["dualpath"].append(row)
            print(f"  repeat {r + 1} dualpath: {json.dumps(row)}", flush=True)
            if peer:
                row = llama_server_trial(args, peer[1], prompt, os.path.join(work, "slots"), args.server_logs, r)
                runs["llama-server"].append(row)
                print(f"  repeat {r + 1} llama-server: {json.dumps(row)}", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| server | cold TTFT ms | restored TTFT ms | ratio | prompt tokens restored | recomputed | "
          "same text | restart to health ms |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    summary = {}
    for name, rows in runs.items():
        if not rows:
            continue
        cold, warm = _median(rows, "cold_ttft_ms"), _median(rows, "restored_ttft_ms")
        s = summary[name] = {"cold_ttft_ms": cold, "restored_ttft_ms": warm,
                             "ratio": warm / cold if cold and warm else None,
                             "restored_tokens": _median(rows, "restored_tokens"),
                             "recomputed_tokens": _median(rows, "recomputed_tokens"),
                             "same_text": all(row["same_text"] for row in rows),
                             "restart_ms": _median(rows, "restart_ms")}
        print(f"| {name} | {cold:.0f} | {warm:.0f} | {s['ratio']:.3f} | {s['restored_tokens']} | "
              f"{s['recomputed_tokens']} | {'yes' if s['same_text'] else 'no'} | {s['restart_ms']:.0f} |")
    write_json(args.json, {"model": args.model, "prompt_tokens": len(prompt), "prefix_tokens": prefix,
                           "threads": args.threads, "summary": summary, "runs": runs})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("prefix-restart", help="TTFT after a kill and restart for a prompt whose prefix was seen "
                                             "before (prefix cache on disk; llama-server's slot save/restore)")
    s.add_argument("-m", "--model", required=True, help="GGUF file")
    s.add_argument("--prefix-tokens", type=int, default=2000, help="tokens of the shared prefix")
    s.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    s.add_argument("--ctx", type=int, default=4096, help="context window of both servers")
    s.add_argument("--kv-dtype", choices=["f16", "f32", "q8"], help="DualPath's KV type (default: the config's)")
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-r", "--repeats", type=int, default=3)
    s.add_argument("--peer", metavar="llama-server=PATH", help="also run llama.cpp's llama-server at PATH")
    s.add_argument("--server-logs", metavar="DIR", help="keep each server run's stderr in DIR")
    s.add_argument("--json", help="also write every run as JSON here")
    s.set_defaults(func=cmd_bench_prefix_restart)
