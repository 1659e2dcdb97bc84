"""Attribute docstrings: the one place a config field's meaning is written.

A field of an ops dataclass, a Dagster run config or a resource is documented by the string right
under it (PEP 257's attribute docstrings)::

    ngram: int = 8
    \"\"\"Word n-gram length of the n-gram overlap layer (>= 2).\"\"\"

Python keeps no trace of those strings at run time, so they are read from the class's source lines
with ``ast`` (only the class's own lines are parsed). Dagster shows a field's pydantic ``description``;
:func:`describe_fields` fills it from the docstring. pydantic's own ``use_attribute_docstrings``
does the same but searches the call stack and the source for each class (about 0.4 s over the code
location's configs: too slow for a code location that must load in under 3 s).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
from typing import TypeVar

T = TypeVar("T", bound=type)


@functools.lru_cache(maxsize=None)
def _source_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return fh.read().splitlines()


@functools.lru_cache(maxsize=None)
def _class_bodies(path: str) -> dict[str, list[ast.stmt]]:
    """Top-level class name -> its body statements, for one source file (parsed once)."""
    tree = ast.parse("\n".join(_source_lines(path)), filename=path)
    return {n.name: n.body for n in tree.body if isinstance(n, ast.ClassDef)}


def _class_body(path: str, name: str) -> list[ast.stmt]:
    """The body of the top-level class ``name`` in ``path``. Only the class's own lines are parsed
    (from ``class name`` to the next line that starts in column 0): parsing whole modules costs
    ~0.3 s over the code location. Falls back to the whole file if that slice does not parse."""
    lines = _source_lines(path)
    start = next((i for i, line in enumerate(lines) if line.startswith(f"class {name}(") or line.startswith(f"class {name}:")), None)
    if start is None:
        return []
    end = next((j for j in range(start + 1, len(lines)) if lines[j][:1] not in ("", " ", "\t", "#", ")")), len(lines))
    try:
        tree = ast.parse("\n".join(lines[start:end]))
    except SyntaxError:
        return _class_bodies(path).get(name, [])
    node = tree.body[0] if tree.body else None
    return node.body if isinstance(node, ast.ClassDef) and node.name == name else _class_bodies(path).get(name, [])


def own_attribute_docs(klass: type) -> dict[str, str]:
    """Field name -> the attribute docstring under it in ``klass``'s own class body (bases not
    read). Empty for a class whose source file cannot be read (built at run time, nested in a
    function, or from a compiled module)."""
    path = getattr(sys.modules.get(klass.__module__), "__file__", None)
    if not path or not path.endswith(".py"):
        return {}
    body = _class_body(path, klass.__name__)
    out = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return out


@functools.lru_cache(maxsize=None)
def attribute_docs(source: type) -> dict[str, str]:
    """Field name -> attribute docstring of a dataclass and of its dataclass bases (a subclass's
    docstring wins); fields without one are left out."""
    out: dict[str, str] = {}
    for klass in reversed(source.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(own_attribute_docs(klass))
    return out


def describe_fields(model: T) -> T:
    """Class decorator for a pydantic model (a Dagster ``Config`` or ``ConfigurableResource``): each
    field declared in its own body that has no description gets its attribute docstring as one,
    which is what the Dagster UI shows. Returns the class itself."""
    docs = own_attribute_docs(model)
    fields = getattr(model, "model_fields", {})
    for name in model.__dict__.get("__annotations__", {}):
        f = fields.get(name)
        if f is not None and not f.description and name in docs:
            f.description = docs[name]
    return model
