"""In-process RollArc roles for paper-scale end-to-end comparisons in *scaled real time* (RollArc,
arXiv 2512.22560 §4-5; docs/rollarc.md). Torch-free, ray-free.

``SimRoles`` implements ``ops.rl.rollarc.core.Roles`` with ``asyncio.sleep``: an operation that costs ``x``
simulated seconds sleeps ``x * time_scale`` wall seconds, so ``run_rollarc`` and ``run_monolithic``
run unchanged and a run's simulated seconds are ``RunResult.wall_s / time_scale``. Every modelled
cost is drawn from seeds that depend only on ``(seed, task.uid, trajectory index)``, so both
schedulers face exactly the same trajectories (lengths, env latencies, turns until done, rewards).

Cost model (simulated seconds; parameters in ``SimConfig``):

* **Workload**: each trajectory's per-turn token shape is ``sim.rollarc.AgenticWorkload.draw`` (prompt =
  the conversation so far, prefill = what the prefix cache does not hold, a long first response and
  short later ones). The synthetic environment ends the episode after a seeded number of turns
  ``~ U{done_turns}``; after ``max_turns`` replies the scheduler truncates it.
* **LLM call (RollArc, ``llm``)**: routed by ``router.RequestRouter`` (``affinity`` | ``uniform``,
  expected decode length from a ``DecodeLengthEstimator`` keyed first/later turn) to one engine of
  the ``engines`` pools, each with its ``router.PoolProfile``. An engine is a capacity-limited
  server: ``max_batch`` slots (an ``asyncio.Semaphore``; a request waits for a slot), prefill is
  compute-bound and serialised per engine (FIFO at ``prefill_tok_s`` tokens/s of the engine), decode
  runs concurrently for every admitted sequence at ``decode_tok_s`` tokens/s each (memory-bound, so
  independent of the batch size up to ``max_batch``). Request time = slot wait + prefill-queue wait
  + prefill_tokens / prefill_tok_s + decode_tokens / decode_tok_s. Simplification: a prefill does not
  stall the decoding sequences of its engine (chunked prefill), unlike ``sim.rollarc.simulate``.
* **LLM call (baseline, ``llm_batch``)**: one static batch on the colocated engines
  (``colocated_engines``, default: as many engines as ``engines`` in total, all of the
  ``gpu_compute`` profile — the homogeneous cluster a monolithic system runs on). The batch is split
  round-robin over the engines; each engine runs its share in waves of ``max_batch``: a wave costs
  sum(prefill) / prefill_tok_s + max(decode) / decode_tok_s (the slowest sequence holds the wave);
  the call returns when the slowest engine is done.
* **Environment step**: ``EnvLatency(kind, mean_s)`` seconds (seeded per trajectory), then either
  the synthetic env (done after its drawn turn count) or a real one (``envs.make_env`` run in a
  thread with ``asyncio.to_thread``, its latency injected here, scaled, not by ``LatentEnv``).
  ``env_reset`` costs nothing.
* **Reward**: ``reward_s`` (a stateless verifier call). Synthetic: 1.0 with a seeded per-task
  success probability ~ U(0.15, 0.85) when the episode ended ``ok``, else 0.0, so groups have
  variance. Real: FrozenLake replayed by ``verify_frozenlake``; ToolMath exact match of the final
  answer with ``spec["answer"]`` (a stand-in for the reward pool's verifier).
* **Train**: ``train_fixed_s + tokens / train_tok_s``, tokens = each trained trajectory's final
  context (last prompt + last response: the multi-turn sample trained once, env tokens masked).
* **Publish**: ``publish_s`` (weight sync to every engine); the engines' version becomes ``version``
  only when it completes. A segment records the version at admission to its engine (the oldest
  weights that touched it).

Fidelity: sleeps wake late by the event loop's timer granularity and load, and the scheduler's own
CPU time passes between operations. Each trajectory therefore runs on its own intended clock (see
``max_catchup_s``), so that lag does not accumulate along an episode; ``stats()`` reports how late
sleeps woke (simulated s) and how often a trajectory fell too far behind (``resyncs``). Check a
result by re-running at twice the ``time_scale``: the simulated seconds should not move. [open] The paper publishes no per-pool engine speeds nor its trainer throughput;
the defaults below are derived from vendor peaks (see ``SimConfig``).
"""

