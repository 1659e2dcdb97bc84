"""RollArc environments: the sandboxed calculator, FrozenLake as text, tool-use math, the latency
knob and the in-process episode loop with its four statuses. The calculator's behaviour is checked
in both sandbox modes (bwrap skips without bubblewrap, except in CI; the escape battery is in
test_sandbox_escape.py)."""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections import deque

import pytest

from ops.rl.rollarc.envs import (ENV_NAMES, EnvLatency, FrozenLakeText, LatentEnv, ToolMath,
                                 frozenlake_map, make_env, parse_final_answer,
                                 parse_frozenlake_action, run_episode, tool_math_reward_item,
                                 verify_frozenlake)
from ops.rl.rollarc.sandbox import SANDBOX_MODES, SandboxUnavailable, require, run_python
from ops.rl.rollarc.types import EPISODE_STATUSES, Task

def _env_sandbox() -> str:
    """The mode the environment tests run in: bwrap where installed (and always in CI, where a
    missing bwrap must fail), else the explicitly weaker rlimits."""
    try:
        require("bwrap")
        return "bwrap"
    except SandboxUnavailable:
        return "bwrap" if (os.environ.get("CI") or os.environ.get("CRUCIBLE_SANDBOX_REQUIRED")) else "rlimits"


ENV_SANDBOX = _env_sandbox()


@pytest.fixture(params=SANDBOX_MODES)
def sb(request):
    """Each sandbox mode; bwrap skips where bubblewrap is missing (fails in CI)."""
    if request.param == "bwrap" and ENV_SANDBOX != "bwrap":
        pytest.skip("bubblewrap (bwrap) is not installed here; CI installs it (.ci/run)")
    return request.param


MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def shortest_path(desc: list[str]) -> list[str]:
    """BFS over frozen tiles from S to G (independent of the env code)."""
    n = len(desc)
    prev = {(0, 0): None}
    q = deque([(0, 0)])
    while q:
        r, c = q.popleft()
        if desc[r][c] == "G":
            path, node = [], (r, c)
            while prev[node] is not None:
                node, move = prev[node]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and desc[nr][nc] != "H" and (nr, nc) not in prev:
                prev[(nr, nc)] = ((r, c), move)
                q.append((nr, nc))
    raise AssertionError("no path")


def scripted(replies):
    """A policy that says the next of ``replies`` each turn (repeating the last)."""
    def policy(messages):
        k = sum(m["role"] == "assistant" for m in messages)
        return replies[min(k, len(replies) - 1)]
    return policy


def lake(seed, size=4):
    return Task(f"fl-{seed}", "frozenlake", {"map_seed": seed, "size": size})


def math_task(problem="What is 6 times 7?", answer="42"):
    return Task("tm-1", "tool_math", {"problem": problem, "answer": answer, "answer_type": "numeric"})


# ------------------------------------------------------------------------------------------ sandbox

def test_sandbox_evaluates_arithmetic_math_and_statements(sb):
    assert run_python("2**10", sandbox=sb).output == "1024"
    assert run_python("math.sqrt(2)", sandbox=sb).output == repr(math.sqrt(2))
    r = run_python("x = comb(5, 2)\nprint('c', x)\nx * 2", sandbox=sb)
    assert (r.ok, r.output, r.error) == (True, "c 10\n20", "")


def test_sandbox_infinite_loop_is_stopped_by_cpu_limit_before_wall_limit(sb):
    r = run_python("while True: pass", cpu_s=0.3, wall_s=20.0, sandbox=sb)
    assert not r.ok and r.error == "CPU time limit exceeded (0.3 s)"
    # stopped at the limit, not before: ITIMER_PROF and wait4's rusage account CPU time separately
    # (rusage's utime + stime are tick samples scaled to the run time), so the reported time may sit
    # below 0.3 s: measured 0.2555-0.3606 s over 36 runs at load 9-10 (issue 42 review)
    assert 0.2 <= r.cpu_s < 1.5 and r.wall_s < 10.0


def test_sandbox_sleep_is_stopped_by_wall_limit(sb):
    r = run_python("import time; time.sleep(100)", cpu_s=1.0, wall_s=0.5, sandbox=sb)
    assert not r.ok and r.error == "wall-clock limit exceeded (0.5 s)"
    assert 0.5 <= r.wall_s < 3.0


