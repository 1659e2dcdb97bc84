"""The RollArc run: the monolithic synchronous baseline and RollArc on the same environments, tasks,
initial policy and number of optimizer steps. Launched by the ``rollarc_run`` asset through Dagster
Pipes (the launch protocol, ``assets.launch`` / ``ops.launch.worker_main``); it streams one message
per step and returns the result, which ``worker_main`` writes as ``result.json`` (docs/rollarc.md).

    python -m ops.rl.rollarc.driver --spec spec.json --out DIR [--fingerprint FP]

``RunConfig`` is the flat run configuration the asset shows in the Launchpad (its defaults are
``core.ArcConfig``'s, ``ray_roles.RoleSpec``'s and ``RunSpec``'s); ``RunConfig.spec`` builds the
``RunSpec`` and validates it, the asset's one check; ``load_spec`` is the driver's.

The baseline runs first, colocated in this process (``LocalRoles``); then Ray starts (local
``ray.init`` with the four pool resources, or ``ray_address``) with the disaggregated roles
(``RayRoles``) and the elastic reward pool.

Resume (``RunState``): every ``checkpoint_every`` optimizer steps of a method the driver saves,
under ``DIR/state/``, the trainer's state (``trainer-<method>-<step>.pt``: weights, AdamW state,
policy version, RNG; written by the trainer, ``ops.rl.ray_actors._TrainerImpl``) and, in
``state.json`` (the commit point, written atomically after the trainer file), the method's
``RunResult`` so far: step rows, trajectory summaries, counters and the number of tasks consumed. A
finished method is stored whole. Launched again with the same ``--out`` and spec, the driver skips
the finished methods, and for the method in progress loads the trainer state, publishes it to every
engine (versioned sync: policy version k + 1 after step k) and continues with step k + 1 on the
tasks after the consumed ones (``core.run_rollarc(start_step=...)``), logging the Dagster retry
number. Lost: the steps after the last save, and RollArc's groups in flight at the interruption
(fresh groups are generated from the next tasks). ``wall_s`` adds the launches' training seconds
(setup and lost work excluded); a resumed method's utilisation covers its last launch. A state of
another spec (``fingerprint``) is ignored; a finished launch removes its state (``result.json`` is
the record).

Task ``scratchpad`` (the result contract of the RL drivers): every group is a ``checked_subtraction``
episode (``envs.CheckedSubtraction``) on ``ops.rl.scratchpad.problems(task_seed, ...)``; with
``eval_size`` the trainer's held-out accuracy (``_TrainerImpl.heldout``) is measured before, every
``eval_every`` steps and after each method, never inside its times. The result adds ``task``,
``eval`` ({method: [{step, train_wall_s, accuracy, n, policy_version}, ...]}), ``response_lengths``
({method: response tokens of every trained trajectory, in order}), ``budget`` (the processes and
threads of the methods, ``placement``) and ``speedup_vs_monolithic`` ({method: x}).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Optional

from ops.launch import DriverState
from ops.rl.runs import read_problems, resume_state

from ops.rl.grpo import GRPOConfig

from .core import ArcConfig
from .ray_roles import REWARD_AUTOSCALING, RoleSpec

METHODS = ("monolithic", "rollarc", "async0", "rollarc_a1", "rollarc_a2")
"""The methods a run may hold: ``monolithic`` (the synchronous lock-step baseline, ``core.run_monolithic``)
and the trajectory-level asynchronous scheduler (``core.run_rollarc``) at the spec's ``async_ratio``
(``rollarc``) or at a fixed one: ``async0`` (async_ratio 0: trajectory-level asynchrony and
redundancy, no off-policy data), ``rollarc_a1``, ``rollarc_a2``. Redundancy is the spec's for all
of them. Which processes run a method is ``RunSpec.placement``'s."""
DEFAULT_METHODS = ("monolithic", "rollarc")
TASKS = ("curated", "scratchpad")
PLACEMENTS = ("split", "local", "ray")
ENVS = ("frozenlake", "tool_math")
"""The environments of a run by default, mixed round-robin over groups."""

CRASH_ENV = "CRUCIBLE_ROLLARC_CRASH_AFTER_STEPS"
"""Fault injection (tests): ``N`` makes the driver SIGKILL its process group (itself and a local Ray
instance: the launch, as a node preemption would) right after the first save that holds N or more
steps of the run (finished methods' steps included). Counted over the whole run: a relaunch whose
saved state already holds N steps is not killed again (``ops.rl.runs.crash_if_asked``)."""


