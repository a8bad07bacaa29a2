"""Thread placement on this machine: ORT's affinity string, pinning a thread, reading it back."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from dualpath.platform.affinity import ort_affinity_string, pin_current_thread, thread_placement

ALLOWED = os.sched_getaffinity(0)
needs_cpu0_and_cpu1 = pytest.mark.skipif(not {0, 1} <= ALLOWED, reason="needs cpu0 and cpu1")


@pytest.mark.parametrize("cpus, threads, expected", [
    ((4, 5, 6), 3, "6;7"), ((0, 1), 2, "2"), ((7,), 1, ""), ((8, 9, 10, 11), 2, "10"),
    ((3, 0, 1), 3, "1;2"), ((15, 14, 13, 12, 11, 10, 9, 8), 8, "15;14;13;12;11;10;9")])
def test_ort_affinity_string_is_one_based_with_threads_minus_one_groups(cpus, threads, expected):
    s = ort_affinity_string(cpus, threads)
    assert s == expected
    assert s.count(";") == threads - 2 if threads > 1 else s == ""  # threads - 1 groups


@pytest.mark.parametrize("cpus, threads, message", [
    ((0, 1), 3, "3 threads need 3 cpus, got 2"), ((0,), 0, "num_threads=0 must be >= 1"),
    ((0, 0), 2, "name a CPU twice"), ((-1, 0), 2, "CPU numbers >= 0")])
def test_ort_affinity_string_refuses_impossible_requests(cpus, threads, message):
    with pytest.raises(ValueError, match=message):
        ort_affinity_string(cpus, threads)


def _spin(seconds=0.02):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _in_thread(fn):
    """Run fn in a fresh thread (pinning it leaves pytest's thread alone); re-raise its error."""
    out = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@needs_cpu0_and_cpu1
def test_pin_current_thread_moves_it_to_cpu0_then_cpu1_and_placement_reads_it_back():
    main_tid = threading.get_native_id()

    def body():
        tid = threading.get_native_id()
        seen = []
        previous = pin_current_thread({0})
        _spin()
        seen.append(thread_placement()[tid][1:])
        pin_current_thread({1})
        _spin()
        seen.append(thread_placement()[tid][1:])
        return previous, seen, thread_placement()[main_tid][2]

    previous, seen, main_allowed = _in_thread(body)
    assert previous == ALLOWED
    assert seen == [(0, frozenset({0})), (1, frozenset({1}))]
    assert main_allowed == frozenset(ALLOWED)  # only the calling thread moved


def test_pin_current_thread_names_the_cpus_it_could_not_use():
    def body():
        with pytest.raises(OSError, match=r"cannot pin this thread to cpu \[4095\]"):
            pin_current_thread({4095})
        return os.sched_getaffinity(0)

    assert _in_thread(body) == ALLOWED  # a refused pin leaves the mask as it was


def test_thread_placement_lists_every_thread_with_name_cpu_and_mask():
    placement = thread_placement()
    assert threading.get_native_id() in placement
    for _tid, (name, cpu, allowed) in placement.items():
        assert isinstance(name, str) and name
        assert cpu in range(os.cpu_count() or 1)
        assert allowed <= frozenset(range(os.cpu_count() or 1))


def test_pin_current_thread_goes_through_the_setaffinity_it_is_given_and_names_a_refusal():
    import errno

    calls = []

    def refuse(tid, cpus):  # as an Android app's kernel refuses a big core
        calls.append((tid, set(cpus)))
        raise PermissionError(errno.EPERM, "Operation not permitted")

    def body():
        with pytest.raises(OSError, match=r"cannot pin this thread to cpu \[1\]: Operation not permitted") as err:
            pin_current_thread({1}, setaffinity=refuse)
        return err.value.errno, os.sched_getaffinity(0)

    assert _in_thread(body) == (errno.EPERM, ALLOWED)
    assert calls == [(0, {1})]


PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_placement_probe.py")


def probe(*args) -> dict:
    """Run ort_placement_probe.py in a fresh interpreter (see its docstring for why)."""
    pytest.importorskip("onnxruntime")
    out = subprocess.run([sys.executable, PROBE, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_cpu0_and_cpu1
@pytest.mark.parametrize("cpus", [(0, 1), (1, 0)])
def test_ort_worker_lands_on_cpus_1_and_the_pinned_caller_on_cpus_0(cpus):
    """A two-thread phase: the caller on cpus[0] (pinned by us), ORT's one worker on cpus[1]
    (pinned by ORT from the affinity string) after a warm-up run."""
    steps = probe("phases", ",".join(map(str, cpus)))["steps"]
    for step in steps:
        assert step["caller"] == [cpus[0], [cpus[0]]]
        assert list(step["new_threads"].values()) == [[cpus[1], [cpus[1]]]]


@needs_cpu0_and_cpu1
def test_two_phase_sessions_on_cpu0_big_cpu1_little_keep_each_phase_on_its_core():
    """The runner's sequence with the governor's plan on this machine declared cpu0 big and
    cpu1 little: one session per phase, the caller pinned to the phase's CPU before its steps."""
    from dualpath.config import Config, PowerConfig
    from dualpath.platform.governor import Governor
    from dualpath.platform.power import PowerState
    from dualpath.platform.topology import read_topology

    topo = read_topology().override("0:big,1:little")
    gov = Governor(topo, lambda: PowerState(), Config(power=PowerConfig(profile="balanced")), allowed_cpus={0, 1})
    plan = gov.choose()
    assert (plan.prefill.cpus, plan.decode.cpus) == ((0,), (1,))
    spec = "/".join(",".join(map(str, p.cpus)) for p in (plan.prefill, plan.decode))
    steps = probe("phases", spec)["steps"]
    assert [(s["phase"], s["caller"]) for s in steps] == [(0, [0, [0]]), (1, [1, [1]]), (0, [0, [0]]), (1, [1, [1]])]
    assert all(s["new_threads"] == {} for s in steps)  # one thread per phase: ORT starts no workers


def test_ort_refuses_per_session_pools_once_the_global_pool_exists():
    """Why the engine must not create ORT's global thread pool when phases are pinned: after
    set_global_thread_pool_sizes, no session may have its own pool (onnxruntime 1.32)."""
    result = probe("global_pool_then_per_session")
    assert result["per_session_after_global"] == "refused"
    assert "use_per_session_threads must be false when using a global thread pool" in result["message"]
