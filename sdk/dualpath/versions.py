"""The versions of our dependencies against the lower bounds we declare.

The bounds are read from the installed package's own metadata (pyproject.toml's
``dependencies``, as pip installed them): one source, no copy here. A dependency
older than its bound is refused before any model is read, with an error that names
the installed and the needed version and the command that fixes it; never a
traceback from deep inside ONNX Runtime or gguf. A source checkout that was never
installed has no metadata: nothing is checked then.
"""

from __future__ import annotations

import re
from importlib import metadata

from .errors import DualPathError

CHECKED = ("onnxruntime", "numpy", "gguf", "pyyaml", "jinja2", "onnx", "ml_dtypes", "tokenizers")
"""The runtime dependencies whose lower bounds are checked (when installed)."""


class DependencyError(DualPathError, ImportError):
    """An installed dependency is older than DualPath needs."""


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``1.20.1`` -> (1, 20, 1),
    ``2.1.0rc1`` -> (2, 1, 0), ``1.26.4+cpu`` -> (1, 26, 4)."""
    parts = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):  # 0rc1, 4+cpu: the release ends here
            break
    return tuple(parts)


def declared_minimums(requires: list[str] | None = None) -> dict[str, str]:
    """``package -> lowest version`` from the ``>=`` bounds of DualPath's runtime
    requirements (extras left out), e.g. ``{"onnxruntime": "1.20.1", ...}``. Empty when
    DualPath is not installed (a source checkout on ``sys.path``)."""
    if requires is None:
        try:
            requires = metadata.requires("dualpath") or []
        except metadata.PackageNotFoundError:
            return {}
    found = {}
    for req in requires:
        spec, _, marker = req.partition(";")
        if "extra ==" in marker:
            continue
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)", spec)
        if m is None:
            continue
        bound = re.search(r">=\s*([0-9][0-9A-Za-z.+\-]*)", m.group(2))
        if bound:
            found[_canonical(m.group(1))] = bound.group(1)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_versions(names=CHECKED) -> dict[str, str]:
    """``package -> installed version`` for those of ``names`` that are installed."""
    out = {}
    for name in names:
        try:
            out[_canonical(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def too_old(installed: dict[str, str], minimums: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(package, installed, needed)`` for every installed package below its bound."""
    return [(name, have, minimums[name]) for name, have in sorted(installed.items())
            if name in minimums and parse_version(have) < parse_version(minimums[name])]


def check_versions(installed: dict[str, str] | None = None, minimums: dict[str, str] | None = None) -> None:
    """Raise ``DependencyError`` naming every dependency older than its declared bound,
    with the pip command that upgrades them."""
    old = too_old(installed_versions() if installed is None else installed,
                  declared_minimums() if minimums is None else minimums)
    if not old:
        return
    listed = "; ".join(f"{name} {have} is installed, DualPath needs {need} or newer" for name, have, need in old)
    command = " ".join(f"'{name.replace('_', '-')}>={need}'" for name, _, need in old)
    raise DependencyError(f"{listed}. Upgrade with: pip install -U {command}")
