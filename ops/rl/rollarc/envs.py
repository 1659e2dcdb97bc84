"""RollArc's stateful multi-turn text environments, their latency knob and an in-process episode loop.

RollArc (arXiv 2512.22560 §3-4) runs agentic trajectories turn by turn: LLM call -> environment step
-> ... -> reward, with stateful environments on CPU workers and stateless verifiers in an elastic
reward pool. This module provides the environments (torch-free, ray-free):

* ``FrozenLakeText`` — gymnasium's ``FrozenLake-v1`` (toy text; https://gymnasium.farama.org/
  environments/toy_text/frozen_lake/) with ``is_slippery=False`` and a seeded random map, so an
  action sequence has one outcome and ``verify_frozenlake`` can replay it statelessly.
* ``ToolMath`` — a curated STEM problem; the policy may call a sandboxed Python calculator
  (``ops.rl.rollarc.sandbox.run_python``) before answering. ``tool_math_reward_item`` turns the final
  answer into the reward service's ``RewardItem``.

Interface (``TextEnv``): ``reset(task) -> str`` (instructions + state: the first user message),
``step(action_text) -> StepResult`` (next observation, done, info), ``close()``. One instance holds
one episode's state; instances share nothing, so many may run in threads of one process. Errors are
raised as exceptions with a message (``ValueError`` for a bad task spec, ``RuntimeError`` for a step
out of order); the orchestration turns them into ``env_error``.

Policy syntax (put it in the system prompt; the first observation repeats it):

* FrozenLake: reply with one move, ``Action: <left|down|right|up>``. The last ``Action:`` counts; without one, the first of the words left/down/right/up in the reply. A reply with none is
  an invalid action: a wasted turn, counted in ``info["invalid_actions"]``.
* ToolMath: ``<calc>EXPR</calc>`` runs Python (an expression or statements; ``math`` names built in)
  and the next observation is ``Result: <value>`` or ``Error: <message>`` (up to 3 calls a turn);
  ``Answer: X`` on its own line, or ``\\boxed{X}``, ends the episode (a reply with an answer is not
  also calculated). A reply with neither is an invalid action.

* CheckedSubtraction: the multi-turn form of the scratchpad task (``ops.rl.scratchpad.tool_prompt``):
  each turn writes chain lines ending with ``?`` and the checker (a sandboxed subprocess) replies
  ``ok``; ``\\boxed{X}`` ends the episode. Its latency is real work, never a sleep (see the class).

Benchmarks vary environment latency (RollArc's heterogeneous environment cost) with ``EnvLatency``
and ``LatentEnv`` (or ``make_env(..., latency=...)``); ``checked_subtraction`` needs none.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from typing import Callable, Optional, Sequence

from ops.rl.rollarc.sandbox import DEFAULT_MODE, require, run_python
from ops.rl.rollarc.types import StepResult, Task

#: gymnasium FrozenLake action ids 0..3, in order.
FROZENLAKE_ACTIONS = ("left", "down", "right", "up")
ENV_NAMES = ("frozenlake", "tool_math")
"""The environments a curated run mixes (``driver.RunSpec.envs``)."""
ALL_ENV_NAMES = ENV_NAMES + ("checked_subtraction",)
"""Every environment ``make_env`` builds (``checked_subtraction``: selected by the driver's task ``scratchpad``)."""
LATENCY_KINDS = ("none", "low", "medium", "heavy")


class TextEnv:
    """A multi-turn text environment: ``reset(task) -> str``, ``step(action_text) -> StepResult``,
    ``close()``. Subclasses hold one episode's state; not safe to share one instance across threads."""

    name = ""

    def reset(self, task: Task) -> str:
        raise NotImplementedError

    def step(self, action_text: str) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------- FrozenLake

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


# ------------------------------------------------------------------------------------------ ToolMath

_CALC = re.compile(r"<calc>(.*?)</calc>", re.S | re.I)
_ANSWER_LINE = re.compile(r"(?im)^[ \t>*_#-]*(?:final[ \t]+)?answer[*_ \t]*[:：][ \t*_]*(.+?)[ \t]*$")


def parse_final_answer(text: str) -> Optional[str]:
    """The final answer of a reply: the last ``\\boxed{...}`` (balanced braces), else the last line
    ``Answer: X`` (also ``Final answer:``, ``**Answer:**``), stripped of ``$``, ``**`` and a final
    period; None when there is none (or it is empty)."""
    from ops.curation.verify import last_boxed

    text = text or ""
    ans = last_boxed(text)
    if ans is None:
        found = _ANSWER_LINE.findall(text)
        ans = found[-1] if found else None
    if ans is None:
        return None
    ans = ans.strip().strip("*_ ").strip()
    if ans.endswith(".") and not ans[:-1].rstrip().endswith("."):
        ans = ans[:-1].rstrip()
    if len(ans) >= 2 and ans[0] == ans[-1] == "$":
        ans = ans[1:-1].strip()
    return ans or None


class ToolMath(TextEnv):
    """A curated STEM problem with a sandboxed Python calculator tool.

    task.spec: ``problem`` (str), ``answer`` and ``answer_type`` (used by the verifier, not here;
    see ``tool_math_reward_item``). The policy writes ``<calc>EXPR</calc>`` (observation
    ``Result: ...`` / ``Error: ...``) or ``Answer: X`` / ``\\boxed{X}`` (done).

    Args:
        cpu_s, wall_s, mem_mb: limits of each calculator call (``sandbox.run_python``).
        sandbox: ``bwrap`` (kernel-enforced, the default) or ``rlimits`` (the weaker mode, only when
            asked for): ``sandbox.SANDBOX_MODES``.
        max_calls_per_turn: ``<calc>`` blocks run per reply (later ones are skipped, and said so).
        max_result_chars: cap on each result shown to the policy.

    info (every step): ``final_answer`` (str or None), ``calc_calls``, ``calc_errors``,
    ``invalid_actions`` (replies with neither a call nor an answer), ``calc_cpu_s``.

    Raises (constructor): ValueError for a bad limit or sandbox mode; ``sandbox.SandboxUnavailable``
    for ``bwrap`` without bubblewrap installed (the environment refuses to run model-generated code).
    """

    name = "tool_math"

    def __init__(self, cpu_s: float = 1.0, wall_s: float = 2.0, mem_mb: int = 256,
                 max_calls_per_turn: int = 3, max_result_chars: int = 500, sandbox: str = DEFAULT_MODE):
        if not (cpu_s > 0 and wall_s > 0 and mem_mb >= 64):
            raise ValueError(f"tool_math needs cpu_s > 0, wall_s > 0, mem_mb >= 64; got {cpu_s}, {wall_s}, {mem_mb}")
        if max_calls_per_turn < 1 or max_result_chars < 1:
            raise ValueError(f"tool_math needs max_calls_per_turn >= 1 and max_result_chars >= 1, got "
                             f"{max_calls_per_turn}, {max_result_chars}")
        require(sandbox)
        self.cpu_s, self.wall_s, self.mem_mb, self.sandbox = cpu_s, wall_s, mem_mb, sandbox
        self.max_calls_per_turn, self.max_result_chars = max_calls_per_turn, max_result_chars
        self._live = False
        self._closed = False

    def reset(self, task: Task) -> str:
        if self._closed:
            raise RuntimeError("tool_math: reset after close")
        problem = task.spec.get("problem") if isinstance(task.spec, dict) else None
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"tool_math task.spec needs a non-empty 'problem' (str), got {task.spec!r}")
        self._final, self._calls, self._errors, self._invalid, self._cpu = None, 0, 0, 0, 0.0
        self._live = True
        return ("Solve the problem below. You may use a Python calculator: write <calc>EXPR</calc> "
                "(an expression or a few statements; math functions such as sqrt, comb, pi are built "
                "in) and the next message shows \"Result: ...\" or \"Error: ...\". Up to "
                f"{self.max_calls_per_turn} calls per reply. When you are done, write the final answer "
                "on its own line as \"Answer: X\" (or \\boxed{X}); that ends the episode.\n\n"
                f"Problem: {problem.strip()}")

    def _info(self) -> dict:
        return {"final_answer": self._final, "calc_calls": self._calls, "calc_errors": self._errors,
                "invalid_actions": self._invalid, "calc_cpu_s": self._cpu}

    def step(self, action_text: str) -> StepResult:
        if not self._live:
            raise RuntimeError("tool_math: step before reset, after the episode ended, or after close")
        text = action_text if isinstance(action_text, str) else ""
        answer = parse_final_answer(text)
        if answer is not None:
            self._final, self._live = answer, False
            return StepResult(f"Answer recorded: {answer}", True, self._info())
        exprs = _CALC.findall(text)
        if not exprs:
            self._invalid += 1
            why = "an unclosed <calc> (close it with </calc>)" if "<calc>" in text.lower() else \
                "neither a <calc>EXPR</calc> call nor a final answer"
            return StepResult(f"Your reply had {why}. This turn was wasted. Call the calculator with "
                              "<calc>EXPR</calc> or finish with \"Answer: X\".", False, self._info())
        lines = []
        for i, expr in enumerate(exprs[: self.max_calls_per_turn]):
            r = run_python(expr.strip(), cpu_s=self.cpu_s, wall_s=self.wall_s, mem_mb=self.mem_mb,
                           max_output_chars=self.max_result_chars, sandbox=self.sandbox)
            self._calls += 1
            self._cpu += r.cpu_s
            if r.ok:
                body = "Result: " + (r.output.strip() or "(no output)")
            else:
                self._errors += 1
                body = "Error: " + r.error
            lines.append(body if len(exprs) == 1 else f"[{i + 1}] {body}")
        if len(exprs) > self.max_calls_per_turn:
            lines.append(f"(only the first {self.max_calls_per_turn} <calc> calls of a reply are run)")
        return StepResult("\n".join(lines), False, self._info())

    def close(self) -> None:
        self._live, self._closed = False, True


