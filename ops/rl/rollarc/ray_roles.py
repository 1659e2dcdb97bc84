"""RollArc's roles on real engines: disaggregated on Ray (``RayRoles``) and colocated in one process for
the monolithic baseline (``LocalRoles``). Both implement ``ops.rl.rollarc.core.Roles`` with the same
policy, engine (``ops.rl.engine.HFEngine``), environments, verifiers and trainer
(``ops.rl.rollpacker.stream.StreamTrainer`` with the engine's log-probabilities as the old policy).

Placement (RollArc, arXiv 2512.22560 §3, hardware-affinity mapping): every role asks for one unit of
its pool's Ray custom resource and 0 CPUs — engines on ``gpu_compute`` / ``gpu_bandwidth``, the
trainer on ``gpu_compute``, environment workers on ``cpu_env``, reward replicas (Ray Serve, elastic)
on ``reward``. A cluster's nodes advertise the pools their hardware fits (``ray start
--resources='{"gpu_bandwidth": 8}'``); the local default advertises all four on this node. With
``engine_gpus`` / ``trainer_gpus`` > 0 (``ops.rl.runs.PolicySpec``) the engines and the trainer also
request ``num_gpus``, so Ray gives each its CUDA device and the models run there.

* Engine actor (asyncio actor): requests from many trajectories are batched as they arrive (up to
  ``max_batch``, waiting at most ``batch_wait_s`` for company) — the dynamic batching a serving
  engine does; generation and weight updates run on one executor thread, so a version is never
  half-applied (``ops.rl.weights``). Each response carries the version that generated it.
* Environment worker (threaded actor, ``max_concurrency`` sessions at once): one stateful session
  per trajectory; a slow step occupies one thread only, so it blocks only its own trajectory.
* The driver routes each LLM request with ``router.RequestRouter`` (prompt tokens known after
  tokenisation, decode tokens from ``DecodeLengthEstimator``).

Resume: both roles run the trainer as ``ops.rl.ray_actors._TrainerImpl`` (a Ray actor, or in this
process), so ``save_checkpoint(path)`` / ``load_checkpoint(path)`` write and read the same file
(policy weights, AdamW state, policy version, torch RNG) with the same code as RollPacker's trainer;
after a load, ``publish(version)`` brings every engine to the loaded version.

``ray``, ``torch`` and ``transformers`` are imported inside functions.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field

from ops.rl.runs import PolicySpec

from .types import POOLS, Segment, StepResult, Task, Trajectory


REWARD_AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1.0, "upscale_delay_s": 0.5,
                      "downscale_delay_s": 5.0, "look_back_period_s": 1.0, "metrics_interval_s": 0.25}
"""The reward pool's Serve autoscaling in a RollArc run: one to two replicas, scaling within seconds (a run's
steps last seconds to minutes, so Serve's slower production defaults would never scale within one)."""

TRAIN_METRICS = ("loss", "grad_norm", "clip_fraction", "kl", "tokens", "masked_tokens")
"""The trainer's step metrics (``StreamTrainer.step``) a RollArc step row keeps; ``masked_tokens`` counts the
tokens whose log-ratio was beyond ``grpo.log_ratio_bound`` (masked out of the loss, ``ops.rl.grpo``)."""


