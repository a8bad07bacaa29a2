"""Placement read-back: threads checked where the plan put them, the fallback when the OS
did not honour a pin, and thread counts that never exceed the cores of a phase's class.

The fixture tests run the governor on a fake sysfs topology over a fake /proc tree; the
pins go through ``Placer``'s ``setaffinity`` seam (the one production uses), here a
``FakeKernel`` that behaves as a phone app's kernel does. The tests at the end read back
real threads of this machine, in-process or in a fresh interpreter (ORT's pinned
per-session pools cannot share a process with its global pool).
"""

import errno
import json
import logging
import os
import random
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from platform_testlib import MACHINES, fixture_topology, write_task

from dualpath.config import Config, PowerConfig, RuntimeConfig
from dualpath.platform import Governor, Placer, describe_placement, thread_placement
from dualpath.platform.placement import fallback_phase
from dualpath.platform.power import PowerState
from dualpath.platform.profiles import PROFILES, PhasePlan, SessionSpec, class_cpus, resolve_plan

PID = 4242
CALLER = 4242  # the main thread's tid is the pid
ALLOWED = os.sched_getaffinity(0)
needs_cpu0_and_cpu1 = pytest.mark.skipif(not {0, 1} <= ALLOWED, reason="needs cpu0 and cpu1")


class FakeKernel:
    """A phone app's kernel over a fake ``/proc/PID/task`` tree. Threads start on
    ``inherited`` (the app's cpuset now). With an ``error`` (PermissionError,
    OSError(EINVAL)) a pin lands on the CPUs it names outside ``refused`` and raises when
    that leaves none, as Linux does with a cpuset; with ``error`` None a pin that names a
    CPU of ``refused`` returns and changes nothing, as vendor kernels that ignore big-core
    pins do. Other pins land.
    ``setaffinity`` is the Placer's seam (the calling thread is CALLER); ``worker`` starts
    a thread that pins itself in C (an ORT or kernel pool worker): nothing raises there,
    a refused pin just leaves it where it was."""

    def __init__(self, proc: str, inherited, refused, error: BaseException | None):
        self.proc, self.inherited, self.refused, self.error = proc, frozenset(inherited), frozenset(refused), error
        self.calls = []
        write_task(proc, PID, CALLER, "python", min(self.inherited), self.inherited)

    def setaffinity(self, tid: int, cpus) -> None:
        assert tid == 0  # the calling thread only
        cpus = frozenset(cpus)
        self.calls.append(cpus)
        if self.error is not None:
            cpus -= self.refused
            if not cpus:
                raise self.error
        elif cpus & self.refused:
            return
        write_task(self.proc, PID, CALLER, "python", min(cpus), cpus)

    def worker(self, tid: int, cpu: int) -> None:
        allowed = self.inherited if cpu in self.refused else frozenset((cpu,))
        write_task(self.proc, PID, tid, "python", min(allowed), allowed)


def build_like_the_engine(gov: Governor, kernel: FakeKernel, num_sessions: int = 2):
    """What ModelRunner does once when built, over the fake kernel: every session set's
    ORT workers and pool workers start and pin themselves, the caller is pinned for the
    set's warm-up step, the set is read back; then the governor gets what was seen."""
    placer, seen, tid = gov.placer, {}, 5000
    for sp in gov.session_specs():
        ort, pool = [], []
        for _ in range(num_sessions):
            for cpu in sp.cpus[1:]:
                tid += 1
                kernel.worker(tid, cpu)
                ort.append(tid)
        for cpu in sp.cpus[1:]:
            tid += 1
            kernel.worker(tid, cpu)
            pool.append(tid)
        placer.pin_caller(set(sp.cpus[:1]), warn=False)
        seen[sp] = placer.check_set(sp, ort_tids=ort, num_sessions=num_sessions, pool_tids=pool, caller_tid=CALLER)
    return gov.verify_placement(seen)


