"""Only the step commits a launched driver's output, after the asset validated the result (issue 42
item 8, the drivers after cpt_base_models; case orchestrator-killed-mid-training: "no file of the
lake changes without a recorded materialization"). One test per driver family, each the approach of
test_launch_commit.py: materialize once, then a materialization with other settings whose launch
finishes but whose step fails right after it (a function the asset calls while it builds its
outputs raises once) must leave every committed lake file byte-identical; where the driver stages
an output, it waits in that run's folder. Real launches at the smallest sizes the asset tests use."""

import hashlib
from pathlib import Path

import dagster as dg
import pytest

from resources.compute import ComputeResource
from resources.lake import LakeResource


def _lake_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, run folders (``.run-*``) left out."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not any(part.startswith(".run-") for part in p.parts)}


def _fail_once(monkeypatch, owner, name: str) -> list:
    """Make ``owner.name`` raise on its first call (a step failing after its launch), then behave."""
    calls, real = [], getattr(owner, name)

    def fail_once(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(f"simulated failure in {name} after the launch")
        return real(*a, **k)

    monkeypatch.setattr(owner, name, fail_once)
    return calls


def _materialize(assets, resources, config, **kw):
    return dg.materialize(assets, resources=resources, run_config={"ops": config}, raise_on_error=False, **kw)


def test_rl_policy_failed_step_leaves_the_committed_policy_byte_identical(tmp_path, monkeypatch):
    """Case orchestrator-killed-mid-training (rl_policy): the warm start of other settings whose step
    fails after the launch changes no committed file (policy folder, table); the trained policy
    waits staged in the run folder with this spec's fingerprint."""
    import json

    from assets import rl_policy as rp
    from tests.assets.test_rl_policy import SMALL

    lake = LakeResource(root=str(tmp_path))
    res = {"lake": lake, "compute": ComputeResource()}
    assert _materialize([rp.rl_policy], res, {"rl_policy": {"config": SMALL}}).success
    before = _lake_digest(tmp_path / "rl_policy")
    assert {"policy/model.safetensors", "policy/metrics.json", "data.delta/_delta_log/00000000000000000000.json"} <= set(before)
    calls = _fail_once(monkeypatch, rp, "_bucket_table")
    r = _materialize([rp.rl_policy], res, {"rl_policy": {"config": {**SMALL, "seed": 1}}})
    assert not r.success and calls == [1]
    assert _lake_digest(tmp_path / "rl_policy") == before
    [run_dir] = (tmp_path / "rl_policy").glob(".run-*")
    staged = run_dir / "outputs" / "policy"
    assert (staged / "model.safetensors").read_bytes() != (tmp_path / "rl_policy/policy/model.safetensors").read_bytes()
    assert json.loads((staged / "metrics.json").read_text())["fingerprint"] != \
        json.loads((tmp_path / "rl_policy/policy/metrics.json").read_text())["fingerprint"]


def test_sft_checkpoint_failed_step_leaves_the_committed_model_byte_identical(tmp_path, monkeypatch):
    """Case orchestrator-killed-mid-training (sft_checkpoint, the SFT worker that stage2_checkpoint
    shares): stage-1 SFT of other settings on 2 gloo ranks whose step fails after the launch (while
    scoring) changes no committed file (model folder, plan.json, scored tables); the trained model
    waits staged in the run folder."""
    import ops.posttrain.evaluate as evaluate
    from assets import posttrain
    from tests.assets.test_posttrain_assets import RUN_CONFIG, _lake

    lake = _lake(tmp_path)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300)}
    cfg = RUN_CONFIG["ops"]["sft_checkpoint"]["config"]
    assert _materialize([posttrain.sft_checkpoint], res, {"sft_checkpoint": {"config": cfg}}).success
    root = tmp_path / "lake" / "sft_checkpoint"
    before = _lake_digest(root)
    assert {"model/model.safetensors", "model/metrics.json", "plan.json", "data.delta/_delta_log/00000000000000000000.json"} <= set(before)
    calls = _fail_once(monkeypatch, evaluate, "score_many")
    r = _materialize([posttrain.sft_checkpoint], res, {"sft_checkpoint": {"config": {**cfg, "schedule": {**cfg["schedule"], "lr": 1e-3}}}})
    assert not r.success and calls == [1]
    assert _lake_digest(root) == before
    [run_dir] = root.glob(".run-*")
    staged = run_dir / "outputs" / "model"
    assert (staged / "model.safetensors").read_bytes() != (root / "model" / "model.safetensors").read_bytes()


