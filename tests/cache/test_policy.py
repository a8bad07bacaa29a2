"""The path policy (cache/policy.py): every case of the documented routing rule, the
migration rule and the low_power override, with thresholds read from the config.

CFG uses non-default thresholds (seq_path_threshold 100 instead of 8192,
locality_threshold 0.25 instead of 0.5); each boundary below falls where the
defaults would route the other way, so a router reading constants fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.cache.manager import KVCacheManager
from dualpath.cache.policy import Path, PathPolicy, Phase
from dualpath.config import KVCacheConfig, PowerConfig

CFG = KVCacheConfig(seq_path_threshold=100, locality_threshold=0.25)
DEFAULT = KVCacheConfig()


def route(cfg: KVCacheConfig, phase: Phase, context_tokens: int, locality: float = 0.0) -> Path:
    return PathPolicy.from_config(cfg).route(phase, context_tokens, locality)


def test_config_thresholds_differ_from_defaults():
    assert (DEFAULT.seq_path_threshold, DEFAULT.locality_threshold) == (8192, 0.5)
    assert CFG.path_mode == "dual"


@pytest.mark.parametrize("context_tokens", [101, 102, 8192, 10**6])
def test_prefill_above_seq_path_threshold_takes_sequential_path(context_tokens):
    assert route(CFG, Phase.PREFILL, context_tokens) is Path.SEQUENTIAL


@pytest.mark.parametrize("context_tokens", [0, 1, 99, 100])
def test_prefill_at_or_below_seq_path_threshold_takes_hybrid_path(context_tokens):
    assert route(CFG, Phase.PREFILL, context_tokens) is Path.HYBRID


def test_prefill_threshold_is_read_from_config():
    assert route(CFG, Phase.PREFILL, 101) is Path.SEQUENTIAL
    assert route(DEFAULT, Phase.PREFILL, 101) is Path.HYBRID
    assert route(DEFAULT, Phase.PREFILL, 8192) is Path.HYBRID
    assert route(DEFAULT, Phase.PREFILL, 8193) is Path.SEQUENTIAL


@pytest.mark.parametrize("locality", [0.0, 1.0])
def test_prefill_ignores_locality(locality):
    assert route(CFG, Phase.PREFILL, 50, locality) is Path.HYBRID
    assert route(CFG, Phase.PREFILL, 500, locality) is Path.SEQUENTIAL


@pytest.mark.parametrize("locality", [0.25, 0.26, 0.5, 1.0])
def test_decode_at_or_above_locality_threshold_takes_sequential_path(locality):
    assert route(CFG, Phase.DECODE, 64, locality) is Path.SEQUENTIAL


@pytest.mark.parametrize("locality", [0.0, 0.1, 0.2499])
def test_decode_below_locality_threshold_takes_random_path(locality):
    assert route(CFG, Phase.DECODE, 64, locality) is Path.RANDOM


def test_decode_locality_threshold_is_read_from_config():
    assert route(CFG, Phase.DECODE, 64, 0.3) is Path.SEQUENTIAL
    assert route(DEFAULT, Phase.DECODE, 64, 0.3) is Path.RANDOM
    assert route(DEFAULT, Phase.DECODE, 64, 0.5) is Path.SEQUENTIAL


@pytest.mark.parametrize("context_tokens", [1, 100, 101, 10**6])
def test_decode_ignores_context_length(context_tokens):
    assert route(CFG, Phase.DECODE, context_tokens, 0.0) is Path.RANDOM
    assert route(CFG, Phase.DECODE, context_tokens, 1.0) is Path.SEQUENTIAL


def test_decode_without_a_locality_score_counts_as_scattered():
    assert route(CFG, Phase.DECODE, 10**6) is Path.RANDOM
    zero = dataclasses.replace(CFG, locality_threshold=0.0)
    assert route(zero, Phase.DECODE, 10**6) is Path.SEQUENTIAL


def test_locality_threshold_one_needs_fully_contiguous_reads():
    one = dataclasses.replace(CFG, locality_threshold=1.0)
    assert route(one, Phase.DECODE, 64, 0.999) is Path.RANDOM
    assert route(one, Phase.DECODE, 64, 1.0) is Path.SEQUENTIAL


CASES = [(Phase.PREFILL, 1, 0.0), (Phase.PREFILL, 100, 1.0), (Phase.PREFILL, 101, 0.0),
         (Phase.PREFILL, 10**6, 1.0), (Phase.DECODE, 64, 0.0), (Phase.DECODE, 64, 0.25),
         (Phase.DECODE, 10**6, 1.0), (Phase.DECODE, 1, 0.2499)]


@pytest.mark.parametrize("phase,context_tokens,locality", CASES)
def test_path_mode_sequential_forces_sequential_in_every_phase(phase, context_tokens, locality):
    cfg = dataclasses.replace(CFG, path_mode="sequential")
    assert route(cfg, phase, context_tokens, locality) is Path.SEQUENTIAL


@pytest.mark.parametrize("phase,context_tokens,locality", CASES)
def test_path_mode_random_forces_random_in_every_phase(phase, context_tokens, locality):
    cfg = dataclasses.replace(CFG, path_mode="random")
    assert route(cfg, phase, context_tokens, locality) is Path.RANDOM


def test_dual_mode_reaches_every_path_over_the_cases():
    assert {route(CFG, *case) for case in CASES} == {Path.SEQUENTIAL, Path.HYBRID, Path.RANDOM}


# -- migration ------------------------------------------------------------------

@pytest.mark.parametrize("path", [Path.RANDOM, Path.HYBRID])
def test_a_scattered_sequence_past_the_threshold_migrates(path):
    policy = PathPolicy.from_config(CFG)
    assert policy.migrates(path, 101, 0.24)
    assert not policy.migrates(path, 100, 0.0)     # not past the threshold
    assert not policy.migrates(path, 101, 0.25)    # local enough already


def test_a_sequential_sequence_never_migrates():
    assert not PathPolicy.from_config(CFG).migrates(Path.SEQUENTIAL, 10**6, 0.0)


@pytest.mark.parametrize("mode", ["sequential", "random"])
def test_forced_path_modes_never_migrate(mode):
    policy = PathPolicy.from_config(dataclasses.replace(CFG, path_mode=mode))
    assert not policy.migrates(Path.RANDOM, 10**6, 0.0)


# -- power profiles ---------------------------------------------------------------

LOW = PowerConfig(low_power_seq_path_threshold=32768)


@pytest.mark.parametrize("profile", ["", "performance", "balanced", "auto"])
def test_profiles_other_than_low_power_keep_the_configured_threshold(profile):
    assert PathPolicy.from_config(DEFAULT, LOW, profile).seq_path_threshold == 8192


def test_low_power_raises_the_threshold_and_changes_the_route():
    normal = PathPolicy.from_config(DEFAULT, LOW, "balanced")
    low = PathPolicy.from_config(DEFAULT, LOW, "low_power")
    assert low.seq_path_threshold == 32768
    # A 10k-token document: an extent of its own normally, on pages in low_power.
    assert normal.route(Phase.PREFILL, 10_000) is Path.SEQUENTIAL
    assert low.route(Phase.PREFILL, 10_000) is Path.HYBRID
    # A 10k-token scattered sequence: migrates normally, stays put in low_power.
    assert normal.migrates(Path.RANDOM, 10_000, 0.0)
    assert not low.migrates(Path.RANDOM, 10_000, 0.0)


def test_low_power_never_lowers_a_larger_configured_threshold():
    big = dataclasses.replace(DEFAULT, seq_path_threshold=65536)
    assert PathPolicy.from_config(big, LOW, "low_power").seq_path_threshold == 65536


def test_the_cache_routes_by_the_policy_it_is_given():
    # The same manager, the same prompt: the policy swapped in (as the runner does when
    # the governor switches profile) decides the path of the next request.
    dp = KVCacheConfig(block_bytes=4096, page_tokens=4, kv_dtype="f32", seq_path_threshold=16)
    cache = KVCacheManager(dp, num_layers=1, num_kv_heads=1, head_dim=4, num_blocks=16)
    power = PowerConfig(low_power_seq_path_threshold=64)
    prompt = list(range(40))
    a, b = cache.new_seq_id(), cache.new_seq_id()
    cache.start(a, prompt)
    cache.policy = PathPolicy.from_config(dp, power, "low_power")
    cache.start(b, prompt)
    assert (cache.path_of(a), cache.path_of(b)) == (Path.SEQUENTIAL, Path.HYBRID)