@dataclass
class RoleSpec(PolicySpec):
    """What the roles need (JSON-serialisable; part of the driver's RunSpec): the policy
    (``ops.rl.runs.PolicySpec``: tokenizer_dir, model_dir (None = the tiny random policy), lr,
    temperature, seed, tiny_hidden, threads of each engine actor, reward_timeout_s and
    reward_retries of one reward request) and the placement and sizes below."""

    engines: dict = field(default_factory=lambda: {"gpu_compute": 1, "gpu_bandwidth": 1})
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
    env_latency: str = "heavy"
    """Injected per-step env latency kind (``envs.EnvLatency``): none | low | medium | heavy (same mean)."""
    env_latency_mean_s: float = 1.0
    """Mean of the injected per-step env latency (s, >= 0)."""
    sandbox: str = "bwrap"
    """How the environments run model-generated code and checkers (``ops.rl.rollarc.sandbox.SANDBOX_MODES``):
    ``bwrap`` (kernel-enforced: bubblewrap namespaces, uid 65534, read-only interpreter; environments refuse to
    start where it is missing) or ``rlimits`` (the weaker process-only mode, only when asked for explicitly)."""
    reward_autoscaling: dict = field(default_factory=dict)
    """Ray Serve ``autoscaling_config`` of the elastic reward pool (keys of ``ray.serve.config.AutoscalingConfig``:
    min_replicas, max_replicas, target_ongoing_requests, upscale_delay_s, ...) over ``REWARD_AUTOSCALING``;
    Serve's own model checks it when the pool starts (``reward_pool.autoscaling_config``)."""
    trainer_threads: int = 2
    """Torch threads of the trainer actor on Ray (the heaviest role)."""
    grpo: dict = field(default_factory=dict)
    """The trainer's GRPO loss (``ops.rl.grpo.GRPOConfig`` fields over its defaults): ``scale`` (std | none),
    ``agg`` (seq-mean-token-mean | seq-mean-token-sum | token-mean; a trajectory is one row whatever its
    turns), ``clip_eps`` / ``clip_eps_high`` / ``clip_ratio_c`` (clip), ``kl_coef`` / ``kl_max`` (KL to the
    initial policy), ``log_ratio_bound``, ``std_floor``, ``eps``. ``grpo_config`` builds and checks it."""

    def __post_init__(self):
        from .sandbox import check_mode

        self.reward_autoscaling = {**REWARD_AUTOSCALING, **self.reward_autoscaling}
        check_mode(self.sandbox)

    def grpo_config(self):
        """The trainer's ``GRPOConfig``. Raises ValueError naming the field (``grpo.<field>``), also for
        a key GRPOConfig does not have."""
        from dataclasses import fields as dc_fields

        from ops.rl.grpo import GRPOConfig

        known = {f.name for f in dc_fields(GRPOConfig)}
        unknown = sorted(set(self.grpo) - known)
        if unknown:
            raise ValueError(f"grpo.{unknown[0]} is not a GRPO setting (known: {sorted(known)})")
        return GRPOConfig(**self.grpo)

    def policy(self) -> dict:
        """``PolicySpec.policy`` plus the trainer's ``grpo`` section (``_TrainerImpl`` builds its
        ``GRPOConfig`` from it)."""
        return {**super().policy(), "grpo": dict(self.grpo)}


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

    return EnvLatency(spec.env_latency, spec.env_latency_mean_s, seed=spec.seed * 1_000_003 + zlib.crc32(key.encode()))


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


# ------------------------------------------------------------------------------------ actors