from __future__ import annotations

import asyncio
import random
import zlib
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional

from ops.rl.rollarc.envs import (ENV_NAMES, FROZENLAKE_ACTIONS, LATENCY_KINDS, EnvLatency, make_env,
                                  verify_frozenlake)
from ops.rl.rollarc.router import DEFAULT_PROFILES, ROUTED_POOLS, DecodeLengthEstimator, PoolProfile, RequestRouter
from ops.rl.rollarc.types import Segment, StepResult, Task, Trajectory
from sim.rollarc import AgenticWorkload, Turn

ENV_MODES = ("synthetic", "real")


@dataclass(frozen=True)
class SimConfig:
    """Cost-model parameters (simulated seconds, tokens).

    Raises:
        ValueError: a pool without profile, unknown latency kind, or a bad number (named).
    """

    engines: Mapping[str, int] = field(default_factory=lambda: {"gpu_compute": 8, "gpu_bandwidth": 8})
    """RollArc's rollout engines per pool (``router.ROUTED_POOLS``; ints >= 0, >= 1 in all), default 8 + 8."""
    profiles: Mapping[str, PoolProfile] = field(default_factory=lambda: dict(DEFAULT_PROFILES))
    """Pool -> ``PoolProfile``, needed for every pool with engines (default ``router.DEFAULT_PROFILES``:
    H800-class compute, H20-class bandwidth)."""
    colocated_engines: Optional[Mapping[str, int]] = None
    """The baseline's engines per pool (>= 1 in all); None: ``{"gpu_compute": sum(engines)}``."""
    workload: AgenticWorkload = field(default_factory=AgenticWorkload)
    """Per-turn token shapes (``sim.rollarc.AgenticWorkload``; its ``env_*`` fields are unused)."""
    workload_turns: int = 16
    """Turns drawn per trajectory (>= 1); an LLM call at a later turn raises ValueError."""
    env_latency: str = "medium"
    """Environment latency law, an ``envs.LATENCY_KINDS`` kind."""
    env_mean_s: float = 1.0
    """Mean of the environment step latency (s, >= 0)."""
    done_turns: tuple = (4, 12)
    """(lo, hi) inclusive, 1 <= lo <= hi: the synthetic env is done after U{lo..hi} steps."""
    reward_s: float = 0.5
    """One reward request (s, >= 0)."""
    train_tok_s: float = 60_000.0
    """Trainer tokens/s (> 0). Default 60,000 [assumption]: a 7B dense model on 8 H800-class GPUs at ~35%
    of 989 TFLOP/s each, with 6 x 7e9 FLOP per trained token (forward + backward) -> ~66k tokens/s; a full
    old-log-prob forward (2 x 7e9 more, as ``sim.roofline`` counts it) would give ~49k, so 60k assumes
    that pass is cheaper than a full forward."""
    train_fixed_s: float = 2.0
    """Fixed cost per optimizer step (s, >= 0), besides tokens / train_tok_s."""
    publish_s: float = 3.0
    """One weight sync to every engine (s, >= 0). Default 3: 14 GB of bf16 weights at ~10 GB/s + engine
    reload."""

    def __post_init__(self):
        for name, eng in (("engines", self.engines), ("colocated_engines", self.colocated_engines or {})):
            for p, n in eng.items():
                if p not in ROUTED_POOLS or not isinstance(n, int) or n < 0:
                    raise ValueError(f"SimConfig.{name}: {p!r}: {n!r} (pools {ROUTED_POOLS}, counts int >= 0)")
                if n and p not in self.profiles:
                    raise ValueError(f"SimConfig.profiles has no entry for pool {p!r}")
        if sum(self.engines.values()) < 1:
            raise ValueError(f"SimConfig.engines needs an engine, got {dict(self.engines)}")
        if self.colocated_engines is not None and sum(self.colocated_engines.values()) < 1:
            raise ValueError(f"SimConfig.colocated_engines needs an engine, got {dict(self.colocated_engines)}")
        if self.env_latency not in LATENCY_KINDS:
            raise ValueError(f"SimConfig.env_latency must be one of {LATENCY_KINDS}, got {self.env_latency!r}")
        lo, hi = self.done_turns
        if not 1 <= lo <= hi:
            raise ValueError(f"SimConfig.done_turns must be (lo, hi) with 1 <= lo <= hi, got {self.done_turns}")
        if self.workload_turns < 1:
            raise ValueError(f"SimConfig.workload_turns must be >= 1, got {self.workload_turns}")
        for name in ("env_mean_s", "reward_s", "train_fixed_s", "publish_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"SimConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not self.train_tok_s > 0:
            raise ValueError(f"SimConfig.train_tok_s must be > 0, got {self.train_tok_s}")

    def colocated(self) -> dict:
        """The baseline's engines: ``colocated_engines`` or all of ``engines`` as ``gpu_compute``."""
        return dict(self.colocated_engines or {"gpu_compute": sum(self.engines.values())})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["engines"], d["colocated_engines"] = dict(self.engines), self.colocated()
        d["profiles"] = {p: asdict(v) for p, v in self.profiles.items()}
        return d


class _Engine:
    """One engine (``PoolProfile``): ``max_batch`` slots and a FIFO prefill queue (loop seconds)."""

    def __init__(self, pool: str, index: int, profile: PoolProfile):
        self.pool, self.index, self.p = pool, index, profile
        self.slots = asyncio.Semaphore(profile.max_batch)
        self.prefill_free_at = 0.0
        self.requests = 0


@dataclass
class _Traj:
    """One live episode of ``SimRoles`` (keyed ``group_id/index``), drawn at ``env_reset``."""

    task: Task
    """The episode's task."""
    index: int
    """Trajectory index within its group (the key's tail; 0 when it is not a number)."""
    turns: list
    """The drawn turns ([workload_turns] of ``sim.rollarc.Turn``)."""
    latency: EnvLatency
    """The seeded environment-latency stream (``SimConfig.env_latency``, ``env_mean_s``)."""
    done_after: int
    """The synthetic env is done after this many steps (drawn from U{done_turns})."""
    rng: random.Random
    """Seeded per-trajectory RNG: the turn count, then the real mode's action / answer text."""
    steps: int = 0
    """Environment steps taken so far."""
    injected_s: float = 0.0
    """Environment latency injected so far (simulated s)."""
    env: object = None
    """The real environment (``make_env(task.env)``) in ``real`` env_mode, else None."""
    clock: float = 0.0
    """Intended end (loop s) of its last modelled operation."""


def _seed(*parts) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode())


