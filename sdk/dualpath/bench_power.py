"""``dualpath bench power``: CPU-seconds per generated token and tokens/s per power
profile, side by side in one run (each measurement in a fresh process: ONNX
Runtime's pinned per-session pools cannot share a process with its global pool)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

WORKER = r'''
import json, resource, time, dualpath
overrides = {"power.profile": %(profile)r, "runtime.max_context_tokens": %(ctx)d}
if %(classes)r:
    overrides["power.cpu_classes"] = %(classes)r
llm = dualpath.LLM(%(model)r, dualpath.load_config(None, overrides))
prompt = [1] + list(range(100, 100 + %(prompt)d))
params = dualpath.SamplingParams(temperature=0, max_tokens=%(tokens)d, ignore_eos=True)
llm.generate(prompt[:8], dualpath.SamplingParams(temperature=0, max_tokens=4))  # warm-up
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
c = llm.generate(prompt, params)
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
plan = llm.runner.last_plan
print(json.dumps({"cpu_s_per_token": cpu / c.usage.completion_tokens, "decode_tps": c.timings.decode_tokens_per_s,
                  "prefill_tps": c.timings.prefill_tokens_per_s, "wall_s": t1 - t0,
                  "plan": None if plan is None else {"profile": plan.profile, "prefill": list(plan.prefill.cpus),
                                                     "decode": list(plan.decode.cpus), "spinning": plan.spinning}}))
'''


def run_power_bench(model: str, profiles=("performance", "low_power"), cpu_classes: str = "0:big,1:little",
                    prompt_tokens: int = 256, tokens: int = 128, repeats: int = 3) -> list[dict]:
    samples: dict[str, list[dict]] = {p: [] for p in profiles}
    for _ in range(repeats):
        for profile in profiles:  # interleaved
            code = WORKER % {"profile": profile, "classes": cpu_classes, "model": model, "prompt": prompt_tokens,
                             "tokens": tokens, "ctx": prompt_tokens + tokens + 16}
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                raise RuntimeError(f"{profile}: {out.stderr[-2000:]}")
            samples[profile].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for profile, s in samples.items():
        rows.append({"profile": profile, "cpu_s_per_token": statistics.median(x["cpu_s_per_token"] for x in s),
                     "decode_tps": statistics.median(x["decode_tps"] for x in s),
                     "prefill_tps": statistics.median(x["prefill_tps"] for x in s), "plan": s[0]["plan"],
                     "runs": len(s)})
    return rows


def cmd_bench_power(args) -> int:
    from .models.synth import ensure_default_model

    model = args.model or ensure_default_model()[0]
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def add_parser(bs) -> None:
    p = bs.add_parser("power", help="CPU-seconds per token and tokens/s per power profile")
    p.add_argument("-m", "--model", help="GGUF (default: the built-in synthetic stories15M)")
    p.add_argument("--cpu-classes", default="0:big,1:little",
                   help="topology override (default declares cpu0 big, cpu1 little); '' = read sysfs")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("-r", "--repeats", type=int, default=3)
    p.add_argument("--json")
    p.set_defaults(func=cmd_bench_power)
