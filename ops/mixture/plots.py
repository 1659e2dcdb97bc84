"""Figures of the mixture group (matplotlib Agg, PNG bytes for asset metadata)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from ops.figures import _png


def _grid(n_panels: int, width: float = 9.0, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n_panels, figsize=(width, height), dpi=80, squeeze=False)
    return plt, fig, axes[0]


def loss_curves(runs: pl.DataFrame, predict: dict[str, Callable] | None = None) -> bytes:
    """Validation loss vs CPT tokens D (log x), one panel per target (general, domain), one colour
    per domain ratio and one marker per size. Points are probe checkpoints (D > 0); lines, when
    ``predict`` maps 'general'/'domain' to f(N, D, r_d) -> loss, are the fitted law."""
    plt, fig, axes = _grid(2)
    runs = runs.filter(pl.col("tokens") > 0)
    ratios = sorted(runs["domain_ratio"].unique().to_list())
    sizes = sorted(runs["n_params"].unique().to_list())
    cmap = plt.get_cmap("viridis")
    markers = "osD^v<>"
    for ax, target in zip(axes, ("general", "domain")):
        for i, r in enumerate(ratios):
            colour = cmap(i / max(1, len(ratios) - 1))
            for j, n in enumerate(sizes):
                sub = runs.filter((pl.col("domain_ratio") == r) & (pl.col("n_params") == n)).sort("tokens")
                if sub.is_empty():
                    continue
                ax.scatter(sub["tokens"], sub[f"loss_{target}"], color=colour, marker=markers[j % len(markers)], s=14,
                           label=f"r_d={r:g}" if j == 0 else None)
                if predict and target in predict:
                    d = np.geomspace(sub["tokens"].min(), sub["tokens"].max(), 50)
                    ax.plot(d, predict[target](np.full_like(d, n), d, np.full_like(d, r)), color=colour, lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("CPT tokens D")
        ax.set_ylabel(f"{target} validation loss (nats/token)")
        ax.set_title(f"L_{target[0]}: markers = sizes {', '.join(f'{n / 1e3:.0f}k' for n in sizes)}", fontsize=9)
    axes[0].legend(fontsize=7)
    return _png(plt, fig)


def ratio_curves(r: np.ndarray, series: dict[str, np.ndarray], title: str, marks: dict[str, float] | None = None,
                 ylabel: str = "predicted loss (nats/token)") -> bytes:
    """Predicted losses against the domain ratio r_d, with vertical lines at chosen ratios."""
    plt, fig, axes = _grid(1, 6.0, 3.2)
    ax = axes[0]
    for name, y in series.items():
        ax.plot(r, y, label=name)
    for name, x in (marks or {}).items():
        ax.axvline(x, ls="--", lw=0.8, color="grey")
        ax.text(x, ax.get_ylim()[1], f" {name}", fontsize=7, va="top", rotation=90)
    ax.set_xlabel("domain ratio r_d")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def closed_loop(r: np.ndarray, predicted_rise: np.ndarray, measured: list[tuple[float, float]], T: float,
                grid: list[tuple[float, float]], title: str) -> bytes:
    """The closed loop of the trade-off usage: the law's predicted relative general-loss rise
    against r_d (line, at the target N and D), the validation runs' measured rise (filled dots,
    same N and D), the probe grid's measured rise at the probes' largest D (open squares) and the
    allowed rise T (dashed). Rises are fractions; plotted in percent."""
    plt, fig, axes = _grid(1, 6.0, 3.4)
    ax = axes[0]
    ax.plot(r, 100 * np.asarray(predicted_rise), label="law (target N, D)")
    if grid:
        gx, gy = zip(*grid)
        ax.scatter(gx, 100 * np.asarray(gy), marker="s", facecolors="none", edgecolors="grey",
                   label="probe grid (probe D)")
    if measured:
        mx, my = zip(*measured)
        ax.scatter(mx, 100 * np.asarray(my), color="C3", zorder=3, label="trained (target N, D)")
    ax.axhline(100 * T, ls="--", lw=0.8, color="k", label=f"T = {100 * T:g}%")
    ax.set_xlabel("domain ratio r_d")
    ax.set_ylabel("general-loss rise over the base (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(plt, fig)