class SimRoles:
    """``core.Roles`` on the cost model of this module, in scaled real time.

    Args:
        cfg: ``SimConfig``. time_scale: wall seconds per simulated second (> 0; 0.01: a simulated
            100 s run takes 1 s). seed: workload seed (same seed + same tasks -> same trajectories).
        policy: ``RequestRouter`` policy (``affinity`` | ``uniform``) for ``llm``.
        env_mode: ``synthetic`` (latency only) | ``real`` (``make_env(task.env)``, ``ENV_NAMES``).
        max_catchup_s: wall seconds of event-loop lag a trajectory makes up for (default 0.5).
            Each trajectory keeps the intended end of its last operation and starts the next one
            from there, not from now: the scheduler's CPU time between two operations is not
            simulated time. Behind by more than this, the next operation starts now. A wait for an
            engine slot always starts from now. Episodes started back to back (< 2 ms apart, one
            launch burst) share the burst's first start time. This suits ``core``'s two
            schedulers: a RollArc trajectory never waits between its operations except for a slot,
            and every barrier of the baseline (lock-step LLM batch, env gather, rewards after the
            batch) ends with its latest member, whose clock is current. The trainer's side runs on
            its own intended clock too: ``train`` starts when the last of its trajectories ended
            (intended, recorded at ``env_close``) or the previous publish ended, whichever is later;
            ``publish`` when ``train`` ended; the first launch burst after a publish starts at its
            end (the scheduler's 10 ms polls are not simulated time).
    Attributes: version: the engines' published policy version (0 before the first publish).
    Raises: ValueError: time_scale <= 0, unknown env_mode, or what ``RequestRouter`` raises.
    """

    BURST_GAP_S = 0.002

    def __init__(self, cfg: Optional[SimConfig] = None, time_scale: float = 0.01, seed: int = 0,
                 policy: str = "affinity", env_mode: str = "synthetic", max_catchup_s: float = 0.5):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if not max_catchup_s >= 0:
            raise ValueError(f"max_catchup_s must be >= 0, got {max_catchup_s}")
        self.max_catchup_s = float(max_catchup_s)
        if env_mode not in ENV_MODES:
            raise ValueError(f"env_mode must be one of {ENV_MODES}, got {env_mode!r}")
        self.cfg = cfg or SimConfig()
        self.time_scale, self.seed, self.env_mode = float(time_scale), seed, env_mode
        self.router = RequestRouter(dict(self.cfg.engines), policy)
        self.estimator = DecodeLengthEstimator(self.cfg.workload.max_new_tokens)
        self.version = 0
        self._trajs: dict[str, _Traj] = {}
        self._loop = None
        self._over = [0, 0.0, 0.0]                                  # sleeps, overshoot sum, max (wall s)
        self._counts = {"llm": 0, "llm_batch": 0, "llm_batch_sequences": 0, "env_steps": 0, "rewards": 0,
                        "train_steps": 0, "publishes": 0, "resyncs": 0,
                        "caught_up": 0}
        self._bind()

    # ---------------------------------------------------------------- clock
    def _bind(self) -> None:
        """(Re)create the engines for the running loop (a Semaphore binds to the first loop using it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is self._loop and loop is not None:
            return
        self._loop = loop
        self._burst = (-1.0, -1.0)                                  # (last reset at, its intended start)
        self._published_at: Optional[float] = None                 # intended end of an unused publish
        self._trainer_clock = -1e9                                  # intended end of train / publish
        self._ready: dict[str, float] = {}                          # ended episode -> intended end
        self._engines = {p: [_Engine(p, i, self.cfg.profiles[p]) for i in range(n)]
                         for p, n in self.router.engines.items()}
        colo = self.cfg.colocated()
        self._colo = [_Engine(p, i, self.cfg.profiles[p]) for p in ROUTED_POOLS for i in range(colo.get(p, 0))]

    async def _until(self, end: float) -> None:
        """Sleep until loop time ``end``; record how late we woke (the fidelity check), or count a
        catch-up when ``end`` has already passed."""
        loop = asyncio.get_running_loop()
        left = end - loop.time()
        if left <= 0:
            self._counts["caught_up"] += 1
            return
        await asyncio.sleep(left)
        late = max(0.0, loop.time() - end)
        self._over[0] += 1
        self._over[1] += late
        self._over[2] = max(self._over[2], late)

    def _start(self, st: Optional[_Traj], now: float) -> float:
        """Intended start (loop s) of a trajectory's next operation: the intended end of its last
        one when the trajectory is behind it by at most ``max_catchup_s`` (event-loop lag, made up
        for), else ``now`` (it genuinely waited: a barrier, a queue)."""
        if st is not None and 0.0 <= now - st.clock <= self.max_catchup_s:
            return st.clock
        self._counts["resyncs"] += 1
        return now

    def _traj(self, key: str) -> _Traj:
        st = self._trajs.get(key)
        if st is None:
            raise ValueError(f"rollarc_roles: no episode for key {key!r} (env_reset first)")
        return st

    def workload(self, key: str) -> list[Turn]:
        """The drawn turns of a live trajectory ([workload_turns] of ``sim.rollarc.Turn``). Raises ValueError."""
        return list(self._traj(key).turns)

    # ---------------------------------------------------------------- LLM
    def _segment(self, st: _Traj, turn: Turn, turn_idx: int, version: int, pool: str, latency_s: float) -> Segment:
        dec = turn.decode_tokens
        if self.env_mode == "real" and st.task.env == "frozenlake":
            text = "Action: " + st.rng.choices(FROZENLAKE_ACTIONS, weights=(15, 35, 35, 15))[0]
        elif self.env_mode == "real":
            p = _task_p(self.seed, st.task.uid)
            text = (f"Answer: {st.task.spec.get('answer') if st.rng.random() < p else 'unknown'}"
                    if st.rng.random() < 0.5 else "Let me think.")
        else:
            text = f"action {turn_idx}"
        return Segment(prompt_ids=range(turn.prompt_tokens), response_ids=range(dec), logprobs=[-1.0] * dec,
                       policy_version=version, pool=pool,
                       finish_reason="length" if dec >= self.cfg.workload.max_new_tokens else "stop",
                       latency_s=latency_s, text=text)

    def _turn(self, key: str, turn: int) -> tuple[_Traj, Turn]:
        st = self._traj(key)
        if not 0 <= turn < len(st.turns):
            raise ValueError(f"rollarc_roles: turn {turn} outside the {len(st.turns)} drawn (SimConfig.workload_turns)")
        return st, st.turns[turn]

    async def llm(self, messages: list, key: str, turn: int) -> Segment:
        """One routed LLM call (cost model in the module docstring). Returns a Segment whose
        prompt_ids / response_ids are ``range`` placeholders of the modelled lengths [P] / [T],
        logprobs [T] of -1.0, ``pool`` the serving pool, ``policy_version`` the engines' version at
        admission, ``latency_s`` in *simulated* seconds (queueing included).
        Raises: ValueError: no env_reset for ``key`` or a turn beyond ``workload_turns``."""
        self._bind()
        st, t = self._turn(key, turn)
        kind = "first" if turn == 0 else "later"
        pool, i = self.router.route(t.prefill_tokens, self.estimator.estimate(kind))
        eng = self._engines[pool][i]
        loop = asyncio.get_running_loop()
        t_req = loop.time()
        base = self._start(st, t_req)
        queued = eng.slots.locked()                                 # every slot taken: a genuine wait
        try:
            async with eng.slots:
                version = self.version
                now = loop.time()
                if queued:
                    base = now
                start = max(base, eng.prefill_free_at)
                eng.prefill_free_at = start + t.prefill_tokens / eng.p.prefill_tok_s * self.time_scale
                end = eng.prefill_free_at + t.decode_tokens / eng.p.decode_tok_s * self.time_scale
                eng.requests += 1
                self._counts["llm"] += 1
                await self._until(end)
                st.clock = end
        finally:
            self.router.done(pool, i)
        self.estimator.observe(kind, t.decode_tokens)
        return self._segment(st, t, turn, version, pool, (end - (t_req if queued else base)) / self.time_scale)

    def batch_seconds(self, turns: list[Turn]) -> tuple[float, list[str]]:
        """The static-batch time (simulated s) of ``turns`` on the colocated engines and the pool of
        each sequence: round-robin split, waves of max_batch, each wave sum(prefill)/prefill_tok_s +
        max(decode)/decode_tok_s, the slowest engine wins. Empty -> (0.0, [])."""
        n = len(self._colo)
        per = [0.0] * n
        for e, eng in enumerate(self._colo):
            share = turns[e::n]
            for w in range(0, len(share), eng.p.max_batch):
                wave = share[w:w + eng.p.max_batch]
                per[e] += sum(x.prefill_tokens for x in wave) / eng.p.prefill_tok_s \
                    + max(x.decode_tokens for x in wave) / eng.p.decode_tok_s
        pools = [self._colo[j % n].pool for j in range(len(turns))]
        return (max(per) if turns else 0.0), pools

    async def llm_batch(self, requests: list) -> list:
        """The baseline's lock-step call: ``requests`` = [(messages, key, turn)] -> [Segment], one
        static batch on the colocated engines (``batch_seconds``); every segment's ``latency_s`` is
        the batch's simulated time. Raises: ValueError as ``llm``."""
        self._bind()
        shapes = [self._turn(k, t) for _, k, t in requests]
        secs, pools = self.batch_seconds([t for _, t in shapes])
        version = self.version
        self._counts["llm_batch"] += 1
        self._counts["llm_batch_sequences"] += len(requests)
        now = asyncio.get_running_loop().time()
        end = max((self._start(st, now) for st, _ in shapes), default=now) + secs * self.time_scale
        await self._until(end)
        for st, _ in shapes:
            st.clock = end
        return [self._segment(st, t, turn, version, pool, secs)
                for (st, t), (_, _, turn), pool in zip(shapes, requests, pools)]

    # ---------------------------------------------------------------- environment
    def _launch_time(self) -> float:
        """Intended start of a new episode: the first start of the current launch burst; the first
        burst after a publish starts at the publish's intended end (``core`` launches the next
        step's groups once the version is out; its producer polls for that every 10 ms)."""
        now = asyncio.get_running_loop().time()
        last, base = self._burst
        if not (0 <= now - last <= self.BURST_GAP_S and now - base <= self.max_catchup_s):
            pub, self._published_at = self._published_at, None
            base = pub if pub is not None and 0 <= now - pub <= self.max_catchup_s else now
        self._burst = (now, base)
        return base

    def _trainer_start(self, ready: float, now: float) -> float:
        """Intended start of a trainer operation: when its inputs were ready (intended), if that
        is at most ``max_catchup_s`` ago, else now."""
        base = max(ready, self._trainer_clock)
        if 0.0 <= now - base <= self.max_catchup_s:
            return base
        self._counts["resyncs"] += 1
        return now

    async def env_reset(self, key: str, task: Task) -> str:
        """Start the episode ``key`` (``group_id/index``) of ``task``; draws its workload, latency
        stream, turn count and action RNG from (seed, task.uid, index). Free in simulated time.
        Raises: ValueError: real mode with a task.env outside ``envs.ENV_NAMES`` (or its reset's)."""
        self._bind()
        tail = key.rsplit("/", 1)[-1]
        index = int(tail) if tail.isdigit() else 0
        s = _seed(self.seed, task.uid, index)
        rng = random.Random(s)
        st = _Traj(task=task, index=index, turns=self.cfg.workload.draw(1, self.cfg.workload_turns, s)[0],
                   latency=EnvLatency(self.cfg.env_latency, self.cfg.env_mean_s, seed=s + 1),
                   done_after=rng.randint(*self.cfg.done_turns), rng=rng)
        if self.env_mode == "real":
            if task.env not in ENV_NAMES:
                raise ValueError(f"rollarc_roles: real env_mode needs task.env in {ENV_NAMES}, got {task.env!r}")
            st.env = make_env(task.env)
            self._trajs[key] = st
            st.clock = self._launch_time()
            return await asyncio.to_thread(st.env.reset, task)
        self._trajs[key] = st
        st.clock = self._launch_time()
        return f"[{task.uid}] observation 0"

    async def env_step(self, key: str, action: str) -> StepResult:
        """Sleep one ``EnvLatency`` sample (scaled), then step. ``info``: the real env's, or
        ``steps``; plus ``injected_latency_s`` (simulated s so far). Raises: ValueError (no reset);
        the real env's exceptions."""
        st = self._traj(key)
        dt = st.latency.sample()
        st.injected_s += dt
        self._counts["env_steps"] += 1
        end = self._start(st, asyncio.get_running_loop().time()) + dt * self.time_scale
        await self._until(end)
        st.clock = end
        st.steps += 1
        if st.env is not None:
            r = await asyncio.to_thread(st.env.step, action)
            return StepResult(r.observation, r.done, {**r.info, "injected_latency_s": st.injected_s})
        return StepResult(f"[{st.task.uid}] observation {st.steps}", st.steps >= st.done_after,
                          {"steps": st.steps, "injected_latency_s": st.injected_s})

    async def env_close(self, key: str) -> None:
        """Forget the episode (closing a real env); unknown keys are ignored."""
        st = self._trajs.pop(key, None)
        if st is not None:
            self._ready[key] = st.clock
            if st.env is not None:
                st.env.close()

    # ---------------------------------------------------------------- reward, train, publish
    async def reward(self, traj: Trajectory) -> tuple:
        """(score in {0.0, 1.0}, status) after ``reward_s`` (see the module docstring)."""
        self._counts["rewards"] += 1
        st = self._trajs.get(f"{traj.group_id}/{traj.index}")       # the scheduler's key format
        end = self._start(st, asyncio.get_running_loop().time()) + self.cfg.reward_s * self.time_scale
        await self._until(end)
        if st is not None:
            st.clock = end
        if self.env_mode == "real" and traj.task.env == "frozenlake":
            acts = traj.submission.get("actions", [])
            return await asyncio.to_thread(verify_frozenlake, traj.task.spec, acts), "verified"
        if self.env_mode == "real":
            got = traj.submission.get("final_answer")
            ok = got is not None and str(got).strip() == str(traj.task.spec.get("answer")).strip()
            return float(ok), "verified"
        if traj.status != "ok":
            return 0.0, "verified"
        r = random.Random(_seed(self.seed, "reward", traj.task.uid, traj.index)).random()
        return float(r < _task_p(self.seed, traj.task.uid)), "verified"

    async def train(self, groups: list, step: int) -> dict:
        """One optimizer step: sleeps ``train_fixed_s + tokens / train_tok_s`` (tokens: last prompt +
        last response of every trajectory). Returns {"train_tokens", "sim_train_s", "version_at_train"}."""
        tokens = sum(len(t.segments[-1].prompt_ids) + len(t.segments[-1].response_ids)
                     for g in groups for t in g.trajectories if t.segments)
        secs = self.cfg.train_fixed_s + tokens / self.cfg.train_tok_s
        self._counts["train_steps"] += 1
        now = asyncio.get_running_loop().time()
        keys = [f"{t.group_id}/{t.index}" for g in groups for t in g.trajectories]
        ready = max((self._ready.pop(k, now) for k in keys), default=now)
        self._trainer_clock = self._trainer_start(ready, now) + secs * self.time_scale
        await self._until(self._trainer_clock)
        return {"train_tokens": tokens, "sim_train_s": secs, "version_at_train": self.version}

    async def publish(self, version: int) -> None:
        """Weight sync: after ``publish_s`` every engine serves ``version``.
        Raises: ValueError: ``version`` older than the published one."""
        if version < self.version:
            raise ValueError(f"publish({version}) is older than the published version {self.version}")
        self._counts["publishes"] += 1
        now = asyncio.get_running_loop().time()
        end = self._trainer_start(-1e9, now) + self.cfg.publish_s * self.time_scale
        self._trainer_clock = end
        await self._until(end)
        self._published_at = end
        self.version = version

    def stats(self) -> dict:
        """Counters: calls per role, ``resyncs`` (operations started from now, see
        ``max_catchup_s``), ``caught_up`` (operations whose intended end had passed: no sleep),
        requests per engine pool, router stats, and the fidelity check: how late each sleep woke
        against its intended end, in simulated seconds (mean, max)."""
        n, tot, mx = self._over
        return {**self._counts, "time_scale": self.time_scale,
                "engine_requests": {p: [e.requests for e in es] for p, es in self._engines.items()},
                "router": self.router.stats(), "sleeps": n,
                "late_mean_sim_s": (tot / n / self.time_scale) if n else 0.0,
                "late_max_sim_s": mx / self.time_scale}


def _task_p(seed: int, uid: str) -> float:
    """A task's success probability, U(0.15, 0.85) seeded by (seed, uid)."""
    return random.Random(_seed(seed, "p", uid)).uniform(0.15, 0.85)
