"""Placement read-back: did the OS put our threads where the plan asked, and what runs
instead when it did not.

A pin is a request. Ordinary Android apps are often refused big cores: the call raises
(EINVAL, EPERM), or succeeds and the kernel keeps the thread where its cpuset says.
ONNX Runtime only logs an affinity it cannot apply, and our kernel pool's workers pin
themselves in C without reporting. So the engine checks instead of assuming, once per
session set when it is built (executor/session.py ``ModelRunner``):

1. ``Placer.pin_pool`` / ``Placer.pin_caller`` pin through one ``setaffinity`` callable
   (``os.sched_setaffinity`` in production; tests pass one that refuses) and remember
   every refusal.
2. After one warm-up step on the set (ORT's workers pin themselves shortly after they
   start; our pool's workers at their next job), ``Placer.check_set`` reads back, for the
   caller, every ORT worker and every pool worker of the set, where it may run
   (``Cpus_allowed_list`` in ``/proc/self/task/<tid>/status``) and where it last ran
   (field 39 of ``stat``).
3. ``check_plans`` (through ``Governor.verify_placement``) compares that with every
   profile's plan. A phase whose pins were refused or not honoured is logged once
   (the phase, the CPUs asked for, the CPUs got) and gets ``fallback_phase``: unpinned
   (pinning again would be refused again), on its class if its threads got any core of
   it, and never more threads than usable cores of that class among the CPUs granted.

Nothing here runs per step: a step only pins the calling thread, as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from dualpath.config import Config

from .affinity import SetAffinity, thread_placement
from .profiles import PhasePlan, Plan, SessionSpec, class_cpus
from .topology import Topology, format_cpulist

log = logging.getLogger(__name__)

ROLES = ("caller", "onnxruntime", "kernel pool")
"""The threads of a session set: the calling thread (pinned by us before each step), ONNX
Runtime's intra-op workers (pinned by ORT from the affinity string), our kernel pool's
workers (pinned by the pool before its next job)."""


@dataclass(frozen=True)
class ThreadSeen:
    """One thread, as read back."""

    role: str
    """One of ``ROLES``."""
    tid: int
    name: str
    asked: frozenset[int]
    """The CPUs it was pinned to; empty when it was not pinned (the OS places it)."""
    allowed: frozenset[int]
    """Where the kernel lets it run now (``Cpus_allowed_list``)."""
    last_cpu: int
    """The CPU it last ran on (``stat`` field 39)."""

    @property
    def honoured(self) -> bool:
        return not self.asked or self.allowed == self.asked


@dataclass(frozen=True)
class SetPlacement:
    """Where the threads of one session set were after its warm-up step."""

    spec: SessionSpec
    threads: tuple[ThreadSeen, ...]
    refused: tuple[str, ...] = ()
    """Pin calls to CPUs of this set that raised, in words."""

    @property
    def granted(self) -> frozenset[int]:
        """The CPUs its threads may really run on (the union of their allowed sets)."""
        return frozenset().union(*(t.allowed for t in self.threads))

    @property
    def ran_on(self) -> frozenset[int]:
        return frozenset(t.last_cpu for t in self.threads)

    @property
    def misplaced(self) -> tuple[ThreadSeen, ...]:
        return tuple(t for t in self.threads if not t.honoured)

    @property
    def honoured(self) -> bool:
        return not self.refused and not self.misplaced


class Placer:
    """Pins threads through one ``setaffinity`` callable and reads back where they run.

    ``setaffinity``: ``os.sched_setaffinity`` unless given (tests pass one that refuses);
    ``proc_root``/``pid``: where ``thread_placement`` reads (a fake tree in tests)."""

    def __init__(self, setaffinity: SetAffinity | None = None, proc_root: str = "/proc", pid: int | None = None):
        self.setaffinity = setaffinity or os.sched_setaffinity
        self.proc_root = proc_root
        self.pid = pid
        self.refused: dict[frozenset[int], str] = {}
        """Every CPU set a pin to was refused -> the error, in words."""
        self._warned: set = set()

    # -- pinning ------------------------------------------------------------------
    def pin_caller(self, cpus: Iterable[int], *, warn: bool = True) -> bool:
        """Pin the calling thread to ``cpus`` (once per step: one system call). A refusal is
        recorded, logged once per CPU set when ``warn`` (the placement check reports its own),
        and leaves the thread where it was: never raises OSError."""
        try:
            self.setaffinity(0, cpus)
            return True
        except OSError as e:
            key = frozenset(cpus)
            text = f"pin to cpu {format_cpulist(key)} refused: {e.strerror or e}"
            first = key not in self.refused
            self.refused[key] = text
            if warn and first:
                self.warn_once(("pin", key), "%s; the thread runs where it was", text)
            return False

    def pin_pool(self, pool, cpus: Sequence[int]) -> bool:
        """``pool.set_affinity(cpus)`` (a kernels.ThreadPool: worker ``i`` on ``cpus[i % n]``);
        a refusal is recorded. The workers apply it at their next job, in C, without
        reporting: only ``check_set`` tells whether they got there."""
        try:
            pool.set_affinity(list(cpus))
            return True
        except (OSError, ValueError, RuntimeError) as e:
            self.refused[frozenset(cpus)] = f"kernel pool set_affinity({list(cpus)}) refused: {e}"
            return False

    def warn_once(self, key, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    # -- reading back ---------------------------------------------------------------
    def tids(self) -> frozenset[int]:
        """The thread ids of the process now (to tell which threads a session set started;
        empty when ``/proc`` cannot be read)."""
        pid = os.getpid() if self.pid is None else self.pid
        try:
            return frozenset(int(t) for t in os.listdir(f"{self.proc_root}/{pid}/task"))
        except OSError:
            return frozenset()

    def check_set(self, spec: SessionSpec, *, ort_tids: Iterable[int] = (), num_sessions: int = 0,
                  pool_tids: Sequence[int] = (), caller_tid: int | None = None) -> SetPlacement | None:
        """Read back the threads of one session set, right after its warm-up step (the
        caller moves with every set, so read it before the next set's step).

        ``ort_tids``: threads that appeared while its sessions were created (ORT starts
        ``num_threads - 1`` workers per session, worker ``i`` pinned to ``cpus[i]``; which
        tid is which is not known, so they are matched to those CPUs by what they got;
        threads beyond the expected number are not ORT's). ``pool_tids``: our pool's
        workers (``ThreadPool.worker_tids()[1:]``), worker ``i`` on ``cpus[i]``.
        ``caller_tid``: default the calling thread. None (logged once) when the tree cannot
        be read: the plan then stands unverified."""
        try:
            placement = thread_placement(self.pid, self.proc_root)
        except OSError as e:
            self.warn_once("unreadable", "cannot read back where threads run (%s): thread placement not verified", e)
            return None
        cpus, pinned = spec.cpus, spec.pinned

        def seen(role: str, tid: int, cpu: int) -> ThreadSeen:
            name, last_cpu, allowed = placement[tid]
            return ThreadSeen(role, tid, name, frozenset((cpu,)) if pinned else frozenset(), allowed, last_cpu)

        threads = []
        caller = threading.get_native_id() if caller_tid is None else caller_tid
        if caller in placement:
            threads.append(seen("caller", caller, cpus[0]))
        threads += _match_workers(seen, sorted(t for t in ort_tids if t in placement),
                                  [c for c in cpus[1:] for _ in range(num_sessions)], placement)
        threads += [seen("kernel pool", tid, cpus[i % len(cpus)])
                    for i, tid in enumerate(pool_tids, start=1) if tid in placement]
        refused = tuple(text for key, text in self.refused.items() if key <= set(cpus))
        return SetPlacement(spec, tuple(threads), refused)


def _match_workers(seen, tids: list[int], wanted: list[int], placement) -> list[ThreadSeen]:
    """ORT's workers matched to the CPUs they were asked for: first every thread that sits
    alone on a wanted CPU, then the others take the CPUs left, in order."""
    left = Counter(wanted)
    exact, others = [], []
    for tid in tids:
        allowed = placement[tid][2]
        cpu = next(iter(allowed)) if len(allowed) == 1 else None
        if cpu is not None and left[cpu] > 0:
            left[cpu] -= 1
            exact.append(seen("onnxruntime", tid, cpu))
        else:
            others.append(tid)
    return exact + [seen("onnxruntime", tid, cpu) for tid, cpu in zip(others, left.elements())]


# ---------------------------------------------------------------------------
# Plans against what was seen
# ---------------------------------------------------------------------------

def fallback_phase(phase: PhasePlan, granted: Iterable[int], topology: Topology, config: Config) -> PhasePlan:
    """What ``phase`` runs as when the OS did not honour its pins: unpinned (pinning again
    would be refused again), on its own class if its threads got any core of it, else on
    the class with the most granted cores (a tie goes to the bigger one), with no more
    threads than usable cores of that class among ``granted`` (at least one)."""
    granted = frozenset(granted)
    usable = [(cls, class_cpus(cls, topology, granted, config.power.use_smt)) for cls in topology.classes]
    usable = [(cls, cpus) for cls, cpus in usable if cpus]
    own = [u for u in usable if u[0].name == phase.cls]
    if own or usable:
        cls, cpus = own[0] if own else max(usable, key=lambda u: len(u[1]))  # max keeps the first of a tie
        return PhasePlan(phase.phase, cls.name, cpus[:min(phase.num_threads, len(cpus))], pinned=False)
    return PhasePlan(phase.phase, phase.cls, phase.cpus[:1], pinned=False)  # no class CPU granted: one thread


@dataclass(frozen=True)
class PhaseCheck:
    """One phase of one profile: the plan, what was read back, what runs."""

    profile: str
    planned: PhasePlan
    seen: SetPlacement | None
    """None when its session set was not read back."""
    fallback: PhasePlan | None
    """The plan run instead when the OS did not honour this one."""

    @property
    def honoured(self) -> bool:
        return self.seen is None or self.seen.honoured

    @property
    def running(self) -> PhasePlan:
        return self.fallback or self.planned


@dataclass(frozen=True)
class PlacementReport:
    """Every phase of every profile against the placement read back."""

    checks: tuple[PhaseCheck, ...]
    plans: Mapping[str, Plan]
    """The plans with every fallback applied, by profile."""

    @property
    def honoured(self) -> bool:
        return all(c.honoured for c in self.checks)

    @property
    def mismatches(self) -> tuple[PhaseCheck, ...]:
        return tuple(c for c in self.checks if not c.honoured)

    def warnings(self) -> list[tuple[SessionSpec, str]]:
        """One ``(session spec, message)`` per session set the OS did not honour, naming
        the phases that use it, the CPUs asked for, the CPUs got, and the fallback."""
        by_spec: dict[SessionSpec, list[PhaseCheck]] = {}
        for c in self.mismatches:
            assert c.seen is not None and c.fallback is not None  # a mismatch was seen and has a fallback
            by_spec.setdefault(c.seen.spec, []).append(c)
        out = []
        for spec, checks in by_spec.items():
            c = checks[0]
            assert c.seen is not None and c.fallback is not None
            phases = ", ".join(dict.fromkeys(f"{k.planned.phase} ({k.profile})" for k in checks))
            out.append((spec, f"thread placement not honoured for {phases}: asked for {_asked(c.planned)}, "
                              f"got {_got(c.seen)}; running with {_running(c.fallback)} instead"))
        return out


def check_plans(plans: Mapping[str, Plan], seen: Mapping[SessionSpec, SetPlacement], topology: Topology,
                config: Config) -> PlacementReport:
    """Every pinned phase of ``plans`` against the read-back of its session set."""
    checks: list[PhaseCheck] = []
    fixed: dict[str, Plan] = {}
    for name, plan in plans.items():
        running = {}
        for phase, spec in ((plan.prefill, plan.prefill_spec), (plan.decode, plan.decode_spec)):
            s = seen.get(spec)
            fallback = None
            if s is not None and phase.pinned and not s.honoured:
                fallback = fallback_phase(phase, s.granted, topology, config)
            checks.append(PhaseCheck(name, phase, s, fallback))
            running[phase.phase] = fallback or phase
        fixed[name] = replace(plan, prefill=running["prefill"], decode=running["decode"])
    return PlacementReport(tuple(checks), fixed)


# -- words (warnings and ``dualpath info``) --------------------------------------

def _threads(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def _asked(p: PhasePlan) -> str:
    return f"{p.cls} cpu {format_cpulist(p.cpus)} ({_threads(p.num_threads)})"


def _got(s: SetPlacement) -> str:
    why = list(s.refused)
    for role in ROLES:
        off = [t for t in s.misplaced if t.role == role]
        if off:
            why.append(f"{len(off)} {role} thread{'s' if len(off) != 1 else ''} asked for cpu "
                       f"{format_cpulist(frozenset().union(*(t.asked for t in off)))} may run on cpu "
                       f"{format_cpulist(frozenset().union(*(t.allowed for t in off)))}")
    return f"cpu {format_cpulist(s.granted)}, last ran on cpu {format_cpulist(s.ran_on)} ({'; '.join(why)})"


def _running(p: PhasePlan) -> str:
    return f"{_threads(p.num_threads)}, unpinned, on the granted cores of class {p.cls} (cpu {format_cpulist(p.cpus)})"
