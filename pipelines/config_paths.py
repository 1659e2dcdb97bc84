"""Launchpad paths of run-config classes: how a size set (pipelines/presets.py) names a field,
nested ones by dotted path (``cluster.run_timeout_s``, ``train.epochs``), and how the code location
gives an op's Config class other defaults at those paths.

The Config classes themselves are generated from the ops dataclasses by ``assets._config.fields_of``
(docs/architecture.md, "Configuration"); this module only reads and subclasses them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from assets._config import set_path


def field_at(config_cls: type, path: str) -> Any:
    """The pydantic field of ``config_cls`` at the dotted Launchpad ``path`` (``cluster.run_timeout_s``).
    Raises KeyError naming the first part of the path that is no field."""
    cls, parts = config_cls, path.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(cls, type) and hasattr(cls, "model_fields")) or part not in cls.model_fields:
            raise KeyError(f"{'.'.join(parts[:i + 1])} is not a field of {config_cls.__name__}")
        f = cls.model_fields[part]
        cls = f.annotation
    return f


def unknown_paths(config_cls: type, values: Iterable[str]) -> list[str]:
    """The dotted paths in ``values`` that name no field of ``config_cls`` (sorted)."""
    out = []
    for p in values:
        try:
            field_at(config_cls, p)
        except KeyError:
            out.append(p)
    return sorted(out)


def nested_config(values: dict[str, Any]) -> dict[str, Any]:
    """Size-set values keyed by dotted path (``{"train.epochs": 5.0}``) as the nested run config
    Dagster takes (``{"train": {"epochs": 5.0}}``); plain keys pass through."""
    out: dict[str, Any] = {}
    for path, v in values.items():
        set_path(out, path, v)
    return out


def sized_config(config_cls: type, values: dict[str, Any]) -> type:
    """A subclass of ``config_cls`` whose defaults at the dotted paths of ``values`` are replaced
    (a nested part gets a sized subclass of its own Config class), same name, docstring and
    descriptions: what ``pipelines.presets.with_size_defaults`` gives the op. Raises KeyError for a
    path that is no field."""
    import pydantic

    top: dict[str, Any] = {}
    sub: dict[str, dict[str, Any]] = {}
    for path, v in values.items():
        head, _, rest = path.partition(".")
        if head not in config_cls.model_fields:
            raise KeyError(f"{path} is not a field of {config_cls.__name__}")
        if rest:
            sub.setdefault(head, {})[rest] = v
        else:
            top[head] = v
    fields: dict[str, Any] = {}
    for k, v in top.items():
        f = config_cls.model_fields[k]
        fields[k] = (f.annotation, pydantic.Field(default=v, description=f.description))
    for k, vs in sub.items():
        f = config_cls.model_fields[k]
        part = sized_config(f.annotation, vs)
        fields[k] = (part, pydantic.Field(default_factory=part, description=f.description))
    sized = pydantic.create_model(config_cls.__name__, __base__=config_cls, __module__=config_cls.__module__, **fields)
    sized.__doc__ = config_cls.__doc__
    return sized