def tool_math_reward_item(key: str, spec: dict, final_answer: Optional[str]):
    """The reward service's ``RewardItem`` (``ops.rl.reward``) for a ToolMath episode: the final
    answer as a ``\\boxed{}`` response (no answer -> empty response -> ``unparseable``, 0.0)."""
    from ops.rl.reward import RewardItem

    response = f"\\boxed{{{final_answer}}}" if final_answer else ""
    return RewardItem(key=key, response=response, answer=spec.get("answer"), solution=spec.get("solution"),
                      answer_type=spec.get("answer_type", "numeric"))


# ------------------------------------------------------------------------------ CheckedSubtraction

_DIGITS = re.compile(r"[0-9]{1,6}")

#: The checker program run in the sandbox: recompute the chain from the previous value, each line
#: ``work`` times over (``{prev}``, ``{a}``, ``{lines}``, ``{work}`` are integers the environment
#: formats in; no policy text reaches the subprocess).
_CHECKER = """
prev, a, lines, work = {prev}, {a}, {lines}, {work}
bad = -1
for i, got in enumerate(lines):
    want = prev - a
    acc = 0
    for _ in range(work):
        acc += (prev - a == want)
    if want < 0 or got != want or acc != work:
        bad = i
        break
    prev = want
print(bad)
"""


