"""The plateau criterion of a base model (D-CPT Law, arXiv 2406.01375: the law continues well-trained base
models): its own module so that ``ops.mixture.probe`` (which records it per base) and
``ops.mixture.validation`` (which judges the regime) both import it without importing each other."""

from __future__ import annotations

import math
from typing import Any

PLATEAU_FRACTION = 0.2
"""The last fraction of base pre-training whose improvement of the general validation loss the plateau
criterion measures (``ops.mixture.probe``: each base records its loss at 80% and at 100% of its steps)."""
PLATEAU_TOLERANCE = 0.005
"""A base has plateaued when that last 20% improved its general validation loss by less than 0.5%."""


def plateau_record(loss_at_80: float, loss_final: float, tolerance: float = PLATEAU_TOLERANCE) -> dict[str, Any]:
    """The plateau criterion of one base model: the relative improvement of its general validation loss
    over the last ``PLATEAU_FRACTION`` of pre-training, (L(0.8 S) - L(S)) / L(0.8 S), and whether it is below
    ``tolerance``. Losses in nats/token. Raises ValueError for a non-positive or non-finite loss."""
    for name, v in (("loss_at_80", loss_at_80), ("loss_final", loss_final)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"plateau_record: {name} must be a finite loss > 0, got {v!r}")
    rel = (float(loss_at_80) - float(loss_final)) / float(loss_at_80)
    return {"fraction": PLATEAU_FRACTION, "loss_general_at_80pct": float(loss_at_80),
            "loss_general_final": float(loss_final), "rel_improvement_last_20pct": rel,
            "tolerance": float(tolerance), "plateaued": bool(rel < tolerance)}
