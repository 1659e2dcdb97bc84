"""Small stage figures (matplotlib, Agg) returned as PNG bytes, for asset metadata in the UI."""

from __future__ import annotations

import io


def _fig(width: float = 6.0, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=80)
    return plt, fig, ax


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def funnel(stages: list[tuple[str, int]], title: str) -> bytes:
    """Horizontal bar chart of row counts per stage (first stage on top)."""
    plt, fig, ax = _fig(6.0, 0.45 * len(stages) + 1.0)
    names = [s for s, _ in stages][::-1]
    vals = [v for _, v in stages][::-1]
    bars = ax.barh(names, vals, color="#4C72B0")
    for b, v in zip(bars, vals):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:,}", va="center", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("rows")
    ax.margins(x=0.15)
    return _png(plt, fig)


def grouped_bars(categories: list[str], series: dict[str, list[float]], title: str, ylabel: str = "rows") -> bytes:
    """Grouped bars: one group per category, one bar per series (e.g. before/after)."""
    import numpy as np

    plt, fig, ax = _fig(max(6.0, 0.35 * len(categories) + 2), 3.6)
    x = np.arange(len(categories))
    width = 0.8 / max(len(series), 1)
    for k, (name, vals) in enumerate(series.items()):
        ax.bar(x + k * width, vals, width, label=name)
    ax.set_xticks(x + width * (len(series) - 1) / 2)
    ax.set_xticklabels(categories, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _png(plt, fig)


def histogram(values: list[float], bins: int, title: str, xlabel: str) -> bytes:
    """A histogram of values (e.g. Jaccard similarity of removed near-duplicates)."""
    plt, fig, ax = _fig()
    ax.hist(values, bins=bins, color="#55A868")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows")
    return _png(plt, fig)
