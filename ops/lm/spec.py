"""What the specs of the LM workers share: JSON in and out, and range checks that name the field.

A worker's spec is a dataclass (``ops.mixture.probe.ProbePlan``, ``ops.posttrain.sft.SftPlan``)
that the asset builds and validates before anything is launched, writes as JSON, and the worker
loads and validates again (``ops.launch.worker_main``; docs/architecture.md, "Configuration").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any


def require(what: str, spec: Any, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Raise ValueError listing every failed check as ``<what>.<field> must be <need>, got <value>``.

    ``checks``: (field name, passed, what the field must be)."""
    bad = [f"{what}.{name} must be {need}, got {getattr(spec, name)!r}" for name, ok, need in checks if not ok]
    if bad:
        raise ValueError("; ".join(bad))


class JsonSpec:
    """Mixin of a spec dataclass with a ``validate()`` method returning the spec."""

    def validate(self):  # pragma: no cover - every spec defines its own
        return self

    def to_json(self) -> str:
        """The spec as JSON text (every dataclass field)."""
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str):
        """Parse and validate a spec written by ``to_json``. Raises ValueError naming an unknown
        field or a value out of range, TypeError naming a missing field."""
        d = json.loads(text)
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}")
        return cls(**d).validate()
