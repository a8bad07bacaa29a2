"""``dualpath bench memory``: where every MiB goes, measured beside the memory plan.

Each run is a fresh process (``harness.run_worker``): it imports DualPath, loads the
model, prefills ``--ctx`` random tokens and decodes ``--decode``. The parts:

* ``runtime``: resident memory once Python, NumPy, ONNX Runtime and DualPath are imported;
* ``vocabulary``: what opening the model and building its tokenizer added (the spec's
  token strings, the tokenizer's tables);
* ``weights``: what creating the ONNX Runtime sessions added: their packed copies of the
  weights (the pages of the entry's files they packed from are given back); and the pages
  of the matrices our kernels read in place (a layer's matrices and the classifier in
  their form, ``Weight.kernel_form``, which the load maps: ``Entry.page_in``; an 8-bit
  classifier, ``ModelSpec.classifier_in_kernels``, which the first step maps);
* ``kv cache``: the KV arena's resident pages at the end (read from /proc/self/pagemap);
* ``activations``: the rest of what generating added (ONNX Runtime's buffers for a
  chunk, the step buffers);
* ``peak``: the process's high-water mark (VmHWM), beside the plan's total.

The process's mappings at the end are also summed by kind (/proc/self/smaps):
anonymous, the heap, the entry's weight files, libraries. ``--peer`` adds llama.cpp's
peak for the same file and context (bench e2e's run, flash attention off: llama-cpp-python's
default), in the environment of ``$DUALPATH_LLAMACPP_PYTHON`` else this one (``llamacpp.py``).
"""

from __future__ import annotations

import os

from . import llamacpp
from .common import interleaved, medians, random_prompt, write_json
from .harness import run_worker

TIMEOUT_S = 1800.0
PARTS = ("runtime", "vocabulary", "weights", "kv cache", "activations")


def _status_mb(key: str) -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _mapped_kinds() -> dict[str, float]:
    """Resident MiB by kind of mapping, from /proc/self/smaps."""
    kinds = {"anonymous": 0.0, "heap": 0.0, "weight files": 0.0, "libraries": 0.0, "other": 0.0}
    kind = "other"
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split(None, 5)
            if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:
                name = head[5].strip() if len(head) > 5 else ""
                kind = ("anonymous" if not name else "heap" if name == "[heap]"
                        else "weight files" if name.endswith((".bin", ".gguf")) else
                        "libraries" if ".so" in os.path.basename(name) else "other")
            elif line.startswith("Rss:"):
                kinds[kind] += int(line.split()[1]) / 1024
    return kinds


def resident_bytes(address: int, nbytes: int) -> int:
    """Bytes of [address, address + nbytes) mapped in this process (pagemap bit 63)."""
    import numpy as np

    page = os.sysconf("SC_PAGE_SIZE")
    first, count = address // page, -(-(address + nbytes) // page) - address // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read(count * 8), np.uint64)
    return int((entries >> np.uint64(63)).sum()) * page


def worker(model: str, ctx: int, decode: int, threads: int, chunk: int) -> dict:
    """One measurement (see the module docstring)."""
    import numpy  # noqa: F401  (imported before the runtime figure, as the load needs it)
    import onnxruntime  # noqa: F401

    from ..config import load_config
    from ..executor.memory_plan import MiB, plan_memory
    from ..llm import LLM, resident_mb
    from ..models import read_layout
    from ..sampling_params import SamplingParams

    imported = resident_mb() or 0.0
    cfg = load_config(None, {"runtime.num_threads": threads, "runtime.max_context_tokens": ctx + decode + 1,
                             "runtime.prefill_chunk_tokens": chunk})
    m, layout, merges = read_layout(model)
    plan = plan_memory(m, layout, merges, cfg, ctx + decode + 1)
    llm = LLM(model, cfg)
    rss = llm.load_stats["rss_mb"]
    loaded = resident_mb() or 0.0
    llm.generate(random_prompt(llm.spec.config.vocab_size, ctx),
                 SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True))
    arena = llm.cache.arena
    kv = resident_bytes(arena.address, arena.nbytes) / MiB
    # An 8-bit classifier is mapped by the first step, after "sessions" (the kernels' form
    # is mapped by the load).
    spec = llm.spec
    read = [a for a in (spec.output.data, spec.output.scales) if a is not None] \
        if spec.classifier_in_kernels and not spec.output.kernel_form else []
    in_place = sum(int(resident_bytes(a.ctypes.data, a.nbytes)) for a in read) / MiB
    measured = {"runtime": imported, "vocabulary": rss["tokenizer"] - rss["start"],
                "weights": rss["sessions"] - rss["tokenizer"] + in_place, "kv cache": kv,
                "activations": (resident_mb() or 0.0) - loaded - kv - in_place}
    return {"measured": measured, "plan": {k: v / MiB for k, v in plan.parts.items()},
            "peak_rss_mb": _status_mb("VmHWM"), "plan_mb": plan.total / MiB, "end_rss_mb": resident_mb(),
            "kinds": _mapped_kinds()}