def governor_over(kernel: FakeKernel, tmp_path, profile: str = "balanced", machine: str = "snapdragon_8gen2"):
    placer = Placer(setaffinity=kernel.setaffinity, proc_root=str(tmp_path / "proc"), pid=PID)
    config = Config(power=PowerConfig(profile=profile))
    return Governor(fixture_topology(machine), lambda: PowerState(), config, allowed_cpus=range(8), placer=placer)


def platform_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name.startswith("dualpath.platform")]


# -- reading back ---------------------------------------------------------------------

def test_thread_placement_reads_allowed_list_and_last_cpu_from_a_proc_tree(tmp_path):
    proc = str(tmp_path / "proc")
    write_task(proc, PID, PID, "python", 2, {0, 1, 2})
    write_task(proc, PID, 4300, "ort (worker) 1", 5, {5})
    assert thread_placement(PID, proc) == {PID: ("python", 2, frozenset({0, 1, 2})),
                                           4300: ("ort (worker) 1", 5, frozenset({5}))}


def test_check_set_matches_ort_workers_to_their_cpus_and_leaves_out_threads_not_theirs(tmp_path):
    proc = str(tmp_path / "proc")
    spec = SessionSpec((3, 4, 5, 6), pinned=True, spinning=False)
    write_task(proc, PID, CALLER, "python", 3, {3})
    ort = {101: 6, 102: 4, 103: 5, 104: 5, 105: 6, 106: 4, 107: 4}  # two sessions' workers, and a stray (107)
    for tid, cpu in ort.items():
        write_task(proc, PID, tid, "python", cpu, {cpu} if tid != 107 else set(range(8)))
    for tid, cpu in {201: 4, 202: 5, 203: 6}.items():  # the pool's workers 1..3
        write_task(proc, PID, tid, "python", cpu, {cpu})
    write_task(proc, PID, 300, "power reader", 0, set(range(8)))  # not this set's
    s = Placer(proc_root=proc, pid=PID).check_set(spec, ort_tids=list(ort), num_sessions=2,
                                                  pool_tids=[201, 202, 203], caller_tid=CALLER)
    assert s.honoured and s.granted == {3, 4, 5, 6} and s.ran_on == {3, 4, 5, 6}
    assert [(t.role, t.tid, sorted(t.asked)) for t in s.threads] == [
        ("caller", CALLER, [3]),
        ("onnxruntime", 101, [6]), ("onnxruntime", 102, [4]), ("onnxruntime", 103, [5]),
        ("onnxruntime", 104, [5]), ("onnxruntime", 105, [6]), ("onnxruntime", 106, [4]),
        ("kernel pool", 201, [4]), ("kernel pool", 202, [5]), ("kernel pool", 203, [6])]


# -- refused or ignored pins ------------------------------------------------------------

