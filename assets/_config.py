"""One source for each config (docs/architecture.md, "Configuration").

Every run config an asset shows in the Launchpad mirrors an ops dataclass that holds the meaning,
the default and the validation of each field; the Dagster ``Config`` class takes its defaults from
that dataclass (``field: int = _D.field``) and declares it with ``@mirrors``::

    _D = DecontamConfig()

    @mirrors(DecontamConfig)
    class DecontaminationConfig(dg.Config):
        ngram: int = _D.ngram
        ...

``@mirrors(source, own=...)`` checks, when the module loads, that every field of the Config class
either exists in ``source`` with the same default or is named in ``own`` (asset-only fields such as
a launch timeout), and registers the pair so that the test suite can walk every Config class of the
code location (``tests/test_config_sources.py``). Validation stays in the ops dataclass: it runs
once when the asset builds it and once when a worker loads its spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

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
        bad = mismatches(config_cls)
        if bad:
            raise TypeError("config defaults must come from the ops dataclass: " + "; ".join(bad))
        return config_cls
    return deco