class CheckedSubtraction(TextEnv):
    """Remainder by repeated subtraction with a checker between turns (``ops.rl.scratchpad``, multi-turn
    form; docs/rl_policy.md): the first observation is ``tool_prompt`` (``a:N?``); each policy turn
    writes chain lines (``\\n<value>`` each) and ends with ``?``; the checker recomputes them from the
    previous value in a fresh sandboxed Python subprocess (``sandbox.run_python``) and replies
    ``scratchpad.CHECK_OK`` (``ok``) when every line is right. A wrong line, an unparseable one, or a
    turn with neither ``?`` nor ``\\boxed{}`` ends the episode (failed check: no final answer, so the
    reward service scores it 0.0). A turn with ``\\boxed{X}`` ends the episode with answer X (its
    lines are not checked; ``tool_math_reward_item`` builds the RewardItem). The correct trajectory
    (``scratchpad.tool_turns``) has ``q // 8 + 1`` turns for quotient q = N // a (long-tailed).

    task.spec: ``a`` (2..9), ``n`` (>= 0), ``answer`` (str, N mod a), ``answer_type`` ("numeric"),
    optional ``check_work`` (int >= 0, default ``check_work`` of the constructor). ``sandbox``: the
    checker's sandbox mode (``sandbox.SANDBOX_MODES``; ``bwrap`` by default, like ``ToolMath``).

    **What decides env latency** (all real work, never a sleep): per checked turn, one interpreter
    start of the sandbox (bwrap + ``python -I -S`` + the supervisor's fork: median 0.27-0.32 s a call,
    ~0.07 s of it bwrap's namespaces, on the shared 2-core machine at load ~16, 2026-12-06;
    ``benchmarks/sandbox_overhead.py``; the start alone was ~50 ms in 2026-12-02's process-only sandbox) plus the checker's
    CPU: ``lines x check_work`` loop iterations (CPython; measured 2026-12-02 on the shared 2-core
    machine: start ~50 ms, ``check_work`` 100,000 -> ~20 ms of CPU a line, ~0.2 s for an 8-line turn). A trajectory's env time is therefore linear in
    its number of turns, i.e. in q // 8, and long-tailed like q. ``info["check_cpu_s"]`` /
    ``info["check_wall_s"]`` sum the subprocesses' CPU and wall seconds.

    info (every step): ``final_answer`` (str or None), ``checks`` (checked turns), ``check_failed``
    (bool), ``checked_lines``, ``check_cpu_s``, ``check_wall_s``.
    """

    name = "checked_subtraction"

    def __init__(self, check_work: int = 0, cpu_s: float = 5.0, wall_s: float = 10.0, mem_mb: int = 256,
                 sandbox: str = DEFAULT_MODE):
        if not isinstance(check_work, int) or check_work < 0:
            raise ValueError(f"checked_subtraction.check_work must be an int >= 0, got {check_work!r}")
        require(sandbox)
        self.check_work, self.cpu_s, self.wall_s, self.mem_mb, self.sandbox = check_work, cpu_s, wall_s, mem_mb, sandbox
        self._live = False
        self._closed = False

    def reset(self, task: Task) -> str:
        from ops.rl import scratchpad as sp

        if self._closed:
            raise RuntimeError("checked_subtraction: reset after close")
        spec = task.spec if isinstance(task.spec, dict) else {}
        a, n = spec.get("a"), spec.get("n")
        if not (isinstance(a, int) and 2 <= a <= 9 and isinstance(n, int) and n >= 0):
            raise ValueError(f"checked_subtraction task.spec needs 'a' (int 2..9) and 'n' (int >= 0), got {task.spec!r}")
        work = spec.get("check_work", self.check_work)
        if not isinstance(work, int) or work < 0:
            raise ValueError(f"checked_subtraction.check_work must be an int >= 0, got {work!r}")
        self.a, self.value, self.work = a, n, work
        self._final, self._checks, self._failed, self._lines, self._cpu, self._wall = None, 0, False, 0, 0.0, 0.0
        self._live = True
        return sp.tool_prompt(sp.Problem(task.uid, a, n))

    def _info(self) -> dict:
        return {"final_answer": self._final, "checks": self._checks, "check_failed": self._failed,
                "checked_lines": self._lines, "check_cpu_s": self._cpu, "check_wall_s": self._wall}

    def _fail(self, why: str) -> StepResult:
        self._failed, self._live = True, False
        return StepResult(why, True, self._info())

    def step(self, action_text: str) -> StepResult:
        from ops.rl import scratchpad as sp

        if not self._live:
            raise RuntimeError("checked_subtraction: step before reset, after the episode ended, or after close")
        text = action_text if isinstance(action_text, str) else ""
        if "\\boxed{" in text:
            self._final, self._live = parse_final_answer(text), False
            return StepResult(f"Answer recorded: {self._final}", True, self._info())
        if not text.rstrip().endswith("?"):
            return self._fail("check failed: the turn ends with neither '?' nor \\boxed{}")
        raw = [x.strip() for x in text.rstrip()[:-1].split("\n") if x.strip()]
        if not raw or not all(_DIGITS.fullmatch(x) for x in raw):
            return self._fail("check failed: unparseable line")
        lines = [int(x) for x in raw]
        r = run_python(_CHECKER.format(prev=self.value, a=self.a, lines=lines, work=self.work),
                       cpu_s=self.cpu_s, wall_s=self.wall_s, mem_mb=self.mem_mb, sandbox=self.sandbox)
        self._checks += 1
        self._cpu += r.cpu_s
        self._wall += r.wall_s
        if not r.ok:
            raise RuntimeError(f"checked_subtraction: the checker failed: {r.error}")
        bad = int(r.output.strip())
        if bad >= 0:
            self._lines += bad
            return self._fail(f"check failed at line {bad + 1}")
        self._lines += len(lines)
        self.value = lines[-1]
        return StepResult(sp.CHECK_OK, False, self._info())

    def close(self) -> None:
        self._live, self._closed = False, True


