"""Closed-loop validation of the mixture plan: train the target model at the law's answers and judge
the plan by what the training measured, not by what the law predicted.

The D-CPT Law's usages (Que et al., arXiv 2406.01375 §3) are constrained optimisations on a fitted
law. A fitted law can be wrong exactly where the constraint binds: on the embedded probes the
trade-off answer (r_d ~ 0.8-0.9) lies above a grid ratio (0.75) whose probe already measured a
general-loss rise just over T (docs/mixture.md, "Closed loop"). This module holds the pure part of
the ``mixture_validation`` asset and its blocking check: which runs verify the plan, and the
verdict on their measured losses. numpy only; no dagster, no torch.

Units: losses in nats/token; rises are relative, (L_g - L_g0) / L_g0, against the base model's
measured general loss L_g0; N in non-embedding parameters; D in CPT tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np


@dataclass
class ValidationParams:
    """Parameters of the ``mixture_validation`` asset (docs/mixture.md, "Closed loop").

    Raises:
        ValueError: a field outside its range (the message names it).
    """

    seeds: list[int] = field(default_factory=lambda: [2])
    """CPT data-order seeds of every validation run (non-empty, distinct, >= 0). The default (2) is neither
    probe seed (0, 1): a fresh draw of the data order, not a point the law was fitted on. With several seeds
    the verdict uses their mean rise."""
    verify_limited_domain: bool = True
    """Train usage 2's answer (limited domain data) once and report predicted vs measured."""
    verify_allocate_compute: bool = False
    """Train usage 3's answer (resource allocation) once, at the nearest real size with D = C / 6N. Off in
    the main job: usage 3 spends the target's whole compute C again on a smaller model (on the embedded
    probes ~1.5M tokens at ~150k parameters, about as long as the rest of the validation), which the
    mixture group's 6-minute budget cannot hold; ``benchmarks/dcpt_bench.py`` turns it on."""
    allocation_sizes: list[str] = field(default_factory=list)
    """Sizes (keys of ``ops.mixture.probe.SIZES``) usage 3's N may be rounded to; empty = the probed sizes.
    Only sizes with a base model in ``cpt_base_models`` are candidates: any other listed size is left out
    (none left fails the asset), it is not pre-trained."""
    ratio_decimals: int = 3
    """The trained ratios are the plan's rounded to this many decimals, in [1, 6] (the realised mixture is
    exact to one sequence per step, so finer ratios are not trainable)."""

    def __post_init__(self):
        from ops.mixture.probe import SIZES

        self.seeds = [int(s) if not isinstance(s, bool) and float(s) == int(s) else s for s in self.seeds]
        if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds) \
                or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"mixture_validation.seeds must be a non-empty list of distinct integers >= 0, got {self.seeds}")
        self.allocation_sizes = list(self.allocation_sizes)
        unknown = [s for s in self.allocation_sizes if s not in SIZES]
        if unknown:
            raise ValueError(f"mixture_validation.allocation_sizes: unknown size(s) {unknown}; known: {sorted(SIZES)}")
        if not 1 <= int(self.ratio_decimals) <= 6:
            raise ValueError(f"mixture_validation.ratio_decimals must be in [1, 6], got {self.ratio_decimals}")


def nearest_size(n_params: float, sizes: Mapping[str, float]) -> str:
    """The size whose non-embedding parameter count is nearest to ``n_params`` in log N (a tie goes
    to the smaller size). ``sizes``: size name -> N. Raises ValueError on an empty map or N <= 0."""
    if not sizes:
        raise ValueError("nearest_size: no candidate sizes")
    if not n_params > 0:
        raise ValueError(f"nearest_size: n_params must be > 0, got {n_params!r}")
    return min(sizes, key=lambda s: (abs(math.log(float(sizes[s]) / float(n_params))), float(sizes[s])))


def general_rise(loss_general: float, base_general: float) -> float:
    """Relative rise of the general loss over the base model's, (L_g - L_g0) / L_g0 (the usages'
    constraint, arXiv 2406.01375 §3). Raises ValueError when L_g0 <= 0."""
    if not base_general > 0:
        raise ValueError(f"general_rise: base general loss must be > 0, got {base_general!r}")
    return (float(loss_general) - float(base_general)) / float(base_general)


