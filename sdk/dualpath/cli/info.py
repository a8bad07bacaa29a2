"""``dualpath info``: versions, CPU features, kernels, placement, a model and its memory plan."""

from __future__ import annotations

import os
import sys

from .common import config_from_args, model_path


def cmd_info(args) -> int:
    import numpy as np
    import onnxruntime

    from .. import __version__
    from ..platform.cpu import cpu_features, cpu_model, usable_cpus

    cfg = config_from_args(args)
    print(f"dualpath {__version__}  onnxruntime {onnxruntime.__version__}  numpy {np.__version__}  "
          f"python {sys.version.split()[0]}")
    print(f"cpu: {cpu_model()}  ({usable_cpus()} usable cores)")
    print(f"cpu features: {' '.join(cpu_features()) or '(none reported)'}")
    from ..kernels import KERNEL_ISAS, available_kernels, default_kernel
    from ..kernels import cpu_features as kernel_features

    disabled = os.environ.get("DUALPATH_DISABLE_CPU_FEATURES", "")
    asked = cfg.runtime.kernel_isa
    available = available_kernels()
    kernel = default_kernel() if asked == "auto" else asked
    note = "" if kernel in available else " NOT AVAILABLE on this CPU/build: loading a model fails"
    print(f"kernels: attention={kernel} kv_write={kernel} layer_products={kernel} classifier={kernel} "
          f"encoder_attention={kernel} embed=generic  "
          f"(runtime.kernel_isa={asked}{note}; available: {', '.join(available)}; usable ISA features: "
          f"{', '.join(kernel_features()) or 'none'}"
          f"{'; disabled by DUALPATH_DISABLE_CPU_FEATURES=' + disabled if disabled else ''})")
    print("kernel ISAs: " + " ".join(f"{isa}{'' if isa in available else '(-)'}" for isa in KERNEL_ISAS)
          + "  ((-): not on this CPU/build, or disabled)")
    d = cfg.kv_cache
    from ..kernels import KV_DTYPE_DOCS
    kv_what = KV_DTYPE_DOCS[d.kv_dtype]
    print(f"kv cache: one arena of {d.block_bytes // 1024} KiB blocks (block_bytes={d.block_bytes}), pages of "
          f"{d.page_tokens} tokens, kv_dtype={d.kv_dtype} ({kv_what}), prefetch_degree={d.prefetch_degree}, "
          f"huge pages requested (madvise)")
    from ..platform.cpu import numa_nodes

    nodes = numa_nodes()
    print(f"numa: {nodes} node{'s' if nodes != 1 else ''}; "
          + ("binding the KV arena is a no-op here" if nodes <= 1 else
             f"KV arena bound to node {d.numa_node}" if d.numa_node >= 0
             else "KV arena unbound (set kv_cache.numa_node to bind it)"))
    print(f"runtime: threads={cfg.runtime.effective_num_threads()} prefill_chunk={cfg.runtime.prefill_chunk_tokens} "
          f"max_context={cfg.runtime.max_context_tokens or 'model'}")
    from ..cache.policy import PathPolicy
    from ..platform import Governor, describe, load_topology, read_power_state

    topology = load_topology(cfg.power.cpu_classes)
    power = read_power_state(timeout_s=cfg.power.termux_timeout_s)
    plan = Governor(topology, lambda: power, cfg).choose()
    policy = PathPolicy.from_config(d, cfg.power, plan.profile)
    print(describe(topology, power, plan, policy.summary()))
    _print_placement(cfg, topology, power)
    if args.model or args.hf_repo:
        _print_model(args, d)
    return 0


def _print_placement(cfg, topology, power) -> None:
    """Where the threads run: pinned as the engine pins them, on the built-in model, and
    read back from the OS."""
    from ..platform import Governor, describe_placement

    if topology.uniform or not cfg.power.pin_threads:
        print("scheduling: cores are alike (or power.pin_threads is off): one unpinned session set on "
              "ONNX Runtime's shared pool; nothing is pinned, so there is no placement to verify")
    else:  # pin as the engine does, on the built-in model, and print what the OS granted
        from ..config import with_overrides
        from ..errors import DualPathError
        from ..llm import LLM
        from ..models import resolve_model

        gov = Governor(topology, lambda: power, cfg)
        small = with_overrides(cfg, {"runtime.max_context_tokens": 64, "runtime.max_num_seqs": 1,
                                     "runtime.kv_cache_tokens": 0, "model_cache.enabled": False})
        try:
            LLM(resolve_model(None)[0], small, governor=gov)
        except DualPathError as e:
            print(f"placement: not verified (the built-in model did not load: {e})")
        else:
            print(describe_placement(gov.placement) if gov.placement is not None
                  else "placement: not verified (/proc could not be read)")


