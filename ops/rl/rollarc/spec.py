"""The RollArc run's spec: ``RunSpec`` (the typed, JSON-serialisable spec the driver runs, with its
validation; its parts typed: ``arc`` a ``core.ArcConfig``, ``roles`` a ``roles_common.RoleSpec`` with
the GRPO loss a ``GRPOConfig`` and the reward pool's autoscaling a ``RewardAutoscaling``),
``fingerprint`` (what determines a run's steps) and ``load_spec`` (the driver's reading of a spec
file). The driver (``ops.rl.rollarc.driver``) runs the spec.

The ``rollarc_run`` asset's Launchpad config mirrors ``RunSpec`` field for field, nested as it is
(``assets._config.fields_of``); the asset builds the spec from it and validates it (the asset's one
check); ``load_spec`` is the driver's. Errors name the field by its path in the spec, which is the
path set in the Launchpad (``arc.async_ratio``, ``roles.route_policy``; RollArc, arXiv 2512.22560 §4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from ops.lm.spec import JsonSpec

from .core import ArcConfig
from .roles_common import RoleSpec

METHODS = ("monolithic", "rollarc", "async0", "rollarc_a1", "rollarc_a2")
"""The methods a run may hold: ``monolithic`` (the synchronous lock-step baseline, ``monolithic.run_monolithic``)
and the trajectory-level asynchronous scheduler (``core.run_rollarc``) at the spec's ``async_ratio``
(``rollarc``) or at a fixed one: ``async0`` (async_ratio 0: trajectory-level asynchrony and
redundancy, no off-policy data), ``rollarc_a1``, ``rollarc_a2``. Redundancy is the spec's for all
of them. Which processes run a method is ``RunSpec.placement``'s."""
DEFAULT_METHODS = ("monolithic", "rollarc")
TASKS = ("curated", "scratchpad")
PLACEMENTS = ("split", "local", "ray")
ENVS = ("frozenlake", "tool_math")
"""The environments of a run by default, mixed round-robin over groups."""


