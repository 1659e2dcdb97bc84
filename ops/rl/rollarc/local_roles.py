"""The monolithic baseline's roles, colocated in this process (``LocalRoles``): the same policy,
engines, environments, verifiers and trainer as ``ray_roles.RayRoles`` without Ray (RollArc, arXiv
2512.22560 §4: the "monolithic, synchronous" baseline; with ``serve=True`` the equal-budget
comparison of every method). ``torch`` and ``transformers`` are imported inside functions.
"""

from __future__ import annotations

import asyncio
import time

from .ray_roles import EngineServer
from .roles_common import (TRAIN_METRICS, BusyClock, RoleSpec, encode, env_latency_for, reward_request, routed_llm,
                           stop_strings, weight_sync_totals)
from .types import Segment, StepResult, Task, Trajectory


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