@dataclass
class RunSpec:
    """Everything a run needs (JSON-serialisable). ``arc``: ``core.ArcConfig`` fields; ``roles``:
    ``ray_roles.RoleSpec`` fields; ``envs``: environments mixed round-robin over groups. The
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
    """``ray_roles.RoleSpec`` fields over its defaults (token budgets, routing, engines, env latency, ...)."""
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
    limits in s, max_failed_fraction), the roles (``ray_roles.RoleSpec``: token budgets, routing,
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


class RunState(DriverState):
    """What one run directory has saved (see the module docstring).

    Layout: ``<out>/state/state.json`` (fingerprint, finished methods, the method in progress,
    resumes, seconds spent saving) and ``trainer-<method>-<step>.pt`` of the last saved step.

    Attributes:
        done: {method: its result dict (``RunResult.to_dict`` + utilisation, setup_s)}, finished methods.
        current: the method in progress (``method``, ``step`` saved last, ``version``, ``trainer``
            file name, ``result``: ``RunResult.to_dict`` after that step) or None.
        resumes: one dict per resume (method, after_step, policy_version, steps_done, retry_number).
        skipped: why a state on disk was ignored (None: it was not). seconds: time spent saving, over
            every launch.
    """

    FIELDS = {"done": {}, "current": None}

    @property
    def steps_done(self) -> int:
        """Optimizer steps of the run the state holds (finished methods and the saved part of the
        method in progress)."""
        cur = len(self.current["result"]["steps"]) if self.current else 0
        return sum(len(r["steps"]) for r in self.done.values()) + cur

    def _commit(self, t: float) -> None:
        self.commit(t, {self.current["trainer"]} if self.current else set())

    async def save_step(self, method: str, result: dict, roles, timeout_s: float) -> int:
        """Record ``method`` in progress after the last step of ``result`` (``RunResult.to_dict``,
        snapshot when the step ended): the trainer state through ``roles.save_checkpoint`` (bounded
        by ``timeout_s``), then ``state.json``. Returns ``steps_done``. Raises RuntimeError when the
        trainer's version is not the number of steps trained."""
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        k = result["steps"][-1]["step"]
        name = f"trainer-{method}-{k}.pt"
        version = await asyncio.wait_for(roles.save_checkpoint(str(self.dir / name)), timeout_s)
        if version != k + 1:
            raise RuntimeError(f"{method}: the trainer holds policy version {version} after step {k} (expected {k + 1})")
        self.current = {"method": method, "step": k, "version": version, "trainer": name, "result": result}
        self._commit(t)
        return self.steps_done

    def save_done(self, method: str, result: dict) -> int:
        """Record ``method`` as finished with its whole result dict. Returns ``steps_done``."""
        t = time.monotonic()
        self.done[method] = result
        self.current = None
        self._commit(t)
        return self.steps_done


def crash_if_asked(count: int, loaded: int, log: Callable[[str], None]) -> None:
    """Fault injection: SIGKILL this process group when ``CRASH_ENV`` = N with ``loaded`` < N <=
    ``count`` (steps saved now; ``loaded``: steps the state held when this launch started;
    ``ops.rl.runs.crash_if_asked``). Raises ValueError when the variable is not an integer."""
    from ops.rl.runs import crash_if_asked as crash

    crash(CRASH_ENV, count, loaded, log)


def tool_math_problems(df):
    """The rows of a problems table that ToolMath uses: a non-empty answer, a problem under 600
    characters, numeric answer type (when the column exists). Polars in, Polars out."""
    import polars as pl

    df = df.filter(pl.col("answer").is_not_null() & (pl.col("answer").str.strip_chars() != "")
                   & (pl.col("problem").str.len_chars() < 600))
    if "answer_type" in df.columns:
        df = df.filter(pl.col("answer_type") == "numeric")
    return df


