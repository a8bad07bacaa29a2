"""Sliding-window layers give back what is behind their window (cache/windows.py): the
same tokens as a cache that keeps everything, on both paths, with prefix reuse cut
exactly where a window it needs was given back."""

from __future__ import annotations

import numpy as np
import pytest

from dualpath.config import load_config
from dualpath.kernels import KVArena
from dualpath.llm import LLM
from dualpath.models.synth import synth_gguf
from dualpath.sampling.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma3_tiny(tmp_path_factory) -> str:
    """Gemma 3 shapes: 2 of 3 layers slide over 10 positions; a 16-token page of one
    layer is 4 KiB, one OS page, so releasing it gives memory back."""
    return synth_gguf(tmp_path_factory.mktemp("swa") / "gemma3-tiny.gguf", "gemma3-tiny", "F32", seed=1)


def llm(path: str, swa_cache: str, checkpoint: int = 0, path_mode: str = "dual") -> LLM:
    return LLM(path, load_config(None, {
        "runtime.num_threads": 1, "runtime.max_context_tokens": 512, "kv_cache.swa_cache": swa_cache,
        "kv_cache.swa_checkpoint_tokens": checkpoint, "kv_cache.path_mode": path_mode,
        "kv_cache.seq_path_threshold": 256}))


def three_requests(model: LLM) -> tuple[list, list]:
    """A: a 300-token prefix and 3 tokens; B: the prefix and 2 others; C: its first 150
    tokens and 2 others. Returns their tokens and cached prompt tokens."""
    prefix = np.random.default_rng(0).integers(3, 2048, 300).tolist()
    out = [model.generate(p, GREEDY) for p in (prefix + [5, 6, 7], prefix + [8, 9], prefix[:150] + [10, 11])]
    model.runner.cache.check_invariants()
    return [c.token_ids for c in out], [c.usage.cached_prompt_tokens for c in out]


@pytest.mark.parametrize("path_mode", ["dual", "random", "sequential"])
def test_released_windows_change_no_token_on_either_path(gemma3_tiny, path_mode):
    full_tokens, _ = three_requests(llm(gemma3_tiny, "full", path_mode=path_mode))
    model = llm(gemma3_tiny, "window", path_mode=path_mode)
    tokens, _ = three_requests(model)
    assert tokens == full_tokens
    windows = model.runner.cache.windows
    assert windows.released_pages > 0 and windows.released.any()
    assert llm(gemma3_tiny, "full").runner.cache.windows is None


def test_prefix_reuse_stops_where_a_needed_window_was_released(gemma3_tiny):
    """A's prompt end keeps 2 windows before it, so B (which parts from A in A's last 3
    tokens) reuses all its 18 whole pages; C parts at 150, where A released the window
    before every page boundary: nothing is reused, unless a checkpoint every 64
    positions kept one (128 = the last checkpoint before 150)."""
    _, full_cached = three_requests(llm(gemma3_tiny, "full"))
    assert full_cached == [0, 288, 144]
    _, cached = three_requests(llm(gemma3_tiny, "window"))
    assert cached == [0, 288, 0]
    _, cached = three_requests(llm(gemma3_tiny, "window", checkpoint=64))
    assert cached == [0, 288, 128]


def test_release_tiles_zeroes_only_the_flagged_layers_and_checks_offsets():
    arena = KVArena(131072, 2, 3, 1, 64)
    P, tile = 16, arena.tile_bytes(16)
    assert tile == 4096
    slots = np.array([[tile, r, P] for r in range(P)], np.int64)
    k = np.ones((P, 64), np.float32)
    for layer in range(3):
        arena.write(layer, k, k, slots)
    arena.release_tiles([0, 1, 1], np.array([tile], np.int64), P)
    spans = np.array([[tile, P, P]], np.int64)
    assert arena.gather(0, spans, P)[0].min() == 1.0          # kept
    assert not arena.gather(1, spans, P)[0].any()             # released: reads as zeros
    assert not arena.gather(2, spans, P)[1].any()
    with pytest.raises(ValueError, match="does not start a tile"):
        arena.release_tiles([1, 1, 1], np.array([100], np.int64), P)
    with pytest.raises(IndexError):
        arena.release_tiles([1, 1, 1], np.array([2 * 131072], np.int64), P)
    with pytest.raises(ValueError, match="3 flags"):
        arena.release_tiles([1, 1], np.array([0], np.int64), P)
