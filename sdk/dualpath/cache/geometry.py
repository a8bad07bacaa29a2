"""KV cache geometry, the one home of its arithmetic: how many bytes a page is, how many
pages a block holds, how many blocks a cache of a context needs, and what a
sliding-window layer keeps of a sequence.

The cache (cache/manager.py), the memory plan (executor/memory_plan.py) and ``dualpath
info`` all read these functions: none of them computes a size of its own, so the plan
and the arena agree by construction. The head-dimension rule of each KV dtype is the C
table's (``kernels.KV_HEAD_DIM_MULTIPLE``, csrc/kv_arena.c), which the arena enforces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..config import KVCacheConfig
from ..errors import ConfigError
from ..kernels import KV_DTYPES, KV_HEAD_DIM_MULTIPLE, kv_tile_bytes
from ..models.spec import ModelConfig
from .windows import MARGIN

DEFAULT_SPARE_BLOCKS = 2
"""Blocks a default-sized cache (``kv_cache_tokens: 0``) holds beyond twice the context:
the partial pages of a live sequence and of the prefixes cached beside it."""


def head_dim_fits(kv_dtype: str, head_dim: int) -> bool:
    """Whether the arena can cache heads of ``head_dim`` values in ``kv_dtype`` (the C table's rule)."""
    multiple: int = KV_HEAD_DIM_MULTIPLE[kv_dtype]  # (the C extension has no type stubs)
    return head_dim % multiple == 0


def check_head_dim(kv_dtype: str, head_dim: int) -> None:
    """Raise ConfigError when ``kv_dtype`` cannot cache heads of ``head_dim`` values: q8
    keeps each token's f32 scales after its int8 values, 4-byte aligned only when head_dim
    is even (the C table says so; the arena refuses the rest)."""
    if head_dim_fits(kv_dtype, head_dim):
        return
    multiple = KV_HEAD_DIM_MULTIPLE[kv_dtype]
    need = "an even head_dim" if multiple == 2 else f"a head_dim that is a multiple of {multiple}"
    fits = " or ".join(d for d in KV_DTYPES if head_dim_fits(d, head_dim))
    raise ConfigError(f"kv_cache.kv_dtype={kv_dtype} needs {need}; this model's is {head_dim}: use {fits}")


def cache_tokens(kv_cache_tokens: int, max_context_tokens: int) -> int:
    """Tokens the KV cache is asked to hold, all sequences together: ``kv_cache_tokens``, or
    with 0 twice the context (a live sequence and the prefixes cached beside it)."""
    return kv_cache_tokens or 2 * max_context_tokens


def fitted_page_tokens(dp: KVCacheConfig, num_kv_heads: int, head_dim: int) -> int:
    """Tokens per page for a model: ``kv_cache.page_tokens``, halved while one layer's page of
    them does not fit a block (a model whose KV heads are wide: Phi-3-mini's 32 x 96 in f16
    take 12 KiB a token, so 16 tokens are more than a default block); ``page_tokens`` itself
    when not even one token fits (``pages_per_block`` then says so)."""
    p = dp.page_tokens
    while p > 1 and kv_tile_bytes(dp.kv_dtype, num_kv_heads, head_dim, p) > dp.block_bytes:
        p //= 2
    return p


def pages_per_block(dp: KVCacheConfig, page_bytes: int, page_tokens: int) -> int:
    """KV pages of ``page_bytes`` (one layer's K and V of ``page_tokens`` tokens) in a block;
    ConfigError when not even one fits, since a page never straddles two blocks."""
    if page_bytes > dp.block_bytes:
        raise ConfigError(f"kv_cache.block_bytes={dp.block_bytes} cannot hold one page of "
                          f"page_tokens={page_tokens} tokens of this model ({page_bytes} bytes); "
                          "raise block_bytes")
    return dp.block_bytes // page_bytes


def retained_window_tokens(window: int, context: int, page_tokens: int, checkpoint: int) -> int:
    """Positions a sliding-window layer keeps of one sequence of ``context`` tokens
    (cache/windows.py): twice its window before the prompt's end, the rollback margin and
    a page, and a window before every ``checkpoint``-th position (0: none)."""
    kept = 2 * window + MARGIN + page_tokens + (context // checkpoint * window if checkpoint else 0)
    return min(context, kept)


@dataclass(frozen=True)
class KVGeometry:
    """The shape of one KV arena (every field derived by ``kv_geometry``)."""

    kv_dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_tokens: int
    """Tokens per page (the attention kernel's tile): ``fitted_page_tokens``."""
    block_bytes: int
    """Bytes per arena block, per layer (``kv_cache.block_bytes``)."""
    page_bytes: int
    """One layer's K and V (and q8 scales) of ``page_tokens`` tokens."""
    pages_per_block: int
    num_blocks: int
    windows: tuple[int, ...] = ()
    """Per layer, its sliding window (0: a global layer); empty: none known."""

    @property
    def capacity_tokens(self) -> int:
        """Tokens the cache holds, all sequences together."""
        return self.num_blocks * self.pages_per_block * self.page_tokens

    @property
    def token_bytes(self) -> int:
        """One token's K and V (and q8 scales) in one layer."""
        n: int = kv_tile_bytes(self.kv_dtype, self.num_kv_heads, self.head_dim, 1)  # (untyped C extension)
        return n

    @property
    def arena_bytes(self) -> int:
        """Bytes the arena reserves: every layer's blocks."""
        return self.num_layers * self.num_blocks * self.block_bytes

    def layer_window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0

    def sequence_bytes(self, context: int, swa_cache: str = "window", checkpoint: int = 4096,
                       global_layer_slack: int = 0) -> int:
        """KV bytes one sequence of ``context`` tokens keeps resident over every layer: a
        sliding-window layer what it retains (``retained_window_tokens``, with
        ``swa_cache: window``), a global layer every position plus ``global_layer_slack``."""
        total = 0
        for layer in range(self.num_layers):
            w = self.layer_window(layer) if swa_cache == "window" else 0
            if w:
                total += self.token_bytes * retained_window_tokens(w, context, self.page_tokens, checkpoint)
            else:
                total += self.token_bytes * context + global_layer_slack
        return total


def kv_geometry(dp: KVCacheConfig, *, num_layers: int, num_kv_heads: int, head_dim: int,
                num_blocks: int, windows: Sequence[int] = ()) -> KVGeometry:
    """The geometry of an arena of ``num_blocks`` blocks under ``dp`` (ConfigError when the
    KV dtype cannot hold the heads, or not even a page of one token fits a block)."""
    check_head_dim(dp.kv_dtype, head_dim)
    page_tokens = fitted_page_tokens(dp, num_kv_heads, head_dim)
    page_bytes = kv_tile_bytes(dp.kv_dtype, num_kv_heads, head_dim, page_tokens)
    return KVGeometry(dp.kv_dtype, num_layers, num_kv_heads, head_dim, page_tokens, dp.block_bytes, page_bytes,
                      pages_per_block(dp, page_bytes, page_tokens), num_blocks, tuple(windows or ()))


def model_kv_geometry(dp: KVCacheConfig, cfg: ModelConfig, max_context_tokens: int,
                      kv_cache_tokens: int = 0) -> KVGeometry:
    """The geometry of a model's KV cache: ``cache_tokens`` in whole blocks, plus
    ``DEFAULT_SPARE_BLOCKS`` when it is sized by the default rule."""
    g = kv_geometry(dp, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                    num_blocks=1, windows=[cfg.layer_window(i) for i in range(cfg.num_layers)])
    tokens = cache_tokens(kv_cache_tokens, max_context_tokens)
    num_blocks = max(1, -(-tokens // (g.page_tokens * g.pages_per_block)))
    if not kv_cache_tokens:
        num_blocks += DEFAULT_SPARE_BLOCKS
    return replace(g, num_blocks=num_blocks)
