"""The mixture, post-training and CTR parameters (ops dataclasses the run configs mirror): their
ranges, and that the law's config loads without scipy (the code location reads it at load)."""

import subprocess
import sys

import pytest

from ops.mixture.law.config import FitFloorParams, LawFitParams, MixturePlanParams
from ops.mixture.tokens import TokenizerParams
from ops.posttrain.regions import RegionParams
from ops.posttrain.report import ComparisonParams
from ops.posttrain.synthesis import SynthesisParams
from ops.sparse.config import CTREventsParams, CTRModelParams, TrainConfig


def test_the_law_config_loads_without_scipy_and_the_law_still_resolves():
    code = ("import sys; import ops.mixture.law.config as c; assert 'scipy' not in sys.modules, 'scipy loaded'; "
            "from ops.mixture import law; assert law.FORMS['L3'] and callable(law.fit_law); print(c.LawFitParams().forms)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['L3', 'r_additive', 'chinchilla', 'L3_d0', 'r_additive_d0']"


@pytest.mark.parametrize("cls, fields, match", [
    (LawFitParams, {"forms": ["L3", "L9"]}, r"dcpt_law_fit.forms must be a non-empty list of \['L3', 'L3_d0', 'bimix', 'chinchilla', 'data_mixing_law', 'r_additive', 'r_additive_d0'\]"),
    (LawFitParams, {"forms": []}, "dcpt_law_fit.forms must be a non-empty list"),
    (LawFitParams, {"huber_delta": 0.0}, "dcpt_law_fit.huber_delta must be > 0, got 0.0"),
    (LawFitParams, {"holdout_last_k": 0}, "dcpt_law_fit.holdout_last_k must be >= 1, got 0"),
    (LawFitParams, {"min_subdomain_share": 1.0}, r"dcpt_law_fit.min_subdomain_share must be in \[0, 1\), got 1.0"),
    (FitFloorParams, {"min_heldout_r2": 1.5}, r"min_heldout_r2 must be <= 1 \(R\^2\), got 1.5"),
    (FitFloorParams, {"min_heldout_r2": float("nan")}, "min_heldout_r2 must be a finite number, got nan"),
    (MixturePlanParams, {"quantiles": [90.0, 10.0]}, r"mixture_plan.quantiles must be two percentiles 0 <= low < high <= 100"),
    (MixturePlanParams, {"max_general_degradation": -0.01}, "mixture_plan.max_general_degradation must be >= 0"),
    (MixturePlanParams, {"max_extrapolation": 0.5}, "mixture_plan.max_extrapolation must be >= 1, got 0.5"),
    (TokenizerParams, {"vocab_size": 70_000}, r"vocab_size must be in \[300, 65535\] \(uint16 streams\), got 70000"),
    (RegionParams, {"high_loss_weight": 1.5}, r"failure_regions.high_loss_weight must be in \[0, 1\], got 1.5"),
    (RegionParams, {"top_k": 0}, "failure_regions.top_k must be >= 1, got 0"),
    (SynthesisParams, {"near_threshold": 1.0}, r"targeted_synthesis.near_threshold \(Jaccard threshold\) must be in \(0, 1\), got 1.0"),
    (SynthesisParams, {"num_perm": 4}, r"targeted_synthesis.num_perm must be in \[16, 8192\], got 4"),
    (SynthesisParams, {"verify_timeout_s": 0}, "targeted_synthesis.verify_timeout_s must be > 0, got 0"),
    (ComparisonParams, {"n_boot": 0}, "failure_driven_comparison.n_boot must be >= 1, got 0"),
    (CTREventsParams, {"test_fraction": 1.0}, r"ctr_events.test_fraction must be in \(0, 1\), got 1.0"),
    (CTRModelParams, {"dropout": 1.0}, r"ctr_model.dropout must be in \[0, 1\), got 1.0"),
    (CTRModelParams, {"baseline_C": 0.0}, "ctr_model.baseline_C must be > 0, got 0.0"),
    (CTRModelParams, {"crosses": ["gender"]}, r"ctr_model.crosses must be 'a\*b' pairs .*\['gender'\]"),
])
def test_ranges_name_the_field(cls, fields, match):
    with pytest.raises(ValueError, match=match):
        cls(**fields)


def test_the_functions_default_to_the_dataclass():
    import inspect

    from ops.mixture.tokens import build_streams
    from ops.posttrain import regions, report, synthesis

    assert inspect.signature(build_streams).parameters["vocab_size"].default == TokenizerParams().vocab_size == 2048
    assert inspect.signature(regions.find_regions).parameters["k_topics"].default == RegionParams().k_topics == 8
    assert inspect.signature(report.compare).parameters["n_boot"].default == ComparisonParams().n_boot == 2000
    assert inspect.signature(synthesis.ItemFilter).parameters["near_threshold"].default == SynthesisParams().near_threshold == 0.8


def test_ctr_model_params_hand_the_trainer_a_plain_train_config():
    p = CTRModelParams(hidden=[16, 8], epochs=2, baseline_C=0.5)
    cfg = p.train_config()
    assert type(cfg) is TrainConfig and cfg.hidden == (16, 8) and cfg.epochs == 2 and not hasattr(cfg, "baseline_C")
    assert CTRModelParams().train_config() == TrainConfig()
