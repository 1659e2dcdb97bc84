"""Figures of the post-training assets (matplotlib, Agg), returned as PNG bytes."""

from __future__ import annotations

from ops.figures import _fig, _png


def accuracy_bars(table, slices: list[str], checkpoints: list[str], title: str) -> bytes:
    """Grouped bars of accuracy per slice and checkpoint with bootstrap 95% error bars.

    ``table``: polars frame with ``checkpoint``, ``slice``, ``accuracy``, ``ci_low``, ``ci_high``.
    """
    import numpy as np

    plt, fig, ax = _fig(max(6.0, 1.1 * len(slices) + 2), 3.6)
    x = np.arange(len(slices))
    w = 0.8 / max(1, len(checkpoints))
    for k, ck in enumerate(checkpoints):
        acc, lo, hi = [], [], []
        for s in slices:
            r = table.filter((table["checkpoint"] == ck) & (table["slice"] == s))
            a = float(r["accuracy"][0]) if r.height else float("nan")
            acc.append(a)
            lo.append(a - float(r["ci_low"][0]) if r.height else 0.0)
            hi.append(float(r["ci_high"][0]) - a if r.height else 0.0)
        ax.bar(x + k * w, acc, w, yerr=[lo, hi], capsize=2, label=ck)
    ax.set_xticks(x + w * (len(checkpoints) - 1) / 2)
    ax.set_xticklabels(slices, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return _png(plt, fig)


def loss_curves(curves: dict[str, list[dict]], title: str) -> bytes:
    """Training loss (nats per loss token) against optimizer step, one line per run."""
    plt, fig, ax = _fig()
    for name, pts in curves.items():
        ax.plot([p["step"] for p in pts], [p["loss"] for p in pts], marker=".", label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _png(plt, fig)


def failure_mass_bars(regions, top: int = 15) -> bytes:
    """Horizontal bars of failure mass for the top regions (annotation and topic regions coloured apart)."""
    r = regions.sort("rank").head(top)
    plt, fig, ax = _fig(7.0, 0.3 * r.height + 1.2)
    labels = [d[:60] for d in r["description"].to_list()][::-1]
    mass = r["failure_mass"].to_list()[::-1]
    colors = ["#4C72B0" if k == "annotation" else "#DD8452" for k in r["kind"].to_list()][::-1]
    ax.barh(range(len(labels)), mass, color=colors)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.set_xlabel("failure mass (wrong = 1, right but high-loss = 0.5)")
    ax.set_title("failure regions (blue: annotation, orange: topic)", fontsize=10)
    return _png(plt, fig)