class EngineServer:
    """Body of an engine actor (asyncio actor). ``generate`` returns one response dict:
    response_ids [T], logprobs [T], version, finish_reason, text."""

    def __init__(self, spec: dict, pool: str, max_batch: int, batch_wait_s: float):
        import torch

        from ops.rl.engine import HFEngine
        from ops.rl.ray_actors import _build_policy

        torch.set_num_threads(spec.get("threads", 1))
        torch.manual_seed(spec.get("seed", 0) + 1000 + POOLS.index(pool))
        model, tok = _build_policy(spec)
        self.engine = HFEngine.from_spec(model, tok, spec, version=0)
        self.pool, self.max_batch, self.batch_wait_s = pool, max_batch, batch_wait_s
        self.pending: list = []
        self._batcher = None
        self._executor = None
        self.clock = BusyClock()
        self.batches = 0
        self.tokens = 0

    def _exec(self):
        from concurrent.futures import ThreadPoolExecutor

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="engine")
        return self._executor

    async def generate(self, prompt_ids: list, max_new_tokens: int, timeout_s: float, stop=None) -> dict:
        """One request, batched with concurrent ones. ``stop``: stop strings (``stop_strings``; every
        request of a run passes the same ones — a batch uses its first request's)."""
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((prompt_ids, max_new_tokens, timeout_s, fut, stop))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.ensure_future(self._drain())
        return await fut

    async def _drain(self) -> None:
        from ops.rl.types import Prompt

        loop = asyncio.get_running_loop()
        while self.pending:
            if len(self.pending) < self.max_batch:
                await asyncio.sleep(self.batch_wait_s)              # let concurrent requests join the batch
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch:]
            prompts = [Prompt(uid=str(i), token_ids=tuple(b[0])) for i, b in enumerate(batch)]
            mnt, timeout, stop = max(b[1] for b in batch), min(b[2] for b in batch), batch[0][4]
            self.clock.enter()
            try:
                rb = await loop.run_in_executor(self._exec(), lambda: self.engine.generate(prompts, 1, mnt, stop=stop,
                                                                                           timeout_s=timeout))
            except Exception as e:                                  # every request of the batch fails
                for b in batch:
                    if not b[3].done():
                        b[3].set_exception(e)
                continue
            finally:
                self.clock.exit()
            self.batches += 1
            for b, c in zip(batch, rb.completions):
                self.tokens += len(c.token_ids)
                if not b[3].done():
                    b[3].set_result({"response_ids": list(c.token_ids), "logprobs": list(c.logprobs),
                                     "version": c.policy_version, "finish_reason": c.finish_reason, "text": c.text})

    async def update_weights(self, state: dict, version: int) -> int:
        """Versioned sync on the generation thread (between batches). Returns the published version."""
        from ops.rl.weights import sync_weights

        return await asyncio.get_running_loop().run_in_executor(self._exec(), sync_weights, self.engine, state, version)

    async def stats(self) -> dict:
        from ops.rl.weights import sync_stats

        return {"pool": self.pool, **self.clock.snapshot(), "batches": self.batches, "tokens": self.tokens,
                "version": self.engine.version, "sync": sync_stats(self.engine)}


def weight_sync_totals(stats: list[dict]) -> dict:
    """One method's weight-sync record over its engines (``ops.rl.weights.sync_stats`` of each):
    the policy version each engine ends on, and the stale commits refused and failed syncs summed
    (both 0 in a healthy run: RollArc publishes version s + 1 only after version s committed
    everywhere, so a refusal means two publishes raced)."""
    return {"policy_versions": [s["policy_version"] for s in stats],
            "stale_syncs_refused": sum(int(s.get("stale_syncs_refused", 0)) for s in stats),
            "failed_syncs": sum(int(s.get("failed_syncs", 0)) for s in stats)}


class EnvWorker:
    """Body of an environment actor (threaded). Sessions keyed by trajectory key."""

    def __init__(self, spec: dict):
        from .sandbox import require

        self.spec = RoleSpec(**spec)
        require(self.spec.sandbox)             # no bubblewrap on this node: the actor refuses to start
        self.sessions: dict = {}
        self.lock = threading.Lock()
        self.clock = BusyClock()

    def reset(self, key: str, task: Task) -> str:
        from .envs import make_env

        env = make_env(task.env, latency=env_latency_for(self.spec, key), sandbox=self.spec.sandbox)
        with self.lock:
            self.sessions[key] = env
        self.clock.enter()
        try:
            return env.reset(task)
        finally:
            self.clock.exit()

    def step(self, key: str, action: str) -> StepResult:
        with self.lock:
            env = self.sessions.get(key)
        if env is None:
            raise KeyError(f"no environment session {key!r} (closed or never reset)")
        self.clock.enter()
        try:
            return env.step(action)
        finally:
            self.clock.exit()

    def close(self, key: str) -> None:
        with self.lock:
            env = self.sessions.pop(key, None)
        if env is not None:
            try:
                env.close()
            except Exception:
                pass

    def stats(self) -> dict:
        return {"pool": "cpu_env", **self.clock.snapshot(), "open_sessions": len(self.sessions)}


# -------------------------------------------------------------------------- disaggregated (Ray)

