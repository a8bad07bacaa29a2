"""A memory plan before load: the resident memory a model will take at a context, from
its file's header alone, and the largest context (and KV type) a budget allows.

The parts, in MiB of resident memory (docs/performance.md has the measurements the
constants come from, and how close the plan comes):

* ``runtime``: Python, NumPy, ONNX Runtime and DualPath once imported;
* ``vocabulary``: the tokenizer's tables and the spec's token strings, per token (and per
  BPE merge);
* ``weights``: a layer's matrices our kernels multiply (``quants.kernel_form``) as their
  form in the cache entry, mapped and read every step (the file's bits); ONNX Runtime's
  packed copy of every other matrix: a quantized block costs its
  values plus ``PACK_BLOCK_BYTES`` (its f32 scale, block sum and alignment), Q4_K's
  mins one f32 per block more, a float matrix 4 bytes a value; the embedding's rows are
  read from the file (not resident), and a tied table is the classifier's. A classifier
  our kernels run (``ModelSpec.classifier_in_kernels``) is the cache entry's 8-bit form,
  mapped and read every step: its values and an f32 scale a block;
* ``kv cache``: the positions a sequence of the context keeps, in every layer
  (sliding-window layers: their window and what prefix reuse keeps, cache/windows.py);
* ``activations``: ONNX Runtime's buffers for a prefill chunk, the buffers between the graphs
  and our products, the step buffers, and the
  RoPE tables' rows of the positions used (cos and sin per position, read in place).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass, replace

from ..cache.geometry import KVGeometry, cache_tokens, head_dim_fits, model_kv_geometry
from ..config import Config, KVCacheConfig
from ..errors import ConfigError
from ..graph import own_attention
from ..kernels import ggml_layout, lform_bytes
from ..models import read_layout
from ..models.quants import kernel_form
from ..models.spec import ModelConfig, kernel_classifier_form

log = logging.getLogger(__name__)

MiB = 1 << 20
RUNTIME_BYTES = 75 * MiB
"""Python, NumPy, onnxruntime and DualPath imported: above what `bench memory` measures,
so that the plan errs above the peak (docs/performance-log.md, memory)."""
TOKEN_BYTES = 200
"""Per vocabulary token (spec and tokenizer tables), from `bench memory` on SentencePiece
and BPE vocabularies (docs/performance-log.md)."""
MERGE_BYTES = 120
"""Per BPE merge (its pair and rank in the merge table): fitted with TOKEN_BYTES to the
peaks `bench memory` measured on Llama 3 and Qwen2.5 vocabularies (docs/performance-log.md)."""
PACK_BLOCK_BYTES = {4: 8, 8: 11}
"""What ONNX Runtime's MatMulNBits adds to each block's values when it packs them at
accuracy level 4 (an f32 scale, an f32 block sum for the int8 kernel, alignment), by bits:
fitted to the weights measured on TinyLlama and Llama 3.2 1B Q4_K_M (Q4_K and Q6_K) and
Gemma 3 270M (mostly Q8_0 and Q5_0) files (docs/performance.md)."""
ACTIVATION_FLOATS = (6, 8, 4)
"""f32 values per prefill-chunk token in ONNX Runtime's buffers and those between the graphs
and our products, times (hidden_dim, dim, q_dim): fitted to the four files of the memory
figures at 512-token chunks, contexts 512 and 4,096 (docs/performance-log.md, memory)."""
THP_SLACK_BYTES = 1 << 20
"""Per global layer: its KV region is committed in 2 MiB huge pages, half of one unused
on average."""
MIN_CONTEXT = 256
"""The smallest context a budget may choose."""
DEFAULT_MAX_CONTEXT = 1 << 17
"""The most a load takes of the context a file declares when ``max_context_tokens`` is 0:
files declare up to millions of positions (2^32 in a crafted one), and the RoPE tables,
the graphs folder and the step buffers grow with the context whatever the KV cache holds.
A longer context is there to ask for (``runtime.max_context_tokens``, ``--ctx-size``)."""


def default_context(declared: int) -> int:
    """The context of ``max_context_tokens: 0``: the file's own, at most ``DEFAULT_MAX_CONTEXT``."""
    return min(declared, DEFAULT_MAX_CONTEXT)