def tool_math_rows(spec: RunSpec) -> list[dict]:
    """The ToolMath problems of a run, in its seeded order (empty when ``tool_math`` is not one of
    its environments). The asset calls it before launching, so that an unusable table fails before
    a launch and a run folder. Raises FileNotFoundError / ValueError naming the file: missing, lacks
    columns, no numeric problem."""
    if spec.task != "curated" or "tool_math" not in spec.envs:
        return []
    df = read_problems(spec.problems_path)
    rows = tool_math_problems(df).sort("problem_id").to_dicts()
    if not rows:
        raise ValueError(f"problems table {spec.problems_path} has no numeric problem for the tool_math environment "
                         f"({df.height} rows); use envs ['frozenlake'] or curate more problems")
    random.Random(spec.seed).shuffle(rows)
    return rows


def load_tasks(spec: RunSpec) -> list:
    """One task per group of the run (enough for the baseline's steps x G and RollArc's look-ahead),
    environments round-robin: FrozenLake maps by seed, ToolMath problems with numeric answers from
    the curated problems table (``tool_math_rows``)."""
    from .types import Task

    cfg = spec.arc_config
    n = (cfg.steps + 2 * (max(cfg.async_ratio, 2) + 2)) * cfg.groups_per_step * 4
    if spec.task == "scratchpad":
        from ops.rl import scratchpad as sp

        return [Task(uid=p.uid, env="checked_subtraction",
                     spec={"a": p.a, "n": p.n, "answer": p.answer, "answer_type": "numeric", "check_work": spec.check_work})
                for p in sp.problems(spec.task_seed, n, spec.max_lines)]
    math_rows = tool_math_rows(spec)
    out = []
    for i in range(n):
        env = spec.envs[i % len(spec.envs)]
        if env == "frozenlake":
            out.append(Task(uid=f"lake{spec.seed}-{i}", env=env, spec={"map_seed": spec.seed * 10_007 + i, "size": spec.frozenlake_size}))
        else:
            r = math_rows[i % len(math_rows)]
            out.append(Task(uid=str(r["problem_id"]), env=env,
                            spec={"problem": r["problem"], "answer": r["answer"], "solution": r.get("solution"),
                                  "answer_type": r.get("answer_type") or "numeric"}))
    return out


def _progress(pipes, method: str, steps: int, t0: float, start_step: int = 0):
    def on_step(row: dict) -> None:
        done = row["step"] + 1
        el = time.monotonic() - t0
        eta = el / (done - start_step) * (steps - done)
        msg = {k: row[k] for k in ("step", "max_staleness", "wait_s", "train_s", "reward_mean", "failed_rewards",
                                   "trajectories", "loss") if k in row}
        pipes.report_custom_message({"method": method, **msg})
        pipes.log.info(f"{method}: step {done}/{steps}, {(done - start_step) / el:.3f} steps/s, ETA {eta:.0f} s; staleness "
                       f"{row['staleness']}, wait {row['wait_s']:.1f}s, train {row['train_s']:.1f}s, "
                       f"reward {row['reward_mean']}, statuses {row['statuses']}")
    return on_step


