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
