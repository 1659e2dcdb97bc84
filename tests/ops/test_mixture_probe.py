"""CPT probe mechanics: checkpoint spacing, the plan's validation, corpora, and a crashed probe launch
resuming to the same result as an uninterrupted one (the mixture schedule and the block streams are
the LM substrate's: tests/ops/test_lm.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ops.mixture import corpus
from ops.mixture.probe import ProbePlan, base_dir_name, checkpoint_tokens, run_dir_name

ROOT = Path(__file__).resolve().parents[2]


def test_checkpoints_are_exponentially_spaced_and_end_at_the_budget():
    plan = ProbePlan(phase="cpt", data_dir="", base_dir="", out_dir="", seq_len=128, global_batch=16,
                     cpt_tokens=131_072, first_checkpoint=4_096)
    marks = checkpoint_tokens(plan)
    assert marks == [4096, 8192, 16384, 32768, 65536, 131072]
    # not a power-of-two budget: still ends exactly at the (batch-rounded) budget
    plan.cpt_tokens = 100_000
    assert checkpoint_tokens(plan)[-1] == 100_352 and checkpoint_tokens(plan)[-2] == 65536


def test_plan_validation_names_the_field_and_the_run():
    ok = dict(phase="cpt", data_dir="", base_dir="", out_dir="", runs=[{"size": "xs", "ratio": 0.5, "key": "xs|0.50"}])
    assert ProbePlan(**ok).validate(processes=2) is not None
    with pytest.raises(ValueError, match=r"probe\.base_tokens must be >= 1, got 0"):
        ProbePlan(**ok, base_tokens=0).validate()
    with pytest.raises(ValueError, match="global_batch 4 is not a multiple of compute.num_processes 3"):
        ProbePlan(**ok, global_batch=4).validate(processes=3)
    with pytest.raises(ValueError, match=r"'xs\|1\.50'.*ratio 1\.5 outside \[0, 1\]"):
        ProbePlan(**{**ok, "runs": [{"size": "xs", "ratio": 1.5, "key": "xs|1.50"}]}).validate()
    with pytest.raises(ValueError, match="unknown probe size 'xxxl'"):
        ProbePlan(**{**ok, "runs": [{"size": "xxxl", "ratio": 0.5, "key": "k"}]}).validate()
    # the worker loads what the asset wrote, and rejects a field it does not know
    plan = ProbePlan(**ok, seq_len=16)
    assert ProbePlan.from_json(plan.to_json()) == plan
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['seqlen'\]"):
        ProbePlan.from_json(json.dumps({**json.loads(plan.to_json()), "seqlen": 16}))


def test_domain_corpus_labels_subdomains_and_names_missing_columns():
    problems = pl.DataFrame({
        "problem_id": ["a", "b", "c", "d", "e"],
        "problem": ["Solve x+1=2.", "Area of a circle of radius 2?", "Derivative of x^2?", "What is 3+4?", "Which gas do plants absorb?"],
        "solution": ["x = 1", "4 pi", None, "", None],
        "answer": ["1", "4\\pi", "2x", "7", "B"],
        "subject": ["intermediate_algebra", "geometry", "calculus__differentiate", "arithmetic__add_or_sub", "high_school_biology"],
        "domain": ["math", "math", "math", "math", "biology"],
    })
    df = corpus.domain_corpus(problems)
    assert df["subdomain"].to_list() == ["algebra", "geometry", "calculus", "arithmetic", "science"]
    assert df["text"][2].endswith("Answer: 2x") and df["text"][0].endswith("x = 1")
    assert set(df["split"]) <= {"train", "val"}
    with pytest.raises(ValueError, match=r"\['subject'\]"):
        corpus.domain_corpus(problems.drop("subject"))


def _tiny_streams(tmp: Path) -> Path:
    from ops.mixture.tokens import build_streams

    rng = np.random.default_rng(0)
    words = ["the", "dress", "fits", "well", "colour", "fabric", "soft", "small", "large", "love"]
    general = pl.DataFrame({"text": [" ".join(rng.choice(words, 30)) for _ in range(300)],
                            "split": ["val" if i % 10 == 0 else "train" for i in range(300)]})
    maths = ["x + 1 = 2", "area = pi r^2", "3 * 7 = 21", "d/dx x^2 = 2x"]
    domain = pl.DataFrame({"text": [" ".join(rng.choice(maths, 12)) for _ in range(300)],
                           "subdomain": ["algebra" if i % 2 else "geometry" for i in range(300)],
                           "split": ["val" if i % 10 < 2 else "train" for i in range(300)]})
    build_streams(general, domain, tmp / "tok", vocab_size=300)
    return tmp / "tok"


def _plan(tmp: Path, data: Path, out: str, phase: str) -> Path:
    plan = ProbePlan(phase=phase, data_dir=str(data), base_dir=str(tmp / "base"), out_dir=str(tmp / out),
                     runs=[{"size": "xs", "ratio": 0.5, "key": "0.50|xs"}], seq_len=16, global_batch=4,
                     base_tokens=512, cpt_tokens=1024, first_checkpoint=128, val_seqs_general=4,
                     val_seqs_per_subdomain=4)
    p = tmp / f"{out}-{phase}.json"
    p.write_text(plan.to_json())
    return p


def _launch(plan: Path, **extra_env) -> subprocess.CompletedProcess:
    """The worker as the launch protocol starts it (``python -m``, one process), its run folder
    beside the plan file (the same folder on every launch of one plan, like a run lineage)."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_PIPES_CONTEXT"}
    return subprocess.run([sys.executable, "-m", "ops.mixture.probe", "--spec", str(plan), "--out", str(plan.with_suffix(".run")),
                           "--fingerprint", "fp"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**env, "OMP_NUM_THREADS": "1", **extra_env})


