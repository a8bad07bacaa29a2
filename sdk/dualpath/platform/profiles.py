"""Power profiles resolved on a topology: which cores and how many threads each phase uses.

Rules (a parallel region never spans two classes: its slowest thread sets the pace):

- **prefill** (compute bound) runs on the class with the most compute among the classes
  above little (cores x capacity, or x max frequency where capacity is unknown; a tie goes
  to the bigger class). On a Snapdragon 8 Gen 2 that is the four A715/A710 cores, not
  the lone X3.
- **decode** (memory-bandwidth bound) runs on the little class in ``balanced``. In
  ``performance`` it runs on the class with the most cores (a tie goes to the bigger
  class), still one class.
- **low_power** runs both phases on the little class with half its cores (at least one,
  at most ``power.low_power_max_threads``), spinning off and a smaller prefill chunk.
  What a profile overrides among the settings (chunk, spinning, the cache-path threshold)
  is one table, ``config.PROFILE_OVERRIDES``; the engine asks the governor before each
  step and hands the plan down (engine/driver.py).
- One thread per physical core unless ``power.use_smt``; caps: ``power.prefill_max_threads``,
  ``power.decode_max_threads`` and ``runtime.num_threads`` (when not 0).
- Only CPUs in ``allowed_cpus`` (the process's affinity at start) are used.
- A phase never has more threads than its class has usable cores (``class_cpus``): every
  cap and ``runtime.num_threads`` only lower the count. When the OS does not honour the
  pins, ``placement.fallback_phase`` keeps that rule on the cores really granted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dualpath.config import Config, profile_value
from dualpath.errors import ConfigError

from .affinity import ort_affinity_string
from .topology import CoreClass, Topology, cpu_mask, format_cpulist

PROFILES = ("performance", "balanced", "low_power")
"""Profiles a plan resolves to; ``auto`` picks one of them from the power state."""


@dataclass(frozen=True)
class PhasePlan:
    """Where one phase (prefill or decode) runs."""

    phase: str
    """``prefill`` or ``decode``."""
    cls: str
    """The core class its CPUs belong to."""
    cpus: tuple[int, ...]
    """``cpus[i]`` is the CPU thread ``i`` runs on; ``cpus[0]`` is the calling thread's."""
    pinned: bool
    """False when ``power.pin_threads`` is off: the OS places the threads."""

    @property
    def num_threads(self) -> int:
        """Intra-op threads, the caller included (ORT's ``intra_op_num_threads``)."""
        return len(self.cpus)

    @property
    def mask(self) -> int:
        return cpu_mask(self.cpus)

    @property
    def ort_affinities(self) -> str | None:
        """``session.intra_op_thread_affinities`` for this phase's sessions; None when not
        pinned or single-threaded (set no entry then)."""
        if not self.pinned or self.num_threads == 1:
            return None
        return ort_affinity_string(self.cpus, self.num_threads)

    @property
    def caller_cpus(self) -> set[int]:
        """What ``pin_current_thread`` gets before this phase runs: ``{cpus[0]}``."""
        return {self.cpus[0]}


@dataclass(frozen=True)
class SessionSpec:
    """What one ONNX Runtime session set is built with (thread count, affinities and
    spinning are fixed per session, so each distinct spec needs its own set)."""

    cpus: tuple[int, ...]
    """``cpus[i]`` is the CPU of intra-op thread ``i``; 0 is the caller."""
    pinned: bool
    spinning: bool

    @property
    def num_threads(self) -> int:
        """``create_sessions(num_threads=...)``."""
        return len(self.cpus)

    @property
    def affinities(self) -> str | None:
        """``create_sessions(affinities=...)``: None when unpinned or single-threaded."""
        if not self.pinned or len(self.cpus) == 1:
            return None
        return ort_affinity_string(self.cpus, len(self.cpus))