# ----------------------------------------------------------------------------------------- Latency

class EnvLatency:
    """Per-step latency injected into an environment (the benchmark's knob). Same mean for every
    kind except ``none``; thread-safe; seeded (``random.Random(seed)``).

    Kinds, for mean m (quantiles at m = 1 s, from the closed forms):
        none:   0 always.
        low:    lognormal, sigma 0.1, mu = ln m - sigma^2/2     (p50 1.00, p99 1.26; p99/p50 1.26)
        medium: lognormal, sigma 0.75, mu = ln m - sigma^2/2    (p50 0.75, p99 4.3;  p99/p50 5.7)
        heavy:  Pareto, alpha 1.5, scale x_m = m (alpha-1)/alpha = m/3 (p50 0.53, p99 7.2;
                p99/p50 13.6; infinite variance: sample means converge slowly).

    Args:
        kind: one of ``LATENCY_KINDS``.
        mean_s: mean seconds (>= 0).
        seed: RNG seed; give each environment instance its own.
        max_s: optional clip of each sample (lowers the mean of ``heavy``/``medium`` a little).

    Raises:
        ValueError: unknown kind, negative mean or non-positive max_s.
    """

    SIGMA = {"low": 0.1, "medium": 0.75}
    PARETO_ALPHA = 1.5

    def __init__(self, kind: str = "none", mean_s: float = 0.0, seed: int = 0, max_s: Optional[float] = None):
        if kind not in LATENCY_KINDS:
            raise ValueError(f"latency kind must be one of {LATENCY_KINDS}, got {kind!r}")
        if not (isinstance(mean_s, (int, float)) and mean_s >= 0 and math.isfinite(mean_s)):
            raise ValueError(f"latency mean_s must be a finite number >= 0, got {mean_s!r}")
        if max_s is not None and not max_s > 0:
            raise ValueError(f"latency max_s must be > 0 or None, got {max_s!r}")
        self.kind, self.mean_s, self.seed, self.max_s = kind, float(mean_s), seed, max_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def sample(self) -> float:
        """One latency in seconds (>= 0)."""
        if self.kind == "none" or self.mean_s == 0:
            return 0.0
        with self._lock:
            if self.kind == "heavy":
                a = self.PARETO_ALPHA
                x = self.mean_s * (a - 1) / a * self._rng.paretovariate(a)
            else:
                s = self.SIGMA[self.kind]
                x = self._rng.lognormvariate(math.log(self.mean_s) - s * s / 2, s)
        return min(x, self.max_s) if self.max_s is not None else x

    def __repr__(self):
        return f"EnvLatency(kind={self.kind!r}, mean_s={self.mean_s}, seed={self.seed}, max_s={self.max_s})"


