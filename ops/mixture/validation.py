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


RISE_TOLERANCE = 0.01
"""Default two-sided tolerance between the measured and the predicted general-loss rise at the law's r_d
(one percentage point of L_g0; ``ValidationParams.rise_tolerance``)."""
NOISE_MULTIPLE = 2.0
"""Default multiple of the probes' seed noise of the rise (``ValidationParams.noise_multiple``)."""
from ops.mixture.plateau import PLATEAU_FRACTION, PLATEAU_TOLERANCE, plateau_record  # noqa: E402,F401  (re-exported)


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
    rise_tolerance: float = RISE_TOLERANCE
    """Two-sided tolerance of the closed loop (absolute, in units of relative rise: 0.01 = one percentage
    point of L_g0): the measured general-loss rise at the law's r_d must lie within this of the law's own
    predicted rise, widened to ``noise_multiple`` x the probes' seed noise of the rise when that is larger."""
    noise_multiple: float = NOISE_MULTIPLE
    """Multiple of the probes' seed noise (sd of the final general-loss rise over repeated probes) that the
    prediction tolerance is widened to, and that the rise at the highest r_d must exceed for the regime to be
    'ok' (> 0)."""
    plateau_tolerance: float = PLATEAU_TOLERANCE
    """Plateau criterion of a base model: the last ``PLATEAU_FRACTION`` (20%) of its pre-training improved the
    general validation loss by less than this relative amount (0.005 = 0.5%), in (0, 1)."""

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
        if not (math.isfinite(self.rise_tolerance) and self.rise_tolerance >= 0):
            raise ValueError(f"mixture_validation.rise_tolerance must be a finite number >= 0, got {self.rise_tolerance}")
        if not (math.isfinite(self.noise_multiple) and self.noise_multiple > 0):
            raise ValueError(f"mixture_validation.noise_multiple must be > 0, got {self.noise_multiple}")
        if not 0 < self.plateau_tolerance < 1:
            raise ValueError(f"mixture_validation.plateau_tolerance must be in (0, 1), got {self.plateau_tolerance}")


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


