"""One stage contract for specs: JSON in and out, nested-aware, and range checks that name the field.

A stage's spec is one dataclass on :class:`JsonSpec` (``ops.gba.config.RunSpec``,
``ops.rl.rollarc.spec.RunSpec``, ``ops.mixture.probe.ProbePlan``, ``ops.posttrain.sft.SftPlan``,
``ops.rl.warmstart.WarmStartSpec``); its parts are typed dataclasses (``Cluster``, ``Policy``, ...),
never dicts. The asset builds it from its Launchpad config (which mirrors it field for field, nested
parts as nested config: ``assets._config.fields_of``) with :func:`build`, validates it before
anything is launched, writes it with :meth:`JsonSpec.to_json`; the launched process reads it with
:meth:`JsonSpec.from_json` and validates it again (docs/architecture.md, "Configuration"). A field's
path in an error message (``cluster.workers``) is the path the user set in the Launchpad.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any


def require(what: str, spec: Any, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Raise ValueError listing every failed check as ``<what>.<field> must be <need>, got <value>``.

    ``checks``: (field name, passed, what the field must be)."""
    bad = [f"{what}.{name} must be {need}, got {getattr(spec, name)!r}" for name, ok, need in checks if not ok]
    if bad:
        raise ValueError("; ".join(bad))


def _dataclass_of(tp: Any) -> type | None:
    """The dataclass a field type names (``X`` or ``X | None``), else None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        cands = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(cands) == 1:
            return _dataclass_of(cands[0])
    return None


def _value(tp: Any, v: Any, path: str) -> Any:
    """``v`` (JSON or Launchpad data) as the field type ``tp`` takes it: a dict becomes the nested
    dataclass, a list becomes a tuple where the type is one, recursively."""
    if v is None:
        return None
    dc = _dataclass_of(tp)
    if dc is not None:
        if isinstance(v, dc):
            return v
        if isinstance(v, Mapping):
            return build(dc, v, path)
        if isinstance(v, (list, tuple)):                      # a positional record, e.g. [step, to]
            names = [f.name for f in dataclasses.fields(dc) if f.init]
            if len(v) != len(names):
                raise ValueError(f"{path}: expected {names}, got {list(v)!r}")
            return build(dc, dict(zip(names, v)), path)
        raise TypeError(f"{path}: expected a mapping of {dc.__name__}'s fields, got {v!r}")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        cands = [a for a in args if a is not type(None)]
        return _value(cands[0], v, path) if len(cands) == 1 else v
    if origin in (tuple, list) and isinstance(v, (list, tuple)):
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):   # fixed-length tuple
            return tuple(_value(a, x, f"{path}[{i}]") for i, (a, x) in enumerate(zip(args, v)))
        elem = args[0] if args else Any
        out = [_value(elem, x, f"{path}[{i}]") for i, x in enumerate(v)]
        return tuple(out) if origin is tuple else out
    return v


def build(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """The dataclass ``cls`` from nested data (a parsed spec file, a Launchpad config's
    ``model_dump()``): nested mappings become the typed parts, lists become tuples where the field
    is a tuple; fields left out keep their defaults. Not validated (the caller's ``validate``).

    Args:
        where: the path of ``data`` (``""`` at the top), prefixed to every field named in an error.

    Raises:
        ValueError: a field ``cls`` does not have, named by its path (``cluster.wrokers``).
        TypeError: a required field is missing, or a nested part is not a mapping (path named).
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"{where or cls.__name__}: expected a mapping of {cls.__name__}'s fields, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        named = [f"{where}.{u}" if where else u for u in unknown]
        raise ValueError(f"{cls.__name__}: unknown field(s) {named}")
    hints = typing.get_type_hints(cls)
    kw = {k: _value(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kw)
    except TypeError as e:
        raise TypeError(f"{where or cls.__name__}: {e}") from e
    except ValueError as e:                       # a part's own check (``__post_init__``): name it by its path
        msg, last = str(e), where.rpartition(".")[2]
        if not where or msg.startswith(where):
            raise
        if msg.startswith(last + "."):            # GRPOConfig says grpo.agg; the path is roles.grpo.agg
            raise ValueError(where[: len(where) - len(last)] + msg) from None
        raise ValueError(f"{where}: {msg}") from None


class JsonSpec:
    """Base of a stage's spec dataclass: one way to write and read it (nested-aware JSON) and a
    ``validate()`` method returning the spec (raising an error that names the field's path)."""

    def validate(self):  # pragma: no cover - every spec defines its own
        return self

    def to_dict(self) -> dict:
        """The spec as nested plain data (every dataclass field; tuples as lists after JSON)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        """The spec as JSON text (every dataclass field, nested parts as objects)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = ""):
        """Build (:func:`build`) and validate a spec from nested data."""
        return build(cls, data, where).validate()

    @classmethod
    def from_json(cls, text: str):
        """Parse and validate a spec written by ``to_json``. Raises ValueError naming an unknown
        field (by its path) or a value out of range, TypeError naming a missing field."""
        return cls.from_dict(json.loads(text))
