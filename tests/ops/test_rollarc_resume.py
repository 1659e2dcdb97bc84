"""RollArc runs resume after their last saved step (``ops.rl.rollarc.driver.RunState``): a run
interrupted right after a checkpoint continues on a relaunch over the same folder — trainer state
loaded into the same ``_TrainerImpl`` RollPacker uses, the policy version published to the engine,
the tasks after the consumed ones — to the rows of an uninterrupted run. In process with the
colocated roles (``LocalRoles``: the monolithic baseline, no Ray) and the tiny random policy; the
Ray path (RollArc on the pools, a real SIGKILL and a Dagster retry) runs in
tests/assets/test_rollarc_assets.py."""

import os
from pathlib import Path

import polars as pl
import pytest

from ops.rl.rollarc import driver
from dataclasses import asdict

from ops.rl.rollarc.driver import CRASH_ENV, RunSpec, RunState, crash_if_asked, fingerprint
from tests.conftest import RecordingPipes

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"
TIMING = {"wait_s", "train_s"}
TRAJ_TIMING = {"llm_s", "env_s", "reward_s", "wall_s"}


class Crash(Exception):
    pass


Pipes = RecordingPipes


def make_spec(tmp_path, **kw) -> RunSpec:
    problems = tmp_path / "problems.parquet"
    if not problems.exists():
        pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(8)], "problem": [f"What is {i} + {i}?" for i in range(8)],
                      "answer": [str(2 * i) for i in range(8)], "answer_type": ["numeric"] * 8}).write_parquet(problems)
    args = dict(problems_path=str(problems), methods=["monolithic"],
                arc={"steps": 3, "groups_per_step": 2, "group_size": 2, "redundancy": 0, "async_ratio": 0, "max_turns": 2},
                roles={"tokenizer_dir": str(MODEL_DIR), "max_new_tokens": 8, "env_latency": "none", "lr": 1e-2},
                checkpoint_every=1)
    return RunSpec.from_dict({**args, **kw})          # nested data -> the typed arc / roles, validated


def test_an_interrupted_run_resumes_after_its_last_saved_step_to_the_uninterrupted_rows(tmp_path):
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    spec = make_spec(tmp_path)
    fp = fingerprint(spec)

    def launch(out, retry, on_saved=None):
        pipes, state = Pipes(retry), RunState(out, fp)
        state.load()
        return driver.run(spec, pipes, state, on_saved=on_saved), pipes, state

    whole, _, _ = launch(tmp_path / "whole", 0)

    def crash_after_2(n):                      # steps 0 and 1 saved, then the "kill"
        if n == 2:
            raise Crash()

    with pytest.raises(Crash):
        launch(tmp_path / "cut", 0, crash_after_2)
    saved = RunState(tmp_path / "cut", fp)
    assert saved.load() and saved.done == {} and saved.steps_done == 2
    assert (saved.current["method"], saved.current["step"], saved.current["version"]) == ("monolithic", 1, 2)
    assert saved.current["result"]["tasks_consumed"] == 4 and len(saved.current["result"]["trajectories"]) == 8
    assert [p.name for p in saved.dir.glob("*.pt")] == ["trainer-monolithic-1.pt"]     # the previous one removed

    res, pipes, state = launch(tmp_path / "cut", 1)
    log = "\n".join(pipes.lines)
    assert "monolithic: resuming after step 1 (policy version 2 published to the engines) on Dagster retry 1" in log
    assert "monolithic: 2 of 3 steps of the run done; continuing with task 4 of" in log
    assert "monolithic: step 3/3" in log
    assert [m["step"] for m in pipes.messages] == [2]                      # only the missing step ran
    assert state.resumes == [{"method": "monolithic", "after_step": 1, "policy_version": 2, "steps_done": 2,
                              "retry_number": 1}]
    assert res["resumes"] == state.resumes and res["retry_number"] == 1 and res["fingerprint"] == fp
    a, b = res["methods"]["monolithic"], whole["methods"]["monolithic"]
    strip = lambda rows, drop: [{k: v for k, v in r.items() if k not in drop} for r in rows]   # noqa: E731
    # same tasks, group ids, sampled tokens, rewards and losses: weights, AdamW state and RNG came back
    assert strip(a["steps"], TIMING) == strip(b["steps"], TIMING)
    assert strip(a["trajectories"], TRAJ_TIMING) == strip(b["trajectories"], TRAJ_TIMING)
    assert (a["tasks_consumed"], a["trained_trajectories"], a["staleness_hist"]) == (6, 12, {"0": 6})
    assert state.done.keys() == {"monolithic"} and state.current is None and not list(state.dir.glob("*.pt"))

    # a relaunch after the method finished skips it
    res2, pipes2, _ = launch(tmp_path / "cut", 2)
    assert "monolithic: finished before this launch (3 steps), skipped" in "\n".join(pipes2.lines)
    assert res2["methods"]["monolithic"]["steps"] == a["steps"] and not pipes2.messages


def test_checkpoint_every_saves_every_kth_step_and_never_the_last(tmp_path):
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    spec = make_spec(tmp_path, checkpoint_every=2, arc={"steps": 5, "groups_per_step": 1, "group_size": 2,
                                                          "redundancy": 0, "async_ratio": 0, "max_turns": 1})
    state, saves = RunState(tmp_path / "out", fingerprint(spec)), []
    driver.run(spec, Pipes(0), state, on_saved=lambda n: saves.append((n, state.current and state.current["step"])))
    assert saves == [(2, 1), (4, 3), (5, None)]              # after steps 1 and 3; then the finished method


def test_crash_injection_fires_once_over_the_run(monkeypatch):
    kills, lines = [], []
    monkeypatch.setattr(os, "killpg", lambda pg, sig: kills.append(sig))
    monkeypatch.setenv(CRASH_ENV, "4")
    for count, loaded in ((3, 0), (4, 0), (5, 4), (6, 4)):  # first launch: fires at 4; the relaunch loaded 4
        crash_if_asked(count, loaded, lines.append)
    assert len(kills) == 1 and "after 4 saved steps" in lines[0]
    crash_if_asked(5, 2, lines.append)                      # a save past N (checkpoint_every > 1) fires too
    assert len(kills) == 2
    monkeypatch.setenv(CRASH_ENV, "x")
    with pytest.raises(ValueError, match=CRASH_ENV):
        crash_if_asked(1, 0, lines.append)


def test_state_of_another_spec_is_ignored_and_the_fingerprint_ignores_timeouts(tmp_path):
    spec = make_spec(tmp_path)
    same = make_spec(tmp_path, num_cpus=8, ray_address="ray://x:10001", checkpoint_every=3,
                     arc={**asdict(spec.arc), "turn_timeout_s": 99.0}, roles={**asdict(spec.roles), "llm_timeout_s": 5.0})
    assert fingerprint(same) == fingerprint(spec)
    other = make_spec(tmp_path, arc={**asdict(spec.arc), "steps": 5})
    assert fingerprint(other) != fingerprint(spec)
    s = RunState(tmp_path / "out", fingerprint(spec))
    s.save_done("monolithic", {"steps": [{"step": 0}]})
    t = RunState(tmp_path / "out", fingerprint(other))
    assert not t.load() and "from another spec" in t.skipped
    (tmp_path / "out" / "state" / "state.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        RunState(tmp_path / "out", fingerprint(spec)).load()
