"""The governor on a simulated power trace: exact switch points, hysteresis, rate limiting."""

import os

import pytest
from platform_testlib import fixture_topology

from dualpath.config import Config, PowerConfig
from dualpath.platform.governor import Governor, Switch
from dualpath.platform.power import PowerState, ThermalZone


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Trace:
    """A power reader that returns whatever the test set last, and counts the reads."""

    def __init__(self):
        self.state = PowerState()
        self.reads = 0

    def __call__(self) -> PowerState:
        self.reads += 1
        return self.state


def phone(pct, status, temp_c, ac=None, trip_c=80.0):
    return PowerState(battery_pct=pct, battery_status=status, ac_online=ac,
                      zones=(ThermalZone("thermal_zone0", "cpu-1-0", temp_c, trip_c),),
                      sources=("power_supply", "thermal"))


def make(config=None, topology="snapdragon_8gen2"):
    clock, trace = FakeClock(), Trace()
    config = config or Config(power=PowerConfig(min_switch_interval_s=10.0, poll_interval_s=0.0))
    gov = Governor(fixture_topology(topology), trace, config, clock, allowed_cpus=range(16))
    return gov, clock, trace


# (time s, battery %, status, AC, hottest zone C (trip 80 C), expected profile)
TRACE = [
    (0, 60, "discharging", False, 45.0, "balanced"),      # first choice
    (5, 40, "discharging", False, 50.0, "balanced"),
    (10, 20, "discharging", False, 55.0, "balanced"),     # 20% is not below 20%
    (15, 19, "discharging", False, 60.0, "low_power"),    # battery low while discharging
    (20, 21, "discharging", False, 65.0, "low_power"),    # hysteresis: 21% is not above 30%
    (25, 18, "discharging", False, 76.0, "low_power"),    # and now hot: 4 C below the trip
    (30, 18, "charging", True, 74.0, "low_power"),        # charger in, but 6 C <= 5 + 5 C hysteresis: still hot
    (35, 19, "charging", True, 71.0, "low_power"),        # 9 C below the trip: still hot
    (40, 20, "charging", True, 69.0, "performance"),      # 11 C below the trip, charging: performance
    (45, 21, "charging", True, 77.0, "performance"),      # hot again, but the last switch was 5 s ago
    (50, 22, "charging", True, 77.0, "low_power"),        # 10 s after the last switch: low_power
    (55, 23, "charging", True, 60.0, "low_power"),        # cool, but the last switch was 5 s ago
    (60, 24, "charging", True, 60.0, "performance"),
]


def test_power_trace_switches_at_exactly_the_expected_steps():
    gov, clock, trace = make()
    seen = []
    for t, pct, status, ac, temp, _expected in TRACE:
        clock.now = t
        trace.state = phone(pct, status, temp, ac)
        seen.append((t, gov.choose().profile))
    assert seen == [(row[0], row[-1]) for row in TRACE]
    assert [(s.time_s, s.old, s.new) for s in gov.switches] == [
        (0, None, "balanced"), (15, "balanced", "low_power"), (40, "low_power", "performance"),
        (50, "performance", "low_power"), (60, "low_power", "performance")]
    assert [s.reason for s in gov.switches] == [
        "on battery (60%)", "battery 19% and discharging", "on external power",
        "hot: cpu-1-0 at 77.0 °C, trip 80.0 °C", "on external power"]
    assert trace.reads == len(TRACE)


def test_switching_changes_the_plan_object_and_only_then():
    gov, clock, trace = make()
    plans = []
    for t, pct, status, ac, temp, _ in TRACE:
        clock.now = t
        trace.state = phone(pct, status, temp, ac)
        plans.append(gov.choose())
    changes = [TRACE[i][0] for i in range(1, len(plans)) if plans[i] is not plans[i - 1]]
    assert changes == [15, 40, 50, 60]
    low, perf = plans[3], plans[8]
    assert (low.prefill.cpus, low.decode.cpus, low.spinning) == ((0,), (0,), False)
    assert (perf.prefill.cpus, perf.decode.cpus) == ((3, 4, 5, 6), (3, 4, 5, 6))
    assert plans[0].decode.cpus == (0, 1, 2) and plans[0].requested == "auto"


def test_battery_hysteresis_leaves_low_power_only_above_resume_level():
    gov, clock, trace = make(Config(power=PowerConfig(min_switch_interval_s=0.0, poll_interval_s=0.0)))
    profiles = []
    for t, pct in enumerate([25, 19.5, 25, 30, 30.5, 25, 19]):
        clock.now = t
        trace.state = PowerState(battery_pct=pct, battery_status="discharging")
        profiles.append(gov.choose().profile)
    assert profiles == ["balanced", "low_power", "low_power", "low_power", "balanced", "balanced", "low_power"]


