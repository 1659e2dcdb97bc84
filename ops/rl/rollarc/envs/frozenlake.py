"""FrozenLake as a text environment (``FrozenLakeText``): gymnasium's ``FrozenLake-v1`` (toy text;
https://gymnasium.farama.org/environments/toy_text/frozen_lake/) with ``is_slippery=False`` and a
seeded random map, so an action sequence has one outcome and ``verify_frozenlake`` can replay it
statelessly (the reward pool's verifier); ``parse_frozenlake_action`` reads a reply's move."""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ops.rl.rollarc.types import StepResult, Task

from .base import FROZENLAKE_ACTIONS, TextEnv


_ACTION_LINE = re.compile(r"(?i)\baction\W{0,4}[:=][^A-Za-z\n]*(left|down|right|up)\b")
_ACTION_WORD = re.compile(r"(?i)\b(left|down|right|up)\b")


def parse_frozenlake_action(text: str) -> Optional[str]:
    """The move in a reply: the last ``Action: <move>`` (markdown around the move allowed), else the
    first of the words left/down/right/up, else None. Case-insensitive."""
    lines = _ACTION_LINE.findall(text or "")
    if lines:
        return lines[-1].lower()
    m = _ACTION_WORD.search(text or "")
    return m.group(1).lower() if m else None


def _frozenlake_spec(spec: dict) -> tuple[int, float, int]:
    if not isinstance(spec, dict) or "map_seed" not in spec:
        raise ValueError(f"frozenlake task.spec needs 'map_seed' (int), got {spec!r}")
    seed, size, p = spec["map_seed"], spec.get("size", 4), spec.get("p", 0.8)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"frozenlake map_seed must be an int >= 0, got {seed!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= 32:
        raise ValueError(f"frozenlake size must be an int in [2, 32], got {size!r}")
    if not isinstance(p, (int, float)) or not 0.5 <= p <= 1.0:  # below 0.5 map generation may spin
        raise ValueError(f"frozenlake p (frozen-tile probability) must be in [0.5, 1], got {p!r}")
    return size, float(p), seed


def _make_lake(spec: dict):
    import gymnasium as gym
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    size, p, seed = _frozenlake_spec(spec)
    desc = generate_random_map(size=size, p=p, seed=seed)
    env = gym.make("FrozenLake-v1", desc=desc, is_slippery=False)
    env.reset(seed=seed)
    return env, desc


def frozenlake_map(spec: dict) -> list[str]:
    """The map rows (``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal) a spec generates:
    ``generate_random_map(size, p, seed=map_seed)`` (defaults size 4, p 0.8)."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    size, p, seed = _frozenlake_spec(spec)
    return generate_random_map(size=size, p=p, seed=seed)


def verify_frozenlake(spec: dict, actions: Sequence) -> float:
    """Replay ``actions`` on a fresh ``FrozenLake-v1`` built from ``spec``: 1.0 if the goal is reached,
    else 0.0 (hole, step limit, or actions run out). Stateless (the reward pool calls it).

    Args:
        spec: the task spec (``map_seed``, optional ``size``, ``p``).
        actions: move names (``left``...) or gymnasium action ids 0..3; moves after the episode
            ends are ignored.

    Raises:
        ValueError: a bad spec or an unknown action.
    """
    env, _ = _make_lake(spec)
    try:
        for a in actions:
            _, reward, terminated, truncated, _ = env.step(_action_id(a))
            if terminated or truncated:
                return 1.0 if reward > 0 else 0.0
        return 0.0
    finally:
        env.close()


def _action_id(a) -> int:
    if isinstance(a, str) and a.lower() in FROZENLAKE_ACTIONS:
        return FROZENLAKE_ACTIONS.index(a.lower())
    if isinstance(a, int) and not isinstance(a, bool) and 0 <= a < 4:
        return a
    raise ValueError(f"frozenlake action must be one of {FROZENLAKE_ACTIONS} or 0..3, got {a!r}")


class FrozenLakeText(TextEnv):
    """gymnasium ``FrozenLake-v1`` (``is_slippery=False``) rendered as text.

    task.spec: ``map_seed`` (int >= 0), ``size`` (default 4), ``p`` (frozen probability, default
    0.8, in [0.5, 1]). Reaching ``G`` or falling into ``H`` ends the episode (``done``); gymnasium's
    own limit of 100 moves also ends it, with ``info["truncated"] = True``.

    info (every step): ``actions`` (valid moves so far, names), ``reached_goal``, ``fell_in_hole``,
    ``invalid_actions`` (replies with no move), ``position`` ([row, col]).
    """

    name = "frozenlake"

    def __init__(self):
        self._env = None
        self._desc: list[str] = []
        self._closed = False
        self._done = True

    def reset(self, task: Task) -> str:
        if self._closed:
            raise RuntimeError("frozenlake: reset after close")
        if self._env is not None:
            self._env.close()
        self._env, self._desc = _make_lake(task.spec)
        self._pos, self._actions, self._invalid = 0, [], 0
        self._done, self._goal, self._hole, self._truncated = False, False, False, False
        n = len(self._desc)
        return (f"You are on a frozen lake, a {n}x{n} grid. Walk from the start to the goal G without "
                "stepping into a hole H.\nLegend: P = you, S = start, F = frozen (safe), H = hole "
                "(the episode ends, no reward), G = goal. Row 0 is the top row.\nMoves: left, down, "
                "right, up; walking into the edge leaves you in place.\nReply with exactly one move "
                "per turn, e.g. \"Action: right\".\n\n" + self.render())

    def render(self) -> str:
        """The grid with ``P`` at the current position, plus the position line."""
        n = len(self._desc)
        r, c = divmod(self._pos, n)
        rows = [row if i != r else row[:c] + "P" + row[c + 1:] for i, row in enumerate(self._desc)]
        return "\n".join(rows) + f"\nYou are at row {r}, column {c}."

    def _info(self) -> dict:
        n = len(self._desc)
        return {"actions": list(self._actions), "reached_goal": self._goal, "fell_in_hole": self._hole,
                "invalid_actions": self._invalid, "position": list(divmod(self._pos, n)),
                "truncated": self._truncated}

    def step(self, action_text: str) -> StepResult:
        if self._env is None or self._closed:
            raise RuntimeError("frozenlake: step before reset (or after close)")
        if self._done:
            raise RuntimeError("frozenlake: step after the episode ended")
        move = parse_frozenlake_action(action_text if isinstance(action_text, str) else "")
        if move is None:
            self._invalid += 1
            return StepResult("Invalid action: no move (left, down, right, up) found in your reply. "
                              "This turn was wasted. Reply like \"Action: right\".\n\n" + self.render(),
                              False, self._info())
        before = self._pos
        obs, reward, terminated, truncated, _ = self._env.step(FROZENLAKE_ACTIONS.index(move))
        self._pos = int(obs)
        self._actions.append(move)
        if terminated:
            self._done, self._goal, self._hole = True, reward > 0, reward <= 0
            msg = "You reached the goal G. Episode over." if self._goal else "You fell into a hole. Episode over."
        elif truncated:
            self._done = self._truncated = True
            msg = "The step limit of the lake was reached. Episode over."
        elif self._pos == before:
            msg = f"You tried to move {move} but the edge stops you; you stay in place."
        else:
            msg = f"You moved {move}."
        return StepResult(msg + "\n\n" + self.render(), self._done, self._info())

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
        self._closed = True
