"""What the cache hands its callers: where new tokens go, or that there is no room.

They exist so that the scheduler acts on a value, never on the
cache's tables (``KVCacheManager`` in cache/manager.py returns them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .policy import Path


@dataclass(frozen=True)
class NoRoom:
    """Not enough free or evictable pages for ``needed_pages`` more pages."""

    needed_pages: int
    free_pages: int

    def __bool__(self) -> bool:  # so `if not result:` reads naturally
        return False


@dataclass(frozen=True)
class Allocation:
    """Where the new tokens go: slots (num_tokens, 3) int64 rows of (offset, row, P)."""

    slots: np.ndarray
    path: Path
    pos0: int = 0
    """Position of the first new token."""
    prefill: bool = False
    """The tokens are (or end) the sequence's prompt: a prefill step for the kernels."""
