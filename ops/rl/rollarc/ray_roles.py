"""RollArc's roles on real engines: disaggregated on Ray (``RayRoles``, here) and colocated in one process
for the monolithic baseline (``LocalRoles``, in ``local_roles``); their spec
(``RoleSpec``) and shared helpers are in ``roles_common`` (re-exported here). Both implement ``ops.rl.rollarc.core.Roles`` with the same
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
from dataclasses import asdict

from ops.lm.spec import build

from .roles_common import (REWARD_AUTOSCALING, TRAIN_METRICS, BusyClock, RoleSpec, encode,  # noqa: F401 (re-exported)
                           env_latency_for, has_chat_template, render_plain, reward_request, routed_llm, stop_strings,
                           weight_sync_totals)
from .types import POOLS, Segment, StepResult, Task, Trajectory


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


class EnvWorker:
    """Body of an environment actor (threaded). Sessions keyed by trajectory key."""

    def __init__(self, spec: dict):
        from .sandbox import require

        self.spec = build(RoleSpec, spec, "roles")     # asdict(RoleSpec) back to the typed spec
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
                                 backoff_s=0.2).start(autoscaling=asdict(s.reward_autoscaling))
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
