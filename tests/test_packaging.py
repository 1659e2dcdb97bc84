"""The installable package: every third-party module the shipped code imports is declared in
pyproject.toml (a dependency, or an extra when it is imported only inside a function), and
constraints.txt locks every declared package."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.conftest import ROOT

SHIPPED = ("pipelines", "assets", "ops", "resources")
LOCAL = {*SHIPPED, "sim", "tests", "benchmarks"}


def _name(spec: str) -> str:
    """``"math-verify[antlr4_13_2]>=0.9"`` -> ``"math-verify"`` (PEP 503-normalised)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", spec).group(0)).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """Third-party top-level module -> [(file, imported at module level)], over the shipped packages."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for pkg in SHIPPED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                else:
                    continue
                for mod in mods:
                    root = mod.split(".")[0]
                    if root not in sys.stdlib_module_names and root not in LOCAL:
                        found.setdefault(root, []).append((str(path.relative_to(ROOT)), id(node) in top))
    return found


def _distributions(module: str) -> set[str]:
    dists = packages_distributions().get(module)
    return {_name(d) for d in dists} if dists else {_name(module)}  # not installed (an extra): its own name


def test_every_imported_module_is_declared_and_extras_are_imported_lazily():
    project = _project()
    core = {_name(s) for s in project["dependencies"]}
    extras = {_name(s) for specs in project["optional-dependencies"].values() for s in specs}
    undeclared, eager = [], []
    for module, where in sorted(_imports().items()):
        dists = _distributions(module)
        if dists & core:
            continue
        if dists & extras:  # an extra: the import must sit inside a function, with a clear error when missing
            eager += [f"{module} ({f})" for f, at_top in where if at_top]
            continue
        undeclared.append(f"{module} (distribution {', '.join(sorted(dists))}; imported in {where[0][0]})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    assert not eager, f"modules of an extra imported at module level: {eager}"
    assert {"scipy", "safetensors", "tokenizers", "threadpoolctl", "openai", "pydantic"} <= core
    assert {"prod", "vllm", "dev", "ui"} <= set(project["optional-dependencies"])


def test_constraints_lock_every_declared_package_at_a_version_inside_its_range():
    from packaging.requirements import Requirement

    locked = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            locked[_name(name)] = version.strip()
    project = _project()
    specs = list(project["dependencies"]) + [s for extra, specs in project["optional-dependencies"].items()
                                             if extra != "vllm" for s in specs]  # vllm: CUDA images only
    for spec in specs:
        req = Requirement(spec)
        name = _name(req.name)
        assert name in locked, f"{req.name} is declared but not locked in constraints.txt"
        assert req.specifier.contains(locked[name], prereleases=True), \
            f"constraints.txt locks {name}=={locked[name]}, outside pyproject.toml's {req.specifier}"