def run_method(method: str, spec: RunSpec, tasks: list, tok, pipes, state: Optional[RunState] = None,
               on_saved: Optional[Callable[[int], None]] = None, eval_cache: Optional[dict] = None) -> dict:
    """One method, from the initial policy or, when ``state`` holds it in progress, after its last
    saved step: trainer state loaded, ``publish(k + 1)`` to every engine, the saved RunResult
    continued on the tasks after the consumed ones. With ``state``, the trainer state and the
    RunResult are saved every ``spec.checkpoint_every`` steps (not after the last step: the finished
    method is saved whole), then ``on_saved(steps saved over the run)``.

    With ``spec.eval_size``, the trainer's held-out accuracy before the first step (reused from
    ``eval_cache`` when an earlier method of the run measured it: every method starts from the same
    policy and the evaluation is seeded), every ``eval_every`` steps and after the last; evaluation
    seconds are excluded from ``wall_s`` and every ``train_wall_s``.

    Returns ``RunResult.to_dict()`` plus ``utilisation`` (of this launch), ``setup_s`` (actors /
    Serve start, outside ``wall_s``), ``async_ratio``, ``eval`` (entries as in the result contract),
    ``eval_s`` (mid-run evaluation seconds taken out of ``wall_s``). Raises RollArcError (see ``core``), RuntimeError when the
    saved trainer's version does not match the saved steps, FileNotFoundError naming a missing
    trainer file."""
    from .core import RunResult, run_monolithic, run_rollarc
    from .ray_roles import LocalRoles, RayRoles

    cfg, rs = spec.method_config(method), spec.role_spec
    cur = state.current if state is not None and state.current and state.current["method"] == method else None
    res = RunResult.from_dict(cur["result"]) if cur else RunResult(method=method, config=asdict(cfg))
    start, wall0 = len(res.steps), res.wall_s
    t0 = time.monotonic()
    if needs_ray(spec, method):
        roles = RayRoles(rs, tok).start()
    else:
        roles = LocalRoles(rs, tok, serve=spec.placement == "local")
    setup_s = time.monotonic() - t0
    pipes.log.info(f"{method}: roles ready in {setup_s:.1f}s ({type(roles).__name__}, placement {spec.placement}, "
                   f"async_ratio {cfg.async_ratio})")
    probs = spec.eval_problems()
    evals: list = list(cur["result"].get("eval", [])) if cur else []
    ev = {"s": 0.0}                                     # seconds of evaluation inside the method's clock

    async def evaluate(step: int, wall_so_far: float) -> float:
        te = time.monotonic()
        r = await asyncio.wait_for(roles.heldout(probs, spec.eval_temperature, 256, spec.task_seed), cfg.train_timeout_s)
        evals.append({"step": step, "train_wall_s": max(0.0, wall_so_far), "accuracy": r["accuracy"], "n": r["n"],
                      "policy_version": r["policy_version"], "by_lines": r.get("by_lines"), "mean_len": r.get("mean_len")})
        pipes.log.info(f"{method}: held-out accuracy {r['accuracy']:.3f} (n {r['n']}) after {step} steps, "
                       f"policy version {r['policy_version']} ({time.monotonic() - te:.1f}s, not timed)")
        return time.monotonic() - te

    async def go():
        if probs and not cur:                          # before the method's clock starts
            if eval_cache is not None and "step0" in eval_cache:
                evals.append(dict(eval_cache["step0"]))
            else:
                await evaluate(0, 0.0)
                if eval_cache is not None:
                    eval_cache["step0"] = dict(evals[-1])
        if cur:
            path = str(state.dir / cur["trainer"])
            version = await asyncio.wait_for(roles.load_checkpoint(path), cfg.train_timeout_s)
            if version != start:
                raise RuntimeError(f"{method}: {path} holds policy version {version}, the saved run has {start} steps")
            await asyncio.wait_for(roles.publish(version), cfg.train_timeout_s)
            retry = getattr(pipes, "retry_number", None)
            state.resumes.append({"method": method, "after_step": cur["step"], "policy_version": version,
                                  "steps_done": state.steps_done, "retry_number": retry})
            pipes.log.info(f"{method}: resuming after step {cur['step']} (policy version {version} published to the "
                           f"engines) on Dagster retry {'n/a' if retry is None else retry}")
            pipes.log.info(f"{method}: {state.steps_done} of {len(spec.methods) * cfg.steps} steps of the run done; "
                           f"continuing with task {res.tasks_consumed} of {len(tasks)}"
                           + (" (groups in flight at the interruption are lost)" if method == "rollarc" else ""))
        progress = _progress(pipes, method, cfg.steps, time.monotonic(), start)

        def on_step(row: dict):
            progress(row)
            k = row["step"]
            mid_eval = bool(probs and spec.eval_every and k < cfg.steps - 1 and (k + 1) % spec.eval_every == 0)
            save_now = not (state is None or k >= cfg.steps - 1 or (k + 1) % spec.checkpoint_every)
            if not (mid_eval or save_now):
                return None
            wall_now = res.wall_s - ev["s"]

            async def after():
                if mid_eval:
                    ev["s"] += await evaluate(k + 1, wall_now)
                if save_now:
                    snapshot = res.to_dict()
                    snapshot["eval"] = list(evals)
                    snapshot["wall_s"] -= ev["s"]
                    n = await state.save_step(method, snapshot, roles, cfg.train_timeout_s)
                    if on_saved:
                        on_saved(n)
            return after()

        it = iter(tasks[res.tasks_consumed:])
        if method == "monolithic":
            return await run_monolithic(roles, cfg, it, on_step=on_step, start_step=start, result=res)
        return await run_rollarc(roles, cfg, it, on_step=on_step, start_step=start, result=res, method=method)

    async def go_and_eval():
        await go()
        res.wall_s -= ev["s"]                          # evaluation never counts in a method's time
        if probs:
            await evaluate(cfg.steps, res.wall_s)

    try:
        asyncio.run(go_and_eval())
        out = res.to_dict()
        out["utilisation"] = roles.utilisation(res.wall_s - wall0)
    finally:
        roles.close()
    out["setup_s"] = setup_s
    out["async_ratio"] = None if method == "monolithic" else cfg.async_ratio
    out["eval"] = evals
    out["eval_s"] = ev["s"]
    if state is not None:
        n = state.save_done(method, out)
        if on_saved:
            on_saved(n)
    return out


