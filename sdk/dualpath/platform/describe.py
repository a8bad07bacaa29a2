"""Text for ``dualpath info``: the topology table, classes, power state, profile and masks,
and the thread placement read back."""

from __future__ import annotations

from .placement import PlacementReport, SetPlacement
from .power import PowerState
from .profiles import PhasePlan, Plan
from .topology import Topology, format_cpulist


def _opt(value, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def describe_topology(topology: Topology) -> list[str]:
    lines = [f"CPU topology ({len(topology.cpus)} online CPUs; classes from {topology.source})"]
    rows = [["cpu", "class", "core", "capacity", "max MHz", "clock domain", "smt siblings", "part"]]
    for c in topology.cpus:
        rows.append([str(c.cpu), c.cls or "unused", str(c.core), _opt(c.capacity),
                     _opt(None if c.max_freq_khz is None else c.max_freq_khz // 1000),
                     format_cpulist(c.freq_domain) or "-", format_cpulist(c.siblings), c.part or "-"])
    lines += _table(rows)
    if topology.offline:
        lines.append(f"  offline (not used): cpu {format_cpulist(topology.offline)}")
    if topology.uniform:
        all_cpus = format_cpulist(topology.classes[0].cpus)
        lines.append(f"Classes: all cores are equal (nothing tells them apart): all = cpu {all_cpus}")
    else:
        lines.append("Classes (biggest first):")
        for cls in topology.classes:
            smt = f", {len(cls.cpus)} logical" if len(cls.cpus) != len(cls.cores) else ""
            cores = f"{len(cls.cores)} core{'s' if len(cls.cores) != 1 else ''}"
            lines.append(f"  {cls.name:<7} cpu {format_cpulist(cls.cpus):<10} mask {cls.mask:#x}  "
                         f"{cores}{smt}, capacity {_opt(cls.capacity)}, "
                         f"max {_opt(None if cls.max_freq_khz is None else cls.max_freq_khz // 1000)} MHz")
    return lines


def describe_power(power: PowerState | None) -> list[str]:
    if power is None:
        return ["Power: not read"]
    if not power.sources:
        return ["Power: unknown (no battery, supply or thermal zone is readable)"]
    batt = "battery unknown" if power.battery_pct is None else f"battery {power.battery_pct:g}%"
    status = power.battery_status or "status unknown"
    ac = {True: "external power connected", False: "no external power", None: "external power unknown"}
    lines = [f"Power: {batt}, {status}, {ac[power.ac_online]}"
             + ("" if power.battery_temp_c is None else f", battery {power.battery_temp_c:.1f} °C")
             + f" (from {', '.join(power.sources)})"]
    hot, tight = power.hottest, power.tightest
    if hot is not None:
        trip = "" if hot.trip_c is None else f", trip {hot.trip_c:.1f} °C"
        lines.append(f"  hottest zone: {hot.type or hot.name} at {hot.temp_c:.1f} °C{trip}")
    if tight is not None and tight is not hot:
        lines.append(f"  closest to its trip: {tight.type or tight.name} at {tight.temp_c:.1f} °C, "
                     f"trip {tight.trip_c:.1f} °C")
    return lines


def _phase(p: PhasePlan) -> str:
    aff = p.ort_affinities
    pin = ("pinned" if p.pinned else "not pinned (OS placement)")
    return (f"  {p.phase:<8} {p.cls} cpu {format_cpulist(p.cpus)}, {p.num_threads} "
            f"thread{'s' if p.num_threads != 1 else ''}, mask {p.mask:#x}, {pin}; caller on cpu {p.cpus[0]}"
            + ("" if aff is None else f"; ORT intra_op_thread_affinities \"{aff}\""))


def describe(topology: Topology, power_state: PowerState | None, plan: Plan, path: str = "") -> str:
    """Several lines, no trailing newline. ``path`` is the profile's cache-path rule in
    words (``PathPolicy.summary()``: the path policy lives above this layer)."""
    lines = describe_topology(topology) + describe_power(power_state)
    chosen = plan.profile if plan.requested in ("", plan.profile) else f"{plan.profile} (auto)"
    lines.append(f"Profile: {chosen}" + (f": {plan.reason}" if plan.reason else ""))
    lines += [_phase(plan.prefill), _phase(plan.decode)]
    lines.append(f"  {'path: ' + path + ', ' if path else ''}prefill chunk {plan.prefill_chunk_tokens} tokens, "
                 f"spinning {'on' if plan.spinning else 'off'}")
    return "\n".join(lines)


def _roles(s: SetPlacement) -> str:
    n = {role: sum(t.role == role for t in s.threads) for role in ("caller", "onnxruntime", "kernel pool")}
    return f"{n['caller']} caller, {n['onnxruntime']} ORT, {n['kernel pool']} pool"


def describe_placement(report: PlacementReport) -> str:
    """Every phase of every profile: the CPUs planned, the threads read back after the
    warm-up (where they may run, where they last ran) and what runs; then, for each session
    set the OS did not honour, why and the fallback. Several lines, no trailing newline."""
    rows = [["profile", "phase", "asked", "threads read back", "allowed", "last ran on", "result"]]
    for c in report.checks:
        p, s = c.planned, c.seen
        asked = f"{p.cls} cpu {format_cpulist(p.cpus)}" + ("" if p.pinned else " (not pinned)")
        if s is None:
            rows.append([c.profile, p.phase, asked, "-", "-", "-", "not read back"])
            continue
        if c.honoured:
            result = "ok" if p.pinned else "ok (not pinned)"
        else:
            f = c.running
            result = (f"NOT HONOURED -> {f.num_threads} thread{'s' if f.num_threads != 1 else ''} unpinned "
                      f"on {f.cls} cpu {format_cpulist(f.cpus)}")
        rows.append([c.profile, p.phase, asked, _roles(s), f"cpu {format_cpulist(s.granted)}",
                     f"cpu {format_cpulist(s.ran_on)}", result])
    verdict = "as planned" if report.honoured else f"{len(report.mismatches)} phase(s) not as planned"
    lines = [f"Placement read back after one warm-up step per session set ({verdict}):"] + _table(rows)
    lines += [f"  ! {text}" for _, text in report.warnings()]
    return "\n".join(lines)
