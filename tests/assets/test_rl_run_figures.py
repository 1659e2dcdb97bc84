"""The RL assets' own time figures (issue 38, item 4; assets/_rl.py ``run_figures``): labelled with
their steps and seed, every method's first (cold) step excluded, beside the registered claim's
verdict read from claims.json."""

import json

from assets._rl import SMOKE_STEPS, claim_verdicts, run_figures


def _value(md):
    return getattr(md, "value", getattr(md, "data", getattr(md, "text", md)))


def test_the_cold_first_step_is_excluded_for_every_method():
    """The issue's case: the baseline's first step was 1.015 s of its 1.22 s (cold start), the
    method's was not; counting every step gives 4.07x, excluding each first step 2.05x."""
    steps = {"baseline": [1.015, 0.100, 0.105], "rollpacker": [0.200, 0.050, 0.050]}
    out = {k: _value(v) for k, v in run_figures(steps, "baseline", 7, "rollpacker").items()}
    assert round(sum(steps["baseline"]) / sum(steps["rollpacker"]), 2) == 4.07      # the old, misleading figure
    assert out["run_speedup_3_steps_smoke"] == {"baseline": 1.0, "rollpacker": 2.05}
    assert out["run_train_s_3_steps_smoke"] == {"baseline": 0.205, "rollpacker": 0.1}
    assert "3 optimizer step(s) per method, seed 7" in out["run_scope"] and "smoke" in out["run_scope"]
    long = {k: _value(v) for k, v in run_figures({"a": [1.0] * SMOKE_STEPS, "b": [0.5] * SMOKE_STEPS}, "a", 0, "x").items()}
    assert long[f"run_speedup_{SMOKE_STEPS}_steps"] == {"a": 1.0, "b": 2.0}          # no _smoke suffix
    one = {k: _value(v) for k, v in run_figures({"a": [1.0], "b": [0.5]}, "a", 0, "x").items()}
    assert one["run_speedup_1_steps_smoke"].startswith("n/a")


def test_claim_verdict_comes_from_claims_json(tmp_path):
    path = tmp_path / "claims.json"
    assert claim_verdicts("rollpacker", path)["status"] == "claim not yet run"        # no file
    path.write_text(json.dumps({"claims": {
        "rollpacker-speedup": {"verdict": "shown", "status": "complete", "estimate": 1.31, "ci95": [1.12, 1.5],
                               "metric": {"unit": "x"}, "seeds": {"run": 5, "planned": 5}, "label": "real"},
        "rollarc-speedup": {"verdict": "incomplete", "status": "registered, not yet run", "seeds": {"run": 0, "planned": 5}},
        "grpo-gain": {"verdict": "not shown", "seeds": {"run": 5, "planned": 5}}}}))
    got = claim_verdicts("rollpacker", path)
    assert list(got) == ["rollpacker-speedup"]
    assert (got["rollpacker-speedup"]["verdict"], got["rollpacker-speedup"]["ci95"]) == ("shown", [1.12, 1.5])
    assert claim_verdicts("rollarc", path)["rollarc-speedup"]["verdict"] == "claim not yet run"
    assert claim_verdicts("gba", path)["status"] == "claim not yet run"
    shown = _value(run_figures({"baseline": [1, 1], "rollpacker": [1, 1]}, "baseline", 0, "rollpacker", path)["claim_verdict"])
    assert shown["rollpacker-speedup"]["estimate"] == 1.31


def test_a_run_without_training_signal_says_so_in_its_log_and_metadata():
    """RollPacker and RollArc share the rule: every step's groups all zero-signal (equal rewards, so
    every GRPO advantage is 0) is a run that learned nothing; one step with reward variance is not."""
    from assets._rl import training_signal

    class Log:
        def __init__(self):
            self.warnings = []

        def warning(self, msg):
            self.warnings.append(msg)

    class Context:
        log = Log()

    ctx = Context()
    none = training_signal(ctx, "rollpacker_run", [1.0, None, 1.0])
    assert _value(none["training_signal"]).startswith("none: every group zero-signal")
    assert len(ctx.log.warnings) == 1 and ctx.log.warnings[0].startswith("rollpacker_run: every group had equal rewards")
    some = training_signal(ctx, "rollarc_run", [1.0, 0.5])
    assert _value(some["training_signal"]).startswith("yes") and len(ctx.log.warnings) == 1
    assert training_signal(ctx, "rollarc_run", [None]) == {} and len(ctx.log.warnings) == 1