def needs_ray(spec: RunSpec, method: str) -> bool:
    """Whether ``method``'s roles are Ray actors under ``spec.placement``."""
    return spec.placement == "ray" or (spec.placement == "split" and method != "monolithic")


def init_ray(spec: RunSpec) -> None:
    """Ray for the RollArc roles: the local node advertises the four pools (``pool_resources``)."""
    from ops.launch import init_ray as start_ray

    from .ray_roles import pool_resources

    rs = spec.role_spec
    start_ray(spec.ray_address, spec.num_cpus, rs.threads,
              resources=pool_resources(rs.engines, rs.env_workers, rs.reward_autoscaling["max_replicas"]))


def run(spec: RunSpec, pipes, state: Optional[RunState] = None,
        on_saved: Optional[Callable[[int], None]] = None) -> dict:
    """Every method of ``spec`` on the same tasks; with ``state`` (loaded), saving as it goes and
    resuming: methods it holds as done are skipped (their saved results kept), the one in progress
    continues (``run_method``). Returns the result dict (see ``main``)."""
    from ops.rl.policy import load_tokenizer

    t0 = time.monotonic()
    tok = load_tokenizer(spec.tokenizer_dir)
    tasks = load_tasks(spec)
    results, ray_init_s, eval_cache = {}, None, {}
    for method in spec.methods:
        if state is not None and method in state.done:
            results[method] = state.done[method]
            pipes.log.info(f"{method}: finished before this launch ({len(results[method]['steps'])} steps), skipped")
            if not any(r.get("method") == method for r in state.resumes):
                state.resumes.append({"method": method, "skipped": True, "steps_done": len(results[method]["steps"]),
                                      "retry_number": getattr(pipes, "retry_number", None)})
            continue
        if needs_ray(spec, method):
            import ray

            from ray import serve

            ti = time.monotonic()
            init_ray(spec)
            ray_init_s = (ray_init_s or 0.0) + time.monotonic() - ti
            try:
                results[method] = run_method(method, spec, tasks, tok, pipes, state, on_saved, eval_cache)
            finally:
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
        else:
            results[method] = run_method(method, spec, tasks, tok, pipes, state, on_saved, eval_cache)
    out = {"spec": asdict(spec), "methods": results, "ray_init_s": ray_init_s, "wall_s": time.monotonic() - t0,
           "ray_address": spec.ray_address or "local", "task": spec.task,
           "eval": {m: r.get("eval", []) for m, r in results.items()},
           "response_lengths": {m: [t["response_tokens"] for t in r["trajectories"]] for m, r in results.items()},
           "weight_syncs": {m: (r.get("utilisation") or {}).get("weight_syncs") for m, r in results.items()
                            if (r.get("utilisation") or {}).get("weight_syncs")},
           "budget": budget(spec)}
    if "monolithic" in results:
        b = results["monolithic"]["wall_s"]
        out["speedup_vs_monolithic"] = {m: (b / r["wall_s"] if r["wall_s"] > 0 else None)
                                        for m, r in results.items() if m != "monolithic"}
    if state is not None:
        out.update(fingerprint=state.fp, retry_number=getattr(pipes, "retry_number", None), resumes=state.resumes,
                   state_save_s=state.seconds)
    if "monolithic" in results and "rollarc" in results:
        a, b = results["rollarc"], results["monolithic"]
        out["speedup_e2e"] = b["wall_s"] / a["wall_s"] if a["wall_s"] > 0 else None
        # with each method's start-up (RollArc: Ray, Serve and the actors; the baseline: loading the policy)
        tot_a, tot_b = a["wall_s"] + a.get("setup_s", 0.0) + (ray_init_s or 0.0), b["wall_s"] + b.get("setup_s", 0.0)
        out["speedup_incl_setup"] = tot_b / tot_a if tot_a > 0 else None
        out["speedup_trajectories_per_s"] = (a["trajectories_per_s"] / b["trajectories_per_s"]
                                             if b["trajectories_per_s"] > 0 else None)
    return out


