"""Import direction between the layers, checked on the source with ``ast`` (nothing is imported).

* Production code (``ops/``, ``assets/``, ``pipelines/``, ``resources/``) never imports the
  simulators and cost models of ``sim/``: they serve benchmarks and tests only, and import what they
  share with production code from ``ops`` (``sim`` -> ``ops``, never ``ops`` -> ``sim``).
* ``ops/`` never imports Dagster: ops are plain Python run by assets and by drivers launched through
  Dagster Pipes. ``dagster_pipes`` (the standalone, dagster-free Pipes client) is allowed; ``dagster``
  and the other ``dagster_*`` integration libraries (which depend on ``dagster``) are not.
* The modules of ``ops/`` import each other without a cycle (a module that needs a name from one
  that imports it, e.g. an error class, gets it from a third module both import: ``ops/gba/errors.py``).

Every import counts, at any depth (inside functions, ``try``, ``if TYPE_CHECKING``), as do
``importlib.import_module`` / ``__import__`` calls with a literal module name.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("ops", "assets", "pipelines", "resources")
SIM = "sim"
DAGSTER_ALLOWED = {"dagster_pipes"}


def _modules(package: str) -> Iterator[tuple[Path, str]]:
    """(path, dotted module name) of every .py file under ROOT/package."""
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield path, ".".join(parts)


def _resolve(package: str, level: int, module: str | None) -> str:
    """The absolute name of a relative import ``from <level dots><module> import ...`` in ``package``."""
    base = package.split(".") if package else []
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imported_names(source: str, modname: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in ``source``, the code of module ``modname``.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (``c`` may be a submodule); relative imports
    are resolved against the module's package.
    """
    package = modname if is_package else modname.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node.level, node.module) if node.level else (node.module or "")
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            arg = node.args[0]
            if fname in ("import_module", "__import__") and isinstance(arg, ast.Constant) \
                    and isinstance(arg.value, str) and arg.value:
                name = arg.value
                if name.startswith("."):
                    level = len(name) - len(name.lstrip("."))
                    name = _resolve(package, level, name.lstrip(".") or None)
                out.append((node.lineno, name))
    return out


def _is_sim(name: str) -> bool:
    return name == SIM or name.startswith(SIM + ".")


def _is_dagster(name: str) -> bool:
    top = name.split(".")[0]
    return (top == "dagster" or top.startswith("dagster_")) and top not in DAGSTER_ALLOWED


def _violations(packages: tuple[str, ...], forbidden) -> list[str]:
    found = []
    for package in packages:
        for path, modname in _modules(package):
            names = imported_names(path.read_text(encoding="utf-8"), modname, path.name == "__init__.py")
            bad = sorted({(line, name) for line, name in names if forbidden(name)})
            found += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in bad]
    return found


def test_scanner_sees_the_production_packages():
    for package in PRODUCTION:
        assert any(True for _ in _modules(package)), f"no modules found under {package}/"
    assert (ROOT / SIM / "__init__.py").is_file()


@pytest.mark.parametrize("source, modname, expected", [
    ("import sim", "ops.x", True),
    ("import sim.rollarc as r", "ops.x", True),
    ("from sim import rollpacker", "assets.x", True),
    ("from sim.costmodel import epoch_time", "ops.rl.rollpacker.loop", True),
    ("def f():\n    from sim.rollarc_roles import SimRoles\n", "ops.rl.rollarc.driver", True),
    ("import importlib\nimportlib.import_module('sim.rollpacker')", "resources.x", True),
    ("__import__('sim')", "pipelines.x", True),
    ("from .sim import x", "ops.rl.rollarc.core", False),        # ops.rl.rollarc.sim, not top-level sim
    ("from . import sim", "ops.rl.rollarc.core", False),
    ("import simpy, simple_parsing", "ops.x", False),
    ("from ops.rl.types import Prompt", "ops.x", False),
])
def test_sim_detector(source, modname, expected):
    assert any(_is_sim(n) for _, n in imported_names(source, modname)) is expected


@pytest.mark.parametrize("source, expected", [
    ("import dagster as dg", True),
    ("from dagster import asset", True),
    ("import dagster._core.definitions", True),
    ("from dagster_k8s import PipesK8sClient", True),
    ("def f():\n    import dagster\n", True),
    ("from dagster_pipes import open_dagster_pipes", False),
    ("import dagster_pipes", False),
    ("import dagsterish", False),
])
def test_dagster_detector(source, expected):
    assert any(_is_dagster(n) for _, n in imported_names(source, "ops.x")) is expected


def test_production_code_does_not_import_sim():
    bad = _violations(PRODUCTION, _is_sim)
    assert not bad, "production modules import the simulators (reverse it: sim -> ops):\n" + "\n".join(bad)


def test_ops_does_not_import_dagster():
    bad = _violations(("ops",), _is_dagster)
    assert not bad, "ops/ imports Dagster (only dagster_pipes is allowed):\n" + "\n".join(bad)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (at any depth). ``from a import b`` counts as
    importing ``a.b`` when that is a module, else ``a``; a package's own ``__init__`` is not counted
    for its submodules' imports of each other."""
    modules = {modname: path for path, modname in _modules(package)}
    graph: dict[str, set[str]] = {}
    for modname, path in modules.items():
        names = imported_names(path.read_text(encoding="utf-8"), modname, path.name == "__init__.py")
        by_line: dict[int, list[str]] = {}
        for line, name in names:
            by_line.setdefault(line, []).append(name)
        deps = set()
        for same_statement in by_line.values():
            for name in same_statement:
                if name not in modules or name == modname:
                    continue
                if any(other.startswith(name + ".") and other in modules for other in same_statement):
                    continue                      # ``from pkg import submodule``: the submodule is the import
                deps.add(name)
        graph[modname] = deps
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_cycle_detector():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    cycle = import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle is not None and set(cycle) == {"a", "b", "c"} and cycle[0] == cycle[-1]
    # the scanner counts function-level imports: a lazy import closes a cycle as much as a top-level one
    g = import_graph("ops")
    assert "ops.gba.errors" in g["ops.gba.config"] and "ops.gba.staleness" in g["ops.gba.config"]
    assert "ops.gba.config" not in g["ops.gba.staleness"] and "ops.gba.config" not in g["ops.gba.trace"]
    assert "ops.launch" in g["ops.gba.checkpoint"]          # imported inside crash_if_asked / fingerprint


def test_ops_has_no_import_cycle():
    cycle = import_cycle(import_graph("ops"))
    assert cycle is None, "ops/ modules import each other in a cycle: " + " -> ".join(cycle)