def test_learning_rate_scales_as_one_over_width_and_enters_the_fingerprint(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    plan = ProbePlan(phase="base", data_dir=str(tmp_path), base_dir="", out_dir="")
    assert plan.lr_ref_width == 48 and plan.base_schedule.lr == 3e-3
    # never above the given rate below the reference width (xs is 16 wide, s 32), 1/width above it
    assert [plan.lr_for(s, plan.base_schedule.lr) for s in ("xs", "s", "m", "l", "xxl")] == pytest.approx([3e-3, 3e-3, 2.25e-3, 1.5e-3, 7.5e-4])
    assert plan.lr_for("l", 1e-3) == pytest.approx(0.5e-3)
    below = ProbePlan(phase="base", data_dir=str(tmp_path), base_dir="", out_dir="", lr_rule_below_ref=True)
    assert below.lr_for("xs", 3e-3) == pytest.approx(9e-3) and below.lr_for("l", 3e-3) == pytest.approx(1.5e-3)
    # the cap re-hashes only the sizes whose rate it changes: wider sizes keep their published runs
    assert [plan.fingerprint(s) == below.fingerprint(s) for s in ("xs", "s", "m", "l", "xl4", "xxl")] == \
        [False, False, True, True, True, True]
    assert plan.fingerprint("l", 0.5) == below.fingerprint("l", 0.5) and plan.fingerprint("xs", 0.5) != below.fingerprint("xs", 0.5)
    assert plan.base_settings()["lr_rule_below_ref"] is False
    flat = ProbePlan(phase="base", data_dir=str(tmp_path), base_dir="", out_dir="", lr_ref_width=0)
    assert flat.lr_for("xxl", 3e-3) == 3e-3                       # 0: one rate for every size
    assert flat.fingerprint("l") != plan.fingerprint("l") and "lr_ref_width" in plan.base_settings()
    with pytest.raises(ValueError, match=r"probe\.lr_ref_width must be >= 0, got -1"):
        ProbePlan(phase="base", data_dir="", base_dir="", out_dir="", lr_ref_width=-1).validate()


def test_the_schedules_are_lr_schedule_parts_and_known_fingerprints_are_unchanged(tmp_path):
    """ProbePlan's base and CPT schedules are ``LrSchedule`` parts (issue 41 item 1); a run hashes them
    by the flat names it had before (base_lr, warmup_steps, weight_decay, cpt_lr, cpt_warmup_steps),
    so probes trained before stay reusable. The hex digits below were computed with the flat
    ProbePlan (at cf8b190) on the same manifest text."""
    from ops.lm.schedule import LrSchedule

    (tmp_path / "manifest.json").write_text('{"streams": ["general", "domain"], "vocab_size": 512}\n')
    kw = dict(phase="cpt", data_dir=str(tmp_path), base_dir="", out_dir="")
    plan = ProbePlan(**kw)
    assert plan.base_schedule == LrSchedule(lr=3e-3, warmup_steps=10, min_lr_ratio=1.0, weight_decay=0.01)
    assert plan.cpt_schedule == LrSchedule(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.01)
    assert plan.fingerprint("s") == "2edf46365653ef2c"
    assert plan.fingerprint("xxl", init=2) == "2c5f4d74bf74d916"
    assert plan.fingerprint("m", ratio=0.25, seed=1, tokens=8192, init=1) == "b4c74ca8631ab7ba"
    # a plan from flat settings (a committed base's base.json, a registered design): same hashes as the flat plan
    flat = dict(base_lr=1e-3, warmup_steps=5, weight_decay=0.02, cpt_lr=5e-4, cpt_warmup_steps=3)
    q = ProbePlan.from_settings(**kw, lr_rule_below_ref=True, **flat)
    assert (q.fingerprint("xs"), q.fingerprint("xs", ratio=0.5)) == ("4889c3f1f614c1cc", "c92a912a8d777e44")
    assert q.cpt_schedule == LrSchedule(lr=5e-4, warmup_steps=3, min_lr_ratio=1.0, weight_decay=0.02)  # the flat plan's one decay
    assert {k: q.base_settings()[k] for k in ("base_lr", "warmup_steps", "weight_decay")} == \
        {"base_lr": 1e-3, "warmup_steps": 5, "weight_decay": 0.02}
    assert ProbePlan.from_settings(**kw, **q.base_settings(), **q.cpt_settings()) == q
    # what the flat plan could not say (a decaying rate, a CPT decay of its own) is recorded and hashed
    cos = ProbePlan(**kw, cpt_schedule=LrSchedule(lr=3e-3, warmup_steps=0, min_lr_ratio=0.1, weight_decay=0.0))
    assert cos.fingerprint("s") == plan.fingerprint("s") and cos.fingerprint("s", 0.5) != plan.fingerprint("s", 0.5)
    assert cos.cpt_settings()["cpt_min_lr_ratio"] == 0.1 and cos.cpt_settings()["cpt_weight_decay"] == 0.0
    assert ProbePlan.from_settings(**kw, **cos.base_settings(), **cos.cpt_settings()) == cos
    # a given part is copied, never changed; errors name the part's path; a design's flat params nest
    given = LrSchedule(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.0)
    assert ProbePlan.from_settings(**kw, cpt_schedule=given, cpt_lr=2e-3, weight_decay=0.5).cpt_schedule.lr == 2e-3
    assert given.lr == 1e-3
    with pytest.raises(ValueError, match=r"probe\.base_schedule\.lr must be > 0, got 0"):
        ProbePlan.from_settings(**kw, base_lr=0).validate()
    assert ProbePlan.nest_settings({"base_lr": 1e-3, "weight_decay": 0.01, "seq_len": 32}) == \
        {"base_schedule": {"lr": 1e-3, "weight_decay": 0.01}, "seq_len": 32}


def test_crashed_probe_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path):
    data = _tiny_streams(tmp_path)
    assert _launch(_plan(tmp_path, data, "runs", "base")).returncode == 0
    assert (tmp_path / "base/xs/optimizer.pt").exists()
    assert json.loads((tmp_path / "base/xs/base.json").read_text())["lr"] == pytest.approx(3e-3)  # narrower than 48: the base rate

    whole = _launch(_plan(tmp_path, data, "whole", "cpt"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    crashed = _launch(_plan(tmp_path, data, "runs", "cpt"), CRUCIBLE_PROBE_CRASH_AFTER_CHECKPOINTS="2")
    assert crashed.returncode == -9, crashed.stderr[-2000:]                             # killed, as a preemption would
    assert "fault injection (CRUCIBLE_PROBE_CRASH_AFTER_CHECKPOINTS=2)" in crashed.stderr
    run = tmp_path / "runs" / run_dir_name("xs", 0.5)
    state = tmp_path / "runs-cpt.run" / "runs" / run_dir_name("xs", 0.5) / "state"   # in the launch's run folder
    saved = json.loads((state / "state.json").read_text())
    assert saved["step"] == 4 and len(saved["history"]) == 3                           # 2 checkpoints + the base point
    assert (state / saved["model_file"]).exists() and not (run / "metrics.json").exists()
    resumed = _launch(_plan(tmp_path, data, "runs", "cpt"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed at step 4" in resumed.stderr
    got = json.loads((run / "metrics.json").read_text())["points"]
    want = json.loads((tmp_path / "whole" / run_dir_name("xs", 0.5) / "metrics.json").read_text())["points"]
    assert [p["tokens"] for p in got] == [0, 128, 256, 512, 1024]
    for g, w in zip(got, want):
        assert g["loss_general"] == pytest.approx(w["loss_general"], rel=1e-5)
        assert g["loss_domain"] == pytest.approx(w["loss_domain"], rel=1e-5)
    assert not state.exists()  # a finished run keeps only its metrics
    result = json.loads((tmp_path / "runs-cpt.run" / "result.json").read_text())   # what the asset reads
    assert result["runs"]["0.50|xs"]["points"] == got and result["world_size"] == 1 and result["fingerprint"] == "fp"

    again = _launch(_plan(tmp_path, data, "runs", "cpt"))  # same plan, same data: reused, not retrained
    assert again.returncode == 0 and "reused" in again.stderr


def test_fingerprints_and_folders_differ_per_seed_and_budget(tmp_path):
    """A CPT run's seed and its own budget are part of what determines its result; seed 0 with the
    plan's budget hashes as runs did before seeds existed (their published results stay valid)."""
    import hashlib

    (tmp_path / "manifest.json").write_text('{"vocab_size": 300}')
    plan = ProbePlan(phase="cpt", data_dir=str(tmp_path), base_dir="", out_dir="")
    fp = {s: plan.fingerprint("l", 0.5, seed=s) for s in (0, 1, 2)}
    assert len(set(fp.values())) == 3
    # the fields as they were before lr_rule_below_ref existed: a size it does not change (l) hashes as then
    d = {k: plan.setting(k) for k in plan.BASE_FIELDS + plan.CPT_FIELDS if k != "lr_rule_below_ref"}
    legacy = hashlib.sha256(json.dumps(['{"vocab_size": 300}', plan.sizes["l"], d, 0.5], sort_keys=True).encode()).hexdigest()[:16]
    assert fp[0] == legacy
    assert plan.fingerprint("l", 0.5, tokens=plan.cpt_tokens * 4) != fp[0]
    assert len({plan.fingerprint("xs", 0.5, seed=s) for s in (0, 1, 2)}) == 3
    # a run with its own budget is the run a plan with that budget would train
    assert plan.fingerprint("xs", 0.5, tokens=8192) == ProbePlan(phase="cpt", data_dir=str(tmp_path), base_dir="", out_dir="",
                                                                 cpt_tokens=8192).fingerprint("xs", 0.5)
    assert plan.fingerprint("xs") == plan.fingerprint("xs", None, seed=3)    # the base model has no CPT seed
    assert run_dir_name("xs", 0.5) == "xs_r0.500" and run_dir_name("xs", 0.5, 1) == "xs_r0.500_s1"
    assert run_dir_name("l", 0.866, 2, 524288) == "l_r0.866_s2_D524288"
    with pytest.raises(ValueError, match=r"'k': seed must be an integer >= 0, got -1"):
        ProbePlan(phase="cpt", data_dir="", base_dir="", out_dir="", runs=[{"size": "xs", "ratio": 0.5, "key": "k", "seed": -1}]).validate()
    with pytest.raises(ValueError, match=r"'k': tokens must be an integer >= 1"):
        ProbePlan(phase="cpt", data_dir="", base_dir="", out_dir="", runs=[{"size": "xs", "ratio": 0.5, "key": "k", "tokens": 0}]).validate()


def test_seeds_train_distinct_runs_from_one_base(tmp_path):
    """Two seeds of one (size, ratio) in one launch: the same base point, then different data order,
    so different losses at every checkpoint; each run carries its seed and fingerprint; a run with
    its own budget stops there."""
    data = _tiny_streams(tmp_path)
    assert _launch(_plan(tmp_path, data, "runs", "base")).returncode == 0
    spec = json.loads(_plan(tmp_path, data, "runs", "cpt").read_text())
    spec["runs"] = [{"size": "xs", "ratio": 0.5, "key": "a", "seed": 0}, {"size": "xs", "ratio": 0.5, "key": "b", "seed": 1},
                    {"size": "xs", "ratio": 0.5, "key": "c", "seed": 1, "tokens": 256}]
    p = tmp_path / "seeds-cpt.json"
    p.write_text(json.dumps(spec))
    r = _launch(p)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "seeds-cpt.run" / "result.json").read_text())["runs"]
    a, b, c = got["a"], got["b"], got["c"]
    assert (a["seed"], b["seed"], c["seed"]) == (0, 1, 1) and len({a["fingerprint"], b["fingerprint"], c["fingerprint"]}) == 3
    assert a["points"][0] == b["points"][0]                                  # step 0: the shared base model
    assert [p["tokens"] for p in a["points"]] == [p["tokens"] for p in b["points"]] == [0, 128, 256, 512, 1024]
    for pa, pb in zip(a["points"][1:], b["points"][1:]):
        assert pa["loss_general"] != pb["loss_general"] and pa["loss_domain"] != pb["loss_domain"]
    assert [p["tokens"] for p in c["points"]] == [0, 128, 256]
    assert c["points"][1:] == b["points"][1:3]                               # same seed: the same data, cut at its budget
    assert (tmp_path / "runs" / "xs_r0.500_s1" / "metrics.json").exists() and (tmp_path / "runs" / "xs_r0.500_s1_D256").exists()


def _launch_runs(tmp: Path, data: Path, phase: str, name: str, runs: list[dict]) -> tuple[subprocess.CompletedProcess, Path]:
    """The tiny plan of ``phase`` with ``runs`` instead of its own, written as ``<name>.json`` and
    launched; returns the process and the spec file (its run folder is ``<name>.run``)."""
    spec = json.loads(_plan(tmp, data, "runs", phase).read_text())
    spec["runs"] = runs
    p = tmp / f"{name}.json"
    p.write_text(json.dumps(spec))
    return _launch(p), p


def test_base_inits_are_distinct_models_that_cpt_runs_continue(tmp_path):
    """A second base initialisation of one size re-draws the weights and the base data order (its
    own folder, fingerprint and losses); a CPT run carrying init 1 starts from that base's losses
    and differs from the init-0 run of the same seed; init 0 hashes as bases did before inits."""
    import hashlib

    data = _tiny_streams(tmp_path)
    r, p = _launch_runs(tmp_path, data, "base", "inits-base",
                        [{"size": "xs", "ratio": 0.0, "key": "xs"}, {"size": "xs", "ratio": 0.0, "key": "xs|i1", "init": 1}])
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "inits-base.run" / "result.json").read_text())["runs"]
    b0, b1 = got["xs"], got["xs|i1"]
    assert (b0["init"], b1["init"]) == (0, 1) and b0["fingerprint"] != b1["fingerprint"]
    assert b0["losses"]["general"] != b1["losses"]["general"] and b0["n_params"] == b1["n_params"]
    assert (tmp_path / "base" / "xs" / "base.json").exists() and (tmp_path / "base" / "xs_i1" / "base.json").exists()
    plan = ProbePlan.from_json(p.read_text())
    d = {k: plan.setting(k) for k in plan.BASE_FIELDS if k != "lr_rule_below_ref"}
    manifest = (data / "manifest.json").read_text()
    legacy = hashlib.sha256(json.dumps([manifest, plan.sizes["m"], d, None], sort_keys=True).encode()).hexdigest()[:16]
    assert plan.fingerprint("m") == legacy != plan.fingerprint("m", init=1)
    assert base_dir_name("xs") == "xs" and base_dir_name("xs", 1) == "xs_i1"
    assert run_dir_name("xs", 0.5, 1, init=1) == "xs_r0.500_s1_i1"

    r, _ = _launch_runs(tmp_path, data, "cpt", "inits-cpt", [{"size": "xs", "ratio": 0.5, "key": "a", "seed": 1},
                                                             {"size": "xs", "ratio": 0.5, "key": "b", "seed": 1, "init": 1}])
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "inits-cpt.run" / "result.json").read_text())["runs"]
    a, b = got["a"], got["b"]
    assert b["init"] == 1 and a["fingerprint"] != b["fingerprint"]
    assert a["points"][0]["loss_general"] == b0["losses"]["general"] and b["points"][0]["loss_general"] == b1["losses"]["general"]
    assert all(pa["loss_general"] != pb["loss_general"] for pa, pb in zip(a["points"], b["points"]))
    assert (tmp_path / "runs" / "xs_r0.500_s1_i1" / "metrics.json").exists()
    # a run whose base init was never trained names the size and the init
    r, _ = _launch_runs(tmp_path, data, "cpt", "inits-missing", [{"size": "xs", "ratio": 0.5, "key": "c", "init": 2}])
    assert r.returncode != 0 and "no base model for size 'xs' (init 2)" in r.stderr


