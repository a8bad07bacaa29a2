"""No function in the package over 80 lines and no class over 300: a longer one is
doing several jobs, and the next change to it is harder to review than a split would be.
The largest of each are printed (``pytest -s``) so the margin is visible."""

import ast
from pathlib import Path

import dualpath

MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300
PACKAGE = Path(dualpath.__file__).parent


def _sizes():
    """(lines, kind, where) of every function and class in the package's sources."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                yield node.end_lineno - node.lineno + 1, kind, where


def test_no_function_or_class_is_too_long():
    sizes = list(_sizes())
    assert len(sizes) > 500  # the walk found the package's code
    limits = {"function": MAX_FUNCTION_LINES, "class": MAX_CLASS_LINES}
    for kind in limits:
        largest = sorted((s for s in sizes if s[1] == kind), reverse=True)[:5]
        print(f"\nlargest of kind {kind} (limit {limits[kind]} lines):")
        for lines, _, where in largest:
            print(f"  {lines:4d}  {where}")
    over = [f"{where}: {lines} lines (a {kind} may have {limits[kind]})"
            for lines, kind, where in sizes if lines > limits[kind]]
    assert not over, "\n".join(over)
