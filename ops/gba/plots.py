"""Figures of the mode comparison (matplotlib, Agg), returned as PNG bytes for asset metadata."""

from __future__ import annotations

import io

COLORS = {"sync": "#4C72B0", "async": "#DD8452", "gba": "#55A868", "ssp": "#C44E52", "hopbw": "#8172B3",
          "auto": "#222222"}


def auc_vs_time(curves: dict[str, list[dict]], target: float | None = None, title: str = "test AUC vs training time",
                events: dict[str, list[dict]] | None = None) -> bytes:
    """One line per run: test AUC (y) against training seconds (x, evaluation excluded), and per
    sample. ``curves`` maps a run name (a mode, or e.g. "sync_to_gba") -> evaluation points with
    ``train_s``, ``samples`` and ``auc``; ``events`` maps a run name -> its switch events
    (``ops.gba.server.ParameterServer.switch``: ``train_s``, ``samples``, ``from``, ``to``), drawn
    as dashed vertical lines in the run's colour, labelled "from->to"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.0, 3.4), dpi=80)
    palette = iter(["#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"])
    colors = {}
    for mode, pts in curves.items():
        colors[mode] = COLORS.get(mode) or next(palette, None)
        pts = [p for p in pts if p["samples"] > 0]
        kw = {"label": mode, "color": colors[mode], "marker": ".", "linewidth": 1.4}
        ax.plot([p["train_s"] for p in pts], [p["auc"] for p in pts], **kw)
        bx.plot([p["samples"] / 1000 for p in pts], [p["auc"] for p in pts], **kw)
    for mode, evs in (events or {}).items():
        for ev in evs:
            label = f"{ev['from']}->{ev['to']}"
            for a, x in ((ax, ev["train_s"]), (bx, ev["samples"] / 1000)):
                a.axvline(x, color=colors.get(mode, "black"), linestyle="--", linewidth=1, alpha=0.8)
                a.annotate(label, (x, 0.02), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                           color=colors.get(mode, "black"), ha="right", va="bottom")
    for a in (ax, bx):
        if target is not None:
            a.axhline(target, color="grey", linestyle=":", linewidth=1)
        a.set_ylabel("test AUC")
        a.grid(alpha=0.3)
    ax.set_xlabel("training seconds (evaluation excluded)")
    bx.set_xlabel("samples applied (thousands)")
    ax.set_title(title, fontsize=10)
    bx.set_title("per sample (dashed: mode switches)" if events else "per sample", fontsize=10)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
