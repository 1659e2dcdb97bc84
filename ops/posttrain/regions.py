"""Failure regions: where a checkpoint is wrong or unsure, grouped two ways and ranked by failure mass.

Logics-STEM (arXiv 2601.01562) §3: after stage-1 SFT, find failure regions (wrong or high-loss
items clustered by domain/difficulty/topic) to synthesise around. [open] Ours:

* failure mass of an item: 1 when its answer is wrong; ``high_loss_weight`` (default 0.5) when it is
  right but its gold-response loss is in the top ``1 - high_loss_quantile`` of all items (right by
  luck or barely); else 0;
* annotation regions: items grouped by the annotation strata (domain x difficulty x answer type) and
  the ``mathematics_dataset`` module;
* topic regions: TF-IDF over the problem words (digits removed: numbers are the instance, not the
  topic) + k-means (scikit-learn), each cluster described by its top terms and dominant module;
* ranking: by total failure mass (a region that is both large and wrong ranks first); regions with
  fewer than ``min_items`` items are dropped as noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

ANNOTATION_KEYS = ("domain", "difficulty", "answer_type", "module")
REGION_SCHEMA = {"rank": pl.Int64, "region_id": pl.String, "kind": pl.String, "description": pl.String,
                 "module": pl.String, "difficulty": pl.Int64, "n": pl.Int64, "wrong": pl.Int64, "high_loss": pl.Int64,
                 "failure_mass": pl.Float64, "failure_rate": pl.Float64, "accuracy": pl.Float64,
                 "module_share": pl.Float64, "examples": pl.String}


@dataclass
class RegionParams:
    """Parameters of the failure regions and their synthesis targets, the ``failure_regions`` run
    config (module docstring for the method).

    Raises:
        ValueError: a field outside its range (the message names it and the range).
    """

    k_topics: int = 8
    """k-means clusters of the TF-IDF topic regions (>= 1)."""
    min_items: int = 5
    """Regions with fewer items are dropped as noise (>= 1)."""
    high_loss_quantile: float = 0.9
    """A right item is high-loss when its gold-response loss (nats/token) is at or above this quantile of
    all items (in [0, 1])."""
    high_loss_weight: float = 0.5
    """Failure mass of a right but high-loss item (in [0, 1]; wrong items have 1)."""
    top_k: int = 3
    """Synthesis targets targeted_synthesis works on (>= 1): the first top_k distinct generator modules
    met walking the regions by rank (failure mass); regions with no module, an already-taken module or a
    topic below min_module_share are skipped."""
    min_module_share: float = 0.6
    """A topic region becomes a target only when one generator module holds at least this share of its
    items (in [0, 1])."""
    seed: int = 0
    """Seed of k-means."""

    def __post_init__(self):
        for name in ("k_topics", "min_items", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"failure_regions.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("high_loss_quantile", "high_loss_weight", "min_module_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"failure_regions.{name} must be in [0, 1], got {getattr(self, name)}")


_D = RegionParams


def failure_mass(scored: pl.DataFrame, high_loss_quantile: float = _D.high_loss_quantile,
                 high_loss_weight: float = _D.high_loss_weight) -> pl.DataFrame:
    """Add ``high_loss`` (bool) and ``failure_mass`` (float in [0, 1]) to scored items.

    Args:
        scored: ``correct`` (bool) and ``response_loss`` (nats/token) per item.
        high_loss_quantile, high_loss_weight: as in :class:`RegionParams` (which checks their range).
    Raises:
        ValueError: a column is missing.
    """
    for c in ("correct", "response_loss"):
        if c not in scored.columns:
            raise ValueError(f"failure_mass: scored items lack column {c!r}")
    loss = scored["response_loss"].fill_null(float("inf")).to_numpy()
    cut = float(np.quantile(loss[np.isfinite(loss)], high_loss_quantile)) if np.isfinite(loss).any() else float("inf")
    return scored.with_columns(high_loss=pl.Series(loss >= cut) & pl.col("correct")).with_columns(
        failure_mass=pl.when(~pl.col("correct")).then(1.0).when(pl.col("high_loss")).then(high_loss_weight).otherwise(0.0))


def _examples(df: pl.DataFrame, k: int = 2) -> str:
    wrong = df.filter(~pl.col("correct"))
    return " || ".join(t[:70] for t in (wrong if wrong.height else df)["problem"].head(k).to_list())


def annotation_regions(df: pl.DataFrame, keys: tuple[str, ...] = ANNOTATION_KEYS, min_items: int = _D.min_items) -> pl.DataFrame:
    """One region per combination of ``keys`` (rows of ``REGION_SCHEMA``, unranked)."""
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ValueError(f"annotation_regions: items lack annotation column(s) {missing}")
    rows = []
    for key, g in df.group_by(list(keys), maintain_order=True):
        if g.height < min_items:
            continue
        parts = dict(zip(keys, key))
        rows.append({"region_id": "ann:" + "|".join(str(parts[k]) for k in keys), "kind": "annotation",
                     "description": ", ".join(f"{k}={parts[k]}" for k in keys),
                     "module": parts.get("module"), "difficulty": parts.get("difficulty"),
                     **_stats(g), "module_share": 1.0 if "module" in keys else None, "examples": _examples(g)})
    return pl.DataFrame(rows, schema={k: v for k, v in REGION_SCHEMA.items() if k != "rank"})


def _stats(g: pl.DataFrame) -> dict:
    n = g.height
    mass = float(g["failure_mass"].sum())
    return {"n": n, "wrong": int((~g["correct"]).sum()), "high_loss": int(g["high_loss"].sum()),
            "failure_mass": mass, "failure_rate": mass / n, "accuracy": float(g["correct"].mean())}


def topic_regions(df: pl.DataFrame, k: int = _D.k_topics, seed: int = _D.seed, min_items: int = _D.min_items,
                  top_terms: int = 4) -> pl.DataFrame:
    """k-means clusters of TF-IDF vectors of the problem text (rows of ``REGION_SCHEMA``, unranked).

    ``k`` is capped at the number of distinct texts. Each cluster's ``module`` is its most common
    module and ``module_share`` that module's share of the cluster.
    """
    from sklearn.cluster import KMeans
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = df["problem"].to_list()
    if len(texts) < 2:
        return pl.DataFrame(schema={k_: v for k_, v in REGION_SCHEMA.items() if k_ != "rank"})
    vec = TfidfVectorizer(token_pattern=r"(?u)\b[^\W\d_]{2,}\b", ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    try:
        X = vec.fit_transform(texts)
    except ValueError:  # no term in two texts: one topic
        X = None
    k = max(1, min(k, len(set(texts))))
    if X is None or X.shape[1] == 0 or k == 1:
        labels = np.zeros(len(texts), dtype=int)
        terms = [["(all)"]]
    else:
        km = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(X)
        labels = km.labels_
        vocab = np.asarray(vec.get_feature_names_out())
        terms = [vocab[np.argsort(-c)[:top_terms]].tolist() for c in km.cluster_centers_]
    out = df.with_columns(_topic=pl.Series(labels))
    rows = []
    for t in sorted(set(labels.tolist())):
        g = out.filter(pl.col("_topic") == t)
        if g.height < min_items:
            continue
        mod, share, diff = None, None, None
        if "module" in g.columns:
            counts = g["module"].value_counts(sort=True)
            mod, share = counts["module"][0], float(counts["count"][0] / g.height)
        if "difficulty" in g.columns:
            diff = int(g["difficulty"].mode().sort()[0])
        rows.append({"region_id": f"topic:{t}", "kind": "topic", "description": "topic: " + ", ".join(terms[t]),
                     "module": mod, "difficulty": diff, **_stats(g), "module_share": share, "examples": _examples(g)})
    return pl.DataFrame(rows, schema={k_: v for k_, v in REGION_SCHEMA.items() if k_ != "rank"})


def rank_regions(*tables: pl.DataFrame) -> pl.DataFrame:
    """Concatenate region tables and rank them by failure mass (1 = most), ties by rate then id."""
    df = pl.concat([t for t in tables if t.height], how="vertical") if any(t.height for t in tables) else \
        pl.DataFrame(schema={k: v for k, v in REGION_SCHEMA.items() if k != "rank"})
    df = df.sort(["failure_mass", "failure_rate", "region_id"], descending=[True, True, False])
    return df.with_columns(rank=pl.int_range(1, df.height + 1, dtype=pl.Int64)).select(list(REGION_SCHEMA))


def find_regions(scored: pl.DataFrame, k_topics: int = _D.k_topics, min_items: int = _D.min_items,
                 high_loss_quantile: float = _D.high_loss_quantile, high_loss_weight: float = _D.high_loss_weight,
                 seed: int = _D.seed) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Failure mass per item, then annotation and topic regions ranked together.

    Returns:
        (items with ``high_loss`` and ``failure_mass``, ranked regions in ``REGION_SCHEMA``).
    """
    items = failure_mass(scored, high_loss_quantile, high_loss_weight)
    keys = tuple(k for k in ANNOTATION_KEYS if k in items.columns)
    return items, rank_regions(annotation_regions(items, keys, min_items), topic_regions(items, k_topics, seed, min_items))


def synthesis_targets(regions: pl.DataFrame, top_k: int = _D.top_k, min_module_share: float = _D.min_module_share) -> list[dict]:
    """The generator cells to synthesise for: the first ``top_k`` distinct modules met when walking
    the regions by rank.

    An annotation region gives (its module, its difficulty); a topic region gives (its dominant
    module, every difficulty: ``None``) when that module holds at least ``min_module_share`` of it,
    else it is skipped (no generator covers a mixed topic). A module already taken is not taken
    again. Each target carries its region's failure mass (its share of the synthesis budget).

    Returns:
        ``[{"module", "difficulty", "failure_mass", "regions"}]`` in rank order.
    """
    out: list[dict] = []
    taken: set[str] = set()
    for r in regions.sort("rank").iter_rows(named=True):
        if len(out) >= top_k:
            break
        if r["module"] is None or r["module"] in taken:
            continue
        if r["kind"] == "topic" and (r["module_share"] or 0) < min_module_share:
            continue
        taken.add(r["module"])
        out.append({"module": r["module"], "difficulty": r["difficulty"] if r["kind"] == "annotation" else None,
                    "failure_mass": float(r["failure_mass"]), "regions": [r["region_id"]]})
    return out