def test_sandbox_refuses_file_writes(sb, tmp_path):
    target = tmp_path / "out.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')", sandbox=sb)
    assert not r.ok and r.error.startswith("PermissionError") and "writing" in r.error
    r = run_python(f"import os; os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)", sandbox=sb)
    assert not r.ok and "writing" in r.error
    assert not target.exists()


def test_sandbox_refuses_sockets_processes_and_foreign_reads(sb):
    for code in ("import socket; socket.socket()", "__import__('_socket')",
                 "import os; os.system('true')", "import os; os.fork()", "open('/etc/hostname').read()"):
        r = run_python(code, sandbox=sb)
        assert not r.ok and r.error.startswith("PermissionError: sandbox:"), (code, r)


def test_sandbox_child_does_not_see_parent_environment(sb, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_SANDBOX_SECRET", "s3cret")
    r = run_python("import os; sorted(os.environ)", sandbox=sb)
    # Python's locale coercion (PEP 538) may add LC_CTYPE to an empty environment; nothing else
    assert r.ok and r.output in ("[]", "['LC_CTYPE']")


def test_sandbox_memory_and_output_caps_and_errors_are_returned(sb):
    r = run_python("x = bytearray(2 * 1024**3)", mem_mb=256, sandbox=sb)
    assert (r.ok, r.error) == (False, "MemoryError")
    r = run_python("print('a' * 10000)", max_output_chars=100, sandbox=sb)
    assert r.ok and r.output.startswith("a" * 100) and r.output.endswith("[output truncated]") and len(r.output) < 130
    assert run_python("1/0", sandbox=sb).error == "ZeroDivisionError: division by zero"


def test_sandbox_bad_arguments_raise_value_error(sb):
    for kw in ({"cpu_s": 0}, {"wall_s": -1}, {"mem_mb": 8}):
        with pytest.raises(ValueError):
            run_python("1", **kw, sandbox=sb)
    with pytest.raises(ValueError, match="str"):
        run_python(b"1", sandbox=sb)


def test_sandbox_is_thread_safe(sb):
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, run_python(f"{i} ** 3", sandbox=sb).output))
               for i in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert out == {i: str(i ** 3) for i in range(6)}


# --------------------------------------------------------------------------------------- FrozenLake

def test_frozenlake_map_comes_from_gymnasium_seeded_generator():
    assert frozenlake_map({"map_seed": 3}) == ["SFHF", "FFFF", "FFFF", "FFFG"]
    assert frozenlake_map({"map_seed": 5, "size": 6}) == frozenlake_map({"map_seed": 5, "size": 6})


@pytest.mark.parametrize("seed,size", [(0, 4), (7, 5), (11, 6)])
def test_shortest_path_policy_reaches_goal_and_verifies(seed, size):
    path = shortest_path(frozenlake_map({"map_seed": seed, "size": size}))
    policy = scripted([f"I will go {m}.\nAction: {m}" for m in path])
    status, turns, info, transcript = run_episode(make_env("frozenlake"), lake(seed, size), policy, 40, 5.0, 30.0)
    assert (status, turns) == ("ok", len(path))
    assert info["reached_goal"] and info["actions"] == path and info["invalid_actions"] == 0
    assert verify_frozenlake({"map_seed": seed, "size": size}, info["actions"]) == 1.0
    assert "reached the goal" in transcript[-1]["content"] and len(transcript) == 2 * turns + 1


def test_walking_into_a_hole_ends_the_episode_without_reward():
    env = FrozenLakeText()
    first = env.reset(lake(3))
    assert "PFHF" in first and "Action: right" in first
    assert "edge" in env.step("Action: up").observation           # bump: stays at (0, 0)
    env.step("right")
    r = env.step("right")                                        # (0, 2) is H on map seed 3
    assert r.done and r.info["fell_in_hole"] and not r.info["reached_goal"]
    assert r.info["actions"] == ["up", "right", "right"]
    assert verify_frozenlake({"map_seed": 3}, r.info["actions"]) == 0.0
    with pytest.raises(RuntimeError, match="ended"):
        env.step("down")


def test_policy_without_moves_is_truncated_with_every_turn_invalid():
    status, turns, info, transcript = run_episode(make_env("frozenlake"), lake(3), scripted(["hello"]), 5, 5.0, 30.0)
    assert (status, turns, info["invalid_actions"], info["actions"]) == ("truncated", 5, 5, [])
    assert "Invalid action" in transcript[-1]["content"]