def budget(spec: RunSpec) -> str:
    """The processes and threads each method of ``spec`` runs on, in words."""
    rs = spec.role_spec
    n_eng = sum(rs.engines.values())
    if spec.placement == "local":
        return (f"every method: one process (this one) with {n_eng} engine servers ({rs.engines}, dynamic batching "
                f"up to {rs.max_batch}, one generation thread each), the trainer on a thread of it, torch intra-op "
                f"threads {rs.threads} (process-wide), environment steps on threads (each check one sandboxed "
                f"subprocess), one reward verifier process")
    if spec.placement == "ray":
        return (f"every method: Ray actors — {n_eng} engines ({rs.engines}, {rs.threads} torch threads each), one "
                f"trainer actor ({rs.trainer_threads} threads) on gpu_compute, {rs.env_workers} env worker(s), reward "
                f"pool {rs.reward_autoscaling['min_replicas']}-{rs.reward_autoscaling['max_replicas']} replicas; "
                f"Ray CPUs {spec.num_cpus}")
    return (f"split: monolithic colocated in one process (one engine, in-process trainer); the others on Ray "
            f"({n_eng} engines, trainer actor, {rs.env_workers} env worker(s), reward pool) — not an equal budget")


def load_spec(text: str) -> RunSpec:
    """The validated RunSpec of a spec file's text (``RunSpec.to_json``). Raises ValueError naming
    the field, TypeError for an unknown field."""
    return RunSpec(**json.loads(text)).validate()


def run_launched(spec: RunSpec, out: Path, fp: str, pipes) -> dict:
    """The launched run (the ``run`` of ``ops.launch.worker_main``): ``run`` resuming from the state
    saved under ``out`` (``RunState``); ``worker_main`` removes that state once ``result.json`` is written.
    Returns the result dict (see ``run``)."""
    state = resume_state(RunState(out, fingerprint(spec)), pipes.log)
    loaded = state.steps_done
    result = run(spec, pipes, state, on_saved=lambda n: crash_if_asked(n, loaded, pipes.log.info))
    pipes.log.info(f"rollarc run done in {result['wall_s']:.1f}s; speedup {result.get('speedup_e2e')}")
    return result


def main(argv: Optional[list[str]] = None) -> int:
    from ops.launch import worker_main

    return worker_main(load_spec, run_launched, argv, description=__doc__, scratch=("state",))


BENCHMARK_ARC = {"steps": 4, "groups_per_step": 2, "group_size": 3, "max_turns": 3}
"""The real-engine benchmark's workload (``run_benchmark``): larger than the embedded default's
ArcConfig; redundancy and async ratio are ArcConfig's."""


def run_benchmark(problems_path: str, tokenizer_dir: str, model_dir: Optional[str], kinds=("low", "medium", "heavy"),
                  arc: Optional[dict] = None, roles: Optional[dict] = None, seed: int = 0) -> dict:
    """The real-engine benchmark: for each env latency kind, the baseline and RollArc on the same
    tasks and steps (one Ray start per kind). Returns {"settings", kind: {summary rows per method,
    per-pool utilisation, speedups}} (no per-trajectory rows)."""
    from ops.launch import _LocalPipes

    from .report import summary_rows, utilisation_rows

    arc = {**BENCHMARK_ARC, **(arc or {})}
    roles = {"env_latency_mean_s": 0.5, **(roles or {})}
    out: dict = {"settings": {"arc": asdict(ArcConfig(**arc)), "roles": roles, "policy": model_dir or "tiny random Llama",
                              "seed": seed}}
    for kind in kinds:
        spec = RunSpec(problems_path=problems_path, tokenizer_dir=tokenizer_dir, model_dir=model_dir, seed=seed,
                       arc=dict(arc), roles={**roles, "env_latency": kind}).validate()
        r = run(spec, _LocalPipes(0))
        out[kind] = {"summary": summary_rows(r), "utilisation": utilisation_rows(r), "speedup_e2e": r.get("speedup_e2e"),
                     "speedup_trajectories_per_s": r.get("speedup_trajectories_per_s"), "ray_init_s": r["ray_init_s"]}
    return out


if __name__ == "__main__":
    sys.exit(main())
