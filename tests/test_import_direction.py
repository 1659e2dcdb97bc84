"""Import direction between the layers, checked on the source with ``ast`` (nothing is imported): every rule
of docs/architecture.md, "Import direction", read from the page itself.

* The arrows of the page's diagram (``pipelines -> assets -> resources -> ops``, ``assets -> ops``,
  ``sim -> ops``): a package of the repository imports only the packages its arrows reach (pipelines may
  import assets, resources and ops; resources only ops; ops none of them). ``benchmarks`` and ``tests`` may
  import anything.
* Production code (``ops/``, ``assets/``, ``pipelines/``, ``resources/``) never imports the
  simulators and cost models of ``sim/``: they serve benchmarks and tests only, and import what they
  share with production code from ``ops`` (``sim`` -> ``ops``, never ``ops`` -> ``sim``).
* ``ops/`` never imports Dagster: ops are plain Python run by assets and by drivers launched through
  Dagster Pipes. ``dagster_pipes`` (the standalone, dagster-free Pipes client) is allowed; ``dagster``
  and the other ``dagster_*`` integration libraries (which depend on ``dagster``) are not.
* ``ops/`` imports neither ``assets/``, ``resources/`` nor ``pipelines/``; ``assets/`` and ``resources/``
  never import ``pipelines/``.
* The heavy libraries the page lists are never imported at module level by a module the code location
  loads (``pipelines.definitions`` and every module it imports at module level, transitively).
  ``tests/assets/test_definitions.py`` checks the same by importing the location in a fresh interpreter.
* The modules of the repository's packages import each other without a cycle (a module that needs a name
  from one that imports it, e.g. an error class, gets it from a third module both import:
  ``ops/gba/errors.py``).

Every import counts, at any depth (inside functions, ``try``, ``if TYPE_CHECKING``), as do
``importlib.import_module`` / ``__import__`` calls with a literal module name; the heavy-library rule
counts only what runs when a module is imported (not function bodies, not ``if TYPE_CHECKING``).
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PRODUCTION = ("ops", "assets", "pipelines", "resources")
SIM = "sim"
PACKAGES = PRODUCTION + (SIM, "benchmarks", "tests")
DAGSTER_ALLOWED = {"dagster_pipes"}
#: import names of the distributions the page lists as heavy, where they differ
IMPORT_NAMES = {"scikit-learn": "sklearn", "math-verify": "math_verify"}


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
    ("from sim import des", "assets.x", True),
    ("from sim.des.rollpacker import rollpacker_step", "ops.rl.rollpacker.loop", True),
    ("def f():\n    from sim.rollarc_roles import SimRoles\n", "ops.rl.rollarc.driver", True),
    ("import importlib\nimportlib.import_module('sim.des')", "resources.x", True),
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


def import_graph(package: str, within: tuple[str, ...] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` (or of the packages ``within``) it imports (at any depth), for the
    modules of ``package``. ``from a import b`` counts as importing ``a.b`` when that is a module, else ``a``; a
    package's own ``__init__`` is not counted for its submodules' imports of each other."""
    modules = {modname: path for pkg in (within or (package,)) for path, modname in _modules(pkg)}
    own = {modname for _, modname in _modules(package)}
    graph: dict[str, set[str]] = {}
    for modname, path in modules.items():
        if modname not in own:
            continue
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


# --- the rules as written in docs/architecture.md ---------------------------------------------------------------


