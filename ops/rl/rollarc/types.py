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
    """One environment instance to solve.

    Attributes:
        uid: stable id (the group id derives from it and the step).
        env: environment name (``frozenlake`` | ``tool_math``).
        spec: what the environment needs to reset: e.g. ``{"map_seed": 3, "size": 4}`` for
            FrozenLake, ``{"problem": ..., "answer": ..., "answer_type": ...}`` for tool math.
    """

    uid: str
    env: str
    spec: dict


@dataclass
class StepResult:
    """One environment step. ``observation`` is the text shown to the policy next turn;
    ``done`` ends the episode; ``info`` carries what the verifier needs (e.g. the final answer)."""

    observation: str
    done: bool
    info: dict = field(default_factory=dict)


@dataclass
class Segment:
    """One LLM call of a trajectory.

    Attributes:
        prompt_ids: the full context fed to the policy for this turn [P] (chat template of the
            conversation so far); response_ids [T] and logprobs [T]: what the engine sampled and
            the log-probabilities under the sampling distribution.
        policy_version: the engine's published weight version when it served the call.
        pool: the engine pool that served it (``gpu_compute`` | ``gpu_bandwidth``).
        finish_reason: ``stop`` | ``length`` | ``timeout`` | ``abort`` (see ops.rl.types).
        latency_s: seconds from request to response (queueing included).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    policy_version: int
    pool: str
    finish_reason: str
    latency_s: float = 0.0
    text: str = ""


@dataclass
class Trajectory:
    """One episode: its segments, how it ended, and its reward (None = not computed / failed; GRPO
    then excludes it from its group — never 0.0)."""

    group_id: str
    index: int
    task: Task
    created_step: int
    segments: list[Segment] = field(default_factory=list)
    status: str = "ok"
    reward: Optional[float] = None
    reward_status: str = ""
    turns: int = 0
    env_s: float = 0.0
    llm_s: float = 0.0
    reward_s: float = 0.0
    wall_s: float = 0.0
    error: Optional[str] = None
    submission: dict = field(default_factory=dict)

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
    task: Task
    created_step: int
    trajectories: list[Trajectory]
    dropped: int = 0
    finished_at: float = 0.0

    @property
    def oldest_version(self) -> int:
        return min((t.oldest_version for t in self.trajectories), default=self.created_step)


JSON = dict[str, Any]