def test_runs_are_assigned_longest_first_and_auto_picks_by_makespan():
    from ops.mixture.probe import DATA_PARALLEL_EFFICIENCY, assign_runs, choose_parallelism, run_cost

    assert assign_runs([7.0, 25.0, 7.0, 25.0, 12.0], 2) == [[1, 4], [0, 2, 3]]       # loads 37 / 39 (LPT)
    assert assign_runs([1.0], 3) == [[0], [], []]
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        assign_runs([1.0], 0)
    assert choose_parallelism([5.0, 5.0], 2) == "runs"            # makespan 5 < 10 / 1.5
    assert choose_parallelism([10.0], 2) == "data"                # one run: one rank would idle
    assert choose_parallelism([10.0, 1.0], 2) == "data"           # 10 > 11 / 1.5: too unbalanced
    assert choose_parallelism([10.0, 1.0], 2, "runs") == "runs" and choose_parallelism([5.0, 5.0], 1) == "data"
    assert DATA_PARALLEL_EFFICIENCY == 0.75
    plan = ProbePlan(phase="cpt", data_dir="", base_dir="", out_dir="", cpt_tokens=1000)
    xs = plan.sizes["xs"]
    assert run_cost(plan, {"size": "xs"}, 300) == 6.0 * (12 * xs["n_layer"] * xs["n_embd"] ** 2 + 300 * xs["n_embd"]) * 1000
    assert run_cost(plan, {"size": "xs", "tokens": 500}, 300) == run_cost(plan, {"size": "xs"}, 300) / 2
    with pytest.raises(ValueError, match="parallelism"):
        ProbePlan(phase="cpt", data_dir="", base_dir="", out_dir="", parallelism="model").validate()


