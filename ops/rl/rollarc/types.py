"""What flows between RollArc's roles (torch-free, ray-free).

Terms (RollArc, arXiv 2512.22560 §3-4): a *trajectory* is one multi-turn episode of the policy in an
environment (LLM call -> env step -> ... -> reward); a *segment* is one LLM call of it, stamped with
the policy version of the engine that served it; a *group* is the trajectories sampled for one task
(GRPO normalises rewards within it), created at trainer step ``created_step``. Redundant rollouts:
a group launches ``R + redundancy`` trajectories and completes with the first ``R`` to finish.

Staleness of a group at trainer step s = s - (oldest policy version of any kept segment); the group
is trained only while staleness <= ``async_ratio`` (``async_ratio = 0``: exactly synchronous).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

#: How an episode ended. ``ok``: the environment said done (goal, hole, answer given);
#: ``truncated``: max turns reached; ``timeout``: a per-turn or per-episode wall-clock limit hit;
#: ``env_error``: the environment raised or its worker died (only this trajectory is affected).
EPISODE_STATUSES = ("ok", "truncated", "timeout", "env_error")

#: The named resource pools (Ray custom resources). On a cluster each node advertises the pools its
#: hardware fits; on one machine all four are on the local node.
POOLS = ("gpu_compute", "gpu_bandwidth", "cpu_env", "reward")


@dataclass(frozen=True)
class Task:
    """One environment instance to solve."""

    uid: str
    """Stable id (the group id derives from it and the step)."""
    env: str
    """Environment name (``frozenlake`` | ``tool_math`` | ``checked_subtraction``)."""
    spec: dict
    """What the environment needs to reset: e.g. ``{"map_seed": 3, "size": 4}`` for FrozenLake,
    ``{"problem": ..., "answer": ..., "answer_type": ...}`` for tool math."""


@dataclass
class StepResult:
    """One environment step."""

    observation: str
    """The text shown to the policy next turn."""
    done: bool
    """Whether the episode ended (goal, hole, answer given)."""
    info: dict = field(default_factory=dict)
    """What the verifier needs (e.g. the final answer, the FrozenLake actions)."""


@dataclass
class Segment:
    """One LLM call of a trajectory."""

    prompt_ids: list[int]
    """The full context fed to the policy for this turn [P] (chat template of the conversation so far)."""
    response_ids: list[int]
    """What the engine sampled [T]."""
    logprobs: list[float]
    """Log-probabilities [T] of the response tokens under the sampling distribution."""
    policy_version: int
    """The engine's published weight version when it served the call."""
    pool: str
    """The engine pool that served it: ``gpu_compute`` | ``gpu_bandwidth`` (``colocated``: LocalRoles)."""
    finish_reason: str
    """``stop`` | ``length`` | ``timeout`` | ``abort`` (see ops.rl.types)."""
    latency_s: float = 0.0
    """Seconds from request to response (queueing included)."""
    text: str = ""
    """The decoded response (the action the environment gets)."""


@dataclass
class Trajectory:
    """One episode: its segments, how it ended, and its reward (None = not computed / failed; GRPO
    then excludes it from its group — never 0.0)."""

    group_id: str
    """The group it belongs to."""
    index: int
    """Its index among the group's launched trajectories (from 0)."""
    task: Task
    """The task it solves (the group's)."""
    created_step: int
    """The trainer step at which its group was created."""
    segments: list[Segment] = field(default_factory=list)
    """Its LLM calls, in turn order."""
    status: str = "ok"
    """How the episode ended (``EPISODE_STATUSES``): ``ok`` | ``truncated`` | ``timeout`` | ``env_error``."""
    reward: Optional[float] = None
    """The verifier's score; None = not computed / failed (GRPO then excludes it — never 0.0)."""
    reward_status: str = ""
    """The verifier's status (e.g. ``verified``, ``wrong``, ``failed``, ``timeout``), or the episode status."""
    turns: int = 0
    """LLM calls made."""
    env_s: float = 0.0
    """Seconds in environment reset and steps."""
    llm_s: float = 0.0
    """Seconds in LLM calls."""
    reward_s: float = 0.0
    """Seconds waiting for the reward."""
    wall_s: float = 0.0
    """Seconds of the whole episode, reward included."""
    error: Optional[str] = None
    """What ended it when it failed (an exception or a limit), else None."""
    submission: dict = field(default_factory=dict)
    """The last step's ``info`` (what the verifier scores: final answer, FrozenLake actions)."""

    def __post_init__(self):
        if self.status not in EPISODE_STATUSES:
            raise ValueError(f"trajectory.status must be one of {EPISODE_STATUSES}, got {self.status!r}")

    @property
    def oldest_version(self) -> int:
        """The oldest policy version among the segments (the staleness filter uses it); the creation
        step when there is no segment."""
        return min((s.policy_version for s in self.segments), default=self.created_step)

    @property
    def response_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.segments)


@dataclass
class Group:
    """The kept trajectories of one task (``R`` of them) plus the count of redundant ones dropped."""

    group_id: str
    """Stable id (``s<step>-g<n>-<task uid>``)."""
    task: Task
    """The task of every trajectory of the group."""
    created_step: int
    """The trainer step at which it was created."""
    trajectories: list[Trajectory]
    """The kept trajectories (R of them), by index."""
    dropped: int = 0
    """Launched trajectories not kept (redundant ones cancelled once the group had R); 0 in the baseline."""
    finished_at: float = 0.0
    """``time.monotonic()`` when it completed (the buffer's tie-break after created_step)."""

    @property
    def oldest_version(self) -> int:
        return min((t.oldest_version for t in self.trajectories), default=self.created_step)


JSON = dict[str, Any]
