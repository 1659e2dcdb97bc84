"""One source for each config (docs/architecture.md, "Configuration").

Every run config an asset shows in the Launchpad mirrors an ops dataclass that holds the meaning
(an attribute docstring under the field), the default and the validation of each field. The Dagster
``Config`` class is generated from that dataclass by :func:`fields_of` and declared with
``@mirrors``; only the asset's own fields (a launch timeout, say) are written in the class body::

    @mirrors(ProbePlan, own=("timeout_s",))
    class BaseModelConfig(fields_of(ProbePlan, exclude=("data_dir", ...))):
        timeout_s: float = 1800.0  # the asset's own: the launch's wall-clock limit

Each generated field carries the dataclass's type (a tuple becomes a list: Dagster config has no
tuples), its default and its docstring as the Launchpad description. A field whose type is a
dataclass (a stage spec's typed part: ``RunSpec.cluster``) becomes a nested ``Config`` class
generated the same way, with the parent's default instance as its defaults, so the Launchpad shows
the spec's own nesting (``cluster: {workers: 4}``) and the path a user sets is the path an error
names (``cluster.workers must be >= 1``). :func:`to_spec` builds the ops spec back from a config
object (``ops.lm.spec.build``: nested dicts to the typed parts), with no translation table between.

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
from ops.lm.spec import build

#: Config class -> (the ops dataclass it mirrors or None, the fields that are the asset's own; a
#: dotted path names a nested field, ``cluster.workers``)
MIRRORS: dict[type, tuple[type | None, frozenset[str]]] = {}
#: generated Config class -> the defaults (nested plain data) it carries when they are not its
#: dataclass's class defaults: ``fields_of(defaults=instance)``, and every nested part (its
#: parent's default instance)
DEFAULTS: dict[type, dict[str, Any]] = {}


def _plain(v: Any) -> Any:
    """A default as config data: a dataclass instance as a dict of its fields, tuples as lists, recursively."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def dataclass_defaults(source: type, instance: Any = None) -> dict[str, Any]:
    """Field name -> default of a dataclass (``default_factory`` called; fields without one left
    out), or the field values of ``instance``; nested dataclass values as dicts (``_plain``)."""
    out = {}
    for f in dataclasses.fields(source):
        if not f.init:
            continue
        if instance is not None:
            out[f.name] = _plain(getattr(instance, f.name))
        elif f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = _plain(f.default_factory())  # type: ignore[misc]
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def _defaults_of(config_cls: type, source: type) -> dict[str, Any]:
    """The defaults ``config_cls`` must carry: the nearest registered ``DEFAULTS`` along its bases
    (a class generated with an instance's defaults, or a nested part), else ``source``'s."""
    for k in config_cls.__mro__:
        if k in DEFAULTS:
            return DEFAULTS[k]
    return dataclass_defaults(source)


def _is_config(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "model_fields")


def mismatches(config_cls: type, _prefix: str = "", _own: frozenset[str] | None = None) -> list[str]:
    """What breaks the one-source rule in a registered Config class: a default that differs from
    the mirrored dataclass's, or a field that is neither in the dataclass nor in ``own``; nested
    Config fields are checked field by field and named by their path (``GBARunConfig.cluster.workers``)."""
    source, own = MIRRORS[config_cls]
    own = own if _own is None else own | _own
    src = _defaults_of(config_cls, source) if source is not None else {}
    name_of = _prefix or config_cls.__name__
    out = []
    for name, f in config_cls.model_fields.items():
        if name in own:
            continue
        if name not in src:
            required = source is not None and name in {g.name for g in dataclasses.fields(source)}
            if not (required and f.is_required()):      # a field without a default must stay required
                out.append(f"{name_of}.{name}: not a field of {getattr(source, '__name__', None)} and not declared own"
                           if not required else f"{name_of}.{name}: has a default, {source.__name__}.{name} has none")
            continue
        if _is_config(f.annotation) and f.annotation in MIRRORS and isinstance(src[name], dict):
            sub = frozenset(p.split(".", 1)[1] for p in own if p.startswith(name + "."))
            out += mismatches(f.annotation, f"{name_of}.{name}", sub)
        elif not _same(_plain(f.default), src[name]):
            out.append(f"{name_of}.{name}: default {f.default!r} != {source.__name__}.{name} {src[name]!r}")
    return out