class LatentEnv(TextEnv):
    """Wraps an environment and sleeps ``latency.sample()`` seconds before each ``step``.
    ``info["injected_latency_s"]``: seconds slept in this episode so far."""

    def __init__(self, env: TextEnv, latency: EnvLatency):
        self.env, self.latency = env, latency
        self.name = env.name
        self.injected_s = 0.0

    def reset(self, task: Task) -> str:
        self.injected_s = 0.0
        return self.env.reset(task)

    def step(self, action_text: str) -> StepResult:
        dt = self.latency.sample()
        if dt > 0:
            time.sleep(dt)
        self.injected_s += dt
        r = self.env.step(action_text)
        return StepResult(r.observation, r.done, {**r.info, "injected_latency_s": self.injected_s})

    def close(self) -> None:
        self.env.close()


def make_env(name: str, latency: Optional[EnvLatency] = None, sandbox: Optional[str] = None, **kw) -> TextEnv:
    """A new environment by name (``ALL_ENV_NAMES``); ``kw`` go to its constructor (``ToolMath``'s limits);
    ``latency`` (kind other than ``none``) wraps it in ``LatentEnv``; ``sandbox`` (None: the
    environment's default, ``bwrap``) is the mode of the environments that run code (``tool_math``,
    ``checked_subtraction``; FrozenLake runs none and ignores it).

    Raises:
        ValueError: unknown name or sandbox mode; TypeError: unknown keyword;
        ``sandbox.SandboxUnavailable``: ``bwrap`` asked for and bubblewrap missing.
    """
    code_kw = {} if sandbox is None else {"sandbox": sandbox}
    if name == "frozenlake":
        if sandbox is not None:
            require(sandbox)                     # a bad mode is an error even where no code runs
        env: TextEnv = FrozenLakeText(**kw)
    elif name == "tool_math":
        env = ToolMath(**kw, **code_kw)
    elif name == "checked_subtraction":
        env = CheckedSubtraction(**kw, **code_kw)
    else:
        raise ValueError(f"unknown environment {name!r}; known: {ALL_ENV_NAMES}")
    if latency is not None and latency.kind != "none":
        env = LatentEnv(env, latency)
    return env


# ------------------------------------------------------------------------------------ Episode loop

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