@dataclass
class RunSpec(JsonSpec):
    """Everything a run needs (JSON-serialisable through ``JsonSpec``). ``arc``: the scheduler
    (``core.ArcConfig``); ``roles``: the policy and the roles (``roles_common.RoleSpec``: tokenizer,
    weights, seed, optimizer, sampling, engines, routing, env latency, sandbox, reward pool, GRPO
    loss); ``envs``: environments mixed round-robin over groups."""

    problems_path: str = ""
    """The curated problems table (``decontaminated_problems``) of the ToolMath environment (task curated)."""
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    """Methods to run, in order: a non-empty subset of ``METHODS`` without repeats (monolithic, rollarc,
    async0, rollarc_a1, rollarc_a2; async0 / rollarc_a<k> fix ``arc.async_ratio``)."""
    envs: list[str] = field(default_factory=lambda: list(ENVS))
    """Environments mixed round-robin over groups: a non-empty subset of ``envs.ENV_NAMES`` (task curated)."""
    arc: ArcConfig = field(default_factory=ArcConfig)
    """The scheduler (``core.ArcConfig``): steps, groups per step G, group size R, redundancy, async_ratio,
    max_turns, the turn / episode / reward / group-wait / train limits, max_failed_fraction."""
    roles: RoleSpec = field(default_factory=RoleSpec)
    """The policy and the roles (``roles_common.RoleSpec``): tokenizer_dir, model_dir (None = the tiny random
    policy), seed (also the ToolMath problem order, the FrozenLake maps and the env latency), lr, sampling,
    engines per pool, routing, token budgets, env latency, sandbox, reward pool, GRPO loss."""
    frozenlake_size: int = 4
    """Side of each FrozenLake map (cells; the environment accepts 2..32)."""
    task: str = "curated"
    """``curated``: FrozenLake and ToolMath on ``problems_path`` (``envs``); ``scratchpad``: every group
    is a ``checked_subtraction`` episode (``envs`` unused) on ``ops.rl.scratchpad.problems(task_seed,
    ..., max_lines)``, the char-level policy (no chat template: plain rendering, stop at ``?``)."""
    task_seed: int = 0
    """Scratchpad only: seed of the problem stream (``scratchpad.problems(task_seed, ...)``), >= 0."""
    eval_size: int = 0
    """Held-out scratchpad problems (``problems(task_seed + 1000, eval_size, split="heldout")``: disjoint
    from the training tasks by prompt text), scored single-turn by
    the trainer's ``heldout`` (sampled at ``eval_temperature``); 0 = no evaluation."""
    eval_every: int = 0
    """Optimizer steps between evaluations (0: only before and after). A mid-run evaluation of an
    asynchronous method runs while its rollouts go on (their work is not paused); its seconds are
    excluded from the method's times all the same."""
    eval_temperature: float = 1.0
    """Scratchpad only: temperature of the held-out evaluation (>= 0; 0 = greedy)."""
    max_lines: int = 60
    """Scratchpad quotient cap (``scratchpad.problems``' ``max_lines``)."""
    check_work: int = 0
    """``checked_subtraction``'s checker CPU per line (``envs.CheckedSubtraction``)."""
    placement: str = "split"
    """Where each method's roles run. ``split`` (the asset's): the baseline colocated in this process
    (``LocalRoles``, one engine), the others disaggregated on Ray (``RayRoles``). ``local``: every
    method on ``LocalRoles(serve=True)`` in this process — the same engines (``roles.engines``
    batching servers), env threads, trainer and reward process for every method (the equal-budget
    comparison). ``ray``: every method on ``RayRoles``."""
    ray_address: Optional[str] = None
    """Ray cluster to connect to (``auto`` inside a Ray Job); None = a local instance with num_cpus CPUs."""
    num_cpus: int = 2
    """CPUs of the local Ray instance (ignored with ray_address)."""
    checkpoint_every: int = 2
    """Save the trainer state every this many optimizer steps of a method (resume granularity; the
    last step is never saved: the finished method is). A SmolLM2 save (weights + AdamW moments,
    1.6 GB) took 1.6-6.3 s (median 2.0 s, 5 saves) on the embedded default, against ~5 s of optimizer
    step; a run folder holds two saves at once while one is written."""

    def __post_init__(self):
        if self.roles.env_latency is None:           # unset: the task's (the scratchpad checker's latency is real work)
            self.roles = replace(self.roles, env_latency="none" if self.task == "scratchpad" else "heavy")

    @property
    def seed(self) -> int:
        """``roles.seed``: the policy's, the ToolMath problem order's, the FrozenLake maps' and the env latency's."""
        return self.roles.seed

    @property
    def tokenizer_dir(self) -> str:
        return self.roles.tokenizer_dir

    @property
    def model_dir(self) -> Optional[str]:
        return self.roles.model_dir

    @property
    def arc_config(self) -> ArcConfig:
        """``arc`` (kept for the driver's callers)."""
        return self.arc

    @property
    def role_spec(self) -> RoleSpec:
        """``roles`` (kept for the driver's callers)."""
        return self.roles

    def method_config(self, method: str) -> ArcConfig:
        """The ArcConfig a method runs with: ``async0`` / ``rollarc_a<k>`` fix ``async_ratio``."""
        k = {"async0": 0, "rollarc_a1": 1, "rollarc_a2": 2}.get(method)
        return self.arc if k is None else replace(self.arc, async_ratio=k)

    def eval_problems(self) -> list:
        """The held-out scratchpad problems as ``(uid, a, n)`` (empty when ``eval_size`` is 0)."""
        if not self.eval_size:
            return []
        from ops.rl import scratchpad as sp

        return [(p.uid, p.a, p.n) for p in sp.problems(self.task_seed + 1000, self.eval_size, self.max_lines,
                                                       split="heldout")]

    def validate(self) -> "RunSpec":
        """Returns the spec; raises ValueError naming the field by its path (``methods``,
        ``roles.route_policy``, ``roles.grpo.agg``, ...; ``arc`` and ``roles`` check their own fields
        when built: ``arc.async_ratio``, ``roles.sandbox``)."""
        from .envs import ENV_NAMES

        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods must be a non-empty subset of {list(METHODS)}, got {self.methods}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got {self.placement!r}")
        for name in ("eval_size", "eval_every", "task_seed", "check_work"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if not (isinstance(self.eval_temperature, (int, float)) and self.eval_temperature >= 0):
            raise ValueError(f"eval_temperature must be >= 0, got {self.eval_temperature!r}")
        if not (isinstance(self.max_lines, int) and 1 <= self.max_lines <= 60):
            raise ValueError(f"max_lines must be an int in [1, 60], got {self.max_lines!r}")
        if self.eval_size and self.task != "scratchpad":
            raise ValueError("eval_size needs task 'scratchpad' (the held-out set is scratchpad problems)")
        self.roles.check_sampling("roles")
        if self.task == "scratchpad" and self.roles.env_latency != "none":
            raise ValueError(f"roles.env_latency must be 'none' for task 'scratchpad' (its latency is the "
                             f"checker's real work), got {self.roles.env_latency!r}")
        bad = [e for e in self.envs if e not in ENV_NAMES]
        if bad or not self.envs:
            raise ValueError(f"envs must be a non-empty subset of {list(ENV_NAMES)}, got {self.envs}")
        rs = self.roles
        if rs.route_policy not in ("affinity", "uniform"):
            raise ValueError(f"roles.route_policy must be 'affinity' or 'uniform', got {rs.route_policy!r}")
        if rs.env_latency not in ("none", "low", "medium", "heavy"):
            raise ValueError(f"roles.env_latency must be none|low|medium|heavy, got {rs.env_latency!r}")
        if sum(rs.engines.values()) < 1 or any(p not in ("gpu_compute", "gpu_bandwidth") for p in rs.engines):
            raise ValueError(f"roles.engines must map gpu_compute/gpu_bandwidth to counts (>= 1 in all), got {rs.engines}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.placement != "local" and any(m != "monolithic" for m in self.methods):   # a Serve pool starts
            from .reward_pool import autoscaling_config

            autoscaling_config(asdict(rs.reward_autoscaling), where="roles.reward_autoscaling")
        return self


def fingerprint(spec: RunSpec) -> str:
    """Hash of what determines a run's steps: the spec without its Ray address, CPUs,
    ``checkpoint_every``, timeouts and reward retries, with the problems file's path, size and mtime.
    16 hex digits."""
    from ops.launch import spec_fingerprint

    d = asdict(spec)
    for k in ("ray_address", "num_cpus", "checkpoint_every"):
        d.pop(k)
    for part in ("arc", "roles"):
        d[part] = {k: v for k, v in d[part].items() if not k.endswith("timeout_s") and k != "reward_retries"}
    return spec_fingerprint(d, spec.problems_path if spec.task == "curated" else "scratchpad:")


def load_spec(text: str) -> RunSpec:
    """The validated RunSpec of a spec file's text (``RunSpec.to_json``). Raises ValueError naming
    the field by its path (an unknown one too), TypeError for a part that is not a mapping."""
    return RunSpec.from_json(text)
