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


def _launch_exit_driver(tmp_path, name: str, spec: dict):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tests.ops._exit_driver", "--spec", str(tmp_path / f"{name}.json"), "--out", str(tmp_path / name)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_two_gloo_ranks_end_through_exit_worker(tmp_path):
    """A real 2-rank torchrun launch of a driver that all-reduces and gathers over gloo under
    accelerate and ends with exit_worker: both ranks pass the exit barrier and leave through
    os._exit (the driver's atexit marker never prints), exit 0, with the result written and both
    ranks' output flushed. (Ended with sys.exit instead, such a driver aborted after its result in
    6 of 27 launches on the 2-core machine, 2026-12-06; through exit_worker in 0 of 40.)"""
    p = _launch_exit_driver(tmp_path, "run", {"steps": 1})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0 sum 1.57286e+06" in p.stdout and "rank 1 sum 1.57286e+06" in p.stdout, (p.stdout, p.stderr[-2000:])
    assert "interpreter shutdown ran" not in p.stdout and "exit barrier failed" not in p.stderr
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == {
        "sum": 3.0 * 2**19, "ranks": [0, 1], "fingerprint": "", "retry_number": None}


def test_a_rank_missing_at_the_exit_barrier_is_named_and_the_exit_code_kept(tmp_path):
    """Rank 1 leaves without the exit barrier: rank 0's barrier times out after
    barrier_timeout_s, says so, and rank 0 still exits 0 with its result written."""
    p = _launch_exit_driver(tmp_path, "left", {"steps": 1, "rank1_leaves": True, "barrier_timeout_s": 3})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "exit_worker: rank 0: the exit barrier failed" in p.stderr, p.stderr[-3000:]
    assert json.loads((tmp_path / "left" / "result.json").read_text())["ranks"] == [0, 1]


def test_exit_worker_without_a_process_group_is_sys_exit():
    from ops.launch import exit_worker

    with pytest.raises(SystemExit) as e:
        exit_worker(3)
    assert e.value.code == 3
