"""The environment interface (``TextEnv``) and the environment names of RollArc's multi-turn text
environments (``ops.rl.rollarc.envs``, whose docstring describes the interface and the policy syntax)."""

from __future__ import annotations

from ops.rl.rollarc.types import StepResult, Task

#: gymnasium FrozenLake action ids 0..3, in order.
FROZENLAKE_ACTIONS = ("left", "down", "right", "up")
ENV_NAMES = ("frozenlake", "tool_math")
"""The environments a curated run mixes (``spec.RunSpec.envs``)."""
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
