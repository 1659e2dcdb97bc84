"""The in-process episode loop (``run_episode``): the synchronous baseline's and the tests' way to
play one episode with per-call and per-episode timeouts; RollArc's async driver calls ``env.step``
on its own workers instead."""

from __future__ import annotations

import threading
import time
from typing import Callable

from ops.rl.rollarc.types import Task

from .base import TextEnv


def _call_with_timeout(fn, arg, timeout_s: float):
    """Run ``fn(arg)`` in a daemon thread; (value, exception, timed_out). A timed-out call keeps
    running in its thread (Python cannot stop it); the caller must abandon that environment."""
    box: dict = {}
    finished = threading.Event()

    def target():
        try:
            box["value"] = fn(arg)
        except BaseException as e:  # noqa: BLE001 - reported as env_error
            box["error"] = e
        finally:
            finished.set()

    threading.Thread(target=target, daemon=True, name="rollarc-env-call").start()
    if not finished.wait(max(timeout_s, 0.0)):
        return None, None, True
    return box.get("value"), box.get("error"), False


def run_episode(env: TextEnv, task: Task, policy_fn: Callable[[list[dict]], str], max_turns: int,
                turn_timeout_s: float, episode_timeout_s: float) -> tuple[str, int, dict, list[dict]]:
    """Play one episode in-process (the synchronous baseline and tests; RollArc's async driver calls
    ``env.step`` on its own workers instead).

    The transcript is a chat: ``[{"role": "user", "content": first observation}, {"role":
    "assistant", "content": reply}, {"role": "user", "content": observation}, ...]``;
    ``policy_fn(messages) -> str`` gets a copy of it each turn.

    Statuses (``types.EPISODE_STATUSES``): ``ok`` the env said done; ``truncated`` ``max_turns``
    replies without done (or the env reported ``info["truncated"]``); ``timeout`` a ``reset``/``step``
    ran past ``turn_timeout_s`` (run in a worker thread; we stop waiting, never hang) or the episode
    past ``episode_timeout_s`` (checked around policy calls, which are not interrupted);
    ``env_error`` ``reset``/``step`` raised (``info["error"]`` has the message). After ``timeout``
    the environment may still be running a step in its thread: discard it.

    Returns:
        (status, turns = policy replies made, info = the last step's info plus ``error`` when not
        ok/truncated, transcript).

    Raises:
        ValueError: ``max_turns`` < 1 or a non-positive timeout. Exceptions of ``policy_fn``
        propagate (they are not environment errors).
    """
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"run_episode needs max_turns >= 1, got {max_turns!r}")
    if not (turn_timeout_s > 0 and episode_timeout_s > 0):
        raise ValueError(f"run_episode needs positive timeouts, got {turn_timeout_s}, {episode_timeout_s}")
    deadline = time.monotonic() + episode_timeout_s
    transcript: list[dict] = []
    info: dict = {}

    def limit() -> tuple[float, str]:
        left = deadline - time.monotonic()
        return (turn_timeout_s, "turn") if turn_timeout_s <= left else (left, "episode")

    def timeout(what: str, kind: str, turns: int):
        t = turn_timeout_s if kind == "turn" else episode_timeout_s
        return "timeout", turns, {**info, "error": f"{what} exceeded the {kind} timeout of {t:g} s"}, transcript

    t, kind = limit()
    obs, err, timed_out = _call_with_timeout(env.reset, task, t)
    if timed_out:
        return timeout("env.reset", kind, 0)
    if err is not None:
        return "env_error", 0, {"error": f"env.reset raised {type(err).__name__}: {err}"}, transcript
    transcript.append({"role": "user", "content": obs})
    for turn in range(1, max_turns + 1):
        if time.monotonic() >= deadline:
            return timeout("the episode", "episode", turn - 1)
        reply = policy_fn(list(transcript))
        if not isinstance(reply, str):
            raise TypeError(f"policy_fn must return str, got {type(reply).__name__}")
        transcript.append({"role": "assistant", "content": reply})
        t, kind = limit()
        if t <= 0:
            return timeout("the episode", "episode", turn)
        res, err, timed_out = _call_with_timeout(env.step, reply, t)
        if timed_out:
            return timeout(f"env.step (turn {turn})", kind, turn)
        if err is not None:
            return "env_error", turn, {**info, "error": f"env.step (turn {turn}) raised {type(err).__name__}: {err}"}, transcript
        info = dict(res.info)
        transcript.append({"role": "user", "content": res.observation})
        if res.done:
            return ("truncated" if info.get("truncated") else "ok"), turn, info, transcript
    return "truncated", max_turns, info, transcript
