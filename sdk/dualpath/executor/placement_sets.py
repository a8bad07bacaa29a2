"""The session sets of a runner under a power governor, and their placement.

ONNX Runtime pins its workers per session, so every distinct (cores, threads) of every
profile the governor can reach gets a session set of its own, with our kernels' pool
pinned to the same cores and the CPUs a step of that set pins its caller to. Once, when
the runner is built, a warm-up step on every set reads back where its threads run
(platform/placement.py); phases the OS did not honour fall back to unpinned sets built
here. Steps pay nothing for any of it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from ..graph.parts import PartFile
from ..kernels import ThreadPool
from ..models.store import Progress
from .ort_sessions import SessionSet, create_sessions


class ProfileSets:
    """SessionSpec -> (SessionSet, kernel stepper) for every session set the governor's
    plans run on (``sets``), and where a step of each pins its caller (``select``)."""

    def __init__(self, governor):
        self.governor = governor
        self.placer = governor.placer
        self.sets: dict = {}
        """SessionSpec -> (SessionSet, kernel stepper), in the governor's order."""
        self.home: frozenset = frozenset()
        """The CPUs the runner was built on: where a step of an unpinned set (a placement
        fallback) pins its caller back to."""
        self._caller_cpus: dict = {}  # SessionSpec -> the CPUs a step of that set pins its caller to
        self._ort_tids: dict = {}  # SessionSpec -> ORT's worker threads, started with that set's sessions
        self._pin_caller = self.placer.pin_caller
        self._make_stepper: Callable | None = None

    def create(self, parts: list[PartFile], progress: Progress | None, entry) -> dict[object, SessionSet]:
        """One session set per distinct SessionSpec of the governor's plans (all sets share
        the float weights), noting the ORT workers each one started."""
        # Spinning is off in these per-session pools whatever the profile says: each of the
        # L + 1 parts has its own pool, and idle pools spinning against the active one cost
        # the active one much of its decode speed.
        session_sets = {}
        for sp in self.governor.session_specs():
            before = self.placer.tids()
            session_sets[sp] = create_sessions(parts, sp.num_threads, False, sp.affinities,
                                               per_session_pools=True, progress=progress, entry=entry)
            self._ort_tids[sp] = self.placer.tids() - before  # ORT starts a session's workers with it
        return session_sets

    def attach(self, session_sets: dict, make_stepper: Callable) -> None:
        """Give every set its kernel stepper, ``make_stepper(pool, sessions)``, over a pool
        of our own on the set's cores (ONNX Runtime's workers are on them too)."""
        self._make_stepper = make_stepper
        self.home = frozenset(os.sched_getaffinity(0))
        for sp, sessions in session_sets.items():
            pool = ThreadPool(sp.num_threads)  # our kernels' workers, on the same cores as ORT's
            if sp.pinned:
                self.placer.pin_pool(pool, sp.cpus)
            self.sets[sp] = (sessions, make_stepper(pool, sessions))
        # What a step of each set pins the calling thread to: its first CPU, or back where
        # the runner was built for a set that runs unpinned (a placement fallback).
        self._caller_cpus = {sp: frozenset(sp.cpus[:1]) if sp.pinned else self.home for sp in self.sets}

    def select(self, sp) -> tuple:
        """Pin the calling thread for a step on set ``sp`` and return (sessions, stepper).
        One system call; a refused pin is logged once and the step runs where the thread is."""
        self._pin_caller(self._caller_cpus[sp])
        return self.sets[sp]

    def check_placement(self, warm_up: Callable) -> bool:
        """A warm-up step on every set (``warm_up(sp)``), then read back where its threads
        run and hand that to the governor, which falls back (unpinned, no more threads than
        cores granted) for every phase the OS did not honour. Returns whether the sets no
        longer match the governor's plans (then ``rebuild`` them)."""
        placer = self.placer
        seen = {}
        self._pin_caller = functools.partial(placer.pin_caller, warn=False)  # the report says it all
        try:
            for sp, (sessions, kv) in self.sets.items():
                warm_up(sp)
                read = placer.check_set(sp, ort_tids=self._ort_tids.get(sp, ()), num_sessions=len(sessions),
                                        pool_tids=kv.pool.worker_tids()[1:])
                if read is not None:  # None: /proc unreadable (logged), the plan stands unverified
                    seen[sp] = read
        finally:
            self._pin_caller = placer.pin_caller
            placer.pin_caller(self.home, warn=False)  # new threads inherit the creator's mask
        self.governor.verify_placement(seen)
        return set(self.governor.session_specs()) != set(self.sets)

    def rebuild(self, parts: list[PartFile], progress: Progress | None, entry) -> None:
        """Drop the sets no plan runs on any more and build the fallbacks' (unpinned, each
        its own thread count)."""
        specs = self.governor.session_specs()
        for sp in [sp for sp in self.sets if sp not in specs]:
            del self.sets[sp], self._caller_cpus[sp]
        for sp in specs:
            if sp not in self.sets:
                sessions = create_sessions(parts, sp.num_threads, False, None, per_session_pools=True,
                                           progress=progress, entry=entry)
                if self._make_stepper is None:
                    raise RuntimeError("PlacementSets.rebuild before attach")
                self.sets[sp] = (sessions, self._make_stepper(ThreadPool(sp.num_threads), sessions))
                self._caller_cpus[sp] = self.home
