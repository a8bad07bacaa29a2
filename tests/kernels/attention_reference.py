"""NumPy reference attention: the oracle the compiled kernels are tested against.

Plain float64 math, two-pass softmax, no tiling: slow and obviously right.
"""

from __future__ import annotations

import numpy as np


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
              scale: float | None = None, softcap: float = 0.0, window: int = 0) -> np.ndarray:
    """Causal GQA attention; ``softcap`` > 0 caps the scaled scores as softcap *
    tanh(s / softcap) (Gemma 2); ``window`` > 0 lets a query at p see only positions
    > p - window (llama.cpp's standard sliding window).

    q:       (num_tokens, num_heads, head_dim), token t at position pos0 + t
    k_cache: (num_kv_heads, capacity, head_dim), positions [0, pos0 + num_tokens) valid
    v_cache: (num_kv_heads, capacity, head_dim)
    returns  (num_tokens, num_heads, head_dim) float32
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    n_ctx = pos0 + num_tokens
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    qf = q.astype(np.float64).reshape(num_tokens, num_kv_heads, group, head_dim)
    k = k_cache[:, :n_ctx].astype(np.float64)  # (kv_heads, n_ctx, head_dim)
    v = v_cache[:, :n_ctx].astype(np.float64)
    scores = np.einsum("tkgd,knd->tkgn", qf, k) * scale  # (T, kv_heads, group, n_ctx)
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    qpos = (pos0 + np.arange(num_tokens))[:, None]
    causal = np.arange(n_ctx)[None, :] > qpos  # (T, n_ctx): masked
    if window > 0:
        causal |= np.arange(n_ctx)[None, :] <= qpos - window
    scores = np.where(causal[:, None, None, :], -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("tkgn,knd->tkgd", p, v)
    return out.reshape(num_tokens, num_heads, head_dim).astype(np.float32)