@pytest.mark.slow      # ctr_events + two real gba_run launches (1 PS + 2 RPC workers), ~1 min on 2 shared cores
def test_gba_run_failed_step_leaves_the_committed_partition_byte_identical(tmp_path, monkeypatch):
    """Case orchestrator-killed-mid-training (gba_run): a gba partition of other settings whose step
    fails after the launch (while building its metadata) changes no committed file (result.json,
    eval-curve table); the drivers' data cache is outside the lake."""
    from assets import gba, recsys
    from tests.assets.test_gba_assets import TINY

    lake = LakeResource(root=str(tmp_path))
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300)}
    assert dg.materialize([recsys.ctr_events], resources={"lake": lake}).success
    assert _materialize([gba.gba_run], res, {"gba_run": {"config": TINY}}, partition_key="gba").success
    before = _lake_digest(tmp_path / "gba_run")
    assert "gba/result.json" in before and not (tmp_path / "gba_run" / "cache").exists()
    calls = _fail_once(monkeypatch, gba, "summarize")
    r = _materialize([gba.gba_run], res, {"gba_run": {"config": {**TINY, "train": {**TINY["train"], "seed": 7}}}}, partition_key="gba")
    assert not r.success and calls == [1]
    assert _lake_digest(tmp_path / "gba_run") == before


RL = [("rollpacker", "rollpacker_run", "summarize"), ("rollarc", "rollarc_run", "summary_rows")]


@pytest.mark.slow      # two real Ray launches per driver, ~1-2 min each on 2 shared cores
@pytest.mark.parametrize("module, asset, fails", RL, ids=[a for _, a, _ in RL])
def test_rl_run_failed_step_leaves_the_committed_run_byte_identical(tmp_path, monkeypatch, module, asset, fails):
    """Case orchestrator-killed-mid-training (rollpacker_run, rollarc_run): a run of another seed
    whose step fails after the launch (while summarizing) changes no committed file (step table,
    trajectories, result.json)."""
    import importlib

    pytest.importorskip("ray")
    from tests.conftest import lake_with_problems

    mod = importlib.import_module(f"assets.{module}")
    tiny = importlib.import_module(f"tests.assets.test_{module}_assets").TINY
    if not (Path(tiny["model_dir"]) / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    lake = lake_with_problems(tmp_path)
    res = {"lake": lake, "compute": ComputeResource()}
    assert _materialize([getattr(mod, asset)], res, {asset: {"config": tiny}}).success
    before = _lake_digest(tmp_path / asset)
    assert {"data.delta/_delta_log/00000000000000000000.json", "result.json"} <= set(before)
    calls = _fail_once(monkeypatch, mod, fails)
    # another seed: RollPacker's config has it at the top, RollArc's under roles (its RoleSpec)
    other = {**tiny, "roles": {**tiny["roles"], "seed": 3}} if "roles" in tiny else {**tiny, "seed": 3}
    r = _materialize([getattr(mod, asset)], res, {asset: {"config": other}})
    assert not r.success and calls == [1]
    assert _lake_digest(tmp_path / asset) == before


def test_cpt_probe_runs_failed_step_leaves_the_committed_metrics_byte_identical(tmp_path, monkeypatch):
    """Case orchestrator-killed-mid-training (cpt_probe_runs): a probe partition of other CPT settings
    on 2 gloo ranks whose step fails after the launch (while reading the runs) changes no committed
    file (metrics.json, launch.json, the partition's table); the new metrics.json waits staged in
    the run folder. A base of cpt_base_models is the start (tests/assets/test_launch_commit.py covers
    that asset)."""
    import json

    from assets import mixture, mixture_probes
    from tests.assets.test_mixture_assets import TINY_BASE, _corpora

    lake = LakeResource(root=str(tmp_path / "lake"))
    _corpora(lake)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300)}
    assert _materialize([mixture.cpt_tokenizer], res, {"cpt_tokenizer": {"config": {"vocab_size": 300}}}).success
    assert _materialize([mixture.cpt_base_models], res, {"cpt_base_models": {"config": {**TINY_BASE, "inits": [0]}}},
                        partition_key="xs").success
    key = dg.MultiPartitionKey({"size": "xs", "ratio": "0.50"})
    cpt = {"cpt_tokens": 256, "first_checkpoint": 128, "seeds": [0]}
    assert _materialize([mixture.cpt_probe_runs], res, {"cpt_probe_runs": {"config": cpt}}, partition_key=key).success
    root = tmp_path / "lake" / "cpt_probe_runs"
    before = _lake_digest(root)
    assert {"launch.json", "xs_r0.500/metrics.json"} <= set(before)
    calls = _fail_once(monkeypatch, mixture_probes, "partition_table")   # reads the runs after the launch
    r = _materialize([mixture.cpt_probe_runs], res, {"cpt_probe_runs": {"config": {**cpt, "cpt_tokens": 384}}},
                     partition_key=key)
    assert not r.success and calls == [1]
    assert _lake_digest(root) == before
    [run_dir] = root.glob(".run-*")
    staged = json.loads((run_dir / "outputs" / "cpt_probe_runs" / "xs_r0.500" / "metrics.json").read_text())
    assert staged["fingerprint"] != json.loads((root / "xs_r0.500" / "metrics.json").read_text())["fingerprint"]
