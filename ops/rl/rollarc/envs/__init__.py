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

Modules (one per environment family): ``base`` (``TextEnv``, the names), ``frozenlake``,
``tool_math``, ``checked_subtraction``, ``latency`` (``EnvLatency``, ``LatentEnv``) and ``episode``
(``run_episode``); every public name is importable from this package, and ``make_env`` builds any
environment by name.
"""

from __future__ import annotations

from typing import Optional

from ops.rl.rollarc.sandbox import require

from .base import ALL_ENV_NAMES, ENV_NAMES, FROZENLAKE_ACTIONS, LATENCY_KINDS, TextEnv
from .checked_subtraction import CheckedSubtraction
from .episode import run_episode
from .frozenlake import FrozenLakeText, frozenlake_map, parse_frozenlake_action, verify_frozenlake
from .latency import EnvLatency, LatentEnv
from .tool_math import ToolMath, parse_final_answer, tool_math_reward_item

__all__ = ["ALL_ENV_NAMES", "ENV_NAMES", "FROZENLAKE_ACTIONS", "LATENCY_KINDS", "CheckedSubtraction", "EnvLatency",
           "FrozenLakeText", "LatentEnv", "TextEnv", "ToolMath", "frozenlake_map", "make_env", "parse_final_answer",
           "parse_frozenlake_action", "run_episode", "tool_math_reward_item", "verify_frozenlake"]


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
