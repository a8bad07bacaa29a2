"""The path policy: the one home of every rule that decides which part of the
dual-path cache a request's tokens use. The cache applies it (``KVCacheManager``
routes and migrates through its ``policy``); the scheduler hands it the power
profile's policy between steps; the cache benchmark and ``dualpath info`` read
the same object. Nothing else decides a path.

**Routing**, with thresholds from ``kv_cache``:

* prefill whose context exceeds ``seq_path_threshold``  -> SEQUENTIAL
  (a long document: contiguous extents);
* shorter prefill                                       -> HYBRID
  (its cached prefix from pages, the rest continuing in an extent);
* decode whose locality score is >= ``locality_threshold`` -> SEQUENTIAL
  (keep streaming into the sequence's extent);
* other decode                                          -> RANDOM (pages).

The locality score is *measured*, not assumed: the share of the sequence's KV
reads (its tokens, as the kernel reads every one per step) that land in
contiguous runs of at least ``locality_window`` tokens, taken from the kernel
view after merging physically adjacent pages (``KVCacheManager.locality_score``).
A sequence whose pages lie back to back scores high whatever path wrote them;
one stitched from scattered shared pages scores low.

**Migration**: a decoding sequence that has grown past ``seq_path_threshold`` on
scattered pages (not on the sequential path, locality below the threshold)
moves into one extent at the step boundary (bit-exact copy), so its long reads
stream. Only in the ``dual`` path mode.

**Power profile overrides** (``config.PROFILE_OVERRIDES``, the one table): ``low_power``
raises ``seq_path_threshold`` to ``power.low_power_seq_path_threshold`` when that is larger. Contexts below it
stay on pages: their prefill is hybrid (prefix pages are reused, no extent
blocks are claimed for a whole document) and they migrate later or never.

``path_mode`` ``sequential`` / ``random`` forces one path for comparisons.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..config import KVCacheConfig, PowerConfig, profile_value


class Path(enum.Enum):
    SEQUENTIAL = "sequential"
    RANDOM = "random"
    HYBRID = "hybrid"


class Phase(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class PathPolicy:
    """The thresholds in force (see the module docstring); build it with ``from_config``."""

    path_mode: str = "dual"
    """``dual`` routes per request; ``sequential`` or ``random`` force one path."""
    seq_path_threshold: int = 8192
    """Context tokens above which a prefill takes the sequential path and a scattered
    decoding sequence migrates into an extent."""
    locality_threshold: float = 0.5
    """Locality score at or above which decode takes the sequential path."""
    locality_window: int = 512
    """Contiguous run length (tokens) that counts as local in the locality score."""
    profile: str = ""
    """The power profile this policy was made for ("" = none)."""

    @classmethod
    def from_config(cls, dp: KVCacheConfig, power: PowerConfig | None = None, profile: str = "") -> PathPolicy:
        """The policy of ``kv_cache`` under power ``profile`` (its overrides need ``power``)."""
        threshold = profile_value(profile, "kv_cache.seq_path_threshold", dp.seq_path_threshold, power)
        return cls(dp.path_mode, threshold, dp.locality_threshold, dp.locality_window, profile)

    def route(self, phase: Phase, context_tokens: int, locality: float = 0.0) -> Path:
        """The path for one request at one step."""
        if self.path_mode == "sequential":
            return Path.SEQUENTIAL
        if self.path_mode == "random":
            return Path.RANDOM
        if phase is Phase.PREFILL:
            return Path.SEQUENTIAL if context_tokens > self.seq_path_threshold else Path.HYBRID
        return Path.SEQUENTIAL if locality >= self.locality_threshold else Path.RANDOM

    def migrates(self, path: Path, context_tokens: int, locality: float) -> bool:
        """A decoding sequence on ``path`` with this context and locality moves into an extent."""
        return (self.path_mode == "dual" and path is not Path.SEQUENTIAL
                and context_tokens > self.seq_path_threshold and locality < self.locality_threshold)

    def summary(self) -> str:
        """One line for ``dualpath info``."""
        if self.path_mode != "dual":
            return f"{self.path_mode} only (path_mode={self.path_mode})"
        return (f"dual, sequential from {self.seq_path_threshold} tokens, decode by locality "
                f">= {self.locality_threshold:g} over {self.locality_window}-token runs")