@dataclass(frozen=True)
class Plan:
    """A resolved profile: the one thing the engine reads from the governor."""

    profile: str
    """``performance``, ``balanced`` or ``low_power``."""
    prefill: PhasePlan
    decode: PhasePlan
    prefill_chunk_tokens: int
    """Prompt tokens per prefill step (applies from the next step)."""
    spinning: bool
    """``session.intra_op.allow_spinning`` for both phases."""
    requested: str = field(default="", compare=False)
    """The profile asked for (``auto`` or the same as ``profile``)."""
    reason: str = field(default="", compare=False)
    """Why ``auto`` chose it (empty for a fixed profile)."""

    @property
    def prefill_spec(self) -> SessionSpec:
        """The session set prefill steps run on."""
        return SessionSpec(self.prefill.cpus, self.prefill.pinned, self.spinning)

    @property
    def decode_spec(self) -> SessionSpec:
        """The session set decode steps run on."""
        return SessionSpec(self.decode.cpus, self.decode.pinned, self.spinning)


def class_cpus(cls: CoreClass, topology: Topology, allowed: set[int] | frozenset[int] | None,
               use_smt: bool) -> tuple[int, ...]:
    """The CPUs of ``cls`` a phase may put one thread each on: those in ``allowed`` (None =
    all), and one per physical core unless ``use_smt``. A phase never has more threads than
    this has CPUs (resolve_plan, and placement.fallback_phase on the CPUs the OS granted)."""
    cpus = [c for c in cls.cpus if allowed is None or c in allowed]
    if use_smt:
        return tuple(cpus)
    seen: set[tuple[int, ...]] = set()
    out = []
    for c in cpus:  # ascending: the lowest allowed sibling stands for its core
        siblings = topology.cpu(c).siblings
        if siblings not in seen:
            seen.add(siblings)
            out.append(c)
    return tuple(out)


def _weight(cls: CoreClass) -> int:
    return cls.capacity or cls.max_freq_khz or 1


def resolve_plan(profile: str, topology: Topology, config: Config | None = None,
                 allowed_cpus: Iterable[int] | None = None, *, requested: str = "", reason: str = "") -> Plan:
    """The plan of ``profile`` (performance, balanced or low_power) on ``topology``."""
    if profile not in PROFILES:
        raise ConfigError(f"power.profile={profile!r} must be one of {', '.join(PROFILES)} here")
    config = config or Config()
    pc, rt = config.power, config.runtime
    allowed = None if allowed_cpus is None else set(allowed_cpus)
    classes = [(cls, class_cpus(cls, topology, allowed, pc.use_smt)) for cls in topology.classes]
    classes = [(cls, cpus) for cls, cpus in classes if cpus]
    if not classes:
        raise ConfigError(f"no CPU of the core classes ({', '.join(format_cpulist(c.cpus) for c in topology.classes)}) "
                          f"is allowed for this process (allowed: {format_cpulist(allowed or ())})")
    ranked = list(enumerate(classes))  # index 0 = biggest
    little = classes[-1]
    above = ranked[:-1] or ranked
    prefill = max(above, key=lambda ic: (len(ic[1][1]) * _weight(ic[1][0]), -ic[0]))[1]
    if profile == "performance":
        decode = max(ranked, key=lambda ic: (len(ic[1][1]), -ic[0]))[1]
    else:
        decode = little
    if profile == "low_power":
        prefill = decode = little

    def threads(cls_cpus, cap: int) -> tuple[int, ...]:
        cpus = cls_cpus[1]
        n = len(cpus)
        if profile == "low_power":
            n = max(1, n // 2)
            if pc.low_power_max_threads:
                n = min(n, pc.low_power_max_threads)
        for limit in (cap, rt.num_threads):
            if limit:
                n = min(n, limit)
        return cpus[:n]

    return Plan(
        profile=profile,
        prefill=PhasePlan("prefill", prefill[0].name, threads(prefill, pc.prefill_max_threads), pc.pin_threads),
        decode=PhasePlan("decode", decode[0].name, threads(decode, pc.decode_max_threads), pc.pin_threads),
        prefill_chunk_tokens=profile_value(profile, "runtime.prefill_chunk_tokens", rt.prefill_chunk_tokens, pc),
        spinning=profile_value(profile, "runtime.intra_op_spinning", rt.intra_op_spinning, pc),
        requested=requested or profile, reason=reason)
