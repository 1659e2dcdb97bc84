"""The worker side of the launch protocol (ops.launch.worker_main): result file, saved-state removal."""

import json

import pytest

from ops.launch import worker_main


def _spec(tmp_path):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"steps": 3}))
    return p


def test_saved_state_is_removed_only_after_the_result_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    out = tmp_path / "run"
    seen = {}

    def run(spec, out_dir, fp, pipes):
        (out_dir / "state").mkdir()
        (out_dir / "state" / "state.json").write_text("{}")
        seen["state_during_run"] = (out_dir / "state").exists()
        return {"steps_done": spec["steps"]}

    assert worker_main(json.loads, run, ["--spec", str(_spec(tmp_path)), "--out", str(out), "--fingerprint", "ab12"],
                       scratch=("state",)) == 0
    assert seen["state_during_run"] is True
    res = json.loads((out / "result.json").read_text())
    assert res == {"steps_done": 3, "fingerprint": "ab12", "retry_number": None}
    assert not (out / "state").exists()


def test_a_failed_run_keeps_its_saved_state_and_writes_no_result(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    out = tmp_path / "run"

    def run(spec, out_dir, fp, pipes):
        (out_dir / "state").mkdir()
        raise RuntimeError("worker lost")

    with pytest.raises(RuntimeError, match="worker lost"):
        worker_main(json.loads, run, ["--spec", str(_spec(tmp_path)), "--out", str(out)], scratch=("state",))
    assert (out / "state").is_dir()
    assert not (out / "result.json").exists()


def test_a_bad_spec_file_is_named(tmp_path):
    p = tmp_path / "spec.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match=str(p)):
        worker_main(json.loads, lambda *a: {}, ["--spec", str(p), "--out", str(tmp_path / "run")])


def test_a_finished_worker_destroys_its_process_group(tmp_path, monkeypatch):
    """A run that initialised torch.distributed (one gloo rank here) leaves worker_main with the
    default process group destroyed, after its result is written."""
    import torch.distributed as dist

    monkeypatch.delenv("DAGSTER_PIPES_CONTEXT", raising=False)
    seen = {}

    def run(spec, out_dir, fp, pipes):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        seen["during"] = dist.is_initialized()
        return {"ok": True}

    assert worker_main(json.loads, run, ["--spec", str(_spec(tmp_path)), "--out", str(tmp_path / "run")]) == 0
    assert seen["during"] is True and not dist.is_initialized()
    assert json.loads((tmp_path / "run" / "result.json").read_text())["ok"] is True
