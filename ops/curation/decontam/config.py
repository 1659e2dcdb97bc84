"""The parameters of the decontamination detector and the names of its layers and policies.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 3; the layers are described in :mod:`ops.curation.decontam`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import minhash

POLICIES = {"ngram": ("exact", "ngram", "minhash"),
            "strict": ("exact", "ngram", "minhash", "sibling", "semantic", "half-ngram")}
#: every layer a removal can carry, in the order they run
LAYERS = ("exact", "ngram", "minhash", "sibling", "semantic", "half-ngram", "llm-judge", "llm-judge-fail-closed")
#: the word n-gram length of the half-of-an-item's-n-grams guarantee (layer ``half-ngram`` and the check)
HALF_NGRAM_N = 8
#: the benchmarks of that guarantee (the ``no_benchmark_overlap`` check's: MATH-500)
HALF_NGRAM_BENCHMARKS = ("math500",)
#: ``semantic_benchmarks`` entry meaning every benchmark the detector is given
ALL_BENCHMARKS = "all"


@dataclass
class DecontamConfig:
    """Parameters of :class:`Decontaminator` (see the module docstring for their meaning); the
    ``decontaminated_problems`` run config mirrors them.

    Raises:
        ValueError: a field outside its range, named in the message (``ops.curation.minhash.DedupConfigError``
            for the MinHash layer's ``minhash_threshold`` in (0, 1) and ``num_perm`` in [16, 8192]).
    """

    policy: str = "strict"
    """strict (default): copies, template siblings and rephrasings removed; ngram: copies and light edits only."""
    ngram: int = 8
    """Word n-gram length of the n-gram overlap layer and the sibling layer (tokens; >= 2)."""
    short_words: int = 8
    """Benchmark items under this many tokens match by compact key (exact layer), have no siblings (>= 0)."""
    min_words: int = 3
    """Natural-language words an n-gram needs to be informative (in [0, ngram])."""
    max_benchmark_df: int = 4
    """An n-gram in this many benchmark items or more is frequent: no evidence (n-gram, sibling layer; >= 1)."""
    max_train_df: int = 50
    """An n-gram in this many training rows or more is frequent: no evidence (n-gram, sibling layer; >= 1)."""
    containment: float = 0.8
    """N-gram layer: flag when the row's n-grams cover this share of the smaller n-gram set (in (0, 1])."""
    contained_min_tokens: int = 16
    """N-gram layer: a row holding a whole benchmark item of at least this many tokens verbatim (matching form) is
    flagged, notation or not (tokens; >= 0, 0 turns the verbatim test off; items under ``ngram`` tokens never
    count)."""
    minhash_threshold: float = 0.75
    """MinHash layer (word 5-grams): exact Jaccard at or above which a candidate is flagged (in (0, 1))."""
    num_perm: int = 128
    """MinHash permutations of the MinHash layer in [16, 8192] (signature width)."""
    match_normalization: bool = True
    """Compare texts in matching form (match_normalize); False restores the former light normalisation,
    for comparison only."""
    sibling_containment: float = 0.5
    """Sibling layer: flag a row holding this share of an item's (rare) masked or plain n-grams (in (0, 1])."""
    semantic_benchmarks: list[str] = field(default_factory=lambda: [ALL_BENCHMARKS])
    """Benchmarks the semantic (rephrasing) layer compares against; ``"all"`` (default): every benchmark the detector
    is given."""
    semantic_template_df: int = 10
    """Semantic layer: a sentence (or option line) found in this many benchmark items or more is a template ("For
    which of these two scenarios does the main character ...", "Express your answer as a common fraction.") and
    is dropped from both texts before the prefilter and the embedding (>= 2)."""
    semantic_threshold: float = 0.85
    """Embedding cosine at or above which a row is a rephrasing of a benchmark item."""
    semantic_prefilter: float = 0.3
    """TF-IDF cosine at or above which a (row, item) pair passes the semantic prefilter (in [-1, 1])."""
    semantic_floor: float = 0.2
    """Prefilter's second rule: a pair at TF-IDF cosine >= this passes if >= semantic_margin x the next item's
    (in [-1, 1])."""
    semantic_margin: float = 2.0
    """Factor by which a pair's TF-IDF cosine (>= semantic_floor) must beat the next item's to pass (>= 1)."""
    semantic_top_k: int = 1
    """Nearest semantic_benchmarks items (by TF-IDF cosine) the prefilter keeps per row (>= 1)."""
    semantic_max_tokens: int = 128
    """Word pieces kept per text by the embedder (tokens; >= 1; the model's own limit is 256, 128 covers 90% of
    MATH problems)."""
    judge: bool = False
    """Ask the teacher about pairs in the borderline band [judge_low, semantic_threshold); fail-closed."""
    judge_low: float = 0.75
    """Embedding cosine where the judge's borderline band starts (in [-1, 1], <= semantic_threshold)."""
    judge_max_pairs: int = 200
    """Borderline pairs sent to the judge, best first (>= 0); pairs past it are removed fail-closed."""
    judge_timeout_s: float = 600.0
    """Wall-clock limit of the one judge call over all asked pairs (s; > 0); a time-out fails closed."""

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"decontam.policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if self.ngram < 2:
            raise ValueError(f"decontam.ngram must be >= 2, got {self.ngram}")
        if not 0 <= self.min_words <= self.ngram:
            raise ValueError(f"decontam.min_words must be in [0, ngram={self.ngram}], got {self.min_words}")
        if self.contained_min_tokens < 0:
            raise ValueError(f"decontam.contained_min_tokens must be >= 0, got {self.contained_min_tokens}")
        for name in ("short_words", "max_benchmark_df", "max_train_df"):
            if getattr(self, name) < (0 if name == "short_words" else 1):
                raise ValueError(f"decontam.{name} must be >= {0 if name == 'short_words' else 1}, got {getattr(self, name)}")
        for name in ("containment", "sibling_containment"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"decontam.{name} must be in (0, 1], got {getattr(self, name)}")
        if self.semantic_margin < 1:
            raise ValueError(f"decontam.semantic_margin must be >= 1, got {self.semantic_margin}")
        for name in ("semantic_threshold", "semantic_prefilter", "semantic_floor", "judge_low"):
            if not -1 <= getattr(self, name) <= 1:
                raise ValueError(f"decontam.{name} (a cosine) must be in [-1, 1], got {getattr(self, name)}")
        if self.judge_low > self.semantic_threshold:
            raise ValueError(f"decontam.judge_low ({self.judge_low}) must be <= semantic_threshold ({self.semantic_threshold})")
        if self.semantic_template_df < 2:
            raise ValueError(f"decontam.semantic_template_df must be >= 2, got {self.semantic_template_df}")
        for name in ("semantic_top_k", "semantic_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"decontam.{name} must be >= 1, got {getattr(self, name)}")
        if self.judge_max_pairs < 0:
            raise ValueError(f"decontam.judge_max_pairs must be >= 0, got {self.judge_max_pairs}")
        if not self.judge_timeout_s > 0:
            raise ValueError(f"decontam.judge_timeout_s must be > 0, got {self.judge_timeout_s}")
        minhash.check_threshold(self.minhash_threshold, "decontam.minhash_threshold", allow_exact=False)
        minhash.check_num_perm(self.num_perm, "decontam.num_perm")

    @property
    def layers(self) -> tuple[str, ...]:
        return POLICIES[self.policy]
