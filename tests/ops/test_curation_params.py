"""The curation parameters (ops dataclasses the run configs mirror): one default, one range check.

Case ``dedup-threshold-edges`` (tests/cases/curation.json) over the whole threshold x num_perm grid,
the near-dedup check running exactly once per call path, and the other stages' ranges.
"""

import itertools

import numpy as np
import pytest

from ops.curation import dedup, minhash
from ops.curation.annotate import AnnotateParams
from ops.curation.decontam import DecontamConfig
from ops.curation.sampling import SftParams
from ops.curation.sources import RawProblemsParams

TEXTS = ["one two three four five six", "one two three four five six", "one two three four five seven"]


def test_case_dedup_threshold_edges_over_the_whole_grid(curation_cases):
    """Every (threshold, num_perm) of the case: a DedupConfigError naming the parameter and its
    range, or (threshold 1.0, a valid num_perm) the documented fall-back to exact shingle sets; never
    an error from inside datasketch."""
    grid = curation_cases["dedup-threshold-edges"]["input"]
    rank = np.arange(len(TEXTS))
    for threshold, num_perm in itertools.product(grid["threshold"], grid["num_perm"]):
        bad_t, bad_p = not 0.0 < threshold <= 1.0, not 16 <= num_perm <= 8192
        if not (bad_t or bad_p):
            res = dedup.near_dedup(TEXTS, rank, threshold=threshold, num_perm=num_perm)
            assert threshold == 1.0 and res.keep.tolist() == [True, False, True] and res.stats["bands"] == 0
            continue
        with pytest.raises(minhash.DedupConfigError) as e:
            dedup.NearDedupParams(threshold=threshold, num_perm=num_perm)
        msg = str(e.value)
        if bad_t:  # the threshold is checked first
            assert "near_dedup.threshold" in msg and "(0, 1]" in msg and str(threshold) in msg, msg
        else:
            assert "near_dedup.num_perm" in msg and "[16, 8192]" in msg and str(num_perm) in msg, msg


def test_near_dedup_range_check_runs_once_per_call(monkeypatch):
    calls = []
    real = minhash.validate_params
    monkeypatch.setattr(minhash, "validate_params", lambda t, p: (calls.append((t, p)), real(t, p))[1])
    texts = ["a rectangle has a length of 12 cm and a width of 5 cm what is its diagonal"] * 2 + ["find x"]
    params = dedup.NearDedupParams(threshold=0.8)  # the asset boundary
    assert calls == [(0.8, 128)]
    res = dedup.near_dedup(texts, np.arange(3), params)  # a built (validated) dataclass is not re-checked
    assert calls == [(0.8, 128)] and res.keep.tolist() == [True, False, True]
    dedup.near_dedup(texts, np.arange(3), threshold=0.9)  # fields: checked once, here
    assert calls == [(0.8, 128), (0.9, 128)]


def test_near_dedup_takes_params_or_fields_not_both():
    with pytest.raises(TypeError, match="either params or fields"):
        dedup.near_dedup(TEXTS, np.arange(3), dedup.NearDedupParams(), threshold=0.9)


def test_near_dedup_frame_takes_the_priority_from_params():
    import polars as pl

    base = "a rectangle has a length of 12 cm and a width of 5 cm what is the length of its diagonal in centimetres"
    df = pl.DataFrame({"problem_id": ["p1", "p2"], "source": ["arc", "math_test"], "problem": [base, base + " ?"],
                       "solution": [None, None]})
    kept, _, _ = dedup.near_dedup_frame(df, params=dedup.NearDedupParams(source_priority=["arc", "math_test"]))
    assert kept["problem_id"].to_list() == ["p1"]  # arc first here; the default order keeps math_test's p2
    kept, _, _ = dedup.near_dedup_frame(df, params=dedup.NearDedupParams())
    assert kept["problem_id"].to_list() == ["p2"]


@pytest.mark.parametrize("priority, match", [(["arc", "arc"], r"\['arc'\] more than once"),
                                             (["arc", ""], "list of source names"),
                                             ("arc", "list of source names")])
def test_source_priority_is_checked(priority, match):
    with pytest.raises(minhash.DedupConfigError, match=match):
        dedup.ExactDedupParams(source_priority=priority)


def test_near_dedup_shingle_sizes_are_checked():
    with pytest.raises(minhash.DedupConfigError, match="near_dedup.word_n must be an integer >= 1, got 0"):
        dedup.NearDedupParams(word_n=0)


@pytest.mark.parametrize("field, value, match", [
    ("minhash_threshold", 1.0, r"decontam.minhash_threshold \(Jaccard threshold\) must be in \(0, 1\)"),
    ("num_perm", 8, r"decontam.num_perm must be in \[16, 8192\], got 8"),
    ("min_words", 9, r"decontam.min_words must be in \[0, ngram=8\], got 9"),
    ("max_train_df", 0, "decontam.max_train_df must be >= 1, got 0"),
])
def test_decontam_ranges(field, value, match):
    with pytest.raises(ValueError, match=match):
        DecontamConfig(**{field: value})


@pytest.mark.parametrize("cls, field, value, match", [
    (AnnotateParams, "min_confidence", -0.1, r"annotate.min_confidence must be >= 0 .*, got -0.1"),
    (AnnotateParams, "max_per_class", 0, "annotate.max_per_class must be >= 1, got 0"),
    (AnnotateParams, "llm_label_max_rows", -1, "annotate.llm_label_max_rows must be >= 0, got -1"),
    (SftParams, "target_size", 0, "sft_dataset.target_size out of range: 0"),
    (SftParams, "tolerance", 0.6, "sft_dataset.tolerance out of range: 0.6"),
    (RawProblemsParams, "max_quarantine_fraction", 1.2, r"raw_problems.max_quarantine_fraction must be in \[0, 1\], got 1.2"),
    (RawProblemsParams, "mathematics_dataset_per_module", 0, "raw_problems.mathematics_dataset_per_module must be >= 1"),
    (RawProblemsParams, "limit", -1, "raw_problems.limit must be >= 0 or None, got -1"),
])
def test_stage_ranges(cls, field, value, match):
    with pytest.raises(ValueError, match=match):
        cls(**{field: value})


def test_the_run_configs_take_their_defaults_from_the_dataclasses():
    from assets.curation import AnnotateConfig, DecontaminationConfig, DedupConfig, ExactDedupConfig, SftConfig
    from assets.sources import RawProblemsConfig

    assert DedupConfig().model_dump() == {"source_priority": list(dedup.DEFAULT_PRIORITY), "threshold": 0.8,
                                          "num_perm": 128, "seed": 1}
    pairs = [(AnnotateConfig, AnnotateParams, {"allow_missing_sources"}), (ExactDedupConfig, dedup.ExactDedupParams, set()),
             (DedupConfig, dedup.NearDedupParams, set()), (DecontaminationConfig, DecontamConfig, set()),
             (SftConfig, SftParams, set()), (RawProblemsConfig, RawProblemsParams, set())]
    for config_cls, params_cls, own in pairs:
        built = params_cls(**config_cls().model_dump(exclude=own))
        assert built == params_cls(), config_cls.__name__  # the Launchpad defaults are the dataclass's
