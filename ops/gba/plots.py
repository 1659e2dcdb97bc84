"""Figures of the mode comparison (matplotlib, Agg), returned as PNG bytes for asset metadata."""

from __future__ import annotations

import io

COLORS = {"sync": "#4C72B0", "async": "#DD8452", "gba": "#55A868", "ssp": "#C44E52", "hopbw": "#8172B3"}


def auc_vs_time(curves: dict[str, list[dict]], target: float | None = None, title: str = "test AUC vs training time") -> bytes:
    """One line per mode: test AUC (y) against training seconds (x, evaluation excluded).
    ``curves`` maps mode -> evaluation points with ``train_s`` and ``auc``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.0, 3.4), dpi=80)
    for mode, pts in curves.items():
        pts = [p for p in pts if p["samples"] > 0]
        kw = {"label": mode, "color": COLORS.get(mode), "marker": ".", "linewidth": 1.4}
        ax.plot([p["train_s"] for p in pts], [p["auc"] for p in pts], **kw)
        bx.plot([p["samples"] / 1000 for p in pts], [p["auc"] for p in pts], **kw)
    for a in (ax, bx):
        if target is not None:
            a.axhline(target, color="grey", linestyle=":", linewidth=1)
        a.set_ylabel("test AUC")
        a.grid(alpha=0.3)
    ax.set_xlabel("training seconds (evaluation excluded)")
    bx.set_xlabel("samples applied (thousands)")
    ax.set_title(title, fontsize=10)
    bx.set_title("per sample", fontsize=10)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
