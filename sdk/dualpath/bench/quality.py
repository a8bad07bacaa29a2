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
(``harness.run_worker``; llama.cpp's in the environment of ``--peer-python``,
``llamacpp.py``); its logits go through a ``.npy`` file. Deterministic: one run is the figure.

llama.cpp runs the file twice, flash attention off and on (``llama.cpp FA off``, ``llama.cpp
FA on``), and both rows are reported: they are two arithmetics (flash attention's kernel
accumulates in its own order and precision), each what some users get (llama-cpp-python's
default is off, llama-server's is on), and the cost is one more deterministic run. A
"better of the two" would hide which one a reader's llama.cpp runs; the report names the
closer. The exact model's llama.cpp run keeps flash attention off (``EXACT_SETTING``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from importlib import resources

import numpy as np

from . import llamacpp
from .common import write_json
from .harness import run_worker

TIMEOUT_S = 3600.0
MIN_TOKENS = 2
CONTEXT_SLACK = 8
"""Positions below the model's trained context that the text may take (the contexts are
``len(ids) + CONTEXT_SLACK``)."""
EXACT_SETTING = "FA off"
"""llama.cpp's flash attention setting for the exact model: llama-cpp-python's default, the
setting of every earlier report, so that the reference stays the same."""


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


def logits_worker(model: str, ids: list[int], out: str, kv: str, threads: int, overrides: dict | None = None) -> dict:
    """DualPath's teacher-forced logits (len(ids) - 1, vocab) predicting ids[1:], saved to ``out``
    (llama.cpp's: ``_llamacpp_worker.logits``).

    ``kv``: "default" (f16) or "f32"; ``overrides``: config keys (the exact model's run turns
    the model cache off: no 4-byte copy kept)."""
    from ..config import load_config
    from ..llm import LLM
    from .kv_quality import teacher_forced

    o: dict[str, object] = {"runtime.max_context_tokens": len(ids) + CONTEXT_SLACK, "runtime.num_threads": threads}
    if kv != "default":
        o["kv_cache.kv_dtype"] = kv
    o.update(overrides or {})
    llm = LLM(model, load_config(None, o))
    logits = teacher_forced(llm.runner, ids, 1)
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


def measure_quality(model: str, text: str | None = None, threads: int = 2,
                    llama: llamacpp.LlamaCppPeer | None = None, overrides: dict | None = None,
                    workdir: str | None = None) -> dict:
    """Every engine's distance from the exact model of ``model`` (module docstring); llama.cpp
    too, with flash attention off and on, when ``llama`` is given. ``overrides``: DualPath
    config keys for its run of ``model`` (not the exact model's)."""
    text = default_text() if text is None else text
    engines = ["dualpath"] + (llamacpp.variants() if llama else [])
    with tempfile.TemporaryDirectory(prefix="dualpath-quality-", dir=workdir) as tmp:
        tok = run_worker(tokenize_worker, {"model": model, "text": text}, timeout_s=TIMEOUT_S)
        ids = tok["ids"][:tok["context"] - CONTEXT_SLACK]  # both engines refuse more than the trained context
        if len(ids) < MIN_TOKENS:
            raise ValueError(f"the text is {len(ids)} token(s); at least {MIN_TOKENS} are needed")
        exact = dequantized_copy(model, os.path.join(tmp, "exact-f32.gguf"))
        logits = {}

        def run(name: str, path: str, kv: str, o: dict | None = None, setting: str | None = None) -> None:
            out = os.path.join(tmp, name.replace(" ", "_").replace(".", "") + ".npy")
            if setting is None:
                run_worker(logits_worker, {"model": path, "ids": ids, "out": out, "kv": kv, "threads": threads,
                                           "overrides": o}, timeout_s=TIMEOUT_S)
            else:
                assert llama is not None  # a setting is given only with the peer
                llama.logits(path, ids, out, len(ids) + CONTEXT_SLACK, kv == "f32", threads, setting)
            logits[name] = np.load(out)

        run("exact (dualpath)", exact, "f32", {"model_cache.enabled": False})
        run("dualpath", model, "default", overrides)
        if llama:
            run(f"exact ({llamacpp.ENGINE})", exact, "f32", setting=EXACT_SETTING)
            for variant in llamacpp.variants():
                run(variant, model, "default", setting=llamacpp.setting_of(variant))
    targets = np.asarray(ids[1:])
    refs = ["exact (dualpath)"] + ([f"exact ({llamacpp.ENGINE})"] if llama else [])
    res = {"model": model, "tokens": len(ids), "text_tokens": len(tok["ids"]), "scored": len(ids) - 1,
           "engines": engines, "references": refs,
           "rows": {e: {r: compare(logits[r], logits[e], targets) for r in refs} for e in engines}}
    if llama:
        res["references_agree"] = compare(logits[refs[0]], logits[refs[1]], targets)
        res["exact_setting"] = EXACT_SETTING
        res["llama_cpp_python"], res["build"] = llama.version, llama.system_info
    return res


def format_report(res: dict) -> str:
    cut = f" (the first {res['tokens']} of {res['text_tokens']}: the model's context)" \
        if res["tokens"] < res["text_tokens"] else ""
    lines = [f"{os.path.basename(res['model'])}: {res['tokens']} tokens of text{cut}, {res['scored']} positions "
             f"scored (teacher-forced); exact model = the file dequantized to F32 by gguf-py, f32 KV cache"]
    w = max([10] + [len(e) for e in res["engines"]])
    head = f"{'engine':<{w}}"
    for r in res["references"]:
        head += f" | {'against ' + r:<38}"
    lines.append(head + " | ppl")
    lines.append(f"{'':<{w}}" + " | mean KL    p99 KL     max KL    top-1" * len(res["references"]) + " |")
    for e in res["engines"]:
        line = f"{e:<{w}}"
        for r in res["references"]:
            c = res["rows"][e][r]
            line += f" | {c['mean_kl']:<10.6f}{c['p99_kl']:<10.5f}{c['max_kl']:<10.5f}{c['top1']:>6.1%}"
        lines.append(line + f" | {next(iter(res['rows'][e].values()))['ppl']:.3f}")
    if "references_agree" in res:
        c = res["references_agree"]
        lines.append(f"the two exact runs against each other: mean KL {c['mean_kl']:.2e}, top-1 {c['top1']:.1%} "
                     f"(llama.cpp's with flash attention {res['exact_setting'].split()[-1]})")
        ours = res["references"][0]
        kl = {str(llamacpp.setting_of(e)): res["rows"][e][ours]["mean_kl"] for e in res["engines"]
              if llamacpp.setting_of(e)}
        closer = min(kl, key=lambda s: kl[s])
        lines.append(f"llama.cpp is closer to the exact model with {closer} (mean KL against {ours}: " +
                     ", ".join(f"{setting} {v:.6f}" for setting, v in kl.items()) + ")")
        lines.append(f"llama.cpp peer: llama-cpp-python {res['llama_cpp_python']}; its build: {res['build']}")
    return "\n".join(lines)


def cmd_bench_quality(args) -> int:
    from ..models import resolve_model

    model, _ = resolve_model(args.model)
    text = None
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    llama = None
    if args.peer:
        try:
            llama = llamacpp.probe(args.peer_python or llamacpp.default_python())
        except llamacpp.Unavailable as e:
            raise llamacpp.PeerError(f"the llama.cpp peer: {e}") from None
        llamacpp.print_build(llama, sys.stderr)  # its problems before the runs, and again in the report
    res = measure_quality(model, text, args.threads, llama)
    print(format_report(res))
    if llama is not None:
        for line in llama.warnings():
            print(f"WARNING: {line}")
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    q = bs.add_parser("quality", help="KL divergence and top-1 agreement of DualPath and llama.cpp against the "
                                      "file's exact (F32-dequantized) model, teacher-forced over a text")
    q.add_argument("-m", "--model", required=True, help="a GGUF file")
    q.add_argument("--text", help="a UTF-8 text file to read (default: a built-in 273-word passage)")
    q.add_argument("-t", "--threads", type=int, default=2)
    q.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                   help="also llama.cpp (llama-cpp-python) on the same file, flash attention off and on "
                        "(default on)")
    q.add_argument("--peer-python", metavar="PATH",
                   help="interpreter of an environment whose llama-cpp-python is the llama.cpp to compare with "
                        f"(default: ${llamacpp.PYTHON_ENV}, else this one); {llamacpp.SETUP_SCRIPT} builds one")
    q.add_argument("--json")
    q.set_defaults(func=cmd_bench_quality)