def _direction_section(text: str | None = None) -> str:
    """The "Import direction" section of docs/architecture.md (up to the next ``## `` heading)."""
    text = ARCHITECTURE.read_text(encoding="utf-8") if text is None else text
    m = re.search(r"^## Import direction\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"{ARCHITECTURE}: no '## Import direction' section"
    return m.group(1)


def documented_arrows(section: str | None = None) -> dict[str, set[str]]:
    """Package -> the packages it may import, from the section's diagram: each chain ``a -> b -> c`` (arrows of any
    length, several chains on a line apart by 3+ spaces, ``a, b -> c`` for several sources) gives a -> b and b -> c;
    the result is closed transitively (``pipelines -> assets -> resources`` lets pipelines import resources).
    ``anything`` maps to every package."""
    section = _direction_section() if section is None else section
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, f"{ARCHITECTURE}: the Import direction section has no diagram"
    edges: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        for chain in re.split(r"\s{3,}", line.strip()):
            stages = [[p.strip() for p in part.split(",") if p.strip()] for part in re.split(r"\s*-+>\s*", chain)]
            if len(stages) < 2:
                continue
            for src_stage, dst_stage in zip(stages, stages[1:]):
                for a in src_stage:
                    for b in dst_stage:
                        edges.setdefault(a, set()).update(PACKAGES if b == "anything" else {b})
    closed = {a: set(bs) for a, bs in edges.items()}
    changed = True
    while changed:
        changed = False
        for a, bs in closed.items():
            more = set().union(*(closed.get(b, set()) for b in bs)) - bs - {a}
            if more:
                bs |= more
                changed = True
    return closed


def documented_heavy_libraries(section: str | None = None) -> set[str]:
    """Import names of the libraries the section's "Heavy libraries (...)" rule lists."""
    section = _direction_section() if section is None else section
    m = re.search(r"Heavy libraries \(([^)]*)\)", section)
    assert m, f"{ARCHITECTURE}: the Import direction section names no heavy libraries"
    return {IMPORT_NAMES.get(n.strip(), n.strip().replace("-", "_")) for n in m.group(1).split(",") if n.strip()}


def _top(name: str) -> str:
    return name.split(".")[0]


def direction_violations(arrows: dict[str, set[str]], packages=PRODUCTION + (SIM,)) -> list[str]:
    """Imports of a repository package that no arrow of ``arrows`` allows, as ``path:line: name``."""
    found = []
    for package in packages:
        allowed = arrows.get(package, set()) | {package}
        found += _violations((package,), lambda n, allowed=allowed: _top(n) in PACKAGES and _top(n) not in allowed)
    return found


def test_diagram_parser():
    section = "x\n```\na -> b -> c\n     b ----> d        e, f -> anything\n```\n"
    arrows = documented_arrows(section)
    assert arrows["a"] == {"b", "c", "d"} and arrows["b"] == {"c", "d"} and "c" not in arrows
    assert arrows["e"] == arrows["f"] == set(PACKAGES)
    assert documented_heavy_libraries("- Heavy libraries (torch, scikit-learn, math-verify) are ...") == \
        {"torch", "sklearn", "math_verify"}


def test_the_documented_arrows_are_the_layering():
    """What the page draws: pipelines -> assets -> resources -> ops, assets -> ops, sim -> ops."""
    arrows = documented_arrows()
    assert arrows["pipelines"] == {"assets", "resources", "ops"}
    assert arrows["assets"] == {"resources", "ops"}
    assert arrows["resources"] == {"ops"} and arrows["sim"] == {"ops"}
    assert "ops" not in arrows                                  # ops imports no other package of the repository
    assert arrows["benchmarks"] == arrows["tests"] == set(PACKAGES)


def test_every_documented_rule_has_a_check():
    """Each bullet of the section is one of the rules this file checks; a new bullet fails here until it gets one."""
    checks = {"never imports Dagster": test_ops_does_not_import_dagster,
              "never import `sim/`": test_production_code_does_not_import_sim,
              "imports neither `assets/`, `resources/` nor `pipelines/`": test_imports_follow_the_documented_arrows,
              "Heavy libraries": test_the_code_location_imports_no_heavy_library_at_load}
    bullets = re.findall(r"^- (.*?)(?=^- |^\S|\Z)", _direction_section(), re.S | re.M)
    assert bullets, "no rules found"
    for bullet in bullets:
        text = " ".join(bullet.split())
        assert [k for k in checks if k in text], f"docs/architecture.md rule without a check: {text[:120]}"


def test_imports_follow_the_documented_arrows():
    """ops imports none of assets/resources/pipelines/sim; resources only ops; assets never pipelines; sim only ops."""
    bad = direction_violations(documented_arrows())
    assert not bad, ("imports against the direction drawn in docs/architecture.md (pipelines -> assets -> "
                     "resources -> ops, sim -> ops):\n" + "\n".join(bad))


def test_direction_detector():
    arrows = documented_arrows()
    allowed = lambda pkg, name: _top(name) not in PACKAGES or _top(name) in arrows.get(pkg, set()) | {pkg}  # noqa: E731
    assert not allowed("resources", "pipelines.profiles")       # the former resources.sources -> pipelines.profiles
    assert not allowed("ops", "resources.lake") and not allowed("ops", "assets.launch")
    assert not allowed("assets", "pipelines.jobs") and not allowed("sim", "assets.rollarc")
    assert not allowed("ops", "benchmarks.claims") and not allowed("resources", "assets.launch")
    assert allowed("pipelines", "resources.sources") and allowed("assets", "ops.lake") and allowed("sim", "ops.rl")
    assert allowed("ops", "numpy") and allowed("resources", "dagster")


def module_level_imports(source: str, modname: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Like :func:`imported_names`, but only the imports that run when the module is imported: module and class
    bodies, ``if``/``try``/``with`` blocks; not function bodies, not ``if TYPE_CHECKING:``."""
    package = modname if is_package else modname.rpartition(".")[0]
    out: list[tuple[int, str]] = []

    def visit(stmts):
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out.extend((node.lineno, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(package, node.level, node.module) if node.level else (node.module or "")
                out.append((node.lineno, base))
                out.extend((node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*")
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, field, []) or [])
    visit(ast.parse(source).body)
    return out


def load_closure(root: str = "pipelines.definitions") -> dict[str, list[tuple[int, str]]]:
    """Every repository module that importing ``root`` runs (module-level imports, transitively, with the parent
    packages), mapped to its module-level imports."""
    modules = {m: p for pkg in PRODUCTION for p, m in _modules(pkg)}
    seen: dict[str, list[tuple[int, str]]] = {}
    todo = [root]
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in modules:
            continue
        path = modules[mod]
        seen[mod] = module_level_imports(path.read_text(encoding="utf-8"), mod, path.name == "__init__.py")
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [name for _, name in seen[mod] if name in modules]
    return seen


def test_the_code_location_imports_no_heavy_library_at_load():
    heavy = documented_heavy_libraries()
    closure = load_closure()
    assert {"pipelines.definitions", "assets.curation", "resources.lake"} <= set(closure)
    bad = [f"{m}:{line}: {name}" for m, names in sorted(closure.items()) for line, name in names if _top(name) in heavy]
    assert not bad, ("modules the code location loads import a heavy library at module level (import it inside the "
                     "function that uses it):\n" + "\n".join(bad))


def test_heavy_import_detector():
    src = ("import numpy\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
           "def f():\n    import ray\nclass C:\n    import duckdb\ntry:\n    import sklearn\nexcept ImportError:\n    pass\n")
    names = {n for _, n in module_level_imports(src, "ops.x")}
    assert {"numpy", "duckdb", "sklearn"} <= names and not {"torch", "ray"} & names


def test_repository_has_no_import_cycle():
    """The whole production graph (ops, assets, resources, pipelines, sim), function-level imports included."""
    graph: dict[str, set[str]] = {}
    for package in PRODUCTION + (SIM,):
        graph.update(import_graph(package, within=PRODUCTION + (SIM,)))
    cycle = import_cycle(graph)
    assert cycle is None, "modules import each other in a cycle: " + " -> ".join(cycle)
