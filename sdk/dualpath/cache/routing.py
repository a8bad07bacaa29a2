"""The path rule: which part of the dual-path cache a request's tokens go to.

It lives with the cache (the manager applies it when a caller gives no path) and
is published to the scheduler as ``dualpath.scheduler.router``, so no lower layer
imports a higher one.

The rule, with thresholds from ``dualpath_config``:

* prefill whose context exceeds ``seq_path_threshold``  -> SEQUENTIAL
  (a long document: contiguous extents, no prefix caching);
* shorter prefill                                       -> HYBRID
  (its cached prefix from pages, the rest continuing in an extent);
* decode whose locality score is >= ``locality_threshold`` -> SEQUENTIAL
  (keep streaming into the sequence's extent);
* other decode                                          -> RANDOM (pages).

The locality score is *measured*, not assumed: the share of the sequence's KV
reads (its tokens, as the kernel reads every one per step) that land in
contiguous runs of at least ``locality_window`` tokens, taken from the kernel
view after merging physically adjacent pages (``cache.manager.locality_score``).
A sequence whose pages lie back to back scores high whatever path wrote them;
one stitched from scattered shared pages scores low.
``path_mode`` ``sequential`` / ``random`` forces one path for comparisons.
"""

from __future__ import annotations

import enum

from ..config import DualPathConfig


class Path(enum.Enum):
    SEQUENTIAL = "sequential"
    RANDOM = "random"
    HYBRID = "hybrid"


class Phase(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


def route(cfg: DualPathConfig, phase: Phase, context_tokens: int, locality: float = 0.0) -> Path:
    """The path for one request at one step."""
    if cfg.path_mode == "sequential":
        return Path.SEQUENTIAL
    if cfg.path_mode == "random":
        return Path.RANDOM
    if phase is Phase.PREFILL:
        return Path.SEQUENTIAL if context_tokens > cfg.seq_path_threshold else Path.HYBRID
    return Path.SEQUENTIAL if locality >= cfg.locality_threshold else Path.RANDOM
