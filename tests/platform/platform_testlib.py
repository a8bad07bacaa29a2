"""Helpers shared by the platform tests (a plain module: tests/platform cannot be a package,
it would shadow the standard library's ``platform``)."""

import os
import sys

from dualpath.platform.topology import read_topology

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
MACHINES = sorted(n for n in os.listdir(FIXTURES)
                  if os.path.isdir(os.path.join(FIXTURES, n)) and not n.startswith("__"))

if FIXTURES not in sys.path:
    sys.path.insert(0, FIXTURES)
import make_fixtures  # noqa: E402,F401  (re-exported)


def fixture_topology(name: str):
    root = os.path.join(FIXTURES, name)
    return read_topology(os.path.join(root, "sys"), os.path.join(root, "proc"))


def write_task(proc_root: str, pid: int, tid: int, name: str, last_cpu: int, allowed) -> None:
    """One thread of a fake ``/proc/<pid>/task`` tree: ``stat`` with ``last_cpu`` in field 39
    and ``status`` with ``Cpus_allowed_list``, as Linux writes them."""
    from dualpath.platform.topology import format_cpulist

    folder = os.path.join(proc_root, str(pid), "task", str(tid))
    os.makedirs(folder, exist_ok=True)
    fields = ["S", "1"] + ["0"] * 48  # fields 3 .. 52
    fields[39 - 3] = str(last_cpu)
    with open(os.path.join(folder, "stat"), "w") as f:
        f.write(f"{tid} ({name}) {' '.join(fields)}\n")
    with open(os.path.join(folder, "status"), "w") as f:
        f.write(f"Name:\t{name}\nPid:\t{tid}\nCpus_allowed:\t{sum(1 << c for c in allowed):x}\n"
                f"Cpus_allowed_list:\t{format_cpulist(allowed)}\nvoluntary_ctxt_switches:\t1\n")