@dataclass(frozen=True)
class ClosedLoopVerdict:
    """The verdict of the closed loop on the trade-off usage. Rises are relative to the base model's
    measured general loss, (L_g - L_g0) / L_g0; losses in nats/token."""

    T: float
    """The plan's allowed relative rise of the general loss (>= 0)."""
    law_r_d: float
    """The domain ratio r_d the law chose (as trained, rounded)."""
    measured_rise: float
    """The measured relative general-loss rise at law_r_d (mean over seeds)."""
    measured_rise_seeds: tuple[float, ...]
    """The measured relative rise of each seed's run at law_r_d."""
    grid_best_r_d: Optional[float]
    """The probe grid's best feasible ratio (None: no grid point was feasible)."""
    grid_best_measured_rise: Optional[float]
    """The validation's measured relative rise at grid_best_r_d (None if not trained)."""
    holds: bool
    """measured_rise <= T: the plan is accepted."""
    accepted_r_d: float
    """law_r_d when the plan holds; otherwise the corrected choice, the trained ratio with the lowest
    measured domain loss among those whose measured rise is <= T, or 0.0 when none is (no domain data can
    be added within T at this resolution)."""
    corrected: bool
    """accepted_r_d differs from law_r_d."""
    measured: tuple[Mapping[str, Any], ...]
    """Per trained ratio, ascending r_d: {r_d, general_rise, loss_domain, loss_general, seeds} (seed means)."""

    def describe(self) -> str:
        """One sentence naming the numbers (what the blocking check prints)."""
        grid = ("no feasible grid point" if self.grid_best_r_d is None else
                f"grid best r_d {self.grid_best_r_d:g}" + ("" if self.grid_best_measured_rise is None else
                                                        f" (measured rise {self.grid_best_measured_rise:+.2%})"))
        head = (f"law r_d {self.law_r_d:g}: measured general-loss rise {self.measured_rise:+.2%} "
                f"{'<=' if self.holds else '>'} T {self.T:.2%}; {grid}")
        if self.holds:
            return head + "; plan accepted"
        fix = (f"corrected choice r_d {self.accepted_r_d:g} (lowest measured domain loss among measured-feasible ratios)"
               if self.accepted_r_d > 0 else "no trained ratio > 0 holds T: corrected choice r_d 0")
        return head + f"; plan REJECTED, {fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"T": self.T, "law_r_d": self.law_r_d, "measured_rise": self.measured_rise,
                "measured_rise_seeds": list(self.measured_rise_seeds), "grid_best_r_d": self.grid_best_r_d,
                "grid_best_measured_rise": self.grid_best_measured_rise, "holds": self.holds,
                "accepted_r_d": self.accepted_r_d, "corrected": self.corrected,
                "measured": [dict(m) for m in self.measured], "verdict": self.describe()}


def closed_loop_verdict(T: float, law_r_d: float, grid_best_r_d: Optional[float],
                        runs: Sequence[Mapping[str, Any]]) -> ClosedLoopVerdict:
    """Judge the trade-off answer on measured runs of the target model at the target D.

    Args:
        T: allowed relative rise of the general loss (>= 0), the plan's own.
        law_r_d: the law's trade-off ratio as trained.
        grid_best_r_d: the probe grid's best feasible ratio, or None.
        runs: one mapping per trained run at the target (N, D): ``r_d``, ``general_rise`` (relative
            to the base model's measured L_g0), ``loss_domain``, ``loss_general`` and ``seed``.
    Returns:
        ClosedLoopVerdict: holds iff the mean measured rise at ``law_r_d`` is <= T. The threshold is
        the plan's T; nothing here widens it.
    Raises:
        ValueError: T < 0, no run at ``law_r_d``, or a run missing a field (named).
    """
    if not (isinstance(T, (int, float)) and math.isfinite(T) and T >= 0):
        raise ValueError(f"closed_loop_verdict: T must be a finite number >= 0, got {T!r}")
    need = ("r_d", "general_rise", "loss_domain", "loss_general", "seed")
    by_ratio: dict[float, list[Mapping[str, Any]]] = {}
    for i, r in enumerate(runs):
        missing = [k for k in need if k not in r or r[k] is None]
        if missing:
            raise ValueError(f"closed_loop_verdict: run {i} lacks {missing}")
        by_ratio.setdefault(float(r["r_d"]), []).append(r)
    if float(law_r_d) not in by_ratio:
        raise ValueError(f"closed_loop_verdict: no measured run at the law's r_d {law_r_d}; measured ratios {sorted(by_ratio)}")
    measured = []
    for r_d in sorted(by_ratio):
        rs = by_ratio[r_d]
        measured.append({"r_d": r_d, "general_rise": float(np.mean([x["general_rise"] for x in rs])),
                         "loss_domain": float(np.mean([x["loss_domain"] for x in rs])),
                         "loss_general": float(np.mean([x["loss_general"] for x in rs])),
                         "seeds": sorted(int(x["seed"]) for x in rs)})
    at = {m["r_d"]: m for m in measured}
    law = at[float(law_r_d)]
    holds = bool(law["general_rise"] <= T)
    if holds:
        accepted = float(law_r_d)
    else:
        ok = [m for m in measured if m["general_rise"] <= T and m["r_d"] > 0]
        accepted = float(min(ok, key=lambda m: (m["loss_domain"], -m["r_d"]))["r_d"]) if ok else 0.0
    grid = at.get(float(grid_best_r_d)) if grid_best_r_d is not None else None
    return ClosedLoopVerdict(float(T), float(law_r_d), law["general_rise"],
                             tuple(float(x["general_rise"]) for x in by_ratio[float(law_r_d)]),
                             None if grid_best_r_d is None else float(grid_best_r_d),
                             None if grid is None else grid["general_rise"], holds, accepted,
                             accepted != float(law_r_d), tuple(measured))
