"""Profiles resolved on every fixture: exact core sets, thread counts and ORT affinity strings."""

from pathlib import Path

import pytest
from platform_testlib import MACHINES, fixture_topology

from dualpath.cache.policy import PathPolicy
from dualpath.config import Config, PowerConfig, RuntimeConfig, load_config, with_overrides
from dualpath.errors import ConfigError
from dualpath.platform.profiles import PROFILES, resolve_plan

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# name -> profile -> (prefill class, prefill cpus, prefill ORT affinities, decode class, decode cpus, decode affinities)
EXPECTED = {
    "snapdragon_8gen2": {
        # prefill: 4 x 609 (A715/A710) beats 1 x 1024 (X3)
        "performance": ("big", (3, 4, 5, 6), "5;6;7", "big", (3, 4, 5, 6), "5;6;7"),
        "balanced": ("big", (3, 4, 5, 6), "5;6;7", "little", (0, 1, 2), "2;3"),
        "low_power": ("little", (0,), None, "little", (0,), None),
    },
    "rk3588": {
        "performance": ("big", (4, 5, 6, 7), "6;7;8", "big", (4, 5, 6, 7), "6;7;8"),
        "balanced": ("big", (4, 5, 6, 7), "6;7;8", "little", (0, 1, 2, 3), "2;3;4"),
        "low_power": ("little", (0, 1), "2", "little", (0, 1), "2"),
    },
    "exynos_4plus4": {
        "performance": ("big", (4, 5, 6, 7), "6;7;8", "big", (4, 5, 6, 7), "6;7;8"),
        "balanced": ("big", (4, 5, 6, 7), "6;7;8", "little", (0, 1, 2, 3), "2;3;4"),
        "low_power": ("little", (0, 1), "2", "little", (0, 1), "2"),
    },
    "dimensity_9300": {
        # prefill: 3 x 897 (X4 @2.85) beats 1 x 1024 (X4 @3.25); performance decode: 4 A720 > 3 X4
        "performance": ("big", (4, 5, 6), "6;7", "little", (0, 1, 2, 3), "2;3;4"),
        "balanced": ("big", (4, 5, 6), "6;7", "little", (0, 1, 2, 3), "2;3;4"),
        "low_power": ("little", (0, 1), "2", "little", (0, 1), "2"),
    },
    "intel_i7_1260p": {
        # one thread per P-core (SMT siblings 1, 3, 5, 7 stay free)
        "performance": ("big", (0, 2, 4, 6), "3;5;7", "little", tuple(range(8, 16)), "10;11;12;13;14;15;16"),
        "balanced": ("big", (0, 2, 4, 6), "3;5;7", "little", tuple(range(8, 16)), "10;11;12;13;14;15;16"),
        "low_power": ("little", (8, 9), "10", "little", (8, 9), "10"),
    },
    "x86_vm": {
        "performance": ("all", (0, 1, 2, 3), "2;3;4", "all", (0, 1, 2, 3), "2;3;4"),
        "balanced": ("all", (0, 1, 2, 3), "2;3;4", "all", (0, 1, 2, 3), "2;3;4"),
        "low_power": ("all", (0, 1), "2", "all", (0, 1), "2"),
    },
    "rk3399_cpu5_offline": {
        # the one online A72 takes prefill alone: classes never mix
        "performance": ("big", (4,), None, "little", (0, 1, 2, 3), "2;3;4"),
        "balanced": ("big", (4,), None, "little", (0, 1, 2, 3), "2;3;4"),
        "low_power": ("little", (0, 1), "2", "little", (0, 1), "2"),
    },
}


def _shape(plan):
    p, d = plan.prefill, plan.decode
    return (p.cls, p.cpus, p.ort_affinities, d.cls, d.cpus, d.ort_affinities)


