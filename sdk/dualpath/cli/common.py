"""What the subcommands share: the config and sampling parameters built from the
command line, the model's path, the load's progress bar and report."""

from __future__ import annotations

import argparse
import sys
import time


def overrides_from_args(args) -> dict:
    from ..config import parse_overrides

    out = parse_overrides(args.set)
    if getattr(args, "threads", None) is not None:
        out["runtime.num_threads"] = args.threads
    if getattr(args, "ctx_size", None) is not None:
        out["runtime.max_context_tokens"] = args.ctx_size
    if getattr(args, "kv_dtype", None) is not None:
        out["kv_cache.kv_dtype"] = args.kv_dtype
    if getattr(args, "memory_budget", None) is not None:
        out["runtime.memory_budget_mb"] = -1 if args.memory_budget == "auto" else args.memory_budget
    if getattr(args, "chat_template", None) is not None:
        out["runtime.chat_template"] = args.chat_template
    if getattr(args, "draft_model", None):
        out["runtime.speculative"], out["runtime.draft_model"] = "draft", args.draft_model
    if getattr(args, "speculative", None) is not None:
        out["runtime.speculative"] = args.speculative
    if getattr(args, "reasoning_format", None) is not None:
        out["reasoning.format"] = args.reasoning_format
    if getattr(args, "reasoning_budget", None) is not None:
        out["reasoning.budget_tokens"] = args.reasoning_budget
    if getattr(args, "prefix_cache", None) is not None:
        out["prefix_cache.use"], out["prefix_cache.dir"] = "always", args.prefix_cache
    if getattr(args, "no_prefix_cache", False):
        out["prefix_cache.use"] = "never"
    return out


def memory_budget(text: str):
    """``--memory-budget``: ``auto`` or a size in MiB."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a size in MiB nor auto") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} MiB: a budget must be at least 1 MiB (or auto)")
    return value


def config_from_args(args):
    from ..config import load_config

    return load_config(args.config, overrides_from_args(args))


def model_path(args) -> str:
    from ..models import resolve_model

    path, note = resolve_model(args.model, getattr(args, "hf_repo", None))
    if note:
        print(f"dualpath: {note}", file=sys.stderr)
    return path


def mmproj_path(args, wanted: bool = True) -> str | None:
    """The image projector of a run: ``--mmproj``, or with ``-hf`` the one beside the model
    (as llama.cpp's ``-hf`` finds it) where images may come (``wanted``) and ``--no-mmproj``
    is not given."""
    if args.mmproj or not (wanted and getattr(args, "hf_repo", None) and not args.no_mmproj):
        return args.mmproj
    from ..models.hub import resolve_hf_mmproj

    found = resolve_hf_mmproj(args.hf_repo)
    if found is not None:
        print(f"dualpath: its image projector: {found.describe()} (--no-mmproj leaves it out)", file=sys.stderr)
    return found.path if found is not None else None


def sampling_from_args(args, prompt_tokens: int):
    from ..sampling_params import SamplingParams

    max_tokens = args.max_tokens
    if max_tokens is None:
        # run.c's -n: positions in total, prompt included (the last generated token is not fed back)
        max_tokens = max(args.steps - prompt_tokens + 1, 1)
    return SamplingParams(max_tokens=max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repeat_penalty,
                          seed=args.seed, stop=tuple(getattr(args, "stop", None) or ()),
                          ignore_eos=getattr(args, "ignore_eos", False))


class ProgressBar:
    """The load's progress on stderr, on a terminal only (``LLM(progress=...)``): one
    line per stage, redrawn in place, as the Hugging Face tools do."""

    LABELS = {"convert": ("converting", 1 << 20, "MiB"), "sessions": ("loading graphs", 1, "parts")}

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.stage = None
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        label, unit, unit_name = self.LABELS.get(stage, (stage, 1, ""))
        if stage != self.stage:
            if self.stage is not None:
                self.stream.write("\n")
            self.stage, self.t0 = stage, time.perf_counter()
        frac = min(1.0, done / total)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{label}: {frac:4.0%} |{bar:<30}| {done // unit}/{total // unit} {unit_name} "
                          f"[{time.perf_counter() - self.t0:.1f}s]")
        if done >= total:
            self.stream.write("\n")
            self.stage = None
        self.stream.flush()


def load_report(stats: dict) -> str:
    """``dualpath run --verbose``: where the load's time went."""
    names = (("open_s", "opened cached entry"), ("convert_s", "converted"), ("tokenizer_s", "tokenizer"),
             ("graphs_s", "graphs"), ("sessions_s", "ONNX Runtime sessions"), ("total_s", "total"))
    parts = [f"{label} {stats[key]:.2f}s" for key, label in names if key in stats]
    if "kernel_weights_mib" in stats:  # Entry.page_in
        parts.append(f"our kernels' weights {stats['huge_mib']:.0f} of {stats['kernel_weights_mib']:.0f} MiB "
                     f"in huge pages{' (read again)' if stats['reread'] else ''} {stats['page_in_s']:.2f}s")
    return f"dualpath: load (converted-model cache {stats.get('cache', '?')}): " + ", ".join(parts)
