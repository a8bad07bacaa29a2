"""Sampler: llama.cpp's default chain, checked token by token and statistically."""

import math

import numpy as np
import pytest

from dualpath.errors import SamplingParamsError
from dualpath.sampling.sampler import Sampler, SamplingParams

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)  # no filters


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def counts(sampler, logits, n, history=()):
    out = np.zeros(len(logits), np.int64)
    for _ in range(n):
        out[sampler.sample(logits, history)] += 1
    return out


def chi_square(observed, probs):
    expected = probs * observed.sum()
    keep = expected > 0
    assert observed[~keep].sum() == 0, "drew a token of probability 0"
    return float((((observed - expected) ** 2)[keep] / expected[keep]).sum())


@pytest.fixture
def logits():
    return np.random.default_rng(0).normal(0, 3, 1000).astype(np.float32)


def test_greedy_is_argmax(logits):
    sampler = Sampler(SamplingParams(temperature=0.0, seed=1), 1000)
    assert sampler.sample(logits) == int(np.argmax(logits))


def test_greedy_ties_pick_the_lowest_id():
    logits = np.array([1.0, 3.0, 0.0, 3.0], np.float32)
    assert Sampler(SamplingParams(temperature=0.0), 4).sample(logits) == 1


def test_sampling_leaves_the_callers_logits_untouched(logits):
    before = logits.copy()
    sampler = Sampler(SamplingParams(repetition_penalty=1.3, min_p=0.2, top_k=0, top_p=1.0, seed=0), 1000)
    sampler.sample(logits, history=[int(np.argmax(logits)), 5, 7])
    np.testing.assert_array_equal(logits, before)


def test_repetition_penalty_divides_a_positive_logit_and_moves_argmax():
    logits = np.array([2.0, 1.9, 0.0], np.float32)
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    assert Sampler(greedy, 3).sample(logits, history=[]) == 0
    assert Sampler(greedy, 3).sample(logits, history=[0]) == 1  # 2.0 / 1.5 < 1.9


def test_repetition_penalty_multiplies_a_negative_logit():
    logits = np.array([-1.0, -1.2], np.float32)
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    assert Sampler(greedy, 2).sample(logits, history=[0]) == 1  # -1.0 * 1.5 < -1.2


def test_repetition_penalty_counts_each_distinct_token_once():
    logits = np.array([2.0, 1.9], np.float32)
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.04)
    assert Sampler(greedy, 2).sample(logits, history=[0, 0, 0]) == 0  # 2.0/1.04 > 1.9; 2.0/1.04**3 would not be


def test_repetition_penalty_only_sees_the_last_window_tokens():
    logits = np.array([2.0, 1.9, 0.0], np.float32)
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5, repetition_window=2)
    assert Sampler(params, 3).sample(logits, history=np.array([0, 2, 2])) == 0
    assert Sampler(params, 3).sample(logits, history=np.array([2, 2, 0])) == 1


def test_history_with_an_id_outside_the_vocabulary_raises():
    with pytest.raises(ValueError, match="history"):
        Sampler(SamplingParams(repetition_penalty=1.2), 3).sample(np.zeros(3, np.float32), [3])


def test_logits_of_the_wrong_shape_raise():
    with pytest.raises(ValueError, match=r"must be \(4,\)"):
        Sampler(SamplingParams(), 4).sample(np.zeros(5, np.float32))


@pytest.mark.parametrize("temperature", [0.1, 1.0, 5.0, 100.0])
def test_top_k_1_is_greedy_at_any_temperature(logits, temperature):
    sampler = Sampler(SamplingParams(top_k=1, temperature=temperature, seed=3), 1000)
    assert {sampler.sample(logits) for _ in range(50)} == {int(np.argmax(logits))}


def test_top_k_draws_only_from_the_k_best_on_a_large_vocabulary():
    logits = np.random.default_rng(1).normal(0, 1, 32000).astype(np.float32)
    best = set(np.argsort(-logits)[:5].tolist())
    sampler = Sampler(SamplingParams(top_k=5, top_p=1.0, min_p=0.0, temperature=10.0, seed=4), 32000)
    assert {sampler.sample(logits) for _ in range(500)} == best


def test_tiny_top_p_is_argmax(logits):
    sampler = Sampler(SamplingParams(top_k=0, top_p=1e-9, min_p=0.0, temperature=5.0, seed=5), 1000)
    assert {sampler.sample(logits) for _ in range(50)} == {int(np.argmax(logits))}