class RayRoles:
    """The disaggregated roles (Ray must be initialised with the pool resources, see
    ``pool_resources``). ``start()`` creates the actors and the reward pool and checks their health;
    ``close()`` removes them (Ray itself is the caller's)."""

    def __init__(self, spec: RoleSpec, tokenizer, rpc_timeout_s: float = 600.0):
        from .router import DecodeLengthEstimator, RequestRouter

        self.spec, self.tok, self.rpc_timeout_s = spec, tokenizer, rpc_timeout_s
        self.router = RequestRouter({p: n for p, n in spec.engines.items() if n > 0}, policy=spec.route_policy,
                                    prefill_heavy_ratio=spec.prefill_heavy_ratio)
        self.estimator = DecodeLengthEstimator(spec.max_new_tokens)
        self.engines: dict[str, list] = {}
        self.env_workers: list = []
        self.trainer = None
        self.reward_pool = None
        self.train_clock = BusyClock()
        self.sync_s: list[float] = []

    def start(self) -> "RayRoles":
        import ray

        from ops.rl.ray_actors import _TrainerImpl

        from .reward_pool import RewardPool

        s = self.spec
        pol = s.policy()
        Eng = ray.remote(EngineServer)
        for pool in ("gpu_compute", "gpu_bandwidth"):
            self.engines[pool] = [Eng.options(num_cpus=0, num_gpus=s.engine_gpus, resources={pool: 1},
                                              name=None).remote(pol, pool, s.max_batch, s.batch_wait_s)
                                  for _ in range(s.engines.get(pool, 0))]
        Env = ray.remote(EnvWorker)
        self.env_workers = [Env.options(num_cpus=0, resources={"cpu_env": 1}, max_concurrency=s.env_concurrency,
                                        max_restarts=1).remote(asdict(s)) for _ in range(max(1, s.env_workers))]
        self.trainer = ray.remote(_TrainerImpl).options(num_cpus=0, num_gpus=s.trainer_gpus, resources={"gpu_compute": 1}).remote(
            {**pol, "threads": s.trainer_threads})
        self.reward_pool = RewardPool(name="rollarc_reward", timeout_s=s.reward_timeout_s, max_retries=s.reward_retries,
                                 backoff_s=0.2).start(autoscaling=s.reward_autoscaling)
        handles = [e for es in self.engines.values() for e in es]
        ray.get([e.stats.remote() for e in handles] + [w.stats.remote() for w in self.env_workers] +
                [self.trainer.reset.remote()], timeout=self.rpc_timeout_s)
        self.reward_pool.health()                                       # before any training
        return self

    def pool_of(self, pool: str, index: int):
        return self.engines[pool][index]

    async def llm(self, messages: list, key: str, turn: int) -> Segment:
        return await routed_llm(self, messages, turn, lambda pool, i: self.engines[pool][i].generate.remote)

    async def llm_batch(self, requests: list) -> list:
        return await asyncio.gather(*(self.llm(m, k, t) for m, k, t in requests))

    def _env(self, key: str):
        return self.env_workers[int(hashlib.sha1(key.encode()).hexdigest(), 16) % len(self.env_workers)]

    async def env_reset(self, key: str, task: Task) -> str:
        return await self._env(key).reset.remote(key, task)

    async def env_step(self, key: str, action: str) -> StepResult:
        return await self._env(key).step.remote(key, action)

    async def env_close(self, key: str) -> None:
        await self._env(key).close.remote(key)

    async def reward(self, traj: Trajectory) -> tuple:
        r = await self.reward_pool.ascore(reward_request(traj))
        return r.score, r.status

    async def train(self, groups: list, step: int) -> dict:
        from .samples import grpo_samples

        samples, st = grpo_samples(groups, self.spec.grpo_config())
        self.train_clock.enter()
        try:
            await self.trainer.add.remote(samples)
            m = await self.trainer.step.remote()
        finally:
            self.train_clock.exit()
        return {**{k: m[k] for k in TRAIN_METRICS if k in m}, **st}

    async def publish(self, version: int) -> None:
        from .core import RollArcError

        t0 = time.monotonic()
        state = self.trainer.state.remote()
        got = await asyncio.gather(*(e.update_weights.remote(state, version) for es in self.engines.values() for e in es))
        if any(v != version for v in got):
            raise RollArcError(f"weight sync to version {version} incomplete: engines hold {got}")
        self.sync_s.append(time.monotonic() - t0)

    async def heldout(self, problems: list, temperature: float, max_new_tokens: int = 256, seed: int = 0) -> dict:
        """Held-out pass rate of the trainer actor's current policy (``_TrainerImpl.heldout``: one
        single-turn sampled response per scratchpad problem; ``problems`` as ``(uid, a, n)``)."""
        return await asyncio.wait_for(self.trainer.heldout.remote(list(problems), temperature, max_new_tokens, seed),
                                      self.rpc_timeout_s)

    async def save_checkpoint(self, path: str) -> int:
        """Between optimizer steps: the trainer actor writes its state to ``path`` (on a cluster, a
        folder every node mounts). Returns the policy version saved. Raises asyncio.TimeoutError
        past ``rpc_timeout_s``, RuntimeError (from the actor) when a step is half accumulated."""
        return await asyncio.wait_for(self.trainer.save_checkpoint.remote(path), self.rpc_timeout_s)

    async def load_checkpoint(self, path: str) -> int:
        """The trainer actor loads what ``save_checkpoint`` wrote; publish the returned version
        afterwards. Raises asyncio.TimeoutError past ``rpc_timeout_s``, FileNotFoundError naming the
        file."""
        return await asyncio.wait_for(self.trainer.load_checkpoint.remote(path), self.rpc_timeout_s)

    def utilisation(self, wall_s: float) -> dict:
        """Per-pool busy fraction of ``wall_s``: engines (generation), trainer (optimizer steps, on
        gpu_compute), environment workers (a step in flight), reward (a request in flight); plus the
        reward pool's replica counts and the router's stats."""
        import ray

        eng = {p: ray.get([e.stats.remote() for e in es], timeout=60) for p, es in self.engines.items()}
        envs = ray.get([w.stats.remote() for w in self.env_workers], timeout=60)
        rs = self.reward_pool.stats()
        series = rs.get("series") or []
        busy_reward = sum(1 for x in series if x[3] > 0) / len(series) if series else 0.0
        running = [x[1] for x in series] or [0]
        tr = self.train_clock.snapshot()
        out = {}
        for p in ("gpu_compute", "gpu_bandwidth"):
            actors = eng.get(p, [])
            busy = sum(a["busy_s"] for a in actors) + (tr["busy_s"] if p == "gpu_compute" else 0.0)
            n = len(actors) + (1 if p == "gpu_compute" else 0)
            out[p] = {"utilisation": round(busy / (wall_s * n), 4) if n and wall_s > 0 else 0.0, "actors": n,
                      "engine_busy_s": round(sum(a["busy_s"] for a in actors), 3),
                      "batches": sum(a["batches"] for a in actors),
                      "generated_tokens": sum(a["tokens"] for a in actors)}
        out["gpu_compute"]["trainer_busy_s"] = round(tr["busy_s"], 3)
        out["cpu_env"] = {"utilisation": round(sum(e["busy_s"] for e in envs) / (wall_s * len(envs)), 4) if wall_s > 0 else 0.0,
                          "actors": len(envs)}
        out["reward"] = {"utilisation": round(busy_reward, 4), "replicas_peak": rs.get("peak_replicas"),
                         "replicas_mean": round(sum(running) / len(running), 3), "requests": rs.get("requests"),
                         "retries": rs.get("retries"), "failures": rs.get("failures")}
        out["router"] = self.router.stats()
        out["weight_sync_s_mean"] = round(sum(self.sync_s) / len(self.sync_s), 4) if self.sync_s else None
        out["weight_syncs"] = weight_sync_totals([a["sync"] for es in eng.values() for a in es])
        return out

    def close(self) -> None:
        import ray

        if self.reward_pool is not None:
            self.reward_pool.shutdown()
        for h in [e for es in self.engines.values() for e in es] + self.env_workers + [self.trainer]:
            if h is not None:
                ray.kill(h)


