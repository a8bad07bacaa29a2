"""route(): every case of the documented rule, with thresholds read from the config.

CFG uses non-default thresholds (seq_path_threshold 100 instead of 8192,
locality_threshold 0.25 instead of 0.5); each boundary below falls where the
defaults would route the other way, so a router reading constants fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.config import DualPathConfig
from dualpath.scheduler.router import Path, Phase, route

CFG = DualPathConfig(seq_path_threshold=100, locality_threshold=0.25)
DEFAULT = DualPathConfig()


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