@pytest.mark.parametrize("top_k", [0, 4])
@pytest.mark.parametrize("top_p, kept", [(0.75, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_k, top_p, kept):
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    sampler = Sampler(SamplingParams(top_k=top_k, top_p=top_p, min_p=0.0, temperature=1.0, seed=6), 4)
    assert set(np.flatnonzero(counts(sampler, logits, 2000))) == kept


@pytest.mark.parametrize("top_k", [0, 4])
def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability(top_k):
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    sampler = Sampler(SamplingParams(top_k=top_k, top_p=1.0, min_p=0.2, temperature=1.0, seed=7), 4)
    drawn = counts(sampler, logits, 4000)
    assert drawn[3] == 0 and drawn[:2].all() and drawn[2] > 0  # 0.05 < 0.2 * 0.5 <= 0.15
    assert chi_square(drawn, np.array([0.5, 0.3, 0.15, 0.0]) / 0.95) < 20  # renormalised over survivors


def test_same_seed_gives_the_same_tokens(logits):
    params = SamplingParams(temperature=1.5, top_k=0, top_p=0.99, min_p=0.0, seed=42)
    a, b = Sampler(params, 1000), Sampler(params, 1000)
    assert [a.sample(logits) for _ in range(200)] == [b.sample(logits) for _ in range(200)]


def test_different_seeds_give_different_tokens():
    flat = np.zeros(1000, np.float32)  # 200 draws from 1000 equal tokens: agreement is ~1 in 1000 each
    a = Sampler(SamplingParams(seed=1, **OFF), 1000)
    b = Sampler(SamplingParams(seed=2, **OFF), 1000)
    same = sum(a.sample(flat) == b.sample(flat) for _ in range(200))
    assert same < 10


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_unfiltered_draws_match_softmax_of_logits_over_temperature(temperature):
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, -np.inf], np.float32)
    sampler = Sampler(SamplingParams(temperature=temperature, seed=8, **OFF), 8)
    drawn = counts(sampler, logits, 40000)
    probs = softmax(logits.astype(np.float64) / temperature)
    # 6 degrees of freedom (7 live tokens); P(chi2 > 35) ~ 4e-6, and the seed is fixed.
    assert chi_square(drawn, probs) < 35


def test_a_single_remaining_candidate_needs_no_random_draw():
    logits = np.array([0.0, 10.0, -np.inf], np.float32)
    sampler = Sampler(SamplingParams(min_p=0.5, top_k=0, top_p=1.0, temperature=1.0), 3)
    assert sampler.sample(logits) == 1


def test_all_minus_inf_logits_raise():
    with pytest.raises(ValueError, match="no finite maximum"):
        Sampler(SamplingParams(**OFF), 3).sample(np.full(3, -np.inf, np.float32))


def test_stop_string_is_wrapped_in_a_tuple():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


def test_int_temperature_is_stored_as_float():
    params = SamplingParams(temperature=1, top_k=np.int64(5))
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert type(params.top_k) is int


@pytest.mark.parametrize("name, value, allowed", [
    ("temperature", -1.0, ">= 0"),
    ("temperature", math.nan, ">= 0"),
    ("temperature", math.inf, ">= 0"),
    ("top_p", 1.5, "> 0 and <= 1"),
    ("top_p", 0.0, "> 0 and <= 1"),
    ("top_p", math.nan, "> 0 and <= 1"),
    ("top_k", -1, ">= 0"),
    ("top_k", 2.5, ">= 0"),
    ("max_tokens", 0, ">= 1"),
    ("max_tokens", True, ">= 1"),
    ("min_p", -0.1, "between 0 and 1"),
    ("min_p", 1.1, "between 0 and 1"),
    ("repetition_penalty", 0.0, "> 0"),
    ("repetition_penalty", math.nan, "> 0"),
    ("repetition_window", -1, ">= 0"),
    ("seed", -1, "None or an integer >= 0"),
    ("seed", "7", "None or an integer >= 0"),
    ("stop", [""], "non-empty strings"),
    ("stop", None, "non-empty strings"),
    ("ignore_eos", 1, "True or False"),
])
def test_bad_params_raise_naming_the_param_value_and_range(name, value, allowed):
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(**{name: value})
    assert str(err.value).startswith(f"{name}=")
    assert "must be" in str(err.value) and allowed in str(err.value)


def test_temperature_error_reads_like_the_house_style():
    with pytest.raises(SamplingParamsError, match=r"^temperature=-1.0 must be >= 0"):
        SamplingParams(temperature=-1.0)


def test_bad_vocab_size_raises():
    with pytest.raises(SamplingParamsError, match="vocab_size=0"):
        Sampler(SamplingParams(), 0)


@pytest.mark.parametrize("scale, top_p", [(2.0, 0.3), (4.0, 0.9), (3.0, 0.9), (2.0, 0.9)])
def test_nucleus_without_top_k_matches_a_full_sort(scale, top_p):
    # Nuclei of about 190, 240, 1560 and 7700 tokens: the partial search must grow past 64.
    n_vocab = 32000
    logits = np.random.default_rng(2).normal(0, scale, n_vocab).astype(np.float32)
    logits[0] = -1e30  # probability 0, so top_k=n_vocab-1 (a full sort of the rest) is the reference
    probs = softmax(logits.astype(np.float64))
    order = np.argsort(-probs, kind="stable")
    nucleus = set(order[:np.searchsorted(np.cumsum(probs[order]), top_p) + 1].tolist())
    fast = Sampler(SamplingParams(top_k=0, top_p=top_p, min_p=0.0, temperature=1.0, seed=9), n_vocab)
    full = Sampler(SamplingParams(top_k=n_vocab - 1, top_p=top_p, min_p=0.0, temperature=1.0, seed=9), n_vocab)
    drawn = [fast.sample(logits) for _ in range(150)]
    assert drawn == [full.sample(logits) for _ in range(150)]
    assert set(drawn) <= nucleus
