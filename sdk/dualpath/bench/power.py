"""``dualpath bench power``: CPU-seconds per generated token and tokens/s per power
profile, side by side in one run. Each measurement is a fresh process
(``harness.run_worker``): ONNX Runtime's pinned per-session pools cannot share a
process with its global pool."""

from __future__ import annotations

import time

from .common import cpu_seconds, interleaved, medians, model_or_default, random_prompt, write_json
from .harness import run_worker

PROFILES = ("performance", "low_power")
TIMEOUT_S = 900.0
"""Wall-clock limit of one measurement."""


def worker(model: str, profile: str, cpu_classes: str, prompt_tokens: int, tokens: int) -> dict:
    """One measurement: a warm-up, then ``prompt_tokens`` prefilled and ``tokens``
    generated under ``profile``; CPU time of the whole process per generated token."""
    from ..config import load_config
    from ..llm import LLM
    from ..runtime.sampler import SamplingParams

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
    model = model_or_default(args.model)
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
    p = bs.add_parser("power", help="CPU-seconds per token and tokens/s per power profile")
    p.add_argument("-m", "--model", help="GGUF (default: synth:stories15M, random weights)")
    p.add_argument("--cpu-classes", default="0:big,1:little",
                   help="topology override (default declares cpu0 big, cpu1 little); '' = read sysfs")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("-r", "--repeats", type=int, default=3)
    p.add_argument("--json")
    p.set_defaults(func=cmd_bench_power)
