"""``check_invariants`` raises ``InvariantError`` by itself, not through ``assert``: under
``python -O`` (asserts stripped) a broken table is still reported, so the server's shutdown
check cannot pass silently."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dualpath.errors import DualPathError, InvariantError, require


def test_require_raises_invariant_error_that_is_also_an_assertion_error():
    require(True, "fine")
    with pytest.raises(InvariantError, match="the counts disagree") as info:
        require(False, "the counts disagree")
    assert isinstance(info.value, AssertionError) and isinstance(info.value, DualPathError)


_PROBE = textwrap.dedent("""
    import sys
    from dualpath.cache.prefix import PrefixIndex
    from dualpath.errors import InvariantError

    print("asserts stripped:", not __debug__)
    index = PrefixIndex(4, b"salt")
    index.page_hash[2] = None
    index.lru[2] = None  # a cached page that was never registered
    try:
        index.check_invariants([0, 0, 0, 0])
    except InvariantError as e:
        print("InvariantError:", e)
        sys.exit(0)
    print("no error")
    sys.exit(1)
""")


def test_check_invariants_reports_a_broken_table_under_python_O():
    out = subprocess.run([sys.executable, "-O", "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "asserts stripped: True" in out.stdout
    assert "InvariantError: cached page 2" in out.stdout
