"""Exact and near-duplicate removal of problems, with a deterministic content-based survivor rule.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 2: exact dedup on MD5 of normalised text, then
MinHash near-dedup. Our defaults (docs/curation.md, "Exact and near deduplication"): word 5-grams (character 3-grams under 5 tokens),
num_perm 128, Jaccard threshold 0.8 (16 bands x 8 rows: recall-weighted, see minhash.lsh_params), every LSH candidate verified by exact
Jaccard against the cluster's *survivor* — never chained through a third text (star clustering).

Survivor rule (never input order): a row with a reference solution first, then the source with the
higher priority (earlier in ``source_priority``; unlisted sources after, alphabetically), then the
smaller ``problem_id``.

Parameters, their defaults and their validation live in :class:`ExactDedupParams` and
:class:`NearDedupParams` (the ``exact_deduped_problems`` / ``near_deduped_problems`` run configs
mirror them); a bad value raises :class:`ops.curation.minhash.DedupConfigError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from . import minhash
from .text import text_hash

CLUSTER_SCHEMA = {
    "cluster_id": pl.String,  # the survivor's problem_id
    "problem_id": pl.String,
    "source": pl.String,
    "is_survivor": pl.Boolean,
    "stage": pl.String,  # "exact" | "near" | "survivor"
    "matched_to": pl.String,  # the problem_id this row was verified against
    "jaccard": pl.Float64,
}


DEFAULT_PRIORITY = ("math_test", "mmlu_dev_val", "arc", "mathematics_dataset")
"""Survivor source order: MATH test (worked solutions) first, generated mathematics_dataset last."""


@dataclass
class ExactDedupParams:
    """Parameters of exact dedup (:func:`exact_dedup`), the ``exact_deduped_problems`` run config.

    Raises:
        DedupConfigError: a name repeated, empty or not a string (the message names it).
    """

    source_priority: list[str] = field(default_factory=lambda: list(DEFAULT_PRIORITY))
    """Survivor rule after 'has a reference solution': earlier sources win; unlisted come last,
    alphabetically. Distinct, non-empty source names."""

    def __post_init__(self):
        names = list(self.source_priority) if isinstance(self.source_priority, (list, tuple)) else None
        if names is None or any(not isinstance(s, str) or not s.strip() for s in names):
            raise minhash.DedupConfigError(f"dedup.source_priority must be a list of source names, got {self.source_priority!r}")
        repeated = sorted({s for s in names if names.count(s) > 1})
        if repeated:
            raise minhash.DedupConfigError(f"dedup.source_priority names {repeated} more than once")
        self.source_priority = names


@dataclass
class NearDedupParams(ExactDedupParams):
    """Parameters of MinHash-LSH near dedup (:func:`near_dedup`), the ``near_deduped_problems`` run
    config (defaults: docs/curation.md, "Exact and near deduplication"; Logics-STEM arXiv 2601.01562 §2, stage 2).

    Raises:
        DedupConfigError: a value outside its range (the message names the field and the range).
    """

    threshold: float = 0.8
    """Jaccard threshold in (0, 1]; 1.0 = exact shingle-set dedup (no LSH)."""
    num_perm: int = 128
    """MinHash permutations in [16, 8192] (signature width)."""
    seed: int = 1
    """Seed of datasketch's permutation family."""
    word_n: int = 5
    """Word n-gram shingle length (>= 1); texts under ``word_n`` tokens use character n-grams."""
    char_n: int = 3
    """Character n-gram length of the shingles of those short texts (>= 1)."""

    def __post_init__(self):
        super().__post_init__()
        minhash.validate_params(self.threshold, self.num_perm)
        for name in ("word_n", "char_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise minhash.DedupConfigError(f"near_dedup.{name} must be an integer >= 1, got {v!r}")


def _near_params(params: NearDedupParams | None, fields: dict) -> NearDedupParams:
    if params is None:
        return NearDedupParams(**fields)
    if fields:
        raise TypeError(f"near_dedup: pass either params or fields, not both (got params and {sorted(fields)})")
    return params


def survivor_rank(df: pl.DataFrame, source_priority: list[str]) -> np.ndarray:
    """Rank of every row under the survivor rule (0 = keep first). Shape (n,) int64.

    Requires columns ``problem_id``, ``source`` and ``solution`` (null or "" means none).
    """
    prio = {s: i for i, s in enumerate(source_priority)}
    unlisted = sorted(set(df["source"].unique().to_list()) - set(prio))
    for i, s in enumerate(unlisted):
        prio[s] = len(source_priority) + i
    keyed = df.select(
        has_solution=(pl.col("solution").fill_null("").str.len_chars() > 0),
        prio=pl.col("source").replace_strict(prio, return_dtype=pl.Int64),
        problem_id=pl.col("problem_id"),
    ).with_row_index("row")
    order = keyed.sort(["has_solution", "prio", "problem_id"], descending=[True, False, False])["row"].to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def _clusters_frame(records: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(records, schema=CLUSTER_SCHEMA, orient="row")


def exact_dedup(df: pl.DataFrame, source_priority: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Drop rows whose normalised problem text is identical (MD5) to a higher-ranked row.

    Returns:
        (kept, clusters): ``kept`` has the input columns plus ``text_md5``; ``clusters`` has
        :data:`CLUSTER_SCHEMA`, one row per member of each cluster with more than one member.
    """
    if df.is_empty():
        return df.with_columns(text_md5=pl.lit(None, pl.String)), _clusters_frame([])
    rank = survivor_rank(df, source_priority)
    work = df.with_columns(
        text_md5=pl.Series([text_hash(p) for p in df["problem"].to_list()], dtype=pl.String),
        _rank=pl.Series(rank),
    ).sort("_rank")
    first = work.group_by("text_md5", maintain_order=True).agg(
        survivor=pl.col("problem_id").first(), n=pl.len()
    )
    work = work.join(first, on="text_md5", how="left")
    dup = work.filter(pl.col("n") > 1)
    records = [
        (s, pid, src, pid == s, "survivor" if pid == s else "exact", s, 1.0)
        for s, pid, src in dup.select("survivor", "problem_id", "source").iter_rows()
    ]
    kept = work.filter(pl.col("problem_id") == pl.col("survivor")).sort("_rank").drop("_rank", "survivor", "n")
    return kept, _clusters_frame(records)


@dataclass
class NearDedupResult:
    """Output of :func:`near_dedup`."""

    keep: np.ndarray
    """Shape (n,) bool, True for survivors and for rows in no cluster."""
    survivor: np.ndarray
    """Shape (n,) int64, index of the row's survivor (itself when kept)."""
    similarity: np.ndarray
    """Shape (n,) float64, exact Jaccard with the survivor (1.0 when kept)."""
    stats: dict = field(default_factory=dict)
    """Counters (candidate pairs, screened by estimate, verified pairs, rejected candidates, bands, rows)."""


def near_dedup(texts: list[str], rank: np.ndarray, params: NearDedupParams | None = None, **fields) -> NearDedupResult:
    """MinHash-LSH near-duplicate detection with survivor verification (star clustering).

    Texts are visited in ``rank`` order; an unassigned text becomes a survivor and absorbs every
    unassigned LSH candidate whose *exact* shingle Jaccard with it is >= ``threshold``. So every
    removed text is within the threshold of the survivor that replaced it, and no chain A~B~C can
    merge A and C (case ``dedup-no-transitive-chain``). ``threshold == 1.0`` falls back to exact
    shingle-set equality without LSH (case ``dedup-threshold-edges``).

    Args:
        texts: n problem texts (non-empty).
        rank: shape (n,) survivor ranks, 0 = most preferred (see :func:`survivor_rank`).
        params: a (validated) :class:`NearDedupParams`; or instead
        **fields: its fields (``threshold``, ``num_perm``, ``seed``, ``word_n``, ``char_n``), the
            rest at their defaults, validated here.
    Raises:
        minhash.DedupConfigError: a field outside its range (names the field and the range).
        TypeError: both ``params`` and fields given.
    """
    cfg = _near_params(params, fields)
    threshold, num_perm, seed = cfg.threshold, cfg.num_perm, cfg.seed
    n = len(texts)
    if n == 0:
        empty = {"candidate_pairs": 0, "verified_pairs": 0}
        return NearDedupResult(np.ones(0, dtype=bool), np.zeros(0, dtype=np.int64), np.ones(0), empty)
    batch = minhash.shingle_batch(texts, word_n=cfg.word_n, char_n=cfg.char_n)
    if threshold >= 1.0:
        # exact shingle-set equality: group by the hash of the sorted set
        sets = minhash.unique_sets(batch)
        keys = np.array([hash(sets.doc(i).tobytes()) for i in range(n)], dtype=np.int64)
        order = np.lexsort((rank, keys))
        ks = keys[order]
        same = np.concatenate(([False], ks[1:] == ks[:-1]))
        pairs = []
        head = order[0]
        for pos in range(1, n):
            if same[pos]:
                pairs.append((head, order[pos]))
            else:
                head = order[pos]
        cand = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        bands = rows = 0
        n_lsh = len(cand)
    else:
        bands, rows = minhash.lsh_params(threshold, num_perm)
        sig = minhash.signatures(batch, num_perm=num_perm, seed=seed)
        cand = minhash.band_candidates(sig, bands, rows)
        n_lsh = len(cand)
        # cheap screen: drop candidates whose MinHash estimate is far below the threshold
        cand = cand[minhash.estimated_jaccard(sig, cand) >= threshold - minhash.estimate_margin(threshold, num_perm)]
    # verify the rest at once (exact Jaccard), then star-cluster over verified edges only
    sims = minhash.pair_jaccard(batch, cand)
    ok = sims >= threshold
    order = np.argsort(rank, kind="stable")
    keep, survivor, sim, verified = minhash.star_clusters(n, cand[ok], sims[ok], order)
    rejected = int((~ok).sum())
    stats = {
        "candidate_pairs": int(n_lsh),
        "screened_by_estimate": int(n_lsh - len(cand)),
        "verified_pairs": int(verified),
        "rejected_candidates": rejected,
        "bands": bands,
        "rows": rows,
    }
    return NearDedupResult(keep, survivor, sim, stats)


def near_dedup_frame(
    df: pl.DataFrame, source_priority: list[str] | None = None, params: NearDedupParams | None = None, **fields
) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """:func:`near_dedup` over a problems frame. Returns (kept, clusters, stats).

    ``source_priority`` defaults to ``params.source_priority``; ``params`` / ``fields`` as in
    :func:`near_dedup`. ``clusters`` has :data:`CLUSTER_SCHEMA` (stage "near"); ``kept`` keeps the
    input columns. Raises DedupConfigError for a bad field.
    """
    cfg = _near_params(params, fields)
    if df.is_empty():
        return df, _clusters_frame([]), {"candidate_pairs": 0, "verified_pairs": 0}
    rank = survivor_rank(df, cfg.source_priority if source_priority is None else source_priority)
    res = near_dedup(df["problem"].to_list(), rank, cfg)
    ids = df["problem_id"].to_list()
    srcs = df["source"].to_list()
    records = []
    removed = np.flatnonzero(~res.keep)
    heads = sorted(set(res.survivor[removed].tolist()))
    for h in heads:
        records.append((ids[h], ids[h], srcs[h], True, "survivor", ids[h], 1.0))
    for r in removed.tolist():
        s = int(res.survivor[r])
        records.append((ids[s], ids[r], srcs[r], False, "near", ids[s], float(res.similarity[r])))
    kept = df.filter(pl.Series(res.keep))
    return kept, _clusters_frame(records), res.stats


def merge_clusters(exact: pl.DataFrame, near: pl.DataFrame) -> pl.DataFrame:
    """One cluster table over both stages, keyed by the *final* survivor.

    ``exact`` and ``near``: cluster tables of :func:`exact_dedup` and :func:`near_dedup_frame`
    (columns :data:`CLUSTER_SCHEMA`). A row removed as an exact duplicate of X belongs to X's final
    cluster: X itself, or the near survivor that removed X. Each cluster has exactly one
    ``is_survivor`` row; sorted by cluster, survivor first, then problem_id.
    """
    near_removed = near.filter(~pl.col("is_survivor")).select("problem_id", final="cluster_id")
    ex_removed = (
        exact.filter(~pl.col("is_survivor"))
        .join(near_removed.rename({"problem_id": "matched_to"}), on="matched_to", how="left")
        .with_columns(cluster_id=pl.coalesce("final", "matched_to"))
        .drop("final")
    )
    nr = near.filter(~pl.col("is_survivor"))
    removed = pl.concat([ex_removed.select(CLUSTER_SCHEMA.keys()), nr.select(CLUSTER_SCHEMA.keys())])
    survivors = pl.concat(
        [exact.filter(pl.col("is_survivor")), near.filter(pl.col("is_survivor"))]
    ).unique("problem_id", keep="first")
    survivors = survivors.filter(pl.col("problem_id").is_in(removed["cluster_id"].implode()))
    survivors = survivors.with_columns(cluster_id=pl.col("problem_id"), matched_to=pl.col("problem_id"),
                                       stage=pl.lit("survivor"), jaccard=pl.lit(1.0))
    return pl.concat([survivors.select(CLUSTER_SCHEMA.keys()), removed]).sort("cluster_id", "is_survivor", "problem_id",
                                                                              descending=[False, True, False])