def regime_status(bases: Sequence[Mapping[str, Any]], high_r_d: Optional[float], high_rise: Optional[float],
                  noise: Optional[float], noise_multiple: float = NOISE_MULTIPLE,
                  plateau_tolerance: float = PLATEAU_TOLERANCE) -> dict[str, Any]:
    """Is the closed loop in the paper's regime (arXiv 2406.01375 §1, §3: CPT continues well-trained base
    models, so domain data raises the general loss and the law chooses how much of it to accept)?

    'ok' requires both: (1) every base model of the target size has plateaued (``plateau_record``: its
    last 20% of pre-training improved the general validation loss by < ``plateau_tolerance``; a base
    without the record counts as not plateaued); (2) the measured general-loss rise at the highest
    trained r_d (``high_rise`` at ``high_r_d``) exceeds ``noise_multiple`` x the probes' seed noise of the
    rise (``noise``; without a noise estimate, > 0 is required and the reason says so).

    bases: each base's ``base.json`` (``init`` and, when recorded, ``plateau``).
    Returns {regime: 'ok' | 'not reached', reasons: [..], bases: [{init, rel_improvement_last_20pct,
    plateaued}], high_r_d, high_rise, rise_threshold, noise}.
    """
    reasons, rows = [], []
    for b in bases:
        pl_ = b.get("plateau")
        if pl_ is None:
            rows.append({"init": int(b.get("init", 0)), "rel_improvement_last_20pct": None, "plateaued": False})
            reasons.append(f"base init {int(b.get('init', 0))}: no plateau record (trained before it was recorded)")
            continue
        ok = pl_["rel_improvement_last_20pct"] < plateau_tolerance
        rows.append({"init": int(b.get("init", 0)), "rel_improvement_last_20pct": pl_["rel_improvement_last_20pct"],
                     "plateaued": bool(ok)})
        if not ok:
            reasons.append(f"base init {int(b.get('init', 0))} has not plateaued: its last 20% of pre-training improved the "
                           f"general loss by {pl_['rel_improvement_last_20pct']:.2%} (criterion < {plateau_tolerance:.2%})")
    if not bases:
        reasons.append("no base model of the target size")
    threshold = noise_multiple * noise if noise is not None else 0.0
    if high_rise is None:
        reasons.append("no measured general-loss rise at a high r_d")
    elif not high_rise > threshold:
        reasons.append(f"the general loss does not rise measurably at r_d {high_r_d:g}: {high_rise:+.2%} <= "
                       + (f"{noise_multiple:g} x seed noise {noise:.2%}" if noise is not None else "0 (seed noise unknown)"))
    return {"regime": "ok" if not reasons else "not reached", "reasons": reasons, "bases": rows,
            "high_r_d": high_r_d, "high_rise": high_rise, "rise_threshold": threshold, "noise": noise}


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
    """The plan is accepted: within_T, and (when a prediction was given) prediction_ok, and (when a regime
    was given) regime 'ok'."""
    accepted_r_d: Optional[float]
    """law_r_d when the plan holds; None when the regime was not reached (no plan is accepted: a measured
    rise outside the paper's regime says nothing about the trade-off); otherwise the corrected choice, the
    trained ratio with the lowest measured domain loss among those whose measured rise is <= T, or 0.0
    when none is."""
    corrected: bool
    """accepted_r_d is a number other than law_r_d."""
    measured: tuple[Mapping[str, Any], ...]
    """Per trained ratio, ascending r_d: {r_d, general_rise, loss_domain, loss_general, seeds} (seed means)."""
    predicted_rise: Optional[float] = None
    """The law's predicted relative rise at law_r_d against the same L_g0 (None: not checked)."""
    rise_tolerance: Optional[float] = None
    """The two-sided tolerance |measured_rise - predicted_rise| <= rise_tolerance (None: not checked)."""
    within_T: bool = True
    """measured_rise <= T."""
    prediction_ok: Optional[bool] = None
    """|measured_rise - predicted_rise| <= rise_tolerance (None: no prediction given)."""
    regime: Optional[Mapping[str, Any]] = None
    """``regime_status`` of the target size (None: not checked)."""

    def describe(self) -> str:
        """One sentence naming the numbers (what the blocking check prints)."""
        grid = ("no feasible grid point" if self.grid_best_r_d is None else
                f"grid best r_d {self.grid_best_r_d:g}" + ("" if self.grid_best_measured_rise is None else
                                                        f" (measured rise {self.grid_best_measured_rise:+.2%})"))
        head = (f"law r_d {self.law_r_d:g}: measured general-loss rise {self.measured_rise:+.2%} "
                f"{'<=' if self.within_T else '>'} T {self.T:.2%}")
        if self.prediction_ok is not None:
            head += (f", law predicted {self.predicted_rise:+.2%} (|difference| {abs(self.measured_rise - self.predicted_rise):.2%} "
                     f"{'<=' if self.prediction_ok else '>'} tolerance {self.rise_tolerance:.2%})")
        head += f"; {grid}"
        if self.regime is not None:
            head += f"; regime: {self.regime['regime']}"
            if self.regime["regime"] != "ok":
                head += " (" + "; ".join(self.regime["reasons"]) + ")"
        if self.holds:
            return head + "; plan accepted"
        if self.accepted_r_d is None:
            return head + "; plan NOT ACCEPTED: the paper's regime is not reached, so no ratio is accepted"
        fix = (f"corrected choice r_d {self.accepted_r_d:g} (lowest measured domain loss among measured-feasible ratios)"
               if self.accepted_r_d > 0 else "no trained ratio > 0 holds T: corrected choice r_d 0")
        return head + f"; plan REJECTED, {fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"T": self.T, "law_r_d": self.law_r_d, "measured_rise": self.measured_rise,
                "measured_rise_seeds": list(self.measured_rise_seeds), "predicted_rise": self.predicted_rise,
                "rise_tolerance": self.rise_tolerance, "within_T": self.within_T, "prediction_ok": self.prediction_ok,
                "grid_best_r_d": self.grid_best_r_d, "grid_best_measured_rise": self.grid_best_measured_rise,
                "regime": None if self.regime is None else dict(self.regime), "holds": self.holds,
                "accepted_r_d": self.accepted_r_d, "corrected": self.corrected,
                "measured": [dict(m) for m in self.measured], "verdict": self.describe()}


