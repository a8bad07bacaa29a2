"""The benchmarks' one isolated-process harness: a worker runs in a fresh Python
with JSON keyword arguments and the given environment; its JSON result comes back
whatever it prints; a failing or slow worker is an error that names it and quotes
the end of its stderr."""

from __future__ import annotations

import os
import textwrap

import pytest

from dualpath.bench.harness import BenchProcessError, run_peer_script, run_worker, worker_name
from dualpath.errors import DualPathError

WORKERS = '''
import os, sys, time

def double(x, label):
    print("stray output on stdout", flush=True)       # must not corrupt the result
    print("a note on stderr", file=sys.stderr)
    return {"x2": 2 * x, "label": label, "pid": os.getpid(), "marker": os.environ.get("BENCH_MARKER")}

def boom(what):
    print("about to fail", file=sys.stderr)
    raise ValueError(f"kaput: {what}")

def hang():
    time.sleep(60)
'''


@pytest.fixture
def workers(tmp_path):
    """The module ``harness_workers`` and the environment that lets a child import it."""
    (tmp_path / "harness_workers.py").write_text(textwrap.dedent(WORKERS))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def test_worker_runs_in_a_fresh_process_and_returns_its_json(workers):
    env = {**workers, "BENCH_MARKER": "set-by-the-caller"}
    out = run_worker("harness_workers:double", {"x": 21, "label": "ü"}, env=env, timeout_s=120)
    assert out["x2"] == 42 and out["label"] == "ü"
    assert out["marker"] == "set-by-the-caller"
    assert out["pid"] != os.getpid()


def test_failing_worker_raises_naming_it_with_its_stderr_tail(workers):
    with pytest.raises(BenchProcessError) as e:
        run_worker("harness_workers:boom", {"what": "the disk"}, env=workers, timeout_s=120)
    msg = str(e.value)
    assert "harness_workers:boom(what='the disk') exited with status 1" in msg
    assert "about to fail" in msg and "ValueError: kaput: the disk" in msg
    assert isinstance(e.value, DualPathError)  # the CLI reports it as an error, no traceback


def test_worker_past_its_timeout_is_killed_and_named(workers):
    with pytest.raises(BenchProcessError, match=r"harness_workers:hang\(\) did not finish in 3 s \(killed\)"):
        run_worker("harness_workers:hang", env=workers, timeout_s=3)


def test_unknown_worker_is_an_error_naming_it():
    with pytest.raises(BenchProcessError, match="dualpath.bench.e2e:no_such_worker") as e:
        run_worker("dualpath.bench.e2e:no_such_worker", timeout_s=120)
    assert "AttributeError" in str(e.value)


def test_a_bench_module_function_is_named_by_its_module_and_a_closure_is_refused():
    from dualpath.bench import e2e

    assert worker_name(e2e.worker) == "dualpath.bench.e2e:worker"

    def local():
        pass

    with pytest.raises(ValueError, match="module-level function"):
        worker_name(local)
    with pytest.raises(ValueError, match="module:function"):
        worker_name("no_colon")


PEER_SCRIPT = '''
import json, os, sys

def where(tag):
    print("noise on stdout", flush=True)
    return {"tag": tag, "pythonpath": os.environ.get("PYTHONPATH"), "executable": sys.executable}

if __name__ == "__main__":
    result = {"where": where}[sys.argv[1]](**json.load(sys.stdin))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
'''


def test_peer_script_runs_by_path_in_the_given_interpreter_without_our_pythonpath(tmp_path, monkeypatch):
    import sys

    script = tmp_path / "peer.py"
    script.write_text(textwrap.dedent(PEER_SCRIPT))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "ours"))
    out = run_peer_script(sys.executable, str(script), "where", {"tag": "x"}, timeout_s=120)
    assert out == {"tag": "x", "pythonpath": None, "executable": sys.executable}


def test_a_peer_interpreter_that_cannot_start_is_an_error_naming_it(tmp_path):
    missing = str(tmp_path / "no-env" / "bin" / "python")
    with pytest.raises(BenchProcessError, match=f"cannot run {missing}"):
        run_peer_script(missing, str(tmp_path / "peer.py"), "where", timeout_s=120)