def test_gymnasium_step_limit_is_reported_as_truncated():
    status, turns, info, _ = run_episode(make_env("frozenlake"), lake(3), scripted(["left"]), 150, 5.0, 60.0)
    assert (status, turns, info["truncated"]) == ("truncated", 100, True)


def test_frozenlake_action_parsing():
    assert parse_frozenlake_action("maybe left... Action: **Down**") == "down"
    assert parse_frozenlake_action("Action: up\nAction: right") == "right"
    assert parse_frozenlake_action("go Left then right") == "left"
    assert parse_frozenlake_action("leftover upward") is None


def test_verify_frozenlake_is_a_pure_replay():
    spec = {"map_seed": 3}
    win = ["down", "down", "down", "right", "right", "right"]
    assert verify_frozenlake(spec, win) == 1.0
    assert verify_frozenlake(spec, [1, 1, 1, 2, 2, 2, "up", "up"]) == 1.0  # ids; moves after the end ignored
    assert verify_frozenlake(spec, win[:-1]) == 0.0
    with pytest.raises(ValueError, match="action"):
        verify_frozenlake(spec, ["jump"])
    with pytest.raises(ValueError, match="map_seed"):
        verify_frozenlake({"size": 4}, win)


# ----------------------------------------------------------------------------------------- ToolMath

def test_tool_math_calculator_then_answer_is_ok_and_reward_item_verifies():
    policy = scripted(["Let me compute. <calc>6*7</calc>", "The product is 42.\nAnswer: 42"])
    status, turns, info, transcript = run_episode(make_env("tool_math", sandbox=ENV_SANDBOX), math_task(), policy, 6, 10.0, 30.0)
    assert (status, turns, info["final_answer"], info["calc_calls"]) == ("ok", 2, "42", 1)
    assert transcript[2] == {"role": "user", "content": "Result: 42"}
    item = tool_math_reward_item("tm-1/0", math_task().spec, info["final_answer"])
    assert (item.response, item.answer) == ("\\boxed{42}", "42")
    from ops.rl.reward import score_one
    assert score_one(item).status == "verified"


def test_tool_math_errors_invalid_turns_and_call_cap():
    env = ToolMath(max_calls_per_turn=2, sandbox=ENV_SANDBOX)
    assert "Problem: What is 6 times 7?" in env.reset(math_task())
    r = env.step("<calc>1/0</calc> <calc>2**0.5</calc> <calc>3</calc>")
    assert r.observation.splitlines() == ["[1] Error: ZeroDivisionError: division by zero",
                                          f"[2] Result: {2 ** 0.5!r}",
                                          "(only the first 2 <calc> calls of a reply are run)"]
    assert (r.info["calc_calls"], r.info["calc_errors"]) == (2, 1)
    r = env.step("<calc>2+2")
    assert "unclosed" in r.observation and r.info["invalid_actions"] == 1 and not r.done
    r = env.step("thinking...")
    assert r.info["invalid_actions"] == 2 and not r.done
    r = env.step("So the result is \\boxed{\\frac{84}{2}}.")
    assert r.done and r.info["final_answer"] == "\\frac{84}{2}"
    with pytest.raises(RuntimeError):
        env.step("Answer: 1")


def test_final_answer_parsing():
    assert parse_final_answer("work\n**Answer:** $3.5$.") == "3.5"
    assert parse_final_answer("Final answer: x = 2") == "x = 2"
    assert parse_final_answer("Answer: 1\n\\boxed{2}") == "2"
    assert parse_final_answer("the answer is 4") is None
    assert parse_final_answer("\\boxed{}") is None


def test_env_errors_are_reported_with_their_message():
    status, turns, info, transcript = run_episode(make_env("tool_math", sandbox=ENV_SANDBOX), Task("x", "tool_math", {"answer": "1"}),
                                                  scripted(["Answer: 1"]), 3, 5.0, 10.0)
    assert (status, turns, transcript) == ("env_error", 0, [])
    assert info["error"].startswith("env.reset raised ValueError") and "'problem'" in info["error"]

    class CrashOnSecondStep(FrozenLakeText):
        def step(self, action_text):
            if len(self._actions) == 1:
                raise OSError("worker lost its map")
            return super().step(action_text)

    status, turns, info, _ = run_episode(CrashOnSecondStep(), lake(3), scripted(["down"]), 5, 5.0, 10.0)
    assert (status, turns, info["error"]) == ("env_error", 2, "env.step (turn 2) raised OSError: worker lost its map")
    assert info["actions"] == ["down"]  # the last good step's info is kept


