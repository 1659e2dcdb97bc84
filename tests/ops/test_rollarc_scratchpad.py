"""RollArc on the scratchpad task: the ``checked_subtraction`` environment (real subprocess checks),
the plain rendering for a tokenizer without a chat template, and a short real driver run with task
``scratchpad`` (docs/rollarc.md; ops/rl/rollarc/envs.py, driver.py)."""

from __future__ import annotations

import time

import pytest

from ops.rl import scratchpad as sp
from ops.rl.rollarc import sandbox
from ops.rl.rollarc.envs import ALL_ENV_NAMES, ENV_NAMES, make_env, tool_math_reward_item
from ops.rl.rollarc.types import Task
from ops.rl.reward import score_one


def _task(p: sp.Problem, work: int = 0) -> Task:
    return Task(p.uid, "checked_subtraction", {"a": p.a, "n": p.n, "answer": p.answer, "answer_type": "numeric",
                                               "check_work": work})


@pytest.mark.parametrize("a,n", [(7, 3), (7, 7 * 8 + 2), (3, 3 * 17 + 1), (9, 9 * 60 + 8)])
def test_correct_trajectory_scores_one(a, n):
    p = sp.Problem("t", a, n)
    env = make_env("checked_subtraction")
    assert "checked_subtraction" in ALL_ENV_NAMES and "checked_subtraction" not in ENV_NAMES
    assert env.reset(_task(p)) == f"{a}:{n}?"
    turns = 0
    for text, obs in sp.tool_turns(a, n):
        r = env.step(text)
        turns += 1
        if obs is not None:
            assert (r.observation, r.done) == (sp.CHECK_OK, False)
    assert r.done and turns == p.lines // 8 + 1
    assert r.info["final_answer"] == p.answer and r.info["checks"] == p.lines // 8
    assert r.info["checked_lines"] == 8 * (p.lines // 8) and not r.info["check_failed"]
    res = score_one(tool_math_reward_item("k", _task(p).spec, r.info["final_answer"]))
    assert (res.score, res.status) == (1.0, "verified")


def test_wrong_line_ends_the_episode_with_reward_zero():
    p = sp.Problem("t", 7, 7 * 20 + 3)                    # 143: 136 129 122 ...
    env = make_env("checked_subtraction")
    env.reset(_task(p))
    first, _ = sp.tool_turns(p.a, p.n)[0]
    assert env.step(first).observation == sp.CHECK_OK
    bad = "\n80\n73\n66\n60\n52\n45\n38\n31?"             # 4th line wrong (59 expected)
    r = env.step(bad)
    assert r.done and r.info["check_failed"] and r.info["final_answer"] is None
    assert r.observation == "check failed at line 4" and r.info["checked_lines"] == 8 + 3
    res = score_one(tool_math_reward_item("k", _task(p).spec, r.info["final_answer"]))
    assert res.score == 0.0
    with pytest.raises(RuntimeError):
        env.step("\n1?")                                  # the episode is over
    env2 = make_env("checked_subtraction")
    env2.reset(_task(p))
    r2 = env2.step("\n136\n12x?")                         # unparseable: no subprocess needed
    assert r2.done and r2.info["check_failed"] and r2.info["checks"] == 0


def test_check_spawns_a_sandboxed_subprocess_and_work_costs_cpu(monkeypatch):
    started = []
    real = sandbox.subprocess.Popen

    def spy(*args, **kw):                                  # records, then the real Popen
        proc = real(*args, **kw)
        started.append((proc.pid, args[0]))
        return proc

    monkeypatch.setattr(sandbox.subprocess, "Popen", spy)
    p = sp.Problem("t", 2, 2 * 24)                        # 3 checked turns + the answer
    cpu = {}
    for work in (0, 200_000):
        env = make_env("checked_subtraction")
        env.reset(_task(p, work))
        for text, _ in sp.tool_turns(p.a, p.n):
            r = env.step(text)
        cpu[work] = r.info["check_cpu_s"]
        assert r.info["checks"] == 3 and r.info["check_wall_s"] > 0
    assert len(started) == 6 and len({pid for pid, _ in started}) == 6
    assert all("-I" in argv and "-c" in argv for _, argv in started)
    assert cpu[200_000] > cpu[0] + 0.05                   # 24 lines x 200k iterations of real work


def test_plain_rendering_and_stop_for_the_char_tokenizer(tmp_path):
    from ops.rl.rollarc.core import SYSTEM
    from ops.rl.rollarc.roles_common import encode, stop_strings

    tok = sp.build_tokenizer(tmp_path)
    p = sp.Problem("t", 3, 3 * 10 + 2)
    t1, o1 = sp.tool_turns(p.a, p.n)[0]
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sp.tool_prompt(p)},
            {"role": "assistant", "content": t1}, {"role": "user", "content": o1}]
    ids = encode(tok, msgs, 256)
    assert ids == sp.encode(tok, sp.tool_prompt(p) + t1 + o1)     # the SFT concatenation, no separators
    assert encode(tok, msgs, 5) == ids[-5:]
    assert stop_strings(tok) == ["?"]


