"""The RollArc run's spec: ``RunSpec`` (the typed, JSON-serialisable spec the driver runs, with its
validation), ``RunConfig`` (the flat configuration the ``rollarc_run`` asset shows in the Launchpad,
which builds the RunSpec), ``fingerprint`` (what determines a run's steps) and ``load_spec`` (the
driver's reading of a spec file). The driver (``ops.rl.rollarc.driver``) runs the spec.

``RunConfig``'s defaults are ``core.ArcConfig``'s, ``roles_common.RoleSpec``'s and ``RunSpec``'s;
``RunConfig.spec`` builds the ``RunSpec`` and validates it, the asset's one check; ``load_spec`` is
the driver's. Errors name the field as ``rollarc.<field>`` (RollArc, arXiv 2512.22560 §4).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Optional

from ops.rl.grpo import GRPOConfig

from .core import ArcConfig
from .roles_common import REWARD_AUTOSCALING, RoleSpec

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
class RunSpec:
    """Everything a run needs (JSON-serialisable). ``arc``: ``core.ArcConfig`` fields; ``roles``:
    ``roles_common.RoleSpec`` fields; ``envs``: environments mixed round-robin over groups. The
    ArcConfig and the RoleSpec are built (and checked) once per spec: ``arc_config``,
    ``role_spec``."""

    problems_path: str
    """The curated problems table (``decontaminated_problems``) of the ToolMath environment (task curated)."""
    tokenizer_dir: str
    """Hugging Face directory of the tokenizer (and chat template)."""
    model_dir: Optional[str] = None
    """The policy's weights; None = the tiny random 2-layer Llama (wiring checks only)."""
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    """Methods to run, in order: a non-empty subset of ``METHODS`` without repeats (monolithic, rollarc,
    async0, rollarc_a1, rollarc_a2)."""
    envs: list[str] = field(default_factory=lambda: list(ENVS))
    """Environments mixed round-robin over groups: a non-empty subset of ``envs.ENV_NAMES`` (task curated)."""
    arc: dict = field(default_factory=dict)
    """``core.ArcConfig`` fields over its defaults (scheduler: steps, G, R, redundancy, async_ratio, ...)."""
    roles: dict = field(default_factory=dict)
    """``roles_common.RoleSpec`` fields over its defaults (token budgets, routing, engines, env latency, ...)."""
    frozenlake_size: int = 4
    """Side of each FrozenLake map (cells; the environment accepts 2..32)."""
    seed: int = 0
    """Seed of the policy (``PolicySpec.seed``: tiny weights, sampling), the ToolMath problem order, the
    FrozenLake maps and the injected env latency."""
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @cached_property
    def arc_config(self) -> ArcConfig:
        """The scheduler settings (``arc`` over ArcConfig's defaults); raises ValueError naming the field."""
        return ArcConfig(**self.arc)

    @cached_property
    def role_spec(self) -> RoleSpec:
        """The roles' settings (``roles`` over RoleSpec's defaults, with the policy of this spec)."""
        roles = dict(self.roles)
        if self.task == "scratchpad":
            roles.setdefault("env_latency", "none")          # the checker's latency is real work
        return RoleSpec(tokenizer_dir=self.tokenizer_dir, model_dir=self.model_dir, seed=self.seed, **roles)

    def method_config(self, method: str) -> ArcConfig:
        """The ArcConfig a method runs with: ``async0`` / ``rollarc_a<k>`` fix ``async_ratio``."""
        from dataclasses import replace

        k = {"async0": 0, "rollarc_a1": 1, "rollarc_a2": 2}.get(method)
        return self.arc_config if k is None else replace(self.arc_config, async_ratio=k)

    def eval_problems(self) -> list:
        """The held-out scratchpad problems as ``(uid, a, n)`` (empty when ``eval_size`` is 0)."""
        if not self.eval_size:
            return []
        from ops.rl import scratchpad as sp

        return [(p.uid, p.a, p.n) for p in sp.problems(self.task_seed + 1000, self.eval_size, self.max_lines,
                                                       split="heldout")]

    def validate(self) -> "RunSpec":
        """Returns the spec; raises ValueError naming the field (``rollarc.methods``,
        ``rollarc.async_ratio``, ``rollarc.route_policy``, ...)."""
        from .envs import ENV_NAMES

        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"rollarc.methods must be a non-empty subset of {list(METHODS)}, got {self.methods}")
        if self.task not in TASKS:
            raise ValueError(f"rollarc.task must be one of {list(TASKS)}, got {self.task!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"rollarc.placement must be one of {list(PLACEMENTS)}, got {self.placement!r}")
        for name in ("eval_size", "eval_every", "task_seed", "check_work"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"rollarc.{name} must be an int >= 0, got {v!r}")
        if not (isinstance(self.eval_temperature, (int, float)) and self.eval_temperature >= 0):
            raise ValueError(f"rollarc.eval_temperature must be >= 0, got {self.eval_temperature!r}")
        if not (isinstance(self.max_lines, int) and 1 <= self.max_lines <= 60):
            raise ValueError(f"rollarc.max_lines must be an int in [1, 60], got {self.max_lines!r}")
        if self.eval_size and self.task != "scratchpad":
            raise ValueError("rollarc.eval_size needs task 'scratchpad' (the held-out set is scratchpad problems)")
        self.role_spec.check_sampling("rollarc")
        try:
            self.role_spec.grpo_config()
        except (TypeError, ValueError) as e:
            raise ValueError(f"rollarc.roles.{e}") from None
        if self.task == "scratchpad" and self.role_spec.env_latency != "none":
            raise ValueError(f"rollarc.env_latency must be 'none' for task 'scratchpad' (its latency is the "
                             f"checker's real work), got {self.role_spec.env_latency!r}")
        bad = [e for e in self.envs if e not in ENV_NAMES]
        if bad or not self.envs:
            raise ValueError(f"rollarc.envs must be a non-empty subset of {list(ENV_NAMES)}, got {self.envs}")
        _, rs = self.arc_config, self.role_spec          # built, and checked, here once
        if rs.route_policy not in ("affinity", "uniform"):
            raise ValueError(f"rollarc.route_policy must be 'affinity' or 'uniform', got {rs.route_policy!r}")
        if rs.env_latency not in ("none", "low", "medium", "heavy"):
            raise ValueError(f"rollarc.env_latency must be none|low|medium|heavy, got {rs.env_latency!r}")
        if sum(rs.engines.values()) < 1 or any(p not in ("gpu_compute", "gpu_bandwidth") for p in rs.engines):
            raise ValueError(f"rollarc.engines must map gpu_compute/gpu_bandwidth to counts (>= 1 in all), got {rs.engines}")
        if self.checkpoint_every < 1:
            raise ValueError(f"rollarc.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.placement != "local" and any(m != "monolithic" for m in self.methods):   # a Serve pool starts
            from .reward_pool import autoscaling_config

            autoscaling_config(rs.reward_autoscaling, where="rollarc.roles.reward_autoscaling")
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


_ROLE = RoleSpec(tokenizer_dir="")


@dataclass
class RunConfig:
    """A RollArc run as a user configures it, flat (the ``rollarc_run`` asset's Launchpad config
    mirrors it): the methods and environments, the scheduler sizes (``core.ArcConfig``: steps,
    groups_per_step G, group_size R, redundancy, async_ratio, max_turns, the turn and episode
    limits in s, max_failed_fraction), the roles (``roles_common.RoleSpec``: token budgets, routing,
    engines per pool, injected env latency, reward replicas, lr, the sampling distribution:
    temperature, top_k, top_p), the trainer's GRPO loss (``grpo_*``: aggregation, scaling, clip, KL;
    ``RoleSpec.grpo``), the held-out evaluation's temperature, seed, local Ray CPUs and the
    checkpoint cadence (``RunSpec``). Defaults come from those classes."""

    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    """Methods to run, in order: a non-empty subset of monolithic | rollarc | async0 | rollarc_a1 | rollarc_a2
    (``METHODS``; async0 / rollarc_a<k> fix async_ratio)."""
    envs: list[str] = field(default_factory=lambda: list(ENVS))
    """Environments, round-robin over groups."""
    steps: int = ArcConfig.steps
    """Optimizer steps per method."""
    groups_per_step: int = ArcConfig.groups_per_step
    """G: groups (tasks) per optimizer step, 1..8192."""
    group_size: int = ArcConfig.group_size
    """Trajectories per group that are trained (the GRPO group)."""
    redundancy: int = ArcConfig.redundancy
    """Extra trajectories launched per group (RollArc): the first group_size to finish win."""
    async_ratio: int = ArcConfig.async_ratio
    """Staleness bound in optimizer steps (0 = synchronous)."""
    max_turns: int = ArcConfig.max_turns
    """LLM calls per episode, 1..1024; reaching it ends the episode ``truncated``."""
    turn_timeout_s: float = ArcConfig.turn_timeout_s
    """Limit of one env step and of one LLM call (s, > 0)."""
    episode_timeout_s: float = ArcConfig.episode_timeout_s
    """Limit of one whole episode, reward included (s, > 0)."""
    max_failed_fraction: float = ArcConfig.max_failed_fraction
    """A step fails when more than this fraction of its trajectories has no reward."""
    max_new_tokens: int = RoleSpec.max_new_tokens
    """Response budget per LLM call (tokens)."""
    max_prompt_tokens: int = RoleSpec.max_prompt_tokens
    """Context kept per LLM call (left-truncated: the latest turns stay)."""
    route_policy: str = RoleSpec.route_policy
    """``affinity`` (prefill-heavy requests to gpu_compute, decode-heavy to gpu_bandwidth) or ``uniform``."""
    prefill_heavy_ratio: float = RoleSpec.prefill_heavy_ratio
    """Prompt / expected-decode tokens at or above which a request is prefill-heavy (affinity: to
    gpu_compute), > 0; 4.0 suits H800- vs H20-class pools, 12 the embedded default's CPU pools."""
    engines_compute: int = _ROLE.engines["gpu_compute"]
    """Engine actors on the gpu_compute pool."""
    engines_bandwidth: int = _ROLE.engines["gpu_bandwidth"]
    """Engine actors on the gpu_bandwidth pool."""
    env_latency: str = RoleSpec.env_latency
    """Injected env step latency: none | low | medium | heavy (same mean)."""
    env_latency_mean_s: float = RoleSpec.env_latency_mean_s
    """Mean of the injected per-step env latency (s, >= 0)."""
    sandbox: str = RoleSpec.sandbox
    """Sandbox of the environments' code: bwrap (kernel-enforced; the run refuses to start without bubblewrap)
    or rlimits (weaker, process-only: allow it explicitly). Recorded in the run's metadata."""
    reward_max_replicas: int = REWARD_AUTOSCALING["max_replicas"]
    """Most replicas of the elastic reward pool (Ray Serve autoscaling, >= 1)."""
    lr: float = RoleSpec.lr
    """AdamW learning rate of the trainer."""
    temperature: float = RoleSpec.temperature
    """Sampling temperature of the engines (the trainer scores under the same distribution)."""
    top_k: int = RoleSpec.top_k
    """Keep only the k most likely tokens when sampling (0 = off)."""
    top_p: float = RoleSpec.top_p
    """Nucleus sampling mass (1.0 = off)."""
    grpo_agg: str = GRPOConfig.agg
    """GRPO loss aggregation (``ops.rl.grpo``; veRL's names): seq-mean-token-mean (each trajectory one row, the
    token mean over all its turns; GRPO), seq-mean-token-sum, or token-mean (DAPO)."""
    grpo_scale: str = GRPOConfig.scale
    """GRPO advantage scaling: std (divide by the group's reward std; GRPO) or none (centre only; Dr. GRPO)."""
    grpo_clip_eps: float = GRPOConfig.clip_eps
    """PPO clip range eps of the GRPO loss, in (0, 1)."""
    grpo_kl_coef: float = GRPOConfig.kl_coef
    """beta of the k3 KL penalty to the initial policy (>= 0; 0 = off; > 0 keeps a frozen copy in the trainer)."""
    eval_temperature: float = RunSpec.eval_temperature
    """Scratchpad only: temperature of the held-out evaluation (0 = greedy)."""
    seed: int = RunSpec.seed
    """Seed of the policy, sampling, the ToolMath problem order, the FrozenLake maps and the env latency."""
    num_cpus: int = RunSpec.num_cpus
    """CPUs of the local Ray instance (ignored with compute.ray_address)."""
    checkpoint_every: int = RunSpec.checkpoint_every
    """Save the trainer state (weights, AdamW state, version) every this many steps of a method, so a
    retried launch resumes after the last save. SmolLM2's state is 1.6 GB: 1.6-6.3 s per save here
    (median 2 s), against ~5 s of optimizer step."""

    ARC = ("steps", "groups_per_step", "group_size", "redundancy", "async_ratio", "max_turns", "turn_timeout_s",
           "episode_timeout_s", "max_failed_fraction")
    ROLES = ("max_new_tokens", "max_prompt_tokens", "route_policy", "prefill_heavy_ratio", "env_latency",
             "env_latency_mean_s", "sandbox", "lr", "temperature", "top_k", "top_p")

    def spec(self, problems_path: str, tokenizer_dir: str, model_dir: Optional[str],
             ray_address: Optional[str] = None) -> RunSpec:
        """The validated RunSpec of this run on ``problems_path`` with the policy at ``model_dir``
        (None: the tiny random policy on ``tokenizer_dir``'s vocabulary). Raises ValueError naming
        the field."""
        roles = {k: getattr(self, k) for k in self.ROLES}
        roles["engines"] = {"gpu_compute": self.engines_compute, "gpu_bandwidth": self.engines_bandwidth}
        roles["reward_autoscaling"] = {"max_replicas": self.reward_max_replicas}
        grpo = {"agg": self.grpo_agg, "scale": self.grpo_scale, "clip_eps": self.grpo_clip_eps,
                "kl_coef": self.grpo_kl_coef}
        roles["grpo"] = {k: v for k, v in grpo.items() if v != getattr(GRPOConfig, k)}   # the non-default ones
        return RunSpec(problems_path=str(problems_path), tokenizer_dir=tokenizer_dir, model_dir=model_dir,
                       methods=list(self.methods), envs=list(self.envs), arc={k: getattr(self, k) for k in self.ARC},
                       roles=roles, seed=self.seed, ray_address=ray_address, num_cpus=self.num_cpus,
                       checkpoint_every=self.checkpoint_every, eval_temperature=self.eval_temperature).validate()


def load_spec(text: str) -> RunSpec:
    """The validated RunSpec of a spec file's text (``RunSpec.to_json``). Raises ValueError naming
    the field, TypeError for an unknown field."""
    return RunSpec(**json.loads(text)).validate()
