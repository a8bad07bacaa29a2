"""The lower bounds we declare: read from the package's metadata, equal to the pins of
the oldest-versions CI leg, and enforced with an error that says what to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath.versions import DependencyError, check_versions, declared_minimums, parse_version, too_old

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().replace("-", "_").lower()] = version.strip()
    return pins


def test_the_oldest_versions_leg_pins_exactly_the_declared_bounds():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = declared_minimums(project["dependencies"])
    for extra in ("server", "structured", "hub", "vision"):
        declared.update(declared_minimums(project["optional-dependencies"][extra]))
    pins = _pins(ROOT / ".ci" / "oldest-constraints.txt")
    # every declared bound is pinned at its value (1.26 is 1.26.0), and nothing else is
    assert set(pins) == set(declared)
    for name, bound in declared.items():
        assert parse_version(pins[name]) == parse_version(bound) + (0,) * (len(parse_version(pins[name]))
                                                                         - len(parse_version(bound))), name


def test_versions_compare_by_their_release_numbers():
    assert parse_version("1.20.1") == (1, 20, 1)
    assert parse_version("2.1.0rc1") == (2, 1, 0)
    assert parse_version("1.26.4+cpu") == (1, 26, 4)
    assert parse_version("0.16") < parse_version("0.16.0") < parse_version("0.17.1")
    assert too_old({"onnxruntime": "1.20.0", "numpy": "2.3.1"}, {"onnxruntime": "1.20.1", "numpy": "1.26"}) == \
        [("onnxruntime", "1.20.0", "1.20.1")]


def test_a_too_old_dependency_is_refused_naming_both_versions_and_the_command():
    with pytest.raises(DependencyError) as info:
        check_versions({"onnxruntime": "1.19.2", "gguf": "0.10.0", "numpy": "2.3.1"},
                       {"onnxruntime": "1.20.1", "gguf": "0.16", "numpy": "1.26"})
    assert str(info.value) == ("gguf 0.10.0 is installed, DualPath needs 0.16 or newer; onnxruntime 1.19.2 is "
                               "installed, DualPath needs 1.20.1 or newer. Upgrade with: pip install -U "
                               "'gguf>=0.16' 'onnxruntime>=1.20.1'")
    assert isinstance(info.value, ImportError)


def test_the_installed_dependencies_meet_the_declared_bounds():
    if not declared_minimums():
        pytest.skip("dualpath is not installed (a source checkout): no metadata to read the bounds from")
    assert declared_minimums()["onnxruntime"] == "1.20.1"
    check_versions()  # this environment, whichever leg of CI it is
