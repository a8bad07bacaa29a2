"""The governor the engine consults between steps: the current Plan, switched by power state.

``auto`` decides with hysteresis, in this order:

1. **Hot** -> low_power. A thermal zone within ``thermal_margin_c`` of its trip point, the
   hottest zone at or above ``thermal_hot_c``, or the battery at or above ``battery_hot_c``.
   It stays hot until every one of those is ``thermal_hysteresis_c`` further away.
2. **Low battery** -> low_power. Discharging below ``low_battery_pct``; it stays low until
   the battery is above ``resume_battery_pct`` or no longer discharging.
3. **External power** (charging, full, or a supply online) -> performance.
4. On battery -> balanced.
5. No battery readable at all (desktop, VM, edge box, or a phone whose sysfs is denied and
   that has no termux-api) -> ``no_battery_profile`` (balanced unless configured).

Switching is rate-limited: two profile changes are at least ``min_switch_interval_s``
apart (the first choice counts as one). A decision held back by the limit is taken at
the first ``choose()`` after it expires. The power state is read at most every
``poll_interval_s``, so ``choose()`` between decode steps costs a clock read.

A switch only changes which Plan ``choose()`` returns; the engine applies it at a step
boundary, so a running request keeps its tokens and its cache.

Plans are requests to the OS. Once the engine has built and warmed up its session sets
it reads back where their threads run and calls ``verify_placement``: a phase whose pins
were refused or ignored is logged once and replaced by its fallback (placement.py), for
every profile, before the first step.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from dualpath.config import Config

from .placement import PlacementReport, Placer, SetPlacement, check_plans
from .power import PowerState, read_power_state
from .profiles import PROFILES, Plan, SessionSpec, resolve_plan
from .topology import Topology

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Switch:
    """One profile change, for logs and tests."""

    time_s: float
    """``clock()`` when it happened."""
    old: str | None
    """Previous profile (None for the first choice)."""
    new: str
    reason: str


class Governor:
    """Holds the plans of every reachable profile and picks one per ``choose()``."""

    def __init__(self, topology: Topology, power_reader: Callable[[], PowerState] | None = None,
                 config: Config | None = None, clock: Callable[[], float] = time.monotonic,
                 allowed_cpus: Iterable[int] | None = None, placer: Placer | None = None):
        """``power_reader`` defaults to ``read_power_state`` on the real /sys (with the
        configured termux timeout). ``allowed_cpus`` defaults to this thread's affinity now:
        build the governor before pinning anything. ``placer`` pins and reads back threads
        (default: ``os.sched_setaffinity`` and /proc)."""
        self.topology = topology
        self.config = config or Config()
        self.power_config = pc = self.config.power
        self.requested = pc.profile
        self.power_reader = power_reader or functools.partial(read_power_state, timeout_s=pc.termux_timeout_s)
        self.clock = clock
        if allowed_cpus is None and hasattr(os, "sched_getaffinity"):
            allowed_cpus = os.sched_getaffinity(0)
        self.allowed_cpus = None if allowed_cpus is None else frozenset(allowed_cpus)
        names = PROFILES if self.requested == "auto" else (self.requested,)
        self.plans: dict[str, Plan] = {
            name: resolve_plan(name, topology, self.config, self.allowed_cpus, requested=self.requested)
            for name in names}
        """The plan of every profile this governor can choose, by name."""
        self.placer = placer or Placer()
        """How the engine pins its threads and reads them back."""
        self.placement: PlacementReport | None = None
        """What ``verify_placement`` found (None before the engine checked)."""
        self.power: PowerState | None = None
        """The last power state read (None before the first poll, or for a fixed profile)."""
        self.switches: list[Switch] = []
        """Every profile change, oldest first."""
        self._plan: Plan | None = None
        self._target: tuple[str, str] | None = None
        self._last_poll: float | None = None
        self._last_switch: float | None = None
        self._hot = False
        self._low_battery = False

    @property
    def plan(self) -> Plan | None:
        """The current plan (None before the first ``choose()``)."""
        return self._plan

    def session_specs(self) -> tuple[SessionSpec, ...]:
        """Every distinct SessionSpec of every reachable plan, in first-seen order: the
        engine builds one ONNX Runtime session set per entry, then runs a step on
        ``sets[plan.prefill_spec]`` or ``sets[plan.decode_spec]``."""
        seen: dict[SessionSpec, None] = {}
        for plan in self.plans.values():
            seen.setdefault(plan.prefill_spec, None)
            seen.setdefault(plan.decode_spec, None)
        return tuple(seen)

    def verify_placement(self, seen: Mapping[SessionSpec, SetPlacement]) -> PlacementReport:
        """Compare every plan with where its session sets' threads were read back
        (``Placer.check_set`` after a warm-up step); log once per session set the OS did not
        honour, and from now on run those phases on their fallback plans (unpinned, no more
        threads than cores granted). The engine calls it once, before its first step; the
        report stays in ``placement`` (``dualpath info`` prints it)."""
        report = check_plans(self.plans, seen, self.topology, self.config)
        for spec, text in report.warnings():
            self.placer.warn_once(("placement", spec), "%s", text)
        self.plans = dict(report.plans)
        if self._plan is not None:
            self._plan = replace(self.plans[self._plan.profile], reason=self._plan.reason)
        self.placement = report
        return report

    def choose(self) -> Plan:
        """The plan for the next step. The same object is returned until a switch, so the
        engine can test ``plan is not previous``."""
        if self.requested != "auto":
            if self._plan is None:
                self._plan = self.plans[self.requested]
                self.switches.append(Switch(self.clock(), None, self.requested, "fixed profile"))
            return self._plan
        now = self.clock()
        pc = self.power_config
        if self._last_poll is None or now - self._last_poll >= pc.poll_interval_s:
            self._last_poll = now
            self.power = self.power_reader()
            self._target = self._decide(self.power)
        assert self._target is not None  # set by the first poll
        name, reason = self._target
        current = self._plan.profile if self._plan is not None else None
        if name != current and (self._last_switch is None or now - self._last_switch >= pc.min_switch_interval_s):
            log.info("power profile %s -> %s: %s", current, name, reason)
            self._plan = replace(self.plans[name], reason=reason)
            self._last_switch = now
            self.switches.append(Switch(now, current, name, reason))
        assert self._plan is not None  # the first choice always switches
        return self._plan

    def _decide(self, p: PowerState) -> tuple[str, str]:
        """(profile, reason) for ``p``; updates the hot and low-battery latches."""
        pc = self.power_config
        tight, hottest = p.tightest, p.hottest
        margin = pc.thermal_margin_c + (pc.thermal_hysteresis_c if self._hot else 0.0)
        hot_c = pc.thermal_hot_c - (pc.thermal_hysteresis_c if self._hot else 0.0)
        batt_hot_c = pc.battery_hot_c - (pc.thermal_hysteresis_c if self._hot else 0.0)
        why_hot = []
        if tight is not None and tight.headroom_c is not None and tight.headroom_c <= margin:
            why_hot.append(f"{tight.type or tight.name} at {tight.temp_c:.1f} °C, trip {tight.trip_c:.1f} °C")
        if hottest is not None and hottest.temp_c >= hot_c:
            why_hot.append(f"{hottest.type or hottest.name} at {hottest.temp_c:.1f} °C >= {hot_c:.1f} °C")
        if p.battery_temp_c is not None and p.battery_temp_c >= batt_hot_c:
            why_hot.append(f"battery at {p.battery_temp_c:.1f} °C >= {batt_hot_c:.1f} °C")
        self._hot = bool(why_hot)

        pct = p.battery_pct
        if self._low_battery:
            self._low_battery = p.discharging and (pct is None or pct <= pc.resume_battery_pct)
        else:
            self._low_battery = p.discharging and pct is not None and pct < pc.low_battery_pct

        if self._hot:
            return "low_power", "hot: " + "; ".join(why_hot)
        if self._low_battery:
            shown = "unknown" if pct is None else f"{pct:g}%"
            return "low_power", f"battery {shown} and discharging"
        if p.on_external_power:
            return "performance", "on external power"
        if p.on_external_power is False or pct is not None or p.battery_status is not None:
            return "balanced", "on battery" if pct is None else f"on battery ({pct:g}%)"
        return pc.no_battery_profile, "no battery readable"
