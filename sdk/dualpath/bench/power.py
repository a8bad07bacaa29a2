"""``dualpath bench power``: CPU-seconds per generated token and tokens/s per power
profile, side by side in one run. Each measurement is a fresh process
(``harness.run_worker``): ONNX Runtime's pinned per-session pools cannot share a
process with its global pool.

``--threads-sweep``: decode tokens/s and CPU-seconds per token for 1..N threads on each
core class of a topology, N being the class's cores there. A fixture topology (the fake
sysfs trees of tests/platform, ``SWEEP_TOPOLOGIES``) is mapped onto this machine: a class
of k cores runs on this machine's first min(k, usable) CPUs, declared as the only class
(``power.cpu_classes``), one class per process. Up to the CPUs mapped, the engine runs as
it does on a phone (threads pinned by the governor, placement read back); beyond them the
process is confined to those CPUs and runs more threads than it has cores, unpinned: what
a phone does when its pins are ignored and the thread count is not lowered.
"""

from __future__ import annotations

import time

from .common import cpu_seconds, interleaved, medians, model_or_default, random_prompt, write_json
from .harness import run_worker

PROFILES = ("performance", "low_power")
TIMEOUT_S = 900.0
"""Wall-clock limit of one measurement."""

SWEEP_TOPOLOGIES: dict[str, tuple[tuple[str, int], ...]] = {
    "snapdragon_8gen2": (("prime", 1), ("big", 4), ("little", 3)),
    "dimensity_9300": (("prime", 1), ("big", 3), ("little", 4)),
    "rk3588": (("big", 4), ("little", 4)),
    "exynos_4plus4": (("big", 4), ("little", 4)),
    "rk3399_cpu5_offline": (("big", 1), ("little", 4)),
    "intel_i7_1260p": (("big", 4), ("little", 8)),
    "x86_vm": (("all", 4),),
}
"""(class, physical cores) of each fixture topology in tests/platform/fixtures, biggest
first (tests/platform/test_placement.py keeps them equal to what read_topology finds)."""