def pool_resources(engines: dict, env_workers: int, reward_max_replicas: int) -> dict:
    """Ray custom resources the local node advertises so every role fits (``ray.init(resources=)``)."""
    return {"gpu_compute": engines.get("gpu_compute", 0) + 1, "gpu_bandwidth": max(1, engines.get("gpu_bandwidth", 0)),
            "cpu_env": max(1, env_workers), "reward": max(1, reward_max_replicas)}


# ---------------------------------------------------------------------- colocated (baseline)

class LocalRoles:
    """The monolithic baseline's roles: engine, environments, verifier and trainer in this process
    (environment steps on threads; math verification in ``ops.rl.reward.RewardScorer``'s process
    pool, since math-verify needs a main thread).

    ``serve=True`` (the driver's ``placement = "local"``: every method on the same budget) replaces
    the single engine by ``spec.engines`` ``EngineServer`` instances in this process — the same
    dynamic batching and affinity router as ``RayRoles``, each generating on its own thread — and
    sets this process's torch intra-op threads to ``spec.threads`` (shared by the engines and the
    trainer). Budget then: one process; engine threads = sum of ``spec.engines``; one trainer
    thread; environment steps on threads (each check one sandbox subprocess); one reward process.
    """

    def __init__(self, spec: RoleSpec, tokenizer, serve: bool = False):
        import torch

        from ops.rl.engine import HFEngine
        from ops.rl.ray_actors import _build_policy, _TrainerImpl
        from ops.rl.reward import RewardScorer

        from .router import DecodeLengthEstimator, RequestRouter

        self.spec, self.tok, self.serve = spec, tokenizer, serve
        pol = spec.policy()
        torch.manual_seed(spec.seed + 1000)
        self.servers: dict = {}
        if serve:
            self.engine = None
            self.servers = {p: [EngineServer(pol, p, spec.max_batch, spec.batch_wait_s) for _ in range(n)]
                            for p, n in spec.engines.items() if n > 0}
            torch.set_num_threads(pol.get("threads", 1))
            self.router = RequestRouter({p: len(v) for p, v in self.servers.items()}, policy=spec.route_policy,
                                        prefill_heavy_ratio=spec.prefill_heavy_ratio)
            self.estimator = DecodeLengthEstimator(spec.max_new_tokens)
        else:
            model, _ = _build_policy(pol)
            self.engine = HFEngine.from_spec(model, tokenizer, pol, version=0)
        # the Ray trainer's body in this process (same StreamTrainer, AdamW and checkpoint format);
        # this process's torch thread count is left as it is
        self._trainer = _TrainerImpl({**pol, "threads": torch.get_num_threads()})
        self.trainer = self._trainer.trainer
        self.verifier = RewardScorer(workers=1, item_timeout_s=spec.reward_timeout_s).start()
        self.envs: dict = {}
        self.engine_clock, self.train_clock, self.env_clock = BusyClock(), BusyClock(), BusyClock()

    async def _served(self, messages: list, key: str, turn: int) -> Segment:
        return await routed_llm(self, messages, turn, lambda pool, i: self.servers[pool][i].generate)

    async def llm(self, messages: list, key: str, turn: int) -> Segment:
        if self.serve:
            return await self._served(messages, key, turn)
        return (await self.llm_batch([(messages, key, turn)]))[0]

    async def llm_batch(self, requests: list) -> list:
        from ops.rl.types import Prompt

        if self.serve:
            return list(await asyncio.gather(*(self._served(m, k, t) for m, k, t in requests)))
        ids = [encode(self.tok, m, self.spec.max_prompt_tokens) for m, _, _ in requests]
        prompts = [Prompt(uid=str(i), token_ids=tuple(x)) for i, x in enumerate(ids)]
        t0 = time.monotonic()
        self.engine_clock.enter()
        try:
            rb = await asyncio.to_thread(self.engine.generate, prompts, 1, self.spec.max_new_tokens,
                                         stop_strings(self.tok), self.spec.llm_timeout_s)
        finally:
            self.engine_clock.exit()
        dt = time.monotonic() - t0
        return [Segment(prompt_ids=x, response_ids=list(c.token_ids), logprobs=list(c.logprobs),
                        policy_version=c.policy_version, pool="colocated", finish_reason=c.finish_reason,
                        latency_s=dt, text=c.text) for x, c in zip(ids, rb.completions)]

    async def env_reset(self, key: str, task: Task) -> str:
        from .envs import make_env

        env = make_env(task.env, latency=env_latency_for(self.spec, key), sandbox=self.spec.sandbox)
        self.envs[key] = env
        return await asyncio.to_thread(env.reset, task)

    async def env_step(self, key: str, action: str) -> StepResult:
        self.env_clock.enter()
        try:
            return await asyncio.to_thread(self.envs[key].step, action)
        finally:
            self.env_clock.exit()

    async def env_close(self, key: str) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            env.close()

    async def reward(self, traj: Trajectory) -> tuple:
        from .envs import verify_frozenlake

        req = reward_request(traj)
        if isinstance(req, dict):                                   # FrozenLake replay: pure Python
            try:
                s = float(verify_frozenlake(req["spec"], req["actions"]))
                return s, "verified" if s > 0 else "wrong"
            except ValueError as e:
                return None, f"failed: {e}"
        r = (await asyncio.to_thread(self.verifier.score, [req]))[0]
        return r.score, r.status

    async def train(self, groups: list, step: int) -> dict:
        from .samples import grpo_samples

        samples, st = grpo_samples(groups, self.spec.grpo_config())

        def run():
            self.trainer.add(samples)
            return self.trainer.step()

        self.train_clock.enter()
        try:
            m = await asyncio.to_thread(run)
        finally:
            self.train_clock.exit()
        return {**{k: m[k] for k in TRAIN_METRICS if k in m}, **st}

    async def publish(self, version: int) -> None:
        from ops.rl.weights import export_state, sync_weights

        from .core import RollArcError

        if self.serve:
            state = export_state(self.trainer.model)
            got = await asyncio.gather(*(e.update_weights(state, version) for es in self.servers.values() for e in es))
            if any(v != version for v in got):
                raise RollArcError(f"weight sync to version {version} incomplete: engines hold {got}")
            return
        await asyncio.to_thread(sync_weights, self.engine, export_state(self.trainer.model), version)

    async def heldout(self, problems: list, temperature: float, max_new_tokens: int = 256, seed: int = 0) -> dict:
        """``RayRoles.heldout`` in this process (on a thread, between steps)."""
        return await asyncio.to_thread(self._trainer.heldout, list(problems), temperature, max_new_tokens, seed)

    async def save_checkpoint(self, path: str) -> int:
        """``RayRoles.save_checkpoint`` in this process (on a thread). Returns the version saved."""
        return await asyncio.to_thread(self._trainer.save_checkpoint, path)

    async def load_checkpoint(self, path: str) -> int:
        """``RayRoles.load_checkpoint`` in this process (on a thread). Returns the version loaded."""
        return await asyncio.to_thread(self._trainer.load_checkpoint, path)

    def utilisation(self, wall_s: float) -> dict:
        e, t, v = self.engine_clock.snapshot(), self.train_clock.snapshot(), self.env_clock.snapshot()
        f = (lambda x: round(x["busy_s"] / wall_s, 4) if wall_s > 0 else 0.0)
        from ops.rl.weights import sync_stats

        if self.serve:
            es = [x.clock.snapshot() for xs in self.servers.values() for x in xs]
            eng = round(sum(x["busy_s"] for x in es) / (wall_s * len(es)), 4) if wall_s > 0 and es else 0.0
            syncs = weight_sync_totals([sync_stats(x.engine) for xs in self.servers.values() for x in xs])
            return {"colocated": {"engine": eng, "trainer": f(t), "env": f(v)}, "router": self.router.stats(),
                    "weight_syncs": syncs}
        return {"colocated": {"engine": f(e), "trainer": f(t), "env": f(v)},
                "weight_syncs": weight_sync_totals([sync_stats(self.engine)])}

    def close(self) -> None:
        for e in [x for xs in self.servers.values() for x in xs]:
            if e._executor is not None:
                e._executor.shutdown(wait=False)
        self.verifier.stop()