@dataclass
class MemoryPlan:
    """Predicted resident bytes by part (see the module docstring)."""

    context: int
    kv_dtype: str
    geometry: KVGeometry
    """The KV cache's geometry at this context (cache/geometry.py: what the cache builds)."""
    parts: dict[str, int]
    kv_full: int = 0
    """KV bytes once the cache holds as many tokens as it can (``kv_cache_tokens``, else
    twice the context: a live sequence and cached prefixes), what a long-running process
    reaches; ``parts["kv cache"]`` is one sequence of the context."""

    @property
    def total(self) -> int:
        """One sequence of the context (what a single request's peak is)."""
        return sum(self.parts.values())

    @property
    def total_full(self) -> int:
        """With the KV cache full: what a budget is held to."""
        return self.total - self.parts["kv cache"] + self.kv_full

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / MiB:,.0f}" for k, v in self.parts.items())
        return (f"{self.total / MiB:,.0f} MiB at {self.context:,} tokens, {self.kv_dtype} KV ({parts} MiB); "
                f"{self.total_full / MiB:,.0f} MiB once the KV cache is full")


def _matrix_bytes(type_name: str, shape: tuple[int, ...], nbits8: bool, classifier: bool = False,
                  name: str = "") -> int:
    """Resident bytes of one matrix as ONNX Runtime holds it (packed), or as our kernels
    read it in place (the ``classifier``, where they run it; a layer's matrix ``name`` of a
    type they take: ``quants.kernel_form``)."""
    if len(shape) == 1 or type_name in ("F32", "F16", "BF16"):
        return 4 * math.prod(shape)
    rows, cols = shape
    if name and kernel_form(name.removesuffix(".weight"), type_name, shape, classifier):
        return lform_bytes(type_name, rows, cols)
    lay = ggml_layout(type_name)
    bits, sub = lay["bits"], lay["block_size"]
    if classifier and kernel_classifier_form(bits, bool(lay["zero_points"]), sub, cols):
        return rows * (cols // sub) * (sub + 4)  # the cached form: values and an f32 scale a block
    if bits == 8 and not nbits8:  # dequantized to f32 (ONNX Runtime before 1.22)
        return 4 * rows * cols
    blocks = rows * (cols // sub)
    return blocks * (sub * bits // 8 + PACK_BLOCK_BYTES[bits] + (4 if lay["zero_points"] else 0))


def weight_bytes(layout: dict[str, tuple[str, tuple[int, ...]]], nbits8: bool = True) -> int:
    """Every matrix's packed bytes: the embedding's own only when it is also the
    classifier (tied); else its rows are read from the file, not held."""
    tied = "output.weight" not in layout
    classifier = "token_embd.weight" if tied else "output.weight"
    return sum(_matrix_bytes(t, s, nbits8, name == classifier, name) for name, (t, s) in layout.items()
               if name != "token_embd.weight" or tied)


def kv_bytes(cfg: ModelConfig, context: int, kv_dtype: str, swa_cache: str = "window",
             checkpoint: int = 4096, page_tokens: int = 16) -> int:
    """KV bytes one sequence of ``context`` tokens keeps resident (``KVGeometry.sequence_bytes``;
    a global layer's region also leaves ``THP_SLACK_BYTES`` of a huge page unused)."""
    return kv_geometry_of(cfg, kv_dtype, page_tokens).sequence_bytes(context, swa_cache, checkpoint,
                                                                     THP_SLACK_BYTES)


def kv_geometry_of(cfg: ModelConfig, kv_dtype: str, page_tokens: int, dp: KVCacheConfig | None = None,
                   context: int = 0, kv_cache_tokens: int = 0) -> KVGeometry:
    """The geometry the cache of ``cfg`` will have (``model_kv_geometry``, the cache's own
    call) under ``dp`` with ``kv_dtype`` and ``page_tokens``."""
    dp = replace(dp or KVCacheConfig(), kv_dtype=kv_dtype, page_tokens=page_tokens)
    return model_kv_geometry(dp, cfg, max(context, 1), kv_cache_tokens)


def runtime_nbits8() -> bool:
    """Whether this process's ONNX Runtime packs 8-bit MatMulNBits weights (1.22 on)."""
    from .ort_sessions import NBITS8_SINCE, ORT_VERSION

    return ORT_VERSION >= NBITS8_SINCE


def plan_memory(cfg: ModelConfig, layout: dict, merges: int, config: Config, context: int,
                kv_dtype: str | None = None, nbits8: bool | None = None) -> MemoryPlan:
    """The plan for one context and KV type (``kv_dtype`` None: the configured one;
    ``nbits8`` None: as this process's ONNX Runtime)."""
    rt, dp = config.runtime, config.kv_cache
    if nbits8 is None:
        nbits8 = runtime_nbits8()
    kv_dtype = kv_dtype or dp.kv_dtype
    chunk = min(rt.prefill_chunk_tokens, context)
    h, d, q = ACTIVATION_FLOATS
    activations = chunk * 4 * (h * cfg.hidden_dim + d * cfg.dim + q * cfg.num_heads * cfg.head_dim)
    activations += rt.max_num_seqs * cfg.vocab_size * 4  # logits rows
    rope_tables = 2 if cfg.rope_theta_swa and cfg.sliding_window else 1  # Gemma 3: local and global bases
    activations += rope_tables * context * cfg.rope_dim * 4  # (context, rope_dim / 2) cos and sin, f32
    geometry = kv_geometry_of(cfg, kv_dtype, dp.page_tokens, dp, context, rt.kv_cache_tokens)
    kv = functools.partial(geometry.sequence_bytes, swa_cache=dp.swa_cache, checkpoint=dp.swa_checkpoint_tokens,
                           global_layer_slack=THP_SLACK_BYTES)
    one = kv(context)
    capacity = cache_tokens(rt.kv_cache_tokens, context)
    return MemoryPlan(context, kv_dtype, geometry, {
        "runtime": RUNTIME_BYTES,
        "vocabulary": cfg.vocab_size * TOKEN_BYTES + merges * MERGE_BYTES,
        "weights": weight_bytes(layout, nbits8),
        "kv cache": one,
        "activations": activations,
    }, kv_full=max(one, kv(capacity), capacity // max(context, 1) * one))


def _meminfo() -> dict[str, int] | None:
    """/proc/meminfo in bytes, or None where it cannot be read (not Linux)."""
    info = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return info


def _headroom(info: dict[str, int]) -> int:
    return info.get("MemAvailable", 0) - max(256 * MiB, info.get("MemTotal", 0) // 10)


def available_bytes() -> int:
    """What ``memory_budget: auto`` allows: MemAvailable less headroom for the OS (and
    Android's low-memory killer): the larger of 256 MiB and 10% of MemTotal."""
    info = _meminfo()
    if info is None:
        raise ConfigError("runtime.memory_budget_mb=-1 (auto) needs /proc/meminfo, which cannot be read here; "
                          "give a budget in MiB")
    return _headroom(info)


def budget_bytes(memory_budget_mb: int) -> int:
    """``runtime.memory_budget_mb`` in bytes (-1: ``available_bytes``)."""
    return available_bytes() if memory_budget_mb == -1 else memory_budget_mb * MiB


def _largest_context(cfg: ModelConfig, layout: dict, merges: int, config: Config, want: int, kv_dtype: str,
                     nbits8: bool, budget: int) -> int:
    """The largest context up to ``want`` whose plan (KV cache full) fits ``budget``."""
    lo, hi = 0, want
    while lo < hi:  # by bisection (the plan grows with the context)
        mid = (lo + hi + 1) // 2
        if plan_memory(cfg, layout, merges, config, mid, kv_dtype, nbits8).total_full <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit(path: str | os.PathLike, config: Config, budget: int, nbits8: bool | None = None) -> MemoryPlan:
    """The plan to load ``path`` with: at the configured context (``max_context_tokens``,
    0: ``default_context`` of the model's) when it fits ``budget`` bytes, else the largest
    context that fits (and, where q8 fits a longer one, the q8 KV cache). Raises
    ConfigError, naming the figures, when not even ``MIN_CONTEXT`` tokens fit. Reads the
    file's header only."""
    cfg, layout, merges = read_layout(path)
    rt = config.runtime
    if nbits8 is None:
        nbits8 = runtime_nbits8()
    want = rt.max_context_tokens or default_context(cfg.context_length)
    dtypes = [config.kv_cache.kv_dtype]
    if dtypes[0] != "q8" and head_dim_fits("q8", cfg.head_dim):
        dtypes.append("q8")
    best = None
    for dtype in dtypes:
        lo = _largest_context(cfg, layout, merges, config, want, dtype, nbits8, budget)
        if lo >= min(MIN_CONTEXT, want) and (best is None or lo > best.context):
            best = plan_memory(cfg, layout, merges, config, lo, dtype, nbits8)
        if lo == want:
            break
    if best is None:
        need = plan_memory(cfg, layout, merges, config, min(MIN_CONTEXT, want), dtypes[-1], nbits8)
        raise ConfigError(f"{os.path.basename(os.fspath(path))} does not fit a memory budget of "
                          f"{budget / MiB:,.0f} MiB: it needs {need.describe()}; raise runtime.memory_budget_mb "
                          f"or use a smaller model")
    return best


def layout_of(spec) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
    """``read_layout``'s tensor layout and merge count, from a loaded ModelSpec (a cached
    load has them without reading the file's header again)."""
    layout = {f"{w.name}.weight": (w.source_type or "F32", tuple(w.shape)) for w in spec.weights.values()}
    return layout, len(spec.tokenizer.merges or ())


def context_without_budget(spec, config: Config, meminfo: dict[str, int] | None = None) -> int:
    """The context of a load with no ``memory_budget_mb``, checked against this machine
    before anything grows with it (graphs, RoPE tables, the KV arena):

    * ``max_context_tokens`` as given, refused with the plan's figures (ConfigError)
      when the plan, KV cache full, is over MemAvailable;
    * else ``default_context`` of the file's, lowered when over what ``auto`` allows to
      the largest context that fits (said in a log line with the file's own value), and
      refused with the figures when not even ``MIN_CONTEXT`` tokens fit.

    Where /proc/meminfo cannot be read, the context is not checked."""
    cfg, rt, name = spec.config, config.runtime, os.path.basename(str(spec.path))
    want = rt.max_context_tokens or default_context(cfg.context_length)
    if not rt.max_context_tokens and want < cfg.context_length:
        log.warning("%s declares a context of %s tokens; using %s (runtime.max_context_tokens, --ctx-size, "
                    "to ask for more)", name, f"{cfg.context_length:,}", f"{want:,}")
    info = _meminfo() if meminfo is None else meminfo
    if not info or "MemAvailable" not in info:
        return want
    layout, merges = layout_of(spec)
    nbits8 = runtime_nbits8()
    plan = plan_memory(cfg, layout, merges, config, want, nbits8=nbits8)
    available = info["MemAvailable"]
    if rt.max_context_tokens:
        if plan.total_full > available:
            raise ConfigError(f"runtime.max_context_tokens={want:,} does not fit this machine's memory: the plan "
                              f"for {name} is {plan.describe()}, over the {available / MiB:,.0f} MiB MemAvailable "
                              f"says is free; lower it (--ctx-size), bound the KV cache (runtime.kv_cache_tokens), "
                              f"or let --memory-budget auto choose the largest context that fits")
        return want
    budget = _headroom(info)
    if plan.total_full <= budget:
        return want
    kv_dtype = config.kv_cache.kv_dtype
    ctx = _largest_context(cfg, layout, merges, config, want, kv_dtype, nbits8, budget)
    if ctx < min(MIN_CONTEXT, want):
        need = plan_memory(cfg, layout, merges, config, min(MIN_CONTEXT, want), nbits8=nbits8)
        raise ConfigError(f"{name} does not fit this machine's memory ({budget / MiB:,.0f} MiB free, less "
                          f"headroom for the system): it needs {need.describe()}")
    log.warning("%s: a context of %s tokens needs %s MiB, over the %s MiB free (less headroom); using %s "
                "(runtime.max_context_tokens, runtime.memory_budget_mb to choose)", name, f"{want:,}",
                f"{plan.total_full / MiB:,.0f}", f"{budget / MiB:,.0f}", f"{ctx:,}")
    return ctx


ENCODER_TABLES = ("token_embd.weight", "position_embd.weight", "token_types.weight")
"""An encoder's tables whose rows are gathered from the mapped file (executor/encoder.py), not held."""


def encoder_parts(spec, slice_tokens: int) -> dict[str, int]:
    """Resident bytes an embedding model (an encoder, ``spec`` loaded) adds to a process that
    already runs Python and ONNX Runtime, by part: its vocabulary, its matrices as our kernels
    read them (a layer's matrices of their types, in their form: graph/encoder.py) or as ONNX
    Runtime holds them (f32 otherwise; the embedding tables are read from the file), and one
    slice of ``slice_tokens`` tokens in flight: per token the layer's activations, and, where
    attention is ONNX Runtime's over padded texts, at worst (every text as long as the
    context) its attention scores, (heads, context) f32 per token (ours keeps a few rows of
    scores per thread: nothing to count)."""
    cfg = spec.config
    layout, merges = layout_of(spec)
    weights = sum(_matrix_bytes(t, s, runtime_nbits8(), name=name) for name, (t, s) in layout.items()
                  if name not in ENCODER_TABLES)
    h, d, _ = ACTIVATION_FLOATS
    scores = 0 if own_attention(spec) else cfg.num_heads * cfg.context_length
    activations = slice_tokens * 4 * (h * cfg.hidden_dim + d * cfg.dim + scores)
    return {"vocabulary": cfg.vocab_size * TOKEN_BYTES + merges * MERGE_BYTES, "weights": weights,
            "activations": activations}