LLAMA_CPP_SETTING = "FA off"
"""llama.cpp's flash attention setting here: llama-cpp-python's default."""


def _llama_cpp_peak(peer: llamacpp.LlamaCppPeer, model: str, ctx: int, decode: int, threads: int,
                    chunk: int) -> dict:
    from .e2e import llama_cpp_inputs

    return peer.measure(model, **llama_cpp_inputs(peer, model, ctx, decode), decode=decode, threads=threads,
                        chunk=chunk, setting=LLAMA_CPP_SETTING)


def _llama_cpp_peer() -> llamacpp.LlamaCppPeer:
    try:
        return llamacpp.probe(llamacpp.default_python())
    except llamacpp.Unavailable as e:
        raise llamacpp.PeerError(f"--peer: {e}") from None


def cmd_bench_memory(args) -> int:
    kw = {"model": args.model, "ctx": args.ctx, "decode": args.decode, "threads": args.threads, "chunk": args.chunk}
    peer = _llama_cpp_peer() if args.peer else None
    variants = ["dualpath"] + (["llama.cpp"] if args.peer else [])
    runs = interleaved(variants, args.repeats, lambda v: run_worker(worker, kw, timeout_s=TIMEOUT_S)
                       if v == "dualpath" or peer is None else _llama_cpp_peak(peer, **kw))
    ours = runs["dualpath"]
    print(f"{os.path.basename(args.model)}: prompt {args.ctx} tokens, {args.decode} decoded, {args.threads} threads, "
          f"median of {len(ours)} runs")
    print(f"{'part':<14} {'plan MiB':>9} {'measured MiB':>13}")
    for part in PARTS:
        got = medians([r["measured"] for r in ours], (part,))[part]
        print(f"{part:<14} {ours[0]['plan'][part]:>9.1f} {got:>13.1f}")
    peak = medians(ours, ("peak_rss_mb", "plan_mb"))
    print(f"{'peak':<14} {peak['plan_mb']:>9.1f} {peak['peak_rss_mb']:>13.1f}   "
          f"(plan / measured: {peak['plan_mb'] / peak['peak_rss_mb']:.2f})")
    kinds = medians([r["kinds"] for r in ours], tuple(ours[0]["kinds"]))
    print("resident at the end, by mapping: " + ", ".join(f"{k} {v:,.1f}" for k, v in kinds.items()) + " MiB")
    if args.peer:
        theirs = medians(runs["llama.cpp"], ("peak_rss_mb",))["peak_rss_mb"]
        print(f"llama.cpp peak RSS ({LLAMA_CPP_SETTING}): {theirs:,.1f} MiB (ours / llama.cpp: "
              f"{peak['peak_rss_mb'] / theirs:.2f})")
        if peer is not None:
            llamacpp.print_build(peer)
    if args.json:
        write_json(args.json, runs)
    return 0


def add_parser(bs) -> None:
    p = bs.add_parser("memory", help="where every MiB goes (runtime, vocabulary, weights, KV cache, activations), "
                                     "measured beside the memory plan")
    p.add_argument("-m", "--model", required=True, help="a GGUF file or llama2.c checkpoint")
    p.add_argument("--ctx", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--decode", type=int, default=64, help="tokens decoded after the prompt (default 64)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk (default 512)")
    p.add_argument("-r", "--repeats", type=int, default=1)
    p.add_argument("--peer", action="store_true", help="also llama.cpp's peak RSS (llama-cpp-python), same file")
    p.add_argument("--json", help="also write every run as JSON here")
    p.set_defaults(func=cmd_bench_memory)
