"""Experiment tracking (ops/tracking.py, docs/operations.md "Experiment tracking") against a real
MLflow tracking server on loopback (``mlflow server`` over SQLite, its own process group): a real
``rl_policy`` materialization through the launch protocol logs its loss and held-out curves into one
MLflow run tagged with the Dagster run; a crashed launch's retry appends to the same MLflow run; an
unreachable server costs a warning, never the training; the message-to-metric mapping."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.launcher import free_port
from ops.tracking import EXPERIMENT_ENV, URI_ENV, flatten_message
from tests.assets.test_rl_policy import SMALL as ASSET_CONFIG
from tests.conftest import kill_group, wait_until_serving

SMALL = {k: v for k, v in ASSET_CONFIG.items() if k != "timeout_s"}       # the worker spec has no launch timeout


def _warmstart_spec(ws, **fields):
    """The worker spec of the asset config ``SMALL`` + ``fields``: the asset config's partial
    ``schedule`` applied over WarmStartSpec's own schedule defaults (as the asset's Launchpad defaults do)."""
    import dataclasses

    cfg = {**SMALL, **fields}
    base = ws.WarmStartSpec(out_dir=cfg["out_dir"])
    cfg["schedule"] = dataclasses.replace(base.schedule, **cfg.get("schedule", {}))
    return ws.WarmStartSpec(**cfg).validate()

pytest.importorskip("mlflow", reason="the tracking test needs mlflow-skinny (the dev extra)")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``http://127.0.0.1:<port>`` of a fresh MLflow tracking server (killed by process group after)."""
    tmp = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = (tmp / "server.log").open("wb")
    mlflow_cli = str(Path(sys.executable).parent / "mlflow")
    proc = subprocess.Popen([mlflow_cli, "server", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
                             "--default-artifact-root", str(tmp / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, f"{uri}/health", 180, tmp / "server.log", "mlflow server")
        yield uri
    finally:
        kill_group(proc)
        log.close()


def _runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


def test_a_real_launch_logs_its_curves_into_one_mlflow_run_tagged_with_the_dagster_run(tmp_path, mlflow_server):
    from assets import rl_policy as rp
    from resources.compute import ComputeResource
    from resources.lake import LakeResource
    from tests.conftest import materialize_logged

    lake = LakeResource(root=str(tmp_path))
    compute = ComputeResource(tracking_uri=mlflow_server, tracking_experiment="asset-run")
    res, meta, log, _ = materialize_logged([rp.rl_policy], {"lake": lake, "compute": compute},
                                           {"ops": {"rl_policy": {"config": {**ASSET_CONFIG, "log_every": 2}}}})
    assert res.success
    metrics = json.loads((tmp_path / "rl_policy" / "policy" / "metrics.json").read_text())
    client, runs = _runs(mlflow_server, "asset-run")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "rl_policy"
    assert run.data.tags["dagster.run_id"] == res.run_id and run.data.tags["dagster.asset"] == "rl_policy"
    assert run.data.params["max_steps"] == "6" and run.data.params["n_embd"] == "32"
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert loss == [(p["step"], pytest.approx(p["loss"])) for p in metrics["loss_curve"]]
    assert [s for s, _ in loss] == [2, 4, 6]
    acc = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval.accuracy"))
    assert acc == [(p["step"], pytest.approx(p["accuracy"])) for p in metrics["eval_curve"]]
    assert f"tracking: MLflow run {run.info.run_id} at {mlflow_server}" in log


def test_a_retried_launch_appends_to_the_same_mlflow_run(tmp_path, mlflow_server, monkeypatch):
    from ops.lm.train import SimulatedCrash
    from ops.rl import warmstart as ws

    spec = _warmstart_spec(ws, out_dir=str(tmp_path / "policy"), log_every=1, max_steps=4, checkpoint_every=2)
    (tmp_path / "spec.json").write_text(spec.to_json())
    argv = ["--spec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "run"), "--fingerprint", "fp"]
    monkeypatch.setenv(URI_ENV, mlflow_server)
    monkeypatch.setenv(EXPERIMENT_ENV, "retry")
    monkeypatch.setenv(ws.CRASH_ENV, "2")
    with pytest.raises(SimulatedCrash):
        ws.main(argv)
    client, runs = _runs(mlflow_server, "retry")
    assert [r.info.status for r in runs] == ["FAILED"]
    first = json.loads((tmp_path / "run" / "tracking.json").read_text())["run_id"]
    ws.main(argv)                                                     # the retry resumes at step 2
    client, runs = _runs(mlflow_server, "retry")
    assert [(r.info.run_id, r.info.status) for r in runs] == [(first, "FINISHED")]
    steps = sorted(m.step for m in client.get_metric_history(first, "loss"))
    assert steps == [1, 2, 3, 4]                                      # steps 1-2 before the crash, 3-4 after


def test_an_unreachable_server_costs_a_warning_never_the_training(tmp_path, monkeypatch, caplog):
    from ops.rl import warmstart as ws

    spec = _warmstart_spec(ws, out_dir=str(tmp_path / "policy"), max_steps=2, eval_every=2)
    (tmp_path / "spec.json").write_text(spec.to_json())
    monkeypatch.setenv(URI_ENV, f"http://127.0.0.1:{free_port()}")    # nothing listens there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    with caplog.at_level("WARNING", logger="crucible.rank0"):
        ws.main(["--spec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "run")])
    assert json.loads((tmp_path / "run" / "result.json").read_text())["steps"] == 2
    assert "experiment tracking at http://127.0.0.1" in caplog.text and "could not start" in caplog.text
    assert not (tmp_path / "run" / "tracking.json").exists()


def test_messages_map_to_metrics_by_series_and_step():
    assert flatten_message({"method": "tail_batching", "step": 3, "reward_mean": 0.25, "round": "long",
                            "sync": {"version": 4, "stale": False}, "lengths": [1, 2]}) == \
        ("tail_batching", 3.0, {"reward_mean": 0.25, "sync.version": 4.0, "sync.stale": 0.0})
    assert flatten_message({"eval": {"step": 50, "accuracy": 0.5, "n": 128}}) == (None, 50.0, {"eval.accuracy": 0.5, "eval.n": 128.0})
    assert flatten_message({"run": "xs-0.25", "tokens": 4096, "loss_general": 3.5, "nan": float("nan")}) == \
        ("xs-0.25", 4096.0, {"loss_general": 3.5})
    assert flatten_message({"global_step": 12.5, "auc": 0.7}) == (None, 12.5, {"auc": 0.7})
    assert flatten_message({"reused": True}) == (None, None, {"reused": 1.0})