def mirrors(source: type | None, own: Iterable[str] = ()) -> Callable[[type], type]:
    """Class decorator: register ``config_cls`` as the Launchpad face of the ops dataclass ``source``
    (None: an asset-only config with no ops counterpart; then every field must be in ``own``).

    Raises:
        TypeError: at import, naming the field, when a default differs from the dataclass's or a
            field is neither mirrored nor declared own.
    """
    def deco(config_cls: type) -> type:
        # the nested fields a generated base replaced (``fields_of(replace=)``) stay own
        inherited = frozenset(p for k in config_cls.__mro__[1:] if k in MIRRORS and MIRRORS[k][0] is source
                              for p in MIRRORS[k][1] if "." in p)
        MIRRORS[config_cls] = (source, frozenset(own) | inherited)
        describe_fields(config_cls)  # the own fields' attribute docstrings become Launchpad descriptions
        bad = mismatches(config_cls)
        if bad:
            raise TypeError("config defaults must come from the ops dataclass: " + "; ".join(bad))
        return config_cls
    return deco


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``value`` in the nested dict ``data`` at the dotted Launchpad ``path`` (``roles.tokenizer_dir``
    sets ``data["roles"]["tokenizer_dir"]``), creating the dicts on the way; a plain name sets a key."""
    *heads, last = path.split(".")
    node = data
    for h in heads:
        node = node.setdefault(h, {})
    node[last] = value


def to_spec(config: Any, **fill: Any) -> Any:
    """The ops spec a Config object mirrors, built from its values (``ops.lm.spec.build``: nested
    config to the typed parts; the asset's own fields left out) with ``fill`` (fields the Launchpad
    does not offer: paths, the partition's mode; a dotted key names a nested field,
    ``**{"roles.tokenizer_dir": d}``) set, then validated when the spec has ``validate``.

    Raises:
        StopIteration: neither ``config``'s class nor a base is registered with ``@mirrors``.
        whatever the spec's ``validate`` raises, naming the field by its Launchpad path.
    """
    source, own = next(MIRRORS[k] for k in type(config).__mro__ if k in MIRRORS)   # a sized subclass: its base's
    data = config.model_dump(exclude={o for o in own if "." not in o and o in type(config).model_fields})
    for path, v in fill.items():                      # a dotted key fills a nested field: roles.tokenizer_dir
        set_path(data, path, v)
    spec = build(source, data)
    return spec.validate() if hasattr(spec, "validate") else spec


def _launchpad_type(tp: Any, nested: Callable[[type], type] | None = None) -> Any:
    """A dataclass field type as Dagster config takes it: tuples become lists, a dataclass the
    Config class ``nested`` generates for it, recursively."""
    if nested is not None and isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return nested(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        elems = {a for a in args if a is not Ellipsis}
        return list[_launchpad_type(elems.pop(), nested) if len(elems) == 1 else Any]  # type: ignore[misc]
    if origin is list and args:
        return list[_launchpad_type(args[0], nested)]  # type: ignore[misc]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_launchpad_type(a, nested) for a in args)]  # type: ignore[return-value]
    return tp


def _launchpad_value(v: Any) -> Any:
    return _plain(v)


def _split(paths: Iterable[str]) -> tuple[set[str], dict[str, list[str]]]:
    """Dotted paths -> (the top-level names, name -> the rest of each longer path)."""
    top, sub = set(), {}
    for p in paths:
        head, _, rest = p.partition(".")
        if rest:
            sub.setdefault(head, []).append(rest)
        else:
            top.add(head)
    return top, sub


def fields_of(source: type, *, exclude: Iterable[str] = (), base: type | None = None, defaults: Any = None,
              replace: dict[str, tuple[Any, Any, str]] | None = None, _module: str | None = None,
              _name: str | None = None) -> type:
    """A Dagster ``Config`` class with the fields of the ops dataclass ``source``: same names, types
    (tuples as lists, a dataclass as a nested ``Config`` class generated the same way), defaults
    (``default_factory`` called) and attribute docstrings as descriptions, in the dataclass's
    order. Subclass it to add the asset's own fields.

    Args:
        source: the ops dataclass (the one place each default and meaning is written).
        exclude: fields the Launchpad does not offer (the asset fills them in, e.g. paths); a dotted
            path names a field of a nested part (``train.threads``).
        base: a ``Config`` class to extend (default ``dagster.Config``); fields it has are not
            generated again.
        defaults: an instance of ``source`` whose values are the defaults (an ops constant such as
            ``ops.gba.config.JOB``); None = ``source``'s class defaults.
        replace: dotted path -> (type, default, description) of a field the asset shows differently
            (e.g. ``cluster.workers`` optional: None = the launcher's process count); it counts as own.

    Returns:
        A ``Config`` subclass named ``<source>Fields`` in the caller's module, registered with
        ``@mirrors``'s check (the own fields of ``base``, and the fields ``base`` has that ``source``
        lacks, count as own: ``base``'s own entry checks them).

    Raises:
        TypeError: ``source`` is not a dataclass, or ``exclude`` / ``replace`` names a field it does not have.
    """
    import dagster as dg
    import pydantic

    if not dataclasses.is_dataclass(source):
        raise TypeError(f"fields_of: {source!r} is not a dataclass")
    module = _module or sys._getframe(1).f_globals.get("__name__", __name__)
    names = [f.name for f in dataclasses.fields(source) if f.init]
    replace = dict(replace or {})
    ex_top, ex_sub = _split(exclude)
    rep_top = {p: v for p, v in replace.items() if "." not in p}
    _, rep_sub_paths = _split(p for p in replace if "." in p)
    unknown = sorted((ex_top | set(ex_sub) | set(rep_top) | set(rep_sub_paths)) - set(names))
    if unknown:
        raise TypeError(f"fields_of({source.__name__}): exclude names fields it does not have: {unknown}")
    base = base or dg.Config
    hints, docs = typing.get_type_hints(source), attribute_docs(source)
    values = dataclass_defaults(source, defaults)
    instance = defaults
    name = _name or f"{source.__name__}Fields"
    fields: dict[str, Any] = {}

    def nested_cls(dc: type) -> type:              # an element type of a list field (no defaults of its own)
        return fields_of(dc, _module=module)

    for n in names:
        if n in ex_top or n in getattr(base, "model_fields", {}):
            continue
        if n in rep_top:
            tp, default, doc = rep_top[n]
            fields[n] = (tp, pydantic.Field(default=default, description=doc))
            continue
        dc = hints[n] if isinstance(hints[n], type) and dataclasses.is_dataclass(hints[n]) else None
        if dc is not None:
            part = getattr(instance, n) if instance is not None else _dataclass_default(source, n)
            sub_rep = {p.split(".", 1)[1]: v for p, v in replace.items() if p.startswith(n + ".")}
            sub = fields_of(dc, exclude=ex_sub.get(n, ()), defaults=part, replace=sub_rep, _module=module,
                            _name=f"{name.removesuffix('Fields')}_{n}")
            fields[n] = (sub, pydantic.Field(default_factory=sub, description=docs.get(n)))
            continue
        kw = {"description": docs.get(n)}
        if n in values:
            kw["default"] = _launchpad_value(values[n])
        fields[n] = (_launchpad_type(hints[n], nested_cls), pydantic.Field(**kw))
    cls = pydantic.create_model(name, __base__=base, __module__=module, **fields)
    inherited = frozenset(n for n in getattr(base, "model_fields", {}) if n not in names)  # checked by base's own entry
    MIRRORS[cls] = (source, MIRRORS.get(base, (None, frozenset()))[1] | inherited | frozenset(replace))
    if instance is not None:
        DEFAULTS[cls] = values
    return cls


def _dataclass_default(source: type, name: str) -> Any:
    """The default value of field ``name`` of ``source`` (its factory called), or None."""
    f = next(f for f in dataclasses.fields(source) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None
