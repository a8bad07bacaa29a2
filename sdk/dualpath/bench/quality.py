"""``dualpath bench quality``: how far each engine runs a quantized file from its exact model.

The exact model is the file with every tensor dequantized to F32 by gguf-py (the format's
reference code) and run with an f32 KV cache. Each engine reads the same text (a built-in
passage of English prose, or ``--text``), teacher-forced: one pass over its tokens gives the
logits predicting every token after the first. Per engine, against the exact model:

* ``mean_kl``: the mean over positions of KL(exact || engine), in nats, as
  llama.cpp's ``llama-perplexity --kl-divergence`` reports it; ``p99_kl``, ``max_kl``;
* ``top1``: the share of positions where both pick the same most likely token;
* ``ppl``: the engine's perplexity on the text.

The exact model is run by both engines (DualPath and llama.cpp on the F32 copy, f32 KV),
and every engine is compared with both, so neither engine's own arithmetic is the yardstick;
the two references' distance from each other is reported too. Each run is a fresh process
(``harness.run_worker``); its logits go through a ``.npy`` file. Deterministic: one run is
the figure.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from importlib import resources

import numpy as np

from .common import write_json
from .harness import run_worker

TIMEOUT_S = 3600.0
MIN_TOKENS = 2
CONTEXT_SLACK = 8
"""Positions below the model's trained context that the text may take (the contexts are
``len(ids) + CONTEXT_SLACK``)."""
GGML_TYPE_F32 = 0
"""llama.cpp's ``type_k`` / ``type_v`` for an f32 KV cache."""


def default_text() -> str:
    """The built-in passage (sdk/dualpath/data/quality_text.txt): 273 words of prose."""
    return resources.files("dualpath").joinpath("data/quality_text.txt").read_text(encoding="utf-8")