# (inherited mask, refused cpus, error, expected fallback of balanced prefill (planned big 3-6, 4 threads))
REFUSALS = {
    # the app went to the background: its cpuset is the little cores, big pins raise
    "eperm_cpuset_little": ({0, 1, 2}, range(3, 8), PermissionError(errno.EPERM, "Operation not permitted"),
                            PhasePlan("prefill", "little", (0, 1, 2), pinned=False)),
    "einval_cpuset_little": ({0, 1, 2}, range(3, 8), OSError(errno.EINVAL, "Invalid argument"),
                             PhasePlan("prefill", "little", (0, 1, 2), pinned=False)),
    # a vendor kernel that returns success and ignores big-core pins: threads stay on 0-7
    "ignored": (set(range(8)), range(3, 8), None, PhasePlan("prefill", "big", (3, 4, 5, 6), pinned=False)),
    # a cpuset of cpu 0-4: two big cores granted, so two threads, not four
    "ignored_two_big_granted": ({0, 1, 2, 3, 4}, range(5, 8), None, PhasePlan("prefill", "big", (3, 4), pinned=False)),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_pins_warn_once_and_fall_back_to_no_more_threads_than_granted_cores(case, tmp_path, caplog):
    inherited, refused, error, expected = REFUSALS[case]
    kernel = FakeKernel(str(tmp_path / "proc"), inherited, refused, error)
    gov = governor_over(kernel, tmp_path)
    topo = gov.topology
    with caplog.at_level(logging.WARNING):
        report = build_like_the_engine(gov, kernel)
        plan = gov.choose()
        for _ in range(20):  # steps: the caller pinned per phase as the runner does, a refused cpu again
            gov.placer.pin_caller(set(plan.decode.cpus[:1]))
            gov.placer.pin_caller(set(inherited))  # an unpinned phase: back where the engine was built
            gov.placer.pin_caller({3})

    # logged once, naming the phase, the cores asked for and the cores got
    granted = sorted(inherited)
    got = "cpu " + (f"{granted[0]}-{granted[-1]}")
    assert len(platform_warnings(caplog)) == 1, platform_warnings(caplog)
    warning = platform_warnings(caplog)[0]
    assert warning.startswith("thread placement not honoured for prefill (balanced): asked for big cpu 3-6 "
                              f"(4 threads), got {got}"), warning
    if error is not None:
        assert f"pin to cpu 3 refused: {error.strerror}" in warning

    # the fallback: unpinned, never more threads than usable cores of its class granted
    assert plan.prefill == expected
    granted_cores = class_cpus(topo.cls(expected.cls), topo, frozenset(inherited), use_smt=False)
    assert plan.prefill.num_threads <= len(granted_cores) and set(plan.prefill.cpus) <= set(granted_cores)
    assert plan.decode == PhasePlan("decode", "little", (0, 1, 2), pinned=True)  # little pins land
    assert [(c.profile, c.planned.phase, c.honoured) for c in report.checks] == [
        ("balanced", "prefill", False), ("balanced", "decode", True)]

    # what dualpath info prints
    text = describe_placement(gov.placement)
    assert (f"  balanced  prefill  big cpu 3-6     1 caller, 6 ORT, 3 pool  {got}") in text
    assert (f"NOT HONOURED -> {expected.num_threads} threads unpinned on {expected.cls} "
            f"cpu {expected.cpus[0]}-{expected.cpus[-1]}") in text
    assert "  ! " + warning in text.splitlines()
    assert text.splitlines()[0] == ("Placement read back after one warm-up step per session set "
                                    "(1 phase(s) not as planned):")


def test_auto_falls_back_in_every_profile_that_uses_the_refused_cores_with_one_warning(tmp_path, caplog):
    kernel = FakeKernel(str(tmp_path / "proc"), {0, 1, 2}, range(3, 8), PermissionError(errno.EPERM, "denied"))
    gov = governor_over(kernel, tmp_path, profile="auto")
    with caplog.at_level(logging.WARNING):
        report = build_like_the_engine(gov, kernel)
    assert len(platform_warnings(caplog)) == 1
    assert platform_warnings(caplog)[0].startswith(
        "thread placement not honoured for prefill (performance), decode (performance), prefill (balanced): ")
    little3 = ("little", (0, 1, 2), False)
    shapes = {name: [(p.cls, p.cpus, p.pinned) for p in (plan.prefill, plan.decode)]
              for name, plan in gov.plans.items()}
    assert shapes == {"performance": [little3, little3], "balanced": [little3, ("little", (0, 1, 2), True)],
                      "low_power": [("little", (0,), True), ("little", (0,), True)]}
    assert len(report.mismatches) == 3
    # the engine builds a set per spec of the plans: the fallback's, beside the honoured ones
    assert SessionSpec((0, 1, 2), pinned=False, spinning=True) in gov.session_specs()
    assert SessionSpec((3, 4, 5, 6), pinned=True, spinning=True) not in gov.session_specs()


def test_honoured_pins_log_nothing_and_keep_every_plan(tmp_path, caplog):
    kernel = FakeKernel(str(tmp_path / "proc"), range(8), (), None)
    gov = governor_over(kernel, tmp_path, profile="auto")
    before = dict(gov.plans)
    with caplog.at_level(logging.WARNING):
        report = build_like_the_engine(gov, kernel)
    assert report.honoured and platform_warnings(caplog) == [] and gov.plans == before
    assert "(as planned)" in describe_placement(report).splitlines()[0]


def test_a_pin_refused_after_the_check_is_logged_once_and_the_step_goes_on(tmp_path, caplog):
    kernel = FakeKernel(str(tmp_path / "proc"), range(8), (), None)
    gov = governor_over(kernel, tmp_path)
    build_like_the_engine(gov, kernel)
    kernel.refused, kernel.error = frozenset({3}), OSError(errno.EINVAL, "Invalid argument")  # the cpuset changed
    with caplog.at_level(logging.WARNING):
        assert [gov.placer.pin_caller({3}) for _ in range(5)] == [False] * 5
    assert platform_warnings(caplog) == ["pin to cpu 3 refused: Invalid argument; the thread runs where it was"]


# -- thread counts from the topology -------------------------------------------------------

CONFIGS = [Config(), Config(power=PowerConfig(prefill_max_threads=64, decode_max_threads=64)),
           Config(runtime=RuntimeConfig(num_threads=64)), Config(power=PowerConfig(use_smt=True)),
           Config(power=PowerConfig(low_power_max_threads=0))]


@pytest.mark.parametrize("name", MACHINES)
def test_default_thread_counts_never_exceed_the_cores_of_the_phase_class(name):
    topo = fixture_topology(name)
    rng = random.Random(name)
    online = list(topo.online)
    for config in CONFIGS:
        for allowed in [None] + [set(rng.sample(online, rng.randint(1, len(online)))) for _ in range(20)]:
            for profile in PROFILES:
                try:
                    plan = resolve_plan(profile, topo, config, allowed)
                except Exception:  # noqa: BLE001 - an allowed set with no class CPU is refused (tested elsewhere)
                    continue
                for phase in (plan.prefill, plan.decode):
                    cores = class_cpus(topo.cls(phase.cls), topo, allowed, config.power.use_smt)
                    assert 1 <= phase.num_threads <= len(cores), (name, profile, allowed, phase)
                    assert set(phase.cpus) <= set(cores)


@pytest.mark.parametrize("name", MACHINES)
def test_fallback_never_has_more_threads_than_granted_cores_of_its_class(name):
    topo = fixture_topology(name)
    rng = random.Random(name)
    online = list(topo.online)
    grants = [set(online)] + [set(c.cpus) for c in topo.classes] + [{max(online) + 1}]
    grants += [set(rng.sample(online, rng.randint(1, len(online)))) for _ in range(30)]
    for profile in PROFILES:
        plan = resolve_plan(profile, topo)
        for phase in (plan.prefill, plan.decode):
            for granted in grants:
                fb = fallback_phase(phase, granted, topo, Config())
                assert fb.pinned is False and fb.phase == phase.phase and fb.num_threads >= 1
                cores = class_cpus(topo.cls(fb.cls), topo, frozenset(granted), False)
                if cores:
                    assert fb.num_threads <= min(len(cores), phase.num_threads) and set(fb.cpus) <= set(cores)
                    if any(c in granted for c in topo.cls(phase.cls).cpus):
                        assert fb.cls == phase.cls  # its own class while any core of it is granted
                else:  # nothing of any class granted: one thread
                    assert fb.num_threads == 1


def test_sweep_topologies_are_the_fixtures_classes_and_map_onto_this_machine():
    from dualpath.bench.power import SWEEP_TOPOLOGIES, sweep_classes

    assert set(SWEEP_TOPOLOGIES) == set(MACHINES)
    for name in MACHINES:
        topo = fixture_topology(name)
        assert SWEEP_TOPOLOGIES[name] == tuple((c.name, len(c.cores)) for c in topo.classes)
    usable = tuple(sorted(ALLOWED))
    assert sweep_classes("snapdragon_8gen2") == [("prime", 1, usable[:1]), ("big", 4, usable[:4]),
                                                 ("little", 3, usable[:3])]
    with pytest.raises(ValueError, match="must be 'machine' or one of snapdragon_8gen2"):
        sweep_classes("pixel")


# -- this machine ------------------------------------------------------------------------

@needs_cpu0_and_cpu1
def test_thread_pool_pinned_to_cpu0_reads_back_on_cpu0():
    from dualpath.kernels import ThreadPool

    pool = ThreadPool(3)
    placer = Placer()
    spec = SessionSpec((0,), pinned=True, spinning=False)
    out = {}

    def body():  # a thread of its own: pinning it leaves pytest's alone
        assert placer.pin_pool(pool, spec.cpus) and placer.pin_caller({0})
        pool.read(np.zeros(1 << 16, np.uint64))  # a job: the workers apply their affinity first
        out["seen"] = placer.check_set(spec, pool_tids=pool.worker_tids()[1:])

    t = threading.Thread(target=body)
    t.start()
    t.join()
    s = out["seen"]
    assert [(t.role, sorted(t.asked), sorted(t.allowed), t.last_cpu) for t in s.threads] == [
        ("caller", [0], [0], 0), ("kernel pool", [0], [0], 0), ("kernel pool", [0], [0], 0)]
    assert s.honoured and s.granted == {0}
    placer.pin_pool(pool, [1])  # and back: the read-back follows
    pool.read(np.zeros(1 << 16, np.uint64))
    s = placer.check_set(SessionSpec((1,), True, False), pool_tids=pool.worker_tids()[1:], caller_tid=-1)
    assert [(t.role, sorted(t.allowed), t.last_cpu) for t in s.threads] == [("kernel pool", [1], 1)] * 2


def run_py(code: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


ENGINE = r'''
import errno, json, logging, os, sys
sys.path.insert(0, %(testdir)r)
logging.basicConfig(level=logging.WARNING, format="%%(levelname)s %%(name)s: %%(message)s")
import dualpath
from dualpath.models import resolve_model
from dualpath.platform import Governor, Placer, describe_placement, load_topology
from dualpath.platform.power import PowerState
from platform_testlib import fixture_topology

def refuse_cpu0(tid, cpus):  # the seam: the kernel refuses a pin onto cpu 0 alone, as Android refuses big cores
    if set(cpus) == {0}:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    os.sched_setaffinity(tid, cpus)

cfg = dualpath.load_config(None, {"power.profile": %(profile)r, "runtime.max_context_tokens": 64,
                                  "kv_cache.kv_dtype": "f32"})
topology = fixture_topology(%(machine)r) if %(machine)r else load_topology("0:big,1:little")
placer = Placer(setaffinity=refuse_cpu0) if %(refuse)r else None
gov = Governor(topology, lambda: PowerState(), cfg, allowed_cpus=range(16), placer=placer)
llm = dualpath.LLM(resolve_model(None)[0], cfg, governor=gov)
ids = []
for prompt in ("Once upon a time", "One day, a little dog"):
    ids.append(list(llm.generate(prompt, dualpath.SamplingParams(temperature=0, max_tokens=12)).token_ids))
plan = gov.choose()
print(describe_placement(gov.placement), file=sys.stderr)
print(json.dumps({"ids": ids, "honoured": gov.placement.honoured,
                  "granted": {f"{c.profile}/{c.planned.phase}": sorted(c.seen.granted) for c in gov.placement.checks},
                  "prefill": [plan.prefill.cls, list(plan.prefill.cpus), plan.prefill.pinned],
                  "decode": [plan.decode.cls, list(plan.decode.cpus), plan.decode.pinned],
                  "sets": [[list(sp.cpus), sp.pinned] for sp in llm.runner.session_sets]}))
'''
TESTDIR = os.path.dirname(os.path.abspath(__file__))


def reference_ids() -> list[list[int]]:
    import dualpath
    from dualpath.models import resolve_model

    llm = dualpath.LLM(resolve_model(None)[0], dualpath.load_config(None, {
        "power.pin_threads": False, "runtime.max_context_tokens": 64, "kv_cache.kv_dtype": "f32"}))
    return [list(llm.generate(p, dualpath.SamplingParams(temperature=0, max_tokens=12)).token_ids)
            for p in ("Once upon a time", "One day, a little dog")]


@needs_cpu0_and_cpu1
def test_engine_whose_caller_pin_is_refused_warns_once_runs_prefill_unpinned_and_keeps_its_output():
    out, err = run_py(ENGINE % {"testdir": TESTDIR, "profile": "balanced", "machine": "", "refuse": True})
    warnings = [line for line in err.splitlines() if line.startswith("WARNING dualpath.platform")]
    assert len(warnings) == 1, err[-3000:]
    assert re.fullmatch(r"WARNING dualpath\.platform\.placement: thread placement not honoured for prefill "
                        r"\(balanced\): asked for big cpu 0 \(1 thread\), got cpu 0-1, last ran on cpu [0-9,-]+ "
                        r"\(pin to cpu 0 refused: Invalid argument; 1 caller thread asked for cpu 0 may run on "
                        r"cpu 0-1\); running with 1 thread, unpinned, on the granted cores of class big \(cpu 0\) "
                        r"instead", warnings[0]), warnings[0]
    assert out["honoured"] is False
    assert out["prefill"] == ["big", [0], False] and out["decode"] == ["little", [1], True]
    assert out["sets"] == [[[1], True], [[0], False]]  # the refused set is gone, the fallback's built
    assert out["ids"] == reference_ids()


@needs_cpu0_and_cpu1
def test_engine_planned_for_four_cores_on_two_reads_back_two_and_runs_two_unpinned_threads():
    """A real refusal: the x86_vm fixture declares 4 CPUs, this machine has 2. ORT's workers
    and our pool's asked for cpu 2 and 3 (EINVAL: ORT logs it, our pool says nothing) and
    stayed on cpu 0-1; the read-back sees it and the engine runs 2 threads, not 4."""
    if os.cpu_count() != 2:
        pytest.skip("needs a machine with exactly cpu 0 and cpu 1")
    out, err = run_py(ENGINE % {"testdir": TESTDIR, "profile": "performance", "machine": "x86_vm", "refuse": False})
    warnings = [line for line in err.splitlines() if line.startswith("WARNING dualpath.platform")]
    assert len(warnings) == 1 and "asked for all cpu 0-3 (4 threads), got cpu 0-1" in warnings[0]
    assert "onnxruntime threads asked for cpu 2-3 may run on cpu 0-1" in warnings[0]
    assert "kernel pool threads asked for cpu 2-3 may run on cpu 0-1" in warnings[0]
    assert out["granted"] == {"performance/prefill": [0, 1], "performance/decode": [0, 1]}
    assert out["prefill"] == out["decode"] == ["all", [0, 1], False]
    assert out["sets"] == [[[0, 1], False]]
    assert out["ids"] == reference_ids()


@needs_cpu0_and_cpu1
def test_info_prints_the_placement_it_verified():
    proc = subprocess.run([sys.executable, "-m", "dualpath.cli", "info", "--set", "power.cpu_classes=0:big,1:little",
                           "--set", "power.profile=balanced"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DUALPATH_CPU_CLASSES": ""})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = lines.index("Placement read back after one warm-up step per session set (as planned):")
    assert [line.split() for line in lines[start + 1:start + 4]] == [
        ["profile", "phase", "asked", "threads", "read", "back", "allowed", "last", "ran", "on", "result"],
        ["balanced", "prefill", "big", "cpu", "0", "1", "caller,", "0", "ORT,", "0", "pool", "cpu", "0", "cpu", "0",
         "ok"],
        ["balanced", "decode", "little", "cpu", "1", "1", "caller,", "0", "ORT,", "0", "pool", "cpu", "1", "cpu", "1",
         "ok"]]
