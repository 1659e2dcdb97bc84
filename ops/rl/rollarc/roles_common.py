"""What RollArc's two role sets share (``ray_roles.RayRoles``, disaggregated on Ray, and
``local_roles.LocalRoles``, colocated for the baseline): their spec (``RoleSpec``, part of the
driver's ``RunSpec``), the reward pool's autoscaling default, the trainer metrics a step row keeps,
prompt encoding (chat template or plain rendering), the reward request of a trajectory, the seeded
env latency, one routed LLM call (``routed_llm``), the busy-time clock of a pool and the weight-sync
totals (RollArc, arXiv 2512.22560 §3-4). ``torch`` and ``transformers`` are not imported here.
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Optional

from ops.rl.grpo import GRPOConfig
from ops.rl.runs import PolicySpec

from .types import Segment, Trajectory


@dataclass
class RewardAutoscaling:
    """Ray Serve ``autoscaling_config`` of the elastic reward pool in a RollArc run (the fields of
    ``ray.serve.config.AutoscalingConfig`` it sets; Serve's own model checks them when the pool starts,
    ``reward_pool.autoscaling_config``): one to two replicas, scaling within seconds (a run's steps last
    seconds to minutes, so Serve's slower production defaults would never scale within one)."""

    min_replicas: int = 1
    """Fewest replicas of the reward pool (>= 0)."""
    max_replicas: int = 2
    """Most replicas of the reward pool (>= min_replicas)."""
    target_ongoing_requests: float = 1.0
    """Requests in flight per replica Serve aims at (> 0)."""
    upscale_delay_s: float = 0.5
    """How long the load must stay above target before Serve adds a replica (s)."""
    downscale_delay_s: float = 5.0
    """How long the load must stay below target before Serve removes a replica (s)."""
    look_back_period_s: float = 1.0
    """Window of the load average Serve decides on (s)."""
    metrics_interval_s: float = 0.25
    """How often replicas report their load (s)."""


REWARD_AUTOSCALING = asdict(RewardAutoscaling())
"""``RewardAutoscaling``'s defaults as Serve's dict."""

TRAIN_METRICS = ("loss", "grad_norm", "clip_fraction", "kl", "tokens", "masked_tokens")
"""The trainer's step metrics (``StreamTrainer.step``) a RollArc step row keeps; ``masked_tokens`` counts the
tokens whose log-ratio was beyond ``grpo.log_ratio_bound`` (masked out of the loss, ``ops.rl.grpo``)."""


@dataclass(kw_only=True)
class RoleSpec(PolicySpec):
    """What the roles need (JSON-serialisable; the ``roles`` part of the driver's RunSpec): the policy
    (``ops.rl.runs.PolicySpec``: tokenizer_dir, model_dir (None = the tiny random policy), lr,
    temperature, seed, tiny_hidden, threads of each engine actor, reward_timeout_s and
    reward_retries of one reward request) and the placement and sizes below. Its parts are typed:
    ``grpo`` a ``GRPOConfig``, ``reward_autoscaling`` a ``RewardAutoscaling``."""

    tokenizer_dir: str = ""
    """Hugging Face directory of the tokenizer (and chat template); the asset sets it from the policy."""
    engines: dict[str, int] = field(default_factory=lambda: {"gpu_compute": 1, "gpu_bandwidth": 1})
    """Engine actors per pool ({``gpu_compute``: n, ``gpu_bandwidth``: n}; >= 1 engine in all)."""
    route_policy: str = "affinity"
    """``affinity`` (prefill-heavy requests to gpu_compute, the rest to gpu_bandwidth) | ``uniform``
    (``router.RequestRouter``)."""
    prefill_heavy_ratio: float = 12.0
    """Prompt / expected-decode tokens at or above which a request is prefill-heavy (affinity: to
    ``gpu_compute``), > 0. It depends on the pools' hardware: 4.0 for H800-class vs H20-class GPUs
    (``router.DEFAULT_PREFILL_HEAVY_RATIO``). On the embedded default both pools are the same CPU and replies
    are short (16 tokens): 12 separates the first turn (system + first observation, ~250 tokens) from later,
    longer-context turns so that both pools serve."""
    max_new_tokens: int = 16
    """Response budget per LLM call (tokens)."""
    max_prompt_tokens: int = 256
    """Context kept per LLM call (tokens; left-truncated: the latest turns stay)."""
    max_batch: int = 8
    """Engine dynamic batching: most requests an engine generates in one batch."""
    batch_wait_s: float = 0.02
    """Engine dynamic batching: how long a partial batch waits for more requests (s)."""
    llm_timeout_s: float = 60.0
    """Wall-clock limit of one engine generation call (s, > 0)."""
    env_workers: int = 1
    """Environment actors on ``cpu_env`` (at least 1 is started)."""
    env_concurrency: int = 64
    """Environment sessions (trajectories) each environment actor serves at once (``max_concurrency``)."""
    env_latency: Optional[str] = None
    """Injected per-step env latency kind (``envs.EnvLatency``): none | low | medium | heavy (same mean);
    unset = the task's: ``none`` for the scratchpad task (the checker's latency is its real work),
    ``heavy`` for the curated environments (``RunSpec`` resolves it; a RoleSpec alone: heavy)."""
    env_latency_mean_s: float = 1.0
    """Mean of the injected per-step env latency (s, >= 0)."""
    sandbox: str = "bwrap"
    """How the environments run model-generated code and checkers (``ops.rl.rollarc.sandbox.SANDBOX_MODES``):
    ``bwrap`` (kernel-enforced: bubblewrap namespaces, uid 65534, read-only interpreter; environments refuse to
    start where it is missing) or ``rlimits`` (the weaker process-only mode, only when asked for explicitly)."""
    reward_autoscaling: RewardAutoscaling = field(default_factory=RewardAutoscaling)
    """Ray Serve ``autoscaling_config`` of the elastic reward pool (``RewardAutoscaling``: min_replicas,
    max_replicas, target_ongoing_requests, the delays); Serve's own model checks it when the pool starts
    (``reward_pool.autoscaling_config``)."""
    trainer_threads: int = 2
    """Torch threads of the trainer actor on Ray (the heaviest role)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """The trainer's GRPO loss (``ops.rl.grpo.GRPOConfig``): ``scale`` (std | none), ``agg``
    (seq-mean-token-mean | seq-mean-token-sum | token-mean; a trajectory is one row whatever its turns),
    ``clip_eps`` / ``clip_eps_high`` / ``clip_ratio_c`` (clip), ``kl_coef`` / ``kl_max`` (KL to the initial
    policy), ``log_ratio_bound``, ``std_floor``, ``eps``; checked when built (``grpo.<field>``)."""

    def __post_init__(self):
        from .sandbox import check_mode

        check_mode(self.sandbox)

    def grpo_config(self) -> GRPOConfig:
        """The trainer's ``GRPOConfig`` (``grpo``)."""
        return self.grpo

    def policy(self) -> dict:
        """``PolicySpec.policy`` plus the trainer's ``grpo`` section (``_TrainerImpl`` builds its
        ``GRPOConfig`` from it)."""
        return {**super().policy(), "grpo": asdict(self.grpo)}


# ------------------------------------------------------------------------------ shared helpers

def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer renders chats itself (SmolLM2: yes; the scratchpad's char-level one: no)."""
    return bool(getattr(tokenizer, "chat_template", None))


def render_plain(messages: list) -> str:
    """The conversation as one text for a tokenizer without a chat template: the user and assistant
    contents concatenated with no separators, system messages left out — exactly how the scratchpad
    SFT data concatenates the multi-turn form (``tool_prompt``, turn text, observation, turn text,
    ...; ``ops.rl.scratchpad.tool_turns``)."""
    return "".join(m["content"] for m in messages if m.get("role") != "system")


def stop_strings(tokenizer):
    """Where an LLM call stops besides EOS: at ``?`` (the scratchpad's check request) for a tokenizer
    without a chat template, nowhere else for chat models (their template's end of turn is EOS)."""
    return None if has_chat_template(tokenizer) else ["?"]


def encode(tokenizer, messages: list, max_prompt_tokens: int) -> list[int]:
    """Token ids of the conversation with the generation prompt, left-truncated to
    ``max_prompt_tokens`` (the latest turns are kept): the chat template when the tokenizer has one,
    else ``render_plain`` (no special tokens)."""
    if not has_chat_template(tokenizer):
        ids = tokenizer(render_plain(messages), add_special_tokens=False)["input_ids"]
        return [int(t) for t in list(ids)[-max_prompt_tokens:]]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in list(ids)[-max_prompt_tokens:]]


def reward_request(traj: Trajectory):
    """What the verifier scores: the FrozenLake action replay, or the ToolMath final answer."""
    from .envs import tool_math_reward_item

    key = f"{traj.group_id}/{traj.index}"
    if traj.task.env == "frozenlake":
        return {"key": key, "kind": "frozenlake", "spec": dict(traj.task.spec),
                "actions": list(traj.submission.get("actions", []))}
    return tool_math_reward_item(key, traj.task.spec, traj.submission.get("final_answer"))


def env_latency_for(spec: RoleSpec, key: str):
    """A per-trajectory seeded latency model (the same trajectory key gets the same draws in both
    methods)."""
    from .envs import EnvLatency

    return EnvLatency(spec.env_latency or "heavy", spec.env_latency_mean_s, seed=spec.seed * 1_000_003 + zlib.crc32(key.encode()))


async def routed_llm(roles, messages: list, turn: int, generate) -> Segment:
    """One LLM call through the affinity router (both role sets): encode the conversation, route by
    prompt length and the estimated response length of this turn kind, await
    ``generate(pool, i)(ids, max_new_tokens, timeout_s, stop)`` (a Ray actor method or an in-process
    ``EngineServer``), then release the engine and update the length estimator. Returns the Segment."""
    ids = encode(roles.tok, messages, roles.spec.max_prompt_tokens)
    kind = "first" if turn == 0 else "later"
    pool, i = roles.router.route(len(ids), int(roles.estimator.estimate(kind)))
    t0 = time.monotonic()
    try:
        out = await generate(pool, i)(ids, roles.spec.max_new_tokens, roles.spec.llm_timeout_s, stop_strings(roles.tok))
    finally:
        roles.router.done(pool, i)
    roles.estimator.observe(kind, len(out["response_ids"]))
    return Segment(prompt_ids=ids, response_ids=out["response_ids"], logprobs=out["logprobs"],
                   policy_version=out["version"], pool=pool, finish_reason=out["finish_reason"],
                   latency_s=time.monotonic() - t0, text=out["text"])


class BusyClock:
    """Seconds during which at least one call was in flight (union of intervals), thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inflight = 0
        self.since = 0.0
        self.busy_s = 0.0
        self.t0 = time.monotonic()
        self.calls = 0

    def enter(self) -> None:
        with self.lock:
            if self.inflight == 0:
                self.since = time.monotonic()
            self.inflight += 1
            self.calls += 1

    def exit(self) -> None:
        with self.lock:
            self.inflight -= 1
            if self.inflight == 0:
                self.busy_s += time.monotonic() - self.since

    def snapshot(self) -> dict:
        with self.lock:
            extra = time.monotonic() - self.since if self.inflight else 0.0
            return {"busy_s": self.busy_s + extra, "uptime_s": time.monotonic() - self.t0, "calls": self.calls}


def weight_sync_totals(stats: list[dict]) -> dict:
    """One method's weight-sync record over its engines (``ops.rl.weights.sync_stats`` of each):
    the policy version each engine ends on, and the stale commits refused and failed syncs summed
    (both 0 in a healthy run: RollArc publishes version s + 1 only after version s committed
    everywhere, so a refusal means two publishes raced)."""
    return {"policy_versions": [s["policy_version"] for s in stats],
            "stale_syncs_refused": sum(int(s.get("stale_syncs_refused", 0)) for s in stats),
            "failed_syncs": sum(int(s.get("failed_syncs", 0)) for s in stats)}