def dequantized_copy(src: str, dst: str, drop: tuple[str, ...] = ()) -> str:
    """``src`` with every tensor dequantized to F32 by gguf-py (metadata unchanged but the
    file type), without the tensors named in ``drop``."""
    import gguf

    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        sub_type = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type)
    w.add_file_type(0)
    for t in reader.tensors:
        if t.name in drop:
            continue
        w.add_tensor(t.name, gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def tokenize_worker(model: str, text: str) -> dict:
    """The text's ids as DualPath tokenizes it for this model (BOS as the model says), and
    the model's trained context."""
    from ..config import load_config
    from ..llm import LLM

    llm = LLM(model, load_config(None, {"runtime.max_context_tokens": 64}))
    return {"ids": llm.tokenize(text), "context": llm.spec.config.context_length}


def logits_worker(engine: str, model: str, ids: list[int], out: str, kv: str, threads: int,
                  overrides: dict | None = None) -> dict:
    """Teacher-forced logits (len(ids) - 1, vocab) predicting ids[1:], saved to ``out``.

    ``kv``: "default" (each engine's own: f16 for both) or "f32"; ``overrides``: DualPath
    config keys (the exact model's run turns the model cache off: no 4-byte copy kept)."""
    if engine == "dualpath":
        from ..config import load_config
        from ..llm import LLM
        from .kv_quality import teacher_forced

        o = {"runtime.max_context_tokens": len(ids) + CONTEXT_SLACK, "runtime.num_threads": threads}
        if kv != "default":
            o["dualpath_config.kv_dtype"] = kv
        o.update(overrides or {})
        llm = LLM(model, load_config(None, o))
        logits = teacher_forced(llm.runner, ids, 1)
    elif engine == "llama.cpp":
        import llama_cpp

        kw = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if kv == "f32" else {}
        llm = llama_cpp.Llama(model, n_ctx=len(ids) + CONTEXT_SLACK, n_threads=threads, n_threads_batch=threads,
                              logits_all=True, verbose=False, **kw)
        llm.eval(ids[:-1])
        logits = np.array(llm.scores[:len(ids) - 1], dtype=np.float32)
        llm.close()
    else:
        raise ValueError(f"unknown engine {engine!r}: dualpath or llama.cpp")
    np.save(out, logits.astype(np.float32, copy=False))
    return {"shape": list(logits.shape)}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def compare(ref: np.ndarray, test: np.ndarray, targets: np.ndarray, rows: int = 64) -> dict:
    """KL(ref || test) per position, top-1 agreement, and test's perplexity on ``targets``
    (the ids each row predicts); ``rows`` positions at a time (float64 over the vocabulary)."""
    if ref.shape != test.shape or len(targets) != len(ref):
        raise ValueError(f"logits of shapes {ref.shape} and {test.shape} for {len(targets)} targets")
    kl, nll = np.empty(len(ref)), np.empty(len(ref))
    for i in range(0, len(ref), rows):
        lp, lq = _log_softmax(ref[i:i + rows]), _log_softmax(test[i:i + rows])
        kl[i:i + rows] = (np.exp(lp) * (lp - lq)).sum(axis=1)
        nll[i:i + rows] = -lq[np.arange(len(lq)), targets[i:i + rows]]
    return {"mean_kl": float(kl.mean()), "p99_kl": float(np.percentile(kl, 99)), "max_kl": float(kl.max()),
            "top1": float(np.mean(ref.argmax(1) == test.argmax(1))), "ppl": float(np.exp(nll.mean()))}


def measure_quality(model: str, text: str | None = None, threads: int = 2, peer: bool = True,
                    overrides: dict | None = None, workdir: str | None = None) -> dict:
    """Every engine's distance from the exact model of ``model`` (module docstring).
    ``overrides``: DualPath config keys for its run of ``model`` (not the exact model's)."""
    text = default_text() if text is None else text
    engines = ["dualpath"] + (["llama.cpp"] if peer else [])
    with tempfile.TemporaryDirectory(prefix="dualpath-quality-", dir=workdir) as tmp:
        tok = run_worker(tokenize_worker, {"model": model, "text": text}, timeout_s=TIMEOUT_S)
        ids = tok["ids"][:tok["context"] - CONTEXT_SLACK]  # both engines refuse more than the trained context
        if len(ids) < MIN_TOKENS:
            raise ValueError(f"the text is {len(ids)} token(s); at least {MIN_TOKENS} are needed")
        exact = dequantized_copy(model, os.path.join(tmp, "exact-f32.gguf"))
        logits = {}

        def run(name: str, engine: str, path: str, kv: str, o: dict | None) -> None:
            out = os.path.join(tmp, name.replace(" ", "_").replace(".", "") + ".npy")
            run_worker(logits_worker, {"engine": engine, "model": path, "ids": ids, "out": out, "kv": kv,
                                       "threads": threads, "overrides": o}, timeout_s=TIMEOUT_S)
            logits[name] = np.load(out)

        for engine in engines:
            run(f"exact ({engine})", engine, exact, "f32", {"model_cache.enabled": False})
            run(engine, engine, model, "default", overrides if engine == "dualpath" else None)
    targets = np.asarray(ids[1:])
    refs = [f"exact ({e})" for e in engines]
    res = {"model": model, "tokens": len(ids), "text_tokens": len(tok["ids"]), "scored": len(ids) - 1,
           "engines": engines, "references": refs,
           "rows": {e: {r: compare(logits[r], logits[e], targets) for r in refs} for e in engines}}
    if peer:
        res["references_agree"] = compare(logits[refs[0]], logits[refs[1]], targets)
    return res


def format_report(res: dict) -> str:
    cut = f" (the first {res['tokens']} of {res['text_tokens']}: the model's context)" \
        if res["tokens"] < res["text_tokens"] else ""
    lines = [f"{os.path.basename(res['model'])}: {res['tokens']} tokens of text{cut}, {res['scored']} positions "
             f"scored (teacher-forced); exact model = the file dequantized to F32 by gguf-py, f32 KV cache"]
    head = f"{'engine':<10}"
    for r in res["references"]:
        head += f" | {'against ' + r:<38}"
    lines.append(head + " | ppl")
    lines.append(f"{'':<10}" + " | mean KL    p99 KL     max KL    top-1" * len(res["references"]) + " |")
    for e in res["engines"]:
        line = f"{e:<10}"
        for r in res["references"]:
            c = res["rows"][e][r]
            line += f" | {c['mean_kl']:<10.6f}{c['p99_kl']:<10.5f}{c['max_kl']:<10.5f}{c['top1']:>6.1%}"
        lines.append(line + f" | {next(iter(res['rows'][e].values()))['ppl']:.3f}")
    if "references_agree" in res:
        c = res["references_agree"]
        lines.append(f"the two exact runs against each other: mean KL {c['mean_kl']:.2e}, top-1 {c['top1']:.1%}")
    return "\n".join(lines)


def cmd_bench_quality(args) -> int:
    from ..models import resolve_model

    model, _ = resolve_model(args.model)
    text = None
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    res = measure_quality(model, text, args.threads, args.peer)
    print(format_report(res))
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    q = bs.add_parser("quality", help="KL divergence and top-1 agreement of DualPath and llama.cpp against the "
                                      "file's exact (F32-dequantized) model, teacher-forced over a text")
    q.add_argument("-m", "--model", required=True, help="a GGUF file")
    q.add_argument("--text", help="a UTF-8 text file to read (default: a built-in 273-word passage)")
    q.add_argument("-t", "--threads", type=int, default=2)
    q.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                   help="also llama.cpp (llama-cpp-python) on the same file (default on)")
    q.add_argument("--json")
    q.set_defaults(func=cmd_bench_quality)