def _launch2(plan: Path, **extra_env) -> subprocess.CompletedProcess:
    """The worker on 2 CPU ranks, started as ComputeResource starts it (accelerate launch -m)."""
    from ops.launcher import Launcher

    lz = Launcher(num_processes=2)
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_PIPES_CONTEXT"}
    cmd = lz.command("ops.mixture.probe", ["--spec", str(plan), "--out", str(plan.with_suffix(".run")), "--fingerprint", "fp"],
                     module=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, start_new_session=True,  # own group:
                          env={**env, **lz.env(), "ACCELERATE_USE_CPU": "true", **extra_env})  # fault injection kills it


def test_two_ranks_train_whole_runs_to_the_data_parallel_result_and_resume(tmp_path):
    """parallelism "runs" on 2 ranks: each rank trains whole runs alone (world 1 in each record) and
    rank 0's result holds every run; the losses equal those of the same runs trained data-parallel
    over both ranks (same global batch and data order; float rounding only). A launch killed after
    2 checkpoints resumes its runs to the uninterrupted result."""
    data = _tiny_streams(tmp_path)
    assert _launch(_plan(tmp_path, data, "runs", "base")).returncode == 0
    spec = json.loads(_plan(tmp_path, data, "runs", "cpt").read_text())
    spec["runs"] = [{"size": "xs", "ratio": 0.5, "key": "a", "seed": 0}, {"size": "xs", "ratio": 0.5, "key": "b", "seed": 1},
                    {"size": "xs", "ratio": 0.25, "key": "c", "seed": 0}]
    results = {}
    for mode in ("data", "runs"):
        p = tmp_path / f"{mode}-cpt.json"
        p.write_text(json.dumps({**spec, "out_dir": str(tmp_path / mode), "parallelism": mode}))
        r = _launch2(p)
        assert r.returncode == 0, r.stderr[-3000:]
        results[mode] = json.loads((tmp_path / f"{mode}-cpt.run" / "result.json").read_text())
    d, w = results["data"], results["runs"]
    assert (d["parallelism"], w["parallelism"], d["world_size"], w["world_size"]) == ("data", "runs", 2, 2)
    assert sorted(w["runs"]) == ["a", "b", "c"]
    assert {w["runs"][k]["world_size"] for k in "abc"} == {1} and {d["runs"][k]["world_size"] for k in "abc"} == {2}
    for k in "abc":
        for pd, pw in zip(d["runs"][k]["points"], w["runs"][k]["points"], strict=True):
            assert pw["tokens"] == pd["tokens"]
            assert pw["loss_general"] == pytest.approx(pd["loss_general"], rel=1e-4)
            assert pw["loss_domain"] == pytest.approx(pd["loss_domain"], rel=1e-4)
    # killed after 2 checkpoints of a run (either rank): every run resumes to the same numbers
    p = tmp_path / "crash-cpt.json"
    p.write_text(json.dumps({**spec, "out_dir": str(tmp_path / "crash"), "parallelism": "runs"}))
    crashed = _launch2(p, CRUCIBLE_PROBE_CRASH_AFTER_CHECKPOINTS="2")
    assert crashed.returncode != 0 and "fault injection" in crashed.stderr
    assert not (tmp_path / "crash-cpt.run" / "result.json").exists()
    resumed = _launch2(p)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at step" in resumed.stderr
    got = json.loads((tmp_path / "crash-cpt.run" / "result.json").read_text())["runs"]
    for k in "abc":
        assert [q["loss_domain"] for q in got[k]["points"]] == pytest.approx([q["loss_domain"] for q in w["runs"][k]["points"]], rel=1e-5)
