"""The package's imports run one way (STYLE.md, "Layers, one way"), read from the source.

Every ``import`` / ``from ... import`` in sdk/dualpath, at module level or inside a
function or ``if TYPE_CHECKING:``, is resolved to the module it names. An import
from a lower layer to a higher one fails, as does any cycle between modules, and
any import of the compiled extension modules from outside ``dualpath.kernels``.

The KV cache has one owner (STYLE.md, "One owner per resource"): outside cache/ and
scheduler/ no code calls a method that changes it or assigns an attribute on it (the
benchmarks excepted); the engine, the runner, the output maker and the draft model get
plans and results (scheduler/sequences.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sdk" / "dualpath"

LAYERS = [
    ("errors", "kernels", "config", "versions", "sampling_params", "completion"),
    ("models", "tokenizer", "platform", "vision"),
    ("graph", "cache"),
    ("scheduler",),
    ("executor", "sampling"),  # running the model (ONNX Runtime, our kernels); sampling and grammars
    ("engine",),  # requests, outputs, speculative decoding: the engine steps the scheduler and the executor
    ("llm", "chat", "rerank", "images", ""),  # "" = the package's own __init__ (the public API: it imports llm)
    ("server",),
    ("bench",),
    ("cli",),
]
"""Lowest first. A module may import its own layer and the layers below it."""

CACHE_OWNERS = ("cache", "scheduler")
"""The packages that may change the KV cache."""
CACHE_CHANGES = {"allocate", "free", "truncate", "fork", "commit", "start", "evict_all", "migrate"}
"""The cache facade's methods that change it (``KVCacheManager``)."""
CACHE_CHANGES_EXCEPTED = ("bench",)
"""Benchmarks drive the cache directly to measure it."""

COMPILED = {"_kvarena", "_kernels"}
"""Extension modules: only ``dualpath.kernels`` imports them."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = ("dualpath",) + rel.parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str:
    """The longest prefix of a dotted name that is one of our modules (``dualpath.x.Y``
    names the symbol Y of module ``dualpath.x``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in MODULES or candidate in {f"dualpath.{c}" for c in COMPILED}:
            return candidate
    return name


def imports_of(module: str) -> set[str]:
    """Our modules that ``module`` imports, anywhere in its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" for a in node.names]  # a submodule or a symbol
        else:
            continue
        for name in names:
            if name == "dualpath" or name.startswith("dualpath."):
                target = _resolve(name)
                if target != module:
                    out.add(target)
    return out


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in COMPILED:
        top = "kernels"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS in {__file__}")


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in GRAPH.items() for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert upward == []


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t in GRAPH and t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in GRAPH:
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_only_the_kernels_facade_imports_compiled_modules():
    compiled = {f"dualpath.{c}" for c in COMPILED}
    offenders = sorted(m for m, targets in GRAPH.items() if targets & compiled and m != "dualpath.kernels")
    assert offenders == []


@pytest.mark.parametrize("source,expected", [
    ("from ..engine.engine import Engine", "dualpath.engine.engine"),
    ("from .. import llm", "dualpath.llm"),
    ("import dualpath.cache.manager as m", "dualpath.cache.manager"),
    ("from dualpath.config import Config", "dualpath.config"),
])
def test_the_walker_resolves_relative_and_absolute_imports(source, expected, tmp_path, monkeypatch):
    # The checks above are only as good as this resolution: pin it on known lines.
    monkeypatch.setitem(MODULES, "dualpath.scheduler.probe", tmp_path / "probe.py")
    (tmp_path / "probe.py").write_text(source + "\n")
    assert imports_of("dualpath.scheduler.probe") == {expected}


def test_an_upward_import_is_reported(tmp_path, monkeypatch):
    (tmp_path / "probe.py").write_text("def f():\n    from ..executor.session import ModelRunner\n")
    monkeypatch.setitem(MODULES, "dualpath.cache.probe", tmp_path / "probe.py")
    targets = imports_of("dualpath.cache.probe")
    assert targets == {"dualpath.executor.session"}
    assert layer_of("dualpath.executor.session") > layer_of("dualpath.cache.probe")


def test_the_readme_layout_names_every_module_and_package_in_layer_order():
    readme = (PACKAGE.parents[1] / "README.md").read_text()
    block = readme[readme.index("## Layout"):]
    block = block[block.index("```\nsdk/dualpath/") + 4:]
    block = block[:block.index("```")]
    entries = [line.split()[0] for line in block.splitlines()[1:] if line.startswith("  ")]
    names = [n for line in block.splitlines()[1:] if line.startswith("  ")
             for n in line.split("  ")[1].split()]  # "errors.py config.py" share a row
    on_disk = sorted(p.name + ("/" if p.is_dir() else "") for p in PACKAGE.iterdir()
                     if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py") and p.name != "__init__.py")
    assert sorted(n for n in names if n.endswith((".py", "/"))) == on_disk
    # Listed lowest layer first, like LAYERS.
    layers = [layer_of("dualpath." + e.rstrip("/").removesuffix(".py")) for e in entries
              if e.endswith(".py") or (PACKAGE / e / "__init__.py").is_file()]  # data/ has no code
    assert layers == sorted(layers)


def _is_cache(node: ast.AST) -> bool:
    """An expression that names a cache: ``cache``, ``self.cache``, ``llm.cache``, ``draft_cache``..."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "cache" in name.lower()


def cache_changes(path: Path) -> list[str]:
    """``line: source`` of every call of a ``CACHE_CHANGES`` method on a cache, and every
    assignment to an attribute of one, in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in CACHE_CHANGES and _is_cache(node.func.value):
            out.append(f"{node.lineno}: {ast.unparse(node.func)}()")
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        out += [f"{node.lineno}: {ast.unparse(t)} = ..." for t in targets
                if isinstance(t, ast.Attribute) and _is_cache(t.value)]
    return sorted(out, key=lambda change: int(change.split(":")[0]))


def test_only_the_cache_and_the_scheduler_change_the_cache():
    allowed = {f"dualpath.{p}" for p in CACHE_OWNERS + CACHE_CHANGES_EXCEPTED}
    outside = [f"{m}:{change}" for m, path in MODULES.items() if ".".join(m.split(".")[:2]) not in allowed
               for change in cache_changes(path)]
    assert outside == []


def test_the_cache_change_walker_finds_calls_and_assignments(tmp_path):
    # The rule above is only as good as this walk: pin it on known lines.
    (tmp_path / "probe.py").write_text(
        "def f(self, llm, cache, store):\n"
        "    self.cache.free(1)\n"
        "    llm.runner.cache.evict_all()\n"
        "    cache.policy = None\n"
        "    draft_cache.truncate(1, 2)\n"
        "    store.free(1)\n"              # not a cache
        "    cache.stats()\n"              # reads only
        "    self.cache = cache\n")        # the owner keeps a reference
    assert cache_changes(tmp_path / "probe.py") == [
        "2: self.cache.free()", "3: llm.runner.cache.evict_all()", "4: cache.policy = ...", "5: draft_cache.truncate()"]
