"""Thread placement: ONNX Runtime's affinity string, pinning the calling thread, and reading
back where every thread of the process runs.

ONNX Runtime facts this relies on (checked with onnxruntime 1.32 by
tests/platform/ort_placement_probe.py, which reads the placement back):
``session.intra_op_thread_affinities`` takes 1-based processor ids, exactly
``intra_op_num_threads - 1`` groups separated by ``;`` (one per worker; the calling thread
does part of the work and is never pinned by ORT), and an out-of-range id only logs an
error. Workers pin themselves shortly after they start, so read placement after a warm-up run
(placement.py does, once per session set, and falls back when the OS did not comply).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

from .topology import parse_cpulist

SetAffinity = Callable[[int, Iterable[int]], None]
"""``os.sched_setaffinity``'s shape: ``(tid, cpus)``, tid 0 = the calling thread. The one
way DualPath pins a thread from Python; tests pass one that refuses, as Android does."""


def ort_affinity_string(cpus: Sequence[int], num_threads: int) -> str:
    """``session.intra_op_thread_affinities`` for ``num_threads`` intra-op threads where thread
    ``i`` runs on ``cpus[i]``: thread 0 is the caller (pin it with ``pin_current_thread``),
    threads 1.. are ORT's workers, one group each, 1-based. ``(4, 5, 6)``, 3 -> ``"6;7"``.
    One thread -> ``""`` (no workers: set no entry)."""
    cpus = list(cpus)
    if num_threads < 1:
        raise ValueError(f"num_threads={num_threads} must be >= 1")
    if len(cpus) < num_threads:
        raise ValueError(f"{num_threads} threads need {num_threads} cpus, got {len(cpus)}: {cpus}")
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in cpus):
        raise ValueError(f"cpus must be CPU numbers >= 0, got {cpus}")
    if len(set(cpus[:num_threads])) != num_threads:
        raise ValueError(f"cpus {cpus[:num_threads]} name a CPU twice: each thread needs its own")
    return ";".join(str(c + 1) for c in cpus[1:num_threads])


def pin_current_thread(cpus: Iterable[int], setaffinity: SetAffinity | None = None) -> set[int]:
    """Restrict the calling thread (only it: Linux affinity is per thread) to ``cpus``
    through ``setaffinity`` (``os.sched_setaffinity`` unless given); returns its previous set
    so the caller can restore it. Raises OSError naming the CPUs when the kernel refuses
    (a CPU offline or outside the process's cpuset; Android apps are often refused big cores)."""
    wanted = set(cpus)
    previous = os.sched_getaffinity(0)
    try:
        (setaffinity or os.sched_setaffinity)(0, wanted)
    except OSError as e:
        raise OSError(e.errno, f"cannot pin this thread to cpu {sorted(wanted)}: {e.strerror or e} "
                               f"(allowed before: {sorted(previous)})") from None
    return previous


def thread_placement(pid: int | None = None, proc_root: str = "/proc"
                     ) -> dict[int, tuple[str, int, frozenset[int]]]:
    """``tid -> (name, last_cpu, allowed_cpus)`` for every thread of ``pid`` (default: this
    process): ``Cpus_allowed_list`` of ``<proc_root>/<pid>/task/<tid>/status`` (where the
    thread may run, as the kernel holds it after any pin) and field 39 of its ``stat`` (the
    CPU it last ran on). ``proc_root`` points at a fake tree in tests. Threads that exit
    while being read are left out."""
    pid = os.getpid() if pid is None else pid
    task_dir = f"{proc_root}/{pid}/task"
    placement: dict[int, tuple[str, int, frozenset[int]]] = {}
    for entry in os.listdir(task_dir):
        tid = int(entry)
        try:
            with open(f"{task_dir}/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            with open(f"{task_dir}/{entry}/status", encoding="utf-8", errors="replace") as f:
                allowed = next((frozenset(parse_cpulist(line.split(":", 1)[1])) for line in f
                                if line.startswith("Cpus_allowed_list:")), None)
            if allowed is None:  # a kernel without the line: ask the scheduler
                allowed = frozenset(os.sched_getaffinity(tid))
        except (OSError, ProcessLookupError, ValueError):
            continue
        # "tid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ')'.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        placement[tid] = (name, int(fields[39 - 3]), allowed)  # fields[0] is field 3 (state)
    return placement