def worker(model: str, profile: str, cpu_classes: str, prompt_tokens: int, tokens: int) -> dict:
    """One measurement: a warm-up, then ``prompt_tokens`` prefilled and ``tokens``
    generated under ``profile``; CPU time of the whole process per generated token."""
    from ..config import load_config
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    overrides = {"power.profile": profile, "runtime.max_context_tokens": prompt_tokens + tokens + 16}
    if cpu_classes:
        overrides["power.cpu_classes"] = cpu_classes
    llm = LLM(model, load_config(None, overrides))
    prompt = random_prompt(llm.spec.config.vocab_size, prompt_tokens)
    llm.generate(prompt[:8], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    cpu1, t1 = cpu_seconds(), time.perf_counter()
    plan = llm.runner.last_plan
    return {"cpu_s_per_token": (cpu1 - cpu0) / c.usage.completion_tokens,
            "decode_tps": c.timings.decode_tokens_per_s, "prefill_tps": c.timings.prefill_tokens_per_s,
            "wall_s": t1 - t0,
            "plan": None if plan is None else {"profile": plan.profile, "prefill": list(plan.prefill.cpus),
                                               "decode": list(plan.decode.cpus), "spinning": plan.spinning}}


def run_power_bench(model: str, profiles=PROFILES, cpu_classes: str = "0:big,1:little",
                    prompt_tokens: int = 256, tokens: int = 128, repeats: int = 3) -> list[dict]:
    """One row per profile: medians of ``repeats`` interleaved runs."""
    def measure(profile: str) -> dict:
        return run_worker(worker, {"model": model, "profile": profile, "cpu_classes": cpu_classes,
                                   "prompt_tokens": prompt_tokens, "tokens": tokens}, timeout_s=TIMEOUT_S)

    return [{"profile": profile, **medians(s, ("cpu_s_per_token", "decode_tps", "prefill_tps")),
             "plan": s[0]["plan"], "runs": len(s)}
            for profile, s in interleaved(profiles, repeats, measure).items()]


def cmd_bench_power(args) -> int:
    if args.threads_sweep:
        return cmd_threads_sweep(args)
    model = model_or_default(args.model)
    args.prompt, args.tokens, args.repeats = args.prompt or 256, args.tokens or 128, args.repeats or 3
    rows = run_power_bench(model, cpu_classes=args.cpu_classes, prompt_tokens=args.prompt, tokens=args.tokens,
                           repeats=args.repeats)
    print(f"{model}: prompt {args.prompt} tokens, {args.tokens} generated, cpu classes "
          f"{args.cpu_classes or '(from sysfs)'}; median of {args.repeats} interleaved runs")
    print(f"{'profile':<12} {'CPU ms/token':>13} {'decode tok/s':>13} {'prefill tok/s':>14}  plan")
    for r in rows:
        p = r["plan"] or {}
        print(f"{r['profile']:<12} {r['cpu_s_per_token'] * 1e3:>13.2f} {r['decode_tps']:>13.1f} "
              f"{r['prefill_tps']:>14.1f}  prefill cpus {p.get('prefill')}, decode cpus {p.get('decode')}, "
              f"spinning {p.get('spinning')}")
    write_json(args.json, rows)
    return 0


def add_parser(bs) -> None:
    p = bs.add_parser("power", help="CPU-seconds per token and tokens/s per power profile, or per thread count "
                                    "and core class (--threads-sweep)")
    p.add_argument("-m", "--model", help="GGUF (default: synth:stories15M, random weights; with --threads-sweep "
                                         "the built-in stories260K)")
    p.add_argument("--cpu-classes", default="0:big,1:little",
                   help="topology override (default declares cpu0 big, cpu1 little); '' = read sysfs")
    p.add_argument("--prompt", type=int, help="prompt tokens (default 256; 8 with --threads-sweep)")
    p.add_argument("--tokens", type=int, help="generated tokens (default 128; 32 with --threads-sweep)")
    p.add_argument("-r", "--repeats", type=int, help="interleaved repeats (default 3; 1 with --threads-sweep)")
    p.add_argument("--threads-sweep", action="store_true",
                   help="decode tok/s and CPU time per token for 1..N threads on each core class of --topology")
    p.add_argument("--topology", default="snapdragon_8gen2",
                   help=f"for --threads-sweep: a fixture ({', '.join(SWEEP_TOPOLOGIES)}) mapped onto this "
                        "machine's cores, or 'machine' (this machine's classes, --cpu-classes applies)")
    p.add_argument("--json")
    p.set_defaults(func=cmd_bench_power)


# -- threads sweep --------------------------------------------------------------

def sweep_classes(topology: str, cpu_classes: str = "") -> list[tuple[str, int, tuple[int, ...]]]:
    """``(class, cores in the topology, CPUs of this machine it runs on)`` per class.
    ``topology``: a ``SWEEP_TOPOLOGIES`` name, mapped onto this machine's first usable CPUs
    (classes run one at a time, so they may share CPUs), or ``machine``: this machine's
    own classes (``cpu_classes`` overrides them), one CPU per physical core."""
    import os

    if topology == "machine":
        from ..platform import load_topology

        topo = load_topology(cpu_classes)
        allowed = os.sched_getaffinity(0)
        out = [(c.name, len(c.cores), tuple(x for x in c.cores if x in allowed)) for c in topo.classes]
        return [row for row in out if row[2]]
    if topology not in SWEEP_TOPOLOGIES:
        raise ValueError(f"--topology {topology!r} must be 'machine' or one of {', '.join(SWEEP_TOPOLOGIES)}")
    usable = tuple(sorted(os.sched_getaffinity(0)))
    return [(name, cores, usable[:min(cores, len(usable))]) for name, cores in SWEEP_TOPOLOGIES[topology]]


def sweep_worker(model: str, cpus: list[int], threads: int, prompt_tokens: int, tokens: int) -> dict:
    """One point of the sweep: this process confined to ``cpus`` (threads started later
    inherit it), ``threads`` intra-op threads; pinned by the governor when there are at
    least as many CPUs as threads, else unpinned (oversubscribed)."""
    from ..platform import pin_current_thread, thread_placement
    from ..platform.topology import format_cpulist

    pin_current_thread(cpus)
    from ..config import load_config
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    pinned = threads <= len(cpus)
    overrides: dict[str, object] = {"runtime.max_context_tokens": prompt_tokens + tokens + 16}
    if pinned:  # the declared class is the only one: both phases run on it
        overrides.update({"power.cpu_classes": f"{format_cpulist(cpus)}:little", "power.profile": "performance",
                          "power.prefill_max_threads": threads, "power.decode_max_threads": threads})
    else:
        overrides.update({"power.pin_threads": False, "runtime.num_threads": threads})
    llm = LLM(model, load_config(None, overrides))
    prompt = random_prompt(llm.spec.config.vocab_size, prompt_tokens)
    llm.generate(prompt[:4], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    cpu0 = cpu_seconds()
    c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    cpu1 = cpu_seconds()
    gov = llm.governor
    if gov is not None and gov.placement is not None:
        placement = "pinned, read back ok" if gov.placement.honoured else "pinned, NOT HONOURED (fell back)"
    else:
        allowed = frozenset().union(*(a for _, _, a in thread_placement().values()))
        placement = f"unpinned, threads on cpu {format_cpulist(allowed)}"
    return {"cpu_s_per_token": (cpu1 - cpu0) / c.usage.completion_tokens,
            "decode_tps": c.timings.decode_tokens_per_s, "placement": placement}


def run_threads_sweep(model: str, topology: str = "snapdragon_8gen2", cpu_classes: str = "",
                      prompt_tokens: int = 8, tokens: int = 32, repeats: int = 1) -> list[dict]:
    """One row per (class, thread count): medians of ``repeats`` interleaved runs."""
    points = {f"{name}:{n}": (name, cores, cpus, n)
              for name, cores, cpus in sweep_classes(topology, cpu_classes) for n in range(1, cores + 1)}

    def measure(key: str) -> dict:
        _, _, cpus, n = points[key]
        return run_worker(sweep_worker, {"model": model, "cpus": list(cpus), "threads": n,
                                         "prompt_tokens": prompt_tokens, "tokens": tokens},
                          env={"DUALPATH_CPU_CLASSES": ""}, timeout_s=TIMEOUT_S)

    rows = []
    for key, runs in interleaved(list(points), repeats, measure).items():
        name, cores, cpus, n = points[key]
        rows.append({"topology": topology, "class": name, "class_cores": cores, "cpus": list(cpus), "threads": n,
                     "default": n == min(cores, len(cpus)), "oversubscribed": n > len(cpus),
                     **medians(runs, ("cpu_s_per_token", "decode_tps")), "placement": runs[0]["placement"],
                     "runs": len(runs)})
    return rows


def cmd_threads_sweep(args) -> int:
    from ..models import resolve_model
    from ..platform.topology import format_cpulist

    model = resolve_model(args.model)[0]  # default: the built-in stories260K (short)
    prompt, tokens, repeats = args.prompt or 8, args.tokens or 32, args.repeats or 1
    rows = run_threads_sweep(model, args.topology, args.cpu_classes if args.topology == "machine" else "",
                             prompt, tokens, repeats)
    print(f"{model}: threads sweep on {args.topology}, mapped onto this machine; prompt {prompt} tokens, "
          f"{tokens} generated; median of {repeats}; * = the default thread count (the class's cores here)")
    print(f"{'class':<8} {'cores':>5} {'cpus':<6} {'threads':>7} {'decode tok/s':>13} {'CPU ms/token':>13}  placement")
    for r in rows:
        mark = "*" if r["default"] else " "
        note = f"; OVERSUBSCRIBED: {r['threads']} threads on {len(r['cpus'])} cpus" if r["oversubscribed"] else ""
        print(f"{r['class']:<8} {r['class_cores']:>5} {format_cpulist(r['cpus']):<6} {r['threads']:>6}{mark} "
              f"{r['decode_tps']:>13.1f} {r['cpu_s_per_token'] * 1e3:>13.2f}  {r['placement']}{note}")
    write_json(args.json, rows)
    return 0