def test_every_fixture_has_expected_plans():
    assert set(EXPECTED) == set(MACHINES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("profile", PROFILES)
def test_plan_core_sets_threads_and_affinities_are_exact(name, profile):
    plan = resolve_plan(profile, fixture_topology(name))
    assert _shape(plan) == EXPECTED[name][profile]
    assert plan.prefill.num_threads == len(EXPECTED[name][profile][1])
    assert plan.prefill.mask == sum(1 << c for c in EXPECTED[name][profile][1])
    topo = fixture_topology(name)
    for phase in (plan.prefill, plan.decode):  # one class per parallel region
        assert {topo.cpu(c).cls for c in phase.cpus} == {phase.cls}


def test_prefill_chunk_and_spinning_per_profile():
    topo = fixture_topology("rk3588")
    for profile in ("performance", "balanced"):
        plan = resolve_plan(profile, topo)
        assert plan.prefill_chunk_tokens == 512
        assert plan.spinning is True
    low = resolve_plan("low_power", topo)
    assert low.prefill_chunk_tokens == 128
    assert low.spinning is False
    no_spin = Config(runtime=RuntimeConfig(intra_op_spinning=False, prefill_chunk_tokens=64))
    assert resolve_plan("balanced", topo, no_spin).spinning is False
    assert resolve_plan("low_power", topo, no_spin).prefill_chunk_tokens == 64  # the smaller one


def test_thread_caps_apply_per_phase_and_runtime_num_threads_caps_both():
    topo = fixture_topology("intel_i7_1260p")
    capped = Config(power=PowerConfig(prefill_max_threads=2, decode_max_threads=3))
    plan = resolve_plan("balanced", topo, capped)
    assert (plan.prefill.cpus, plan.decode.cpus) == ((0, 2), (8, 9, 10))
    plan = resolve_plan("balanced", topo, Config(runtime=RuntimeConfig(num_threads=1)))
    assert (plan.prefill.cpus, plan.decode.cpus) == ((0,), (8,))
    assert plan.prefill.ort_affinities is None  # one thread: no worker to pin
    plan = resolve_plan("low_power", topo, Config(power=PowerConfig(low_power_max_threads=0)))
    assert plan.decode.cpus == (8, 9, 10, 11)  # half of 8 E-cores, uncapped


def test_use_smt_gives_one_thread_per_logical_cpu():
    plan = resolve_plan("balanced", fixture_topology("intel_i7_1260p"), Config(power=PowerConfig(use_smt=True)))
    assert plan.prefill.cpus == (0, 1, 2, 3, 4, 5, 6, 7)
    assert plan.prefill.ort_affinities == "2;3;4;5;6;7;8"


def test_only_allowed_cpus_are_used():
    topo = fixture_topology("rk3588")
    plan = resolve_plan("balanced", topo, allowed_cpus={1, 2, 6, 7})
    assert (plan.prefill.cpus, plan.decode.cpus) == ((6, 7), (1, 2))
    plan = resolve_plan("balanced", topo, allowed_cpus={0, 1, 2, 3})  # a cpuset of little cores only
    assert (plan.prefill.cls, plan.prefill.cpus, plan.decode.cpus) == ("little", (0, 1, 2, 3), (0, 1, 2, 3))
    with pytest.raises(ConfigError, match="is allowed for this process"):
        resolve_plan("balanced", topo.override("0:big,1:little"), allowed_cpus={5})


def test_pin_threads_off_means_no_affinity_string():
    plan = resolve_plan("balanced", fixture_topology("rk3588"), Config(power=PowerConfig(pin_threads=False)))
    assert plan.prefill.pinned is False and plan.prefill.ort_affinities is None
    assert plan.prefill.cpus == (4, 5, 6, 7)  # the thread count still follows the class


def test_two_core_override_prefill_on_cpu0_decode_on_cpu1():
    topo = fixture_topology("x86_vm").override("0:big,1:little")
    plan = resolve_plan("balanced", topo)
    assert (plan.prefill.cpus, plan.decode.cpus) == ((0,), (1,))
    assert (plan.prefill.caller_cpus, plan.decode.caller_cpus) == ({0}, {1})


def test_unknown_profile_is_refused():
    with pytest.raises(ConfigError, match="power.profile='auto' must be one of performance, balanced, low_power"):
        resolve_plan("auto", fixture_topology("x86_vm"))


@pytest.mark.parametrize("name, profile", [("low_power", "low_power"), ("android", "auto"), ("edge_box", "auto")])
def test_shipped_profile_configs_load_and_resolve(name, profile):
    config = load_config(CONFIGS / f"{name}.yaml")
    assert config.power.profile == profile
    topo = fixture_topology("snapdragon_8gen2")
    for p in PROFILES:
        resolve_plan(p, topo, config)


def test_low_power_yaml_runs_on_one_little_core_of_8gen2_without_spinning():
    config = load_config(CONFIGS / "low_power.yaml")
    plan = resolve_plan(config.power.profile, fixture_topology("snapdragon_8gen2"), config)
    assert (plan.prefill.cpus, plan.decode.cpus, plan.spinning) == ((0,), (0,), False)
    assert plan.prefill_chunk_tokens == 128
    policy = PathPolicy.from_config(config.kv_cache, config.power, plan.profile)
    assert policy.seq_path_threshold == 32768


@pytest.mark.parametrize("key, value, message", [
    ("power.profile", "turbo", "one of 'auto', 'performance', 'balanced', 'low_power'"),
    ("power.cpu_classes", "0:huge", "CPUS:CLASS items joined by commas"),
    ("power.low_battery_pct", 101, "a number between 0 and 100"),
    ("power.resume_battery_pct", 10, "must be >= power.low_battery_pct (20.0)"),
    ("power.min_switch_interval_s", -1, "a number between 0 and 3600"),
    ("power.termux_timeout_s", 0, "a number between 0.1 and 60"),
    ("power.pin_threads", "yes", "true or false"),
    ("power.no_battery_profile", "auto", "one of 'performance', 'balanced', 'low_power'"),
])
def test_bad_power_settings_name_key_and_range(key, value, message):
    with pytest.raises(ConfigError) as err:
        with_overrides(Config(), {key: value})
    assert str(err.value).startswith(f"<overrides>: {key}=")
    assert message in str(err.value)
