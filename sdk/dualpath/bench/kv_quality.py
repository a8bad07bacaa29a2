"""``dualpath bench kv-quality``: what a KV cache element type costs in output quality.

The same model runs with a baseline KV type (f16 by default) and with the type under
test (q8 by default), greedy, on the same prompts. Two measurements per prompt:

* free-running greedy: each generates ``num_tokens`` tokens (EOS ignored) through the
  engine, as ``dualpath run --temperature 0`` does; ``agreement`` is the share of
  positions where the two generations hold the same token, ``same_prefix`` how many
  tokens they share before the first difference (after one, the contexts differ and
  later positions compare different texts);
* teacher-forced logits: both read the baseline's text (prompt + its generation) and
  give the logits predicting each generated token: the max and mean absolute
  difference of those ``num_tokens`` x vocab logits, their share of the baseline
  logits' standard deviation, and ``top1_agreement``, the share of positions where
  both pick the same token on the same context.

Deterministic (greedy, no sampling), so one run is the figure.
"""

from __future__ import annotations

import numpy as np

from .common import write_json

PROMPTS = ("Once upon a time", "Lily and Ben went to the park", "The little dog was sad because",
           "One day, a big bird", "Tom had a red ball and")
"""The five prompts of the README's figures (stories-style text; any tokenizer takes them)."""
MAX_PROMPT_TOKENS = 256


def _llm(model: str, kv_dtype: str, context_tokens: int, overrides: dict | None):
    from ..config import load_config
    from ..llm import LLM

    o = {"kv_cache.kv_dtype": kv_dtype, "runtime.max_context_tokens": context_tokens}
    o.update(overrides or {})
    return LLM(model, load_config(None, o))


def teacher_forced(runner, ids: list[int], first: int) -> np.ndarray:
    """Logits (len(ids) - first, vocab) predicting ids[first:], from one pass over ids
    (chunked by the runner's step); bench quality uses it too."""
    runner.begin([])
    rows, step = [], runner.max_step_tokens
    for i in range(0, len(ids) - 1, step):
        rows.append(runner.forward(ids[i:min(i + step, len(ids) - 1)], all_logits=True).copy())
    return np.concatenate(rows)[first - 1:]


def measure_kv_quality(model: str, kv_dtype: str = "q8", baseline: str = "f16", prompts=PROMPTS,
                       num_tokens: int = 64, overrides: dict | None = None) -> dict:
    """Greedy agreement and logit error of ``kv_dtype`` against ``baseline`` (module
    docstring) over ``prompts``, ``num_tokens`` generated tokens each."""
    from ..sampling_params import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    ctx = MAX_PROMPT_TOKENS + num_tokens
    base = _llm(model, baseline, ctx, overrides)
    test = _llm(model, kv_dtype, ctx, overrides)
    rows = []
    for p in prompts:
        ids = base.tokenize(p)
        if len(ids) > MAX_PROMPT_TOKENS:
            raise ValueError(f"prompt {p[:40]!r}... has {len(ids)} tokens; at most {MAX_PROMPT_TOKENS}")
        want = list(base.generate(ids, greedy).token_ids)
        got = list(test.generate(ids, greedy).token_ids)
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        seq = ids + want
        lb = teacher_forced(base.runner, seq, len(ids))
        lt = teacher_forced(test.runner, seq, len(ids))
        diff = np.abs(lt.astype(np.float64) - lb)
        rows.append({"prompt": p, "prompt_tokens": len(ids), "generated": len(want),
                     "agreement": float(np.mean(np.array(got) == np.array(want))), "same_prefix": int(same),
                     "max_abs_logit_error": float(diff.max()), "mean_abs_logit_error": float(diff.mean()),
                     "logit_std": float(lb.std()),
                     "top1_agreement": float(np.mean(lt.argmax(1) == lb.argmax(1)))})
    spec = base.spec.config
    return {"model": str(base.spec.path), "kv_dtype": kv_dtype, "baseline": baseline, "num_tokens": num_tokens,
            "head_dim": spec.head_dim, "num_kv_heads": spec.num_kv_heads, "num_layers": spec.num_layers,
            "rows": rows,
            "agreement": float(np.mean([r["agreement"] for r in rows])),
            "top1_agreement": float(np.mean([r["top1_agreement"] for r in rows])),
            "max_abs_logit_error": max(r["max_abs_logit_error"] for r in rows),
            "mean_abs_logit_error": float(np.mean([r["mean_abs_logit_error"] for r in rows])),
            "logit_std": float(np.mean([r["logit_std"] for r in rows]))}


def format_report(res: dict) -> str:
    lines = [f"{res['model']}: kv_dtype {res['kv_dtype']} against {res['baseline']}, greedy, "
             f"{len(res['rows'])} prompts x {res['num_tokens']} tokens (head_dim {res['head_dim']}, "
             f"{res['num_kv_heads']} KV heads, {res['num_layers']} layers)",
             f"{'prompt':<32} {'agree':>6} {'prefix':>6} {'top1 tf':>7} {'max |dlogit|':>12} "
             f"{'mean |dlogit|':>13} {'logit std':>9}"]
    for r in res["rows"]:
        lines.append(f"{r['prompt'][:32]:<32} {r['agreement']:>6.0%} {r['same_prefix']:>6} "
                     f"{r['top1_agreement']:>7.0%} {r['max_abs_logit_error']:>12.4f} "
                     f"{r['mean_abs_logit_error']:>13.5f} {r['logit_std']:>9.3f}")
    lines.append(f"{'all':<32} {res['agreement']:>6.0%} {'':>6} {res['top1_agreement']:>7.0%} "
                 f"{res['max_abs_logit_error']:>12.4f} {res['mean_abs_logit_error']:>13.5f} {res['logit_std']:>9.3f}")
    lines.append("agree = same token at a position of the two free-running greedy generations; prefix = tokens "
                 "before the first difference; top1 tf, |dlogit| = on the baseline's text (teacher-forced)")
    return "\n".join(lines)


def cmd_bench_kv_quality(args) -> int:
    from ..models import resolve_model

    model, _ = resolve_model(args.model)
    res = measure_kv_quality(model, args.kv_dtype, args.baseline, num_tokens=args.tokens)
    print(format_report(res))
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    q = bs.add_parser("kv-quality", help="greedy agreement and logit error of a KV element type against another")
    q.add_argument("-m", "--model", help="a model file or synth:PRESET (default: the built-in stories260K.gguf)")
    q.add_argument("--kv-dtype", default="q8", choices=["f16", "f32", "q8"], help="the type measured (default q8)")
    q.add_argument("--baseline", default="f16", choices=["f16", "f32", "q8"], help="compared against (default f16)")
    q.add_argument("-n", "--tokens", type=int, default=64, help="generated tokens per prompt (default 64)")
    q.add_argument("--json")
    q.set_defaults(func=cmd_bench_kv_quality)
