"""A sequence's page table: its pages in position order, its tokens and their hashes.

The manager (cache/manager.py) owns every ``Sequence``; callers reach them only
through its facade. ``span_*`` fields are the kernel view folded so far
(cache/kernel_view.py), kept here so that a step folds in only the new pages.
"""

from __future__ import annotations

from collections.abc import Sequence as _Seq
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

from .policy import Path

TokenIds: TypeAlias = "_Seq[int] | np.ndarray"
"""Token ids as the cache takes them: a list (or other sequence) of ints, or an int array."""


@dataclass
class Sequence:
    seq_id: int
    salt: bytes
    path: Path
    register_pages: bool
    """Hash full pages into the prefix table (off only in the forced sequential mode)."""
    pages: list[int] = field(default_factory=list)
    """Page ids in position order; page i holds positions [i * P, (i + 1) * P)."""
    tokens: list[int] = field(default_factory=list)
    """Token id per position whose KV is (or is being) written."""
    hashes: list[bytes] = field(default_factory=list)
    """Chained hash per full page (also for pages not registered)."""
    blocks: list[int] = field(default_factory=list)
    """Blocks this sequence owns as extents (sequential path), in order."""
    committed: int = 0
    """Tokens whose KV is known written (after the step that wrote them)."""
    prompt_tokens: int = 0
    """Length of the prompt given to start(): positions below it are prefill."""
    released_upto: int = 0
    """Pages before it were looked at by the sliding-window release (cache/windows.py)."""
    span_rows: np.ndarray = field(default_factory=lambda: np.zeros((8, 3), np.int64))
    """Kernel view cache: (capacity, 3) rows (offset, tokens if every page were full, P)."""
    span_n: int = 0
    span_pages: int = 0
    """Pages of ``pages`` already folded into ``span_rows``; -1 after a page changed place."""
    span_long: int = 0
    """Tokens in the folded spans but the last (closed: full pages only) that are at least
    ``span_window`` long: the locality score's numerator without the open last span."""
    span_window: int = 0
    """The ``locality_window`` ``span_long`` was counted with (recounted when the policy's changes)."""

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)