def test_driver_scratchpad_run_reports_the_contract_fields(tmp_path):
    from ops.rl.rollarc.driver import RunSpec, run

    from benchmarks.rl_real_arc import _QuietPipes

    tok_dir = tmp_path / "tok"
    sp.build_tokenizer(tok_dir)                           # tiny random Llama on the char vocabulary
    spec = RunSpec.from_dict(dict(
        problems_path="", task="scratchpad", task_seed=3,
        placement="local", methods=["monolithic", "async0", "rollarc_a1"], eval_size=8, check_work=1000,
        arc={"steps": 2, "groups_per_step": 1, "group_size": 2, "redundancy": 1, "max_turns": 3},
        roles={"tokenizer_dir": str(tok_dir), "model_dir": None, "max_new_tokens": 12, "max_prompt_tokens": 64,
               "lr": 1e-4, "env_latency": "none"}))
    t0 = time.monotonic()
    r = run(spec, _QuietPipes())
    assert time.monotonic() - t0 < 120
    assert r["task"] == "scratchpad" and "2 engine servers" in r["budget"]
    for m in spec.methods:
        res = r["methods"][m]
        ev = r["eval"][m]
        assert [e["step"] for e in ev] == [0, 2] and [e["policy_version"] for e in ev] == [0, 2]
        assert ev[0]["train_wall_s"] == 0.0 and ev[-1]["train_wall_s"] == pytest.approx(res["wall_s"])
        assert all(e["n"] == 8 and 0.0 <= e["accuracy"] <= 1.0 for e in ev)
        assert len(r["response_lengths"][m]) == res["trained_trajectories"] == 2 * 1 * 2
        assert all(t["env"] == "checked_subtraction" for t in res["trajectories"])
        assert {int(k) for k in res["staleness_hist"]} <= set(range((res["async_ratio"] or 0) + 1))
    assert r["eval"]["monolithic"][0] == r["eval"]["async0"][0]      # same initial policy, seeded: measured once
    # the held-out problems are the heldout split, disjoint from every training task by prompt text
    from ops.rl.rollarc.driver import load_tasks

    held = spec.eval_problems()
    assert {sp.split_of(a, n) for _, a, n in held} == {"heldout"} and len(held) == 8
    assert not {(a, n) for _, a, n in held} & {(t.spec["a"], t.spec["n"]) for t in load_tasks(spec)}
    assert set(r["speedup_vs_monolithic"]) == {"async0", "rollarc_a1"}
    with pytest.raises(ValueError, match="roles.env_latency must be 'none' for task 'scratchpad'"):
        RunSpec.from_dict({"task": "scratchpad", "roles": {"tokenizer_dir": str(tok_dir), "env_latency": "heavy"}})
    with pytest.raises(ValueError, match="^placement must be one of"):
        RunSpec.from_dict({"task": "scratchpad", "placement": "x", "roles": {"tokenizer_dir": str(tok_dir), "env_latency": "none"}})
