"""Only the step commits a launched output, and only after the asset succeeded (issue 42 item 8;
case orchestrator-killed-mid-training: "no file of the lake changes without a recorded
materialization"). Real: cpt_base_models on two gloo ranks (tiny sizes), its worker training into
the run folder (assets.launch.staged) and the step committing each base folder."""

import hashlib

import dagster as dg
from assets import mixture, mixture_probes
from resources.compute import ComputeResource
from resources.lake import LakeResource
from tests.assets.test_mixture_assets import TINY_BASE, _corpora


def _digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_failed_step_leaves_the_committed_base_byte_identical_and_a_success_commits(tmp_path, monkeypatch):
    """Case orchestrator-killed-mid-training: a new materialization of cpt_base_models[xs] (other
    settings) whose launch finished but whose step failed afterwards changes no committed file
    (model, optimizer, base.json); the base it trained waits in that run's folder for a
    re-execution (same folder, tests/test_killed_run.py); a successful materialization commits
    its base, with its recorded materialization, and leaves no run folder."""
    lake = LakeResource(root=str(tmp_path / "lake"))
    _corpora(lake)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300)}
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize([mixture.cpt_tokenizer], resources=res, instance=instance,
                          run_config={"ops": {"cpt_tokenizer": {"config": {"vocab_size": 300}}}}).success
    one_init = {**TINY_BASE, "inits": [0]}
    assert dg.materialize([mixture.cpt_base_models], resources=res, partition_key="xs", instance=instance,
                          run_config={"ops": {"cpt_base_models": {"config": one_init}}}).success
    base = tmp_path / "lake" / "cpt_base_models" / "xs"
    before = _digest(base)
    assert {"model.safetensors", "optimizer.pt", "base.json"} <= set(before)

    calls = []
    real = mixture_probes._partition_versions          # the asset's module (assets.mixture re-exports it)

    def fail_once(context, per_key):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated failure after the launch (e.g. while writing metadata)")
        return real(context, per_key)

    monkeypatch.setattr(mixture_probes, "_partition_versions", fail_once)
    other = {"ops": {"cpt_base_models": {"config": {**one_init, "base_tokens": 1024}}}}
    r = dg.materialize([mixture.cpt_base_models], resources=res, partition_key="xs", instance=instance,
                       run_config=other, raise_on_error=False)
    assert not r.success and calls == [1]
    assert _digest(base) == before                                  # nothing committed by a failed step
    [run_dir] = (tmp_path / "lake" / "cpt_base_models").glob(".run-*")
    assert (run_dir / "outputs" / "cpt_base_models" / "xs" / "model.safetensors").exists()

    re = dg.materialize([mixture.cpt_base_models], resources=res, partition_key="xs", instance=instance, run_config=other)
    assert re.success and calls == [1, 1]
    after = _digest(base)
    assert after != before and after["model.safetensors"] != before["model.safetensors"]
    assert list((tmp_path / "lake" / "cpt_base_models").glob(".run-*")) == [run_dir]   # only the failed run's, for its retry