# ---------------------------------------------------------------------------------- timeouts, latency

def test_slow_step_times_out_without_hanging():
    slow = LatentEnv(FrozenLakeText(), EnvLatency("low", mean_s=3.0, seed=0))
    t = time.monotonic()
    status, turns, info, _ = run_episode(slow, lake(3), scripted(["down"]), 5, 0.2, 30.0)
    assert time.monotonic() - t < 1.5
    assert (status, turns, info["error"]) == ("timeout", 1, "env.step (turn 1) exceeded the turn timeout of 0.2 s")


def test_episode_timeout_bounds_a_slow_policy():
    def slow_policy(messages):
        time.sleep(0.12)
        return "Action: left"
    status, turns, info, _ = run_episode(make_env("frozenlake"), lake(3), slow_policy, 50, 5.0, 0.4)
    assert status == "timeout" and 2 <= turns <= 5 and "episode timeout of 0.4 s" in info["error"]


def test_latency_kinds_share_the_mean_and_differ_in_tail():
    n = 100_000
    q = {}
    for kind in ("low", "medium", "heavy"):
        latency = EnvLatency(kind, mean_s=2.0, seed=1)
        xs = sorted(latency.sample() for _ in range(n))
        q[kind] = (statistics.fmean(xs), xs[n // 2], xs[int(0.99 * n)], xs[0])
    assert abs(q["low"][0] - 2.0) < 0.02 and abs(q["medium"][0] - 2.0) < 0.05
    # Pareto(1.5) has infinite variance: pin its scale with robust statistics, the mean loosely
    assert abs(q["heavy"][1] - 2.0 / 3 * 2 ** (1 / 1.5)) < 0.02 and q["heavy"][3] >= 2.0 / 3
    assert abs(q["heavy"][0] - 2.0) < 0.5
    ratio = {k: v[2] / v[1] for k, v in q.items()}
    assert ratio["low"] < 1.35 and 4.5 < ratio["medium"] < 7.0 and 12.0 < ratio["heavy"] < 15.5
    assert EnvLatency("none", 1.0).sample() == 0.0
    a, b = EnvLatency("heavy", 1.0, seed=4), EnvLatency("heavy", 1.0, seed=4)
    assert [a.sample() for _ in range(3)] == [b.sample() for _ in range(3)]
    clipped = EnvLatency("heavy", 1.0, seed=0, max_s=2.5)
    assert max(clipped.sample() for _ in range(2000)) == 2.5
    with pytest.raises(ValueError, match="kind"):
        EnvLatency("spiky", 1.0)


def test_make_env_names_kwargs_and_latency_wrapper():
    assert ENV_NAMES == ("frozenlake", "tool_math") and set(EPISODE_STATUSES) >= {"ok", "timeout"}
    assert make_env("tool_math", cpu_s=0.5, sandbox=ENV_SANDBOX).cpu_s == 0.5
    env = make_env("frozenlake", latency=EnvLatency("low", mean_s=0.05, seed=0))
    assert isinstance(env, LatentEnv) and env.name == "frozenlake"
    env.reset(lake(3))
    t = time.monotonic()
    r = env.step("down")
    assert time.monotonic() - t >= 0.03 and 0.03 < r.info["injected_latency_s"] < 0.08
    assert isinstance(make_env("frozenlake", latency=EnvLatency("none")), FrozenLakeText)
    with pytest.raises(ValueError, match="unknown environment"):
        make_env("taxi")


def test_many_episodes_in_threads_do_not_interfere():
    results = {}

    def play(seed):
        path = shortest_path(frozenlake_map({"map_seed": seed, "size": 5}))
        results[seed] = (path, run_episode(make_env("frozenlake"), lake(seed, 5),
                                           scripted([f"Action: {m}" for m in path]), 40, 10.0, 60.0))

    threads = [threading.Thread(target=play, args=(s,)) for s in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for seed, (path, (status, turns, info, _)) in results.items():
        assert (status, turns, info["actions"], info["reached_goal"]) == ("ok", len(path), path, True), seed
