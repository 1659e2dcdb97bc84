"""One source for each config (docs/architecture.md, "Configuration").

Every run config an asset shows in the Launchpad mirrors an ops dataclass that holds the meaning
(an attribute docstring under the field), the default and the validation of each field. The Dagster
``Config`` class is generated from that dataclass by :func:`fields_of` and declared with
``@mirrors``; only the asset's own fields (a launch timeout, say) are written in the class body::

    @mirrors(ProbePlan, own=("timeout_s",))
    class BaseModelConfig(fields_of(ProbePlan, exclude=("data_dir", ...))):
        timeout_s: float = 1800.0  # the asset's own: the launch's wall-clock limit

Each generated field carries the dataclass's type (a tuple becomes a list: Dagster config has no
tuples), its default and its docstring as the Launchpad description.

``@mirrors(source, own=...)`` checks, when the module loads, that every field of the Config class
either exists in ``source`` with the same default or is named in ``own`` (asset-only fields), and
registers the pair so that the test suite can walk every Config class of the code location
(``tests/test_config_sources.py``). Validation stays in the ops dataclass: it runs once when the
asset builds it and once when a worker loads its spec.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

from ops.docstrings import attribute_docs, describe_fields

#: Config class -> (the ops dataclass it mirrors or None, the fields that are the asset's own)
MIRRORS: dict[type, tuple[type | None, frozenset[str]]] = {}


def dataclass_defaults(source: type) -> dict[str, Any]:
    """Field name -> default of a dataclass (``default_factory`` called; fields without one left out)."""
    out = {}
    for f in dataclasses.fields(source):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def mismatches(config_cls: type) -> list[str]:
    """What breaks the one-source rule in a registered Config class: a default that differs from
    the mirrored dataclass's, or a field that is neither in the dataclass nor in ``own``."""
    source, own = MIRRORS[config_cls]
    src = dataclass_defaults(source) if source is not None else {}
    out = []
    for name, f in config_cls.model_fields.items():
        if name in own:
            continue
        if name not in src:
            out.append(f"{config_cls.__name__}.{name}: not a field of {getattr(source, '__name__', None)} and not declared own")
        elif not _same(f.default, src[name]):
            out.append(f"{config_cls.__name__}.{name}: default {f.default!r} != {source.__name__}.{name} {src[name]!r}")
    return out


def mirrors(source: type | None, own: Iterable[str] = ()) -> Callable[[type], type]:
    """Class decorator: register ``config_cls`` as the Launchpad face of the ops dataclass ``source``
    (None: an asset-only config with no ops counterpart; then every field must be in ``own``).

    Raises:
        TypeError: at import, naming the field, when a default differs from the dataclass's or a
            field is neither mirrored nor declared own.
    """
    def deco(config_cls: type) -> type:
        MIRRORS[config_cls] = (source, frozenset(own))
        describe_fields(config_cls)  # the own fields' attribute docstrings become Launchpad descriptions
        bad = mismatches(config_cls)
        if bad:
            raise TypeError("config defaults must come from the ops dataclass: " + "; ".join(bad))
        return config_cls
    return deco


def _launchpad_type(tp: Any) -> Any:
    """A dataclass field type as Dagster config takes it: tuples become lists, recursively."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        elems = {a for a in args if a is not Ellipsis}
        return list[_launchpad_type(elems.pop()) if len(elems) == 1 else Any]  # type: ignore[misc]
    if origin is list and args:
        return list[_launchpad_type(args[0])]  # type: ignore[misc]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_launchpad_type(a) for a in args)]  # type: ignore[return-value]
    return tp


def _launchpad_value(v: Any) -> Any:
    return [_launchpad_value(x) for x in v] if isinstance(v, (tuple, list)) else v


def fields_of(source: type, *, exclude: Iterable[str] = (), base: type | None = None) -> type:
    """A Dagster ``Config`` class with the fields of the ops dataclass ``source``: same names, types
    (tuples as lists), defaults (``default_factory`` called) and attribute docstrings as
    descriptions, in the dataclass's order. Subclass it to add the asset's own fields.

    Args:
        source: the ops dataclass (the one place each default and meaning is written).
        exclude: fields the Launchpad does not offer (the asset fills them in, e.g. paths).
        base: a ``Config`` class to extend (default ``dagster.Config``); fields it has are not
            generated again.

    Returns:
        A ``Config`` subclass named ``<source>Fields`` in the caller's module, registered with
        ``@mirrors``'s check (the own fields of ``base``, and the fields ``base`` has that ``source``
        lacks, count as own: ``base``'s own entry checks them).

    Raises:
        TypeError: ``source`` is not a dataclass, or ``exclude`` names a field it does not have.
    """
    import dagster as dg
    import pydantic

    if not dataclasses.is_dataclass(source):
        raise TypeError(f"fields_of: {source!r} is not a dataclass")
    names = [f.name for f in dataclasses.fields(source) if f.init]
    unknown = sorted(set(exclude) - set(names))
    if unknown:
        raise TypeError(f"fields_of({source.__name__}): exclude names fields it does not have: {unknown}")
    base = base or dg.Config
    hints, defaults, docs = typing.get_type_hints(source), dataclass_defaults(source), attribute_docs(source)
    fields: dict[str, Any] = {}
    for name in names:
        if name in exclude or name in getattr(base, "model_fields", {}):
            continue
        kw = {"description": docs.get(name)}
        if name in defaults:
            kw["default"] = _launchpad_value(defaults[name])
        fields[name] = (_launchpad_type(hints[name]), pydantic.Field(**kw))
    module = sys._getframe(1).f_globals.get("__name__", __name__)
    cls = pydantic.create_model(f"{source.__name__}Fields", __base__=base, __module__=module, **fields)
    inherited = frozenset(n for n in getattr(base, "model_fields", {}) if n not in names)  # checked by base's own entry
    MIRRORS[cls] = (source, MIRRORS.get(base, (None, frozenset()))[1] | inherited)
    return cls
