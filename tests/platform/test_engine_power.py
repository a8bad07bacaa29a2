"""The governor driving a real model: threads on the right cores per phase, one copy
of the weights for every session set, and profile switches mid-generation that never
change the output.

This machine has two alike cores, so the tests declare cpu0 big and cpu1 little
(``power.cpu_classes``). ORT refuses per-session thread pools once a process has
made its global pool, so each test runs in a fresh interpreter.
"""

import json
import os
import subprocess
import sys

import pytest

from tests_shared import models_dir_path

MODELS = models_dir_path()
GGUF = MODELS / "stories260K.gguf"
needs_model = pytest.mark.skipif(not GGUF.is_file(),
                                 reason=f"test model not found in {MODELS} (set DUALPATH_TEST_MODELS)")
needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                                    reason="needs cpu0 and cpu1")


def run_py(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PLACEMENT = r'''
import json, os, dualpath
from dualpath.platform import thread_placement
cfg = dualpath.load_config(None, {"power.cpu_classes": "0:big,1:little", "power.profile": "balanced"})
llm = dualpath.LLM(%(model)r, cfg)
runner = llm.runner
records = []
run = runner.run
def spy(entries):
    out = run(entries)
    plan = runner.last_plan
    phase = "prefill" if any(len(e.token_ids) > 1 for e in entries.seqs) else "decode"
    sp = plan.prefill_spec if phase == "prefill" else plan.decode_spec
    _, stepper = runner._sets[sp]
    me = thread_placement()[__import__("threading").get_native_id()]
    pool_tids = [t for t in stepper.pool.worker_tids()[1:] if t]
    placement = thread_placement()
    records.append({"phase": phase, "caller_cpu": me[1], "caller_allowed": sorted(me[2]),
                    "pool": [[placement[t][1], sorted(placement[t][2])] for t in pool_tids if t in placement],
                    "phase_cpus": list(sp.cpus)})
    return out
runner.run = spy
llm.generate("Once upon a time", dualpath.SamplingParams(temperature=0, max_tokens=3))   # warm-up
records.clear()
llm.generate("One day, a little dog named Max", dualpath.SamplingParams(temperature=0, max_tokens=8))
print(json.dumps(records))
'''


@needs_model
@needs_two_cpus
def test_prefill_runs_on_the_big_core_and_decode_on_the_little_one():
    records = run_py(PLACEMENT % {"model": str(GGUF)})
    phases = [r["phase"] for r in records]
    assert phases[0] == "prefill" and phases.count("decode") >= 5
    for r in records:
        want = 0 if r["phase"] == "prefill" else 1
        assert r["phase_cpus"] == [want]
        assert r["caller_cpu"] == want and r["caller_allowed"] == [want], r
        for cpu, allowed in r["pool"]:  # our kernel pool's workers (none with one thread per phase)
            assert cpu == want and allowed == [want]


POOL_PINNING = r'''
import json, time
from dualpath.kernels import ThreadPool
from dualpath.platform import thread_placement
import numpy as np
pool = ThreadPool(3)
buf = np.ones(1 << 22, np.uint64)
out = {}
for cpu in (0, 1, 0):
    pool.set_affinity([cpu] * 3)
    pool.read(buf)                      # a job: workers re-pin before running it
    time.sleep(0.05)
    pl = thread_placement()
    out.setdefault(str(cpu), []).append([sorted(pl[t][2]) for t in pool.worker_tids()[1:]])
print(json.dumps(out))
'''


@needs_two_cpus
def test_kernel_pool_workers_repin_before_the_next_job():
    out = run_py(POOL_PINNING)
    assert all(w == [0] for snapshot in out["0"] for w in snapshot) and len(out["0"]) == 2
    assert all(w == [1] for snapshot in out["1"] for w in snapshot)
    assert len(out["1"][0]) == 2  # two workers besides the caller


RSS = r'''
import json, os, dualpath
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
overrides = {"runtime.max_context_tokens": 256, "runtime.num_threads": 1}
if %(pinned)r:
    overrides.update({"power.cpu_classes": "0:big,1:little", "power.profile": "balanced"})
else:
    overrides["power.pin_threads"] = False
llm = dualpath.LLM(%(model)r, dualpath.load_config(None, overrides))
llm.generate([1] * 40, dualpath.SamplingParams(temperature=0, max_tokens=4))
print(json.dumps({"rss_mb": rss_mb(), "sets": max(1, len(llm.runner.session_sets)),
                  "weights_mb": llm.spec.weight_bytes / 2**20}))
'''


@needs_two_cpus
def test_two_session_sets_share_one_copy_of_the_weights(tmp_path):
    from dualpath.models.synth import synth_gguf

    path = synth_gguf(tmp_path / "s110.gguf", "stories110M", "F32", seed=0)
    one = run_py(RSS % {"model": str(path), "pinned": False})
    two = run_py(RSS % {"model": str(path), "pinned": True})
    assert one["weights_mb"] >= 200 and two["sets"] == 2
    assert two["rss_mb"] <= 1.10 * one["rss_mb"], (one, two)


TRACE = r'''
import json, dualpath
from dualpath.config import PowerConfig
from dualpath.platform import Governor, load_topology
from dualpath.platform.power import PowerState, ThermalZone

class Clock:
    now = 0.0
    def __call__(self): return self.now

clock = Clock()
def phone(pct, status, temp, ac):
    return PowerState(battery_pct=pct, battery_status=status, ac_online=ac,
                      zones=(ThermalZone("thermal_zone0", "cpu", temp, 80.0),), sources=("power_supply", "thermal"))
# battery falling, then temperature rising, then the charger plugged in
trace = [phone(60, "discharging", 45, False)] * 6 + [phone(15, "discharging", 50, False)] * 10 \
      + [phone(12, "discharging", 78, False)] * 10 + [phone(13, "charging", 60, True)] * 200
state = {"i": 0}
def reader():
    return trace[min(state["i"], len(trace) - 1)]
cfg = dualpath.load_config(None, {"power.cpu_classes": "0:big,1:little", "power.profile": "auto",
                                  "power.min_switch_interval_s": 3.0, "power.poll_interval_s": 0.0,
                                  "kv_cache.kv_dtype": "f32"})
gov = Governor(load_topology("0:big,1:little"), reader, cfg, clock)
llm = dualpath.LLM(%(model)r, cfg, governor=gov)
runner = llm.runner
run = runner.run
profiles = []
def step(entries):   # one simulated second per step
    out = run(entries)
    profiles.append(runner.last_plan.profile)
    state["i"] += 1
    clock.now += 1.0
    return out
runner.run = step
c = llm.generate("Once upon a time", dualpath.SamplingParams(temperature=0, max_tokens=60))
switches = [[s.time_s, s.old, s.new] for s in gov.switches]
print(json.dumps({"ids": list(c.token_ids), "profiles": profiles, "switches": switches}))
'''


@needs_model
@needs_two_cpus
def test_power_trace_switches_profiles_mid_generation_without_changing_the_output():
    out = run_py(TRACE % {"model": str(GGUF)})
    import dualpath

    ref = dualpath.LLM(GGUF, dualpath.load_config(None, {"power.pin_threads": False,
                                                          "kv_cache.kv_dtype": "f32"}))
    want = ref.generate("Once upon a time", dualpath.SamplingParams(temperature=0, max_tokens=60))
    assert out["ids"] == list(want.token_ids)
    # On battery -> balanced; below 20 % discharging -> low_power; hot stays low_power;
    # charger in and cool -> performance (3 s apart at least).
    assert [s[2] for s in out["switches"]] == ["balanced", "low_power", "performance"], out["switches"]
    times = [s[0] for s in out["switches"]]
    assert times[1] == 6.0 and times[2] == 26.0, times
    assert out["profiles"][0] == "balanced" and out["profiles"][-1] == "performance"
