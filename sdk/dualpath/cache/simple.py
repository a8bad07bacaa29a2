"""A contiguous per-sequence KV cache: the simple cache the dual-path cache replaces.

One sequence, one preallocated buffer per K and V, written in place by the
compiled ``ContiguousKV.step`` (write new rows, then attend).
"""

from __future__ import annotations

import numpy as np

from .._kernels import ContiguousKV

KV_DTYPES = {"f32": np.float32, "f16": np.float16}


class SimpleKVCache:
    """KV storage for one sequence of up to ``capacity_tokens`` positions.

    k_cache, v_cache: (num_layers, num_kv_heads, capacity_tokens, head_dim) of kv_dtype
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity_tokens: int,
                 kv_dtype: str = "f32"):
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={kv_dtype!r} must be one of {sorted(KV_DTYPES)}")
        shape = (num_layers, num_kv_heads, capacity_tokens, head_dim)
        self.kv_dtype = kv_dtype
        self.capacity_tokens = capacity_tokens
        self.k_cache = np.zeros(shape, dtype=KV_DTYPES[kv_dtype])  # (L, kv_heads, capacity, head_dim)
        self.v_cache = np.zeros(shape, dtype=KV_DTYPES[kv_dtype])  # (L, kv_heads, capacity, head_dim)
        self.num_tokens = 0
        """Positions [0, num_tokens) hold valid keys and values."""

    @property
    def nbytes(self) -> int:
        return int(self.k_cache.nbytes + self.v_cache.nbytes)

    def bind(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, scale: float) -> ContiguousKV:
        """The compiled stepper over this cache and the step's q/k/v/out buffers."""
        return ContiguousKV(self.k_cache, self.v_cache, q, k, v, out, scale)

    def reset(self) -> None:
        self.num_tokens = 0

    def truncate(self, num_tokens: int) -> None:
        """Forget positions >= num_tokens (keep a shared prompt prefix)."""
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"cannot truncate a cache of {self.num_tokens} tokens to {num_tokens}")
        self.num_tokens = num_tokens