def closed_loop_verdict(T: float, law_r_d: float, grid_best_r_d: Optional[float],
                        runs: Sequence[Mapping[str, Any]], predicted_rise: Optional[float] = None,
                        rise_tolerance: float = RISE_TOLERANCE,
                        regime: Optional[Mapping[str, Any]] = None) -> ClosedLoopVerdict:
    """Judge the trade-off answer on measured runs of the target model at the target D. The loop can
    fail both ways: a plan that breaks T fails, and so does one whose law mispredicts the rise at its own
    answer by more than ``rise_tolerance`` in either direction (a too-conservative law whose measured rise
    lies far below its prediction is not confirmed by passing T).

    Args:
        T: allowed relative rise of the general loss (>= 0), the plan's own.
        law_r_d: the law's trade-off ratio as trained.
        grid_best_r_d: the probe grid's best feasible ratio, or None.
        runs: one mapping per trained run at the target (N, D): ``r_d``, ``general_rise`` (relative
            to the base model's measured L_g0), ``loss_domain``, ``loss_general`` and ``seed``.
        predicted_rise: the law's predicted relative rise at ``law_r_d`` against the same L_g0 (None:
            the two-sided check is skipped and ``prediction_ok`` is None).
        rise_tolerance: the two-sided tolerance (absolute, in relative-rise units; >= 0).
        regime: ``regime_status`` of the target size (None: not checked); 'not reached' rejects the plan
            and accepts no ratio.
    Returns:
        ClosedLoopVerdict: holds iff the mean measured rise at ``law_r_d`` is <= T, within
        ``rise_tolerance`` of ``predicted_rise`` (if given), and the regime is 'ok' (if given).
    Raises:
        ValueError: T < 0, a negative or non-finite tolerance, no run at ``law_r_d``, or a run missing a
        field (named).
    """
    if not (isinstance(T, (int, float)) and math.isfinite(T) and T >= 0):
        raise ValueError(f"closed_loop_verdict: T must be a finite number >= 0, got {T!r}")
    if not (isinstance(rise_tolerance, (int, float)) and math.isfinite(rise_tolerance) and rise_tolerance >= 0):
        raise ValueError(f"closed_loop_verdict: rise_tolerance must be a finite number >= 0, got {rise_tolerance!r}")
    if predicted_rise is not None and not math.isfinite(float(predicted_rise)):
        raise ValueError(f"closed_loop_verdict: predicted_rise must be finite, got {predicted_rise!r}")
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
    within_T = bool(law["general_rise"] <= T)
    prediction_ok = (None if predicted_rise is None
                     else bool(abs(law["general_rise"] - float(predicted_rise)) <= rise_tolerance))
    regime_ok = regime is None or regime.get("regime") == "ok"
    holds = within_T and prediction_ok is not False and regime_ok
    if holds:
        accepted: Optional[float] = float(law_r_d)
    elif not regime_ok:
        accepted = None
    else:
        ok = [m for m in measured if m["general_rise"] <= T and m["r_d"] > 0]
        accepted = float(min(ok, key=lambda m: (m["loss_domain"], -m["r_d"]))["r_d"]) if ok else 0.0
    grid = at.get(float(grid_best_r_d)) if grid_best_r_d is not None else None
    return ClosedLoopVerdict(float(T), float(law_r_d), law["general_rise"],
                             tuple(float(x["general_rise"]) for x in by_ratio[float(law_r_d)]),
                             None if grid_best_r_d is None else float(grid_best_r_d),
                             None if grid is None else grid["general_rise"], holds, accepted,
                             accepted is not None and accepted != float(law_r_d), tuple(measured),
                             None if predicted_rise is None else float(predicted_rise),
                             None if predicted_rise is None else float(rise_tolerance), within_T, prediction_ok,
                             None if regime is None else dict(regime))