def _print_model(args, d) -> None:
    """``dualpath info -m FILE``: the model's hyper-parameters, and its KV cache under ``d``."""
    from ..models import load_model

    spec = load_model(model_path(args), args.tokenizer)
    m = spec.config
    print(f"model: {spec.path}  format={spec.format}  name={spec.metadata.get('name', '')!r}")
    print(f"  arch={m.arch} dim={m.dim} hidden_dim={m.hidden_dim} layers={m.num_layers} heads={m.num_heads} "
          f"kv_heads={m.num_kv_heads} head_dim={m.head_dim} vocab={m.vocab_size} context={m.context_length}")
    print(f"  rope_theta={m.rope_theta:g} rms_eps={m.rms_eps:g} tied_output={m.tied_output}")
    from ..cache.geometry import kv_geometry
    from ..errors import ConfigError
    from ..kernels import kv_tile_bytes

    try:
        g = kv_geometry(d, num_layers=m.num_layers, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, num_blocks=1)
    except ConfigError as e:
        print(f"  kv cache: {e} (loading fails)")
    else:
        per_token = g.token_bytes * m.num_layers
        f16 = kv_tile_bytes("f16", m.num_kv_heads, m.head_dim, 1) * m.num_layers
        fitted = f"; pages of {g.page_tokens} tokens, a block holding no more" if g.page_tokens < d.page_tokens else ""
        print(f"  kv cache: {per_token:,} bytes per token, all layers, in {d.kv_dtype} "
              f"({per_token / f16:.0%} of f16){fitted}" if m.causal else
              f"  an encoder: {_encoder_task(spec)}, no KV cache")
    diffs = m.differences()
    shown = ' '.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in diffs.items())
    print(f"  family differences: {shown or 'none (plain Llama)'}")
    print(f"  file tensor types: {', '.join(spec.metadata.get('tensor_types', []))}")
    types = ", ".join(f"{k}: {v / 2**20:.1f} MiB" for k, v in spec.weight_types().items())
    print(f"  weights in memory: {spec.weight_bytes / 2**20:.1f} MiB ({types})")
    print(f"  tokenizer: {spec.tokenizer.model}, {spec.tokenizer.vocab_size} tokens, "
          f"chat template: {'yes' if spec.tokenizer.chat_template else 'no'}")
    if m.causal:  # the memory plan does not model an encoder yet
        _print_memory_plan(args, m)


def _print_memory_plan(args, m) -> None:
    """The memory plan (executor/memory_plan.py) at the configured context, and what a
    budget allows."""
    from ..errors import ConfigError
    from ..executor.memory_plan import MiB, budget_bytes, default_context, fit, plan_memory
    from ..models import read_layout

    cfg = config_from_args(args)
    path = model_path(args)
    _, layout, merges = read_layout(path)
    ctx = cfg.runtime.max_context_tokens or default_context(m.context_length)
    if ctx < m.context_length and not cfg.runtime.max_context_tokens:
        print(f"  default context: {ctx:,} of the file's {m.context_length:,} tokens (--ctx-size for more)")
    print(f"  memory plan: {plan_memory(m, layout, merges, cfg, ctx).describe()}")
    if cfg.runtime.memory_budget_mb:
        budget = budget_bytes(cfg.runtime.memory_budget_mb)
        try:
            print(f"  memory budget {budget / MiB:,.0f} MiB: {fit(path, cfg, budget).describe()}")
        except ConfigError as e:
            print(f"  memory budget: {e}")


def _encoder_task(spec) -> str:
    """What an encoder does: embeddings, or a reranker's scores (pooling rank)."""
    pooling = spec.metadata.get("pooling")
    if pooling == "rank":
        labels = spec.metadata.get("rank", {}).get("labels") or ["score"]
        return f"a reranker (pooling rank, outputs: {', '.join(labels)})"
    return f"embeddings only (pooling {pooling})"