def test_thermal_limits_without_trip_point_and_battery_temperature():
    gov, clock, trace = make(Config(power=PowerConfig(min_switch_interval_s=0.0, poll_interval_s=0.0)))
    steps = [  # (zone C without a trip, battery C, expected)
        (84.9, 30.0, "performance"), (85.0, 30.0, "low_power"), (80.1, 30.0, "low_power"),
        (79.9, 30.0, "performance"), (60.0, 42.0, "low_power"), (60.0, 37.1, "low_power"),
        (60.0, 36.9, "performance")]
    got = []
    for t, (zone, batt, _) in enumerate(steps):
        clock.now = t
        trace.state = PowerState(battery_pct=90, battery_status="charging", ac_online=True, battery_temp_c=batt,
                                 zones=(ThermalZone("thermal_zone0", "soc", zone, None),))
        got.append(gov.choose().profile)
    assert got == [s[-1] for s in steps]


def test_power_is_polled_at_most_every_poll_interval():
    gov, clock, trace = make(Config(power=PowerConfig(min_switch_interval_s=0.0, poll_interval_s=5.0)))
    trace.state = PowerState(battery_pct=50, battery_status="discharging")
    for t in (0.0, 1.0, 2.0, 4.9):
        clock.now = t
        assert gov.choose().profile == "balanced"
    trace.state = PowerState(battery_pct=50, battery_status="charging")
    clock.now = 4.99
    assert gov.choose().profile == "balanced"  # not read yet
    clock.now = 5.0
    assert gov.choose().profile == "performance"
    assert trace.reads == 2


def test_unknown_power_uses_no_battery_profile():
    gov, clock, trace = make()
    assert gov.choose().profile == "balanced" and gov.plan.reason == "no battery readable"
    gov, clock, trace = make(Config(power=PowerConfig(no_battery_profile="performance")))
    assert gov.choose().profile == "performance"
    trace.state = PowerState(zones=(ThermalZone("thermal_zone0", "soc", 99.0, None),))
    clock.now = 100.0
    assert gov.choose().profile == "low_power"  # hot wins even on mains


def test_fixed_profile_never_reads_power():
    gov, clock, trace = make(Config(power=PowerConfig(profile="low_power")))
    for t in range(3):
        clock.now = t * 100.0
        assert gov.choose() is gov.plans["low_power"]
    assert trace.reads == 0
    assert list(gov.plans) == ["low_power"]
    assert gov.switches == [Switch(0.0, None, "low_power", "fixed profile")]


def test_session_specs_list_each_distinct_session_set_once():
    gov, _, _ = make()  # auto on 8 Gen 2: performance both phases, balanced decode, low_power both phases
    assert [(s.cpus, s.spinning, s.affinities) for s in gov.session_specs()] == [
        ((3, 4, 5, 6), True, "5;6;7"), ((0, 1, 2), True, "2;3"), ((0,), False, None)]
    gov, _, _ = make(topology="x86_vm")
    assert [(s.cpus, s.spinning) for s in gov.session_specs()] == [((0, 1, 2, 3), True), ((0, 1), False)]
    gov, _, _ = make(Config(power=PowerConfig(profile="balanced")), topology="rk3588")
    specs = gov.session_specs()
    assert [(s.cpus, s.num_threads, s.affinities) for s in specs] == [
        ((4, 5, 6, 7), 4, "6;7;8"), ((0, 1, 2, 3), 4, "2;3;4")]
    plan = gov.choose()
    assert (plan.prefill_spec, plan.decode_spec) == specs  # what a step looks its sessions up by


def test_same_cpus_with_different_spinning_are_different_session_sets():
    config = Config(power=PowerConfig(low_power_max_threads=0))
    gov, _, _ = make(config, topology="x86_vm")
    balanced, low = gov.plans["balanced"], gov.plans["low_power"]
    assert balanced.decode_spec.cpus == (0, 1, 2, 3) and low.decode_spec.cpus == (0, 1)
    topo_gov = Governor(fixture_topology("x86_vm").override("0:little"), lambda: PowerState(), config,
                        allowed_cpus={0})
    specs = topo_gov.session_specs()  # one CPU: every profile runs on cpu0, low_power without spinning
    assert [(s.cpus, s.spinning) for s in specs] == [((0,), True), ((0,), False)]


def test_governor_defaults_to_this_threads_affinity():
    gov = Governor(fixture_topology("x86_vm"), lambda: PowerState(), Config())
    assert gov.allowed_cpus == frozenset(os.sched_getaffinity(0))


@pytest.mark.parametrize("interval", [0.0, 10.0])
def test_first_choice_is_immediate_whatever_the_interval(interval):
    gov, clock, trace = make(Config(power=PowerConfig(min_switch_interval_s=interval, poll_interval_s=0.0)))
    trace.state = PowerState(battery_pct=5, battery_status="discharging")
    clock.now = 1000.0
    assert gov.choose().profile == "low_power"
