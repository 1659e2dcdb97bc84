"""A discrete-event simulation of agentic multi-turn rollouts on heterogeneous engine pools, for the
routing ablation of RollArc's hardware-affinity mapping (arXiv 2512.22560 §4; docs/rollarc.md, "Routing ablation"). Time is
simulated (no sleeping); the cost is O(requests x running sequences).

Workload (``AgenticWorkload``; [open] the paper publishes no per-turn token model, these are
modelled on tool-use / ReAct-style episodes): N trajectories of T turns, all starting at t = 0. Turn
k's prompt is the whole conversation so far, P_k = P_0 + sum_{j<k} (D_j + O_j): the task prompt P_0,
then each earlier response D_j and the observation / tool output O_j the environment returned. The
first response is long reasoning, later ones short actions, so later turns are prefill-heavy. All
lengths are log-normal (median, sigma), clipped to [8, max_new_tokens] for responses; after every
turn the environment takes a log-normal ``env`` time before the next prompt exists (after the last
turn: the final step that ends the episode). The workload is drawn once per seed, so both policies
serve exactly the same requests.

Engine (``PoolProfile``, a decode cost model of a fixed step time with prefill added; the
retired trace-driven RollPacker engine's model without its per-sequence term): each engine continuously batches up to max_batch sequences. An
iteration that admits new requests (FCFS from its queue) prefills their prompts and advances every
running sequence by one token: it lasts prefill_tokens / prefill_tok_s + 1 / decode_tok_s. An
iteration without admissions is one decode step, 1 / decode_tok_s. A request arriving at a busy
engine waits for the end of the current iteration. Simplifications: no chunked prefill (a long
prefill stalls every decoding sequence of its engine for its whole duration — the interference that
makes prefill on a slow-FLOP GPU expensive), decode step time independent of batch size and context
length, prefix caching as one global hit rate on the re-sent history (``prefix_cache_hit``).

Utilisation of a pool = busy engine-seconds (>= 1 sequence in flight) / (engines x makespan).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Optional

from ops.rl.rollarc.router import (DEFAULT_PREFILL_HEAVY_RATIO, DEFAULT_PROFILES, ROUTED_POOLS, DecodeLengthEstimator,
                                   PoolProfile, RequestRouter)


@dataclass(frozen=True)
class TurnShapes:
    """Token shapes of a multi-turn agentic episode (tokens), log-normal around their medians: one
    set of assumptions for the routing ablation (``AgenticWorkload``) and the DES
    (``sim.traces.AgenticTurns``). [open] The paper publishes no per-turn token model; the defaults
    are modelled on tool-use / ReAct-style episodes (module docstring).
    """

    task_prompt_median: float = 600.0
    """Median of P_0, the task prompt: system prompt + task + tool schema (tokens)."""
    task_prompt_sigma: float = 0.3
    """Log-normal sigma of P_0."""
    first_decode_median: float = 700.0
    """Median of D_0, the first turn's reasoning (tokens)."""
    later_decode_median: float = 100.0
    """Median of D_k, k >= 1: a short action / tool call (tokens)."""
    decode_sigma: float = 0.5
    """Log-normal sigma of D_0 and D_k (responses are clipped to [8, max_new_tokens])."""
    observation_median: float = 800.0
    """Median of O_k, a tool output or environment observation appended to the context (tokens)."""
    observation_sigma: float = 0.8
    """Log-normal sigma of O_k."""
    max_new_tokens: int = 2048
    """Cap on every response (tokens); also the decode-length estimator's default."""
    prefix_cache_hit: float = 0.9
    """Fraction of the re-sent history (P_{k-1} + D_{k-1}) the engine does not prefill again, in [0, 1].
    Default 0.9: serving engines keep the conversation's KV (vLLM automatic prefix caching, SGLang
    RadixAttention); below 1 for evictions and turns that land on another engine. [open] Modelled as
    one global rate, not per engine: the router here does not pin a trajectory to the engine that
    holds its prefix. With 0 (no cache) every turn re-prefills its whole context and the compute
    pool saturates."""

    @staticmethod
    def lognormal(rng: random.Random, median: float, sigma: float) -> float:
        """One log-normal draw: exp(log(median) + sigma z), z from ``rng.gauss``."""
        return math.exp(math.log(median) + sigma * rng.gauss(0.0, 1.0))

    def task_prompt(self, rng: random.Random) -> int:
        """P_0 (tokens, >= 1)."""
        return max(1, round(self.lognormal(rng, self.task_prompt_median, self.task_prompt_sigma)))

    def turn(self, rng: random.Random, k: int) -> tuple[int, int]:
        """(D_k, O_k) of turn ``k`` (0-based; tokens): the response, in [8, max_new_tokens], then the
        observation appended after it (>= 1), drawn in that order."""
        med = self.first_decode_median if k == 0 else self.later_decode_median
        dec = int(min(self.max_new_tokens, max(8, round(self.lognormal(rng, med, self.decode_sigma)))))
        obs = max(1, round(self.lognormal(rng, self.observation_median, self.observation_sigma)))
        return dec, obs


@dataclass(frozen=True)
class AgenticWorkload(TurnShapes):
    """Parameters of the multi-turn workload of the routing ablation (tokens; seconds for env times);
    the token shapes (task_prompt_median ... prefix_cache_hit) are ``TurnShapes``'s.
    """

    env_median_s: float = 0.5
    """Median of the log-normal environment step latency after each turn (s)."""
    env_sigma: float = 0.7
    """Log-normal sigma of the environment step latency."""

    def draw(self, n_trajectories: int, turns: int, seed: int) -> list[list["Turn"]]:
        """The seeded workload: [n_trajectories][turns] of ``Turn``.

        Raises: ValueError: n_trajectories < 1, turns < 1 or prefix_cache_hit outside [0, 1].
        """
        if n_trajectories < 1:
            raise ValueError(f"n_trajectories must be >= 1, got {n_trajectories}")
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        if not 0 <= self.prefix_cache_hit <= 1:
            raise ValueError(f"prefix_cache_hit must be in [0, 1], got {self.prefix_cache_hit}")
        rng = random.Random(seed)
        out = []
        for _ in range(n_trajectories):
            prompt = self.task_prompt(rng)
            traj, prefill = [], prompt
            for k in range(turns):
                dec, obs = self.turn(rng, k)
                traj.append(Turn(prompt, prefill, dec, self.lognormal(rng, self.env_median_s, self.env_sigma)))
                cached = round(self.prefix_cache_hit * (prompt + dec))
                prompt += dec + obs
                prefill = prompt - cached
            out.append(traj)
        return out


@dataclass(frozen=True)
class Turn:
    """One LLM call of a drawn trajectory."""

    prompt_tokens: int
    """Context length (tokens): the whole conversation so far."""
    prefill_tokens: int
    """Tokens left to prefill after the prefix cache (<= prompt_tokens)."""
    decode_tokens: int
    """Response length (tokens)."""
    env_s: float
    """Environment time after the call (s)."""


@dataclass
class Served:
    """A served request of ``simulate``: which turn, where it ran and when."""

    trajectory: int
    """Index of the trajectory in the workload."""
    turn: int
    """Turn of the trajectory (0-based)."""
    pool: str
    """Pool that served it (``ROUTED_POOLS``)."""
    engine: int
    """Engine index within the pool."""
    submit_s: float
    """When the request was submitted (simulated s)."""
    finish_s: float
    """When its last token was out (simulated s); ``latency_s`` = finish_s - submit_s."""

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.submit_s


class _Engine:
    """One simulated engine. ``running`` maps request -> tokens still to generate, exact at ``t0``;
    the current iteration run spans ``steps`` decode steps from t0 to ``t_end`` (``atomic``: it
    admitted requests, so it cannot be cut short)."""

    def __init__(self, pool: str, index: int, profile: PoolProfile, push: Callable[[float, tuple], None]):
        self.pool, self.index, self.p, self.push = pool, index, profile, push
        self.dt = 1.0 / profile.decode_tok_s
        self.waiting: deque = deque()
        self.running: dict[int, int] = {}
        self.t0, self.t_end, self.steps, self.atomic, self.gen = 0.0, None, 0, False, 0
        self.busy_s = 0.0

    def _plan(self, t: float) -> None:
        self.t0, self.gen = t, self.gen + 1
        prefill, admitted = 0, 0
        while self.waiting and len(self.running) < self.p.max_batch:
            rid, pre, dec = self.waiting.popleft()
            self.running[rid] = dec
            prefill, admitted = prefill + pre, admitted + 1
        if admitted:
            self.steps, self.atomic = 1, True
            self.t_end = t + prefill / self.p.prefill_tok_s + self.dt
        elif self.running:
            self.steps, self.atomic = min(self.running.values()), False
            self.t_end = t + self.steps * self.dt
        else:
            self.t_end = None
            return
        self.push(self.t_end, ("engine", self, self.gen))

    def arrive(self, t: float, rid: int, prefill_tokens: int, decode_tokens: int) -> None:
        """Queue a request; cut a decode run short at the next step boundary if a slot is free. The
        admission itself is a (possibly zero-step) boundary event, so requests arriving at the same
        instant are admitted together."""
        self.waiting.append((rid, prefill_tokens, decode_tokens))
        if self.t_end is None:                                        # idle: wake up now
            self.t0, self.steps, self.atomic = t, 0, False
            s = 0
        elif self.atomic or len(self.running) >= self.p.max_batch:
            return                                                    # admitted at the planned boundary
        else:
            s = math.ceil((t - self.t0) / self.dt - 1e-9)             # decode steps done at the next boundary
            if s >= self.steps:
                return
        self.steps, self.t_end, self.gen = s, self.t0 + s * self.dt, self.gen + 1
        self.push(self.t_end, ("engine", self, self.gen))

    def boundary(self, t: float, gen: int, finish: Callable[[float, int], None]) -> None:
        if gen != self.gen:
            return                                                    # superseded by a re-plan
        self.busy_s += t - self.t0
        for rid in list(self.running):
            self.running[rid] -= self.steps
            if self.running[rid] <= 0:
                del self.running[rid]
                finish(t, rid)
        self._plan(t)


def simulate(workload: list[list[Turn]], engines: Mapping[str, int], profiles: Mapping[str, PoolProfile],
             policy: str, prefill_heavy_ratio: float = DEFAULT_PREFILL_HEAVY_RATIO,
             spill_outstanding: Optional[int] = None, default_decode_tokens: float = 2048.0) -> dict:
    """Run one routing policy over a drawn workload on simulated engines.

    The router's expected decode length comes from a ``DecodeLengthEstimator`` keyed by turn kind
    (first / later), fed with each finished response — not from the workload's true lengths.

    Args:
        workload: ``AgenticWorkload.draw(...)`` output, [N][T] turns.
        engines: pool -> engine count; profiles: pool -> ``PoolProfile`` for every pool with engines.
        policy, prefill_heavy_ratio, spill_outstanding: as ``RequestRouter``.
        default_decode_tokens: the estimator's guess for an unseen turn kind (max_new_tokens).
    Returns: dict with makespan_s, trajectories_per_s, utilisation {pool: busy fraction in [0, 1]},
        latency_mean_s, latency_p99_s (submit -> last token, queueing included), requests,
        router (``RequestRouter.stats()``) and served (list of ``Served``, one per request).
    Raises: ValueError: a pool with engines but no profile, or what ``RequestRouter`` raises.
    """
    router = RequestRouter(engines, policy, prefill_heavy_ratio, spill_outstanding)
    for p in ROUTED_POOLS:
        if router.engines[p] and p not in profiles:
            raise ValueError(f"profiles has no entry for pool {p!r}")
    heap: list = []
    seq = [0]

    def push(t: float, ev: tuple) -> None:
        seq[0] += 1
        heapq.heappush(heap, (t, seq[0], ev))

    eng = {p: [_Engine(p, i, profiles[p], push) for i in range(router.engines[p])] for p in ROUTED_POOLS}
    est = DecodeLengthEstimator(default_decode_tokens)
    meta: dict[int, tuple[int, int, str, int, float]] = {}            # rid -> (traj, turn, pool, engine, submit)
    served: list[Served] = []
    end = [0.0] * len(workload)

    def finish(t: float, rid: int) -> None:
        i, k, pool, e, t_sub = meta.pop(rid)
        router.done(pool, e)
        turn = workload[i][k]
        est.observe("first" if k == 0 else "later", turn.decode_tokens)
        served.append(Served(i, k, pool, e, t_sub, t))
        if k + 1 < len(workload[i]):
            push(t + turn.env_s, ("submit", i, k + 1))
        else:
            end[i] = t + turn.env_s

    for i in range(len(workload)):
        push(0.0, ("submit", i, 0))
    while heap:
        t, _, ev = heapq.heappop(heap)
        if ev[0] == "engine":
            ev[1].boundary(t, ev[2], finish)
            continue
        _, i, k = ev
        turn = workload[i][k]
        pool, e = router.route(turn.prefill_tokens, est.estimate("first" if k == 0 else "later"))
        rid = len(served) + len(meta)
        meta[rid] = (i, k, pool, e, t)
        eng[pool][e].arrive(t, rid, turn.prefill_tokens, turn.decode_tokens)
    makespan = max(end)
    lat = sorted(s.latency_s for s in served)
    util = {p: (sum(x.busy_s for x in eng[p]) / (len(eng[p]) * makespan) if eng[p] and makespan > 0 else 0.0)
            for p in ROUTED_POOLS}
    return {"policy": policy, "makespan_s": makespan,
            "trajectories_per_s": len(workload) / makespan if makespan else 0.0,
            "utilisation": util, "latency_mean_s": sum(lat) / len(lat),
            "latency_p99_s": lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)],
            "requests": len(served), "router": router.stats(), "served": served}


def routing_ablation(n_trajectories: int = 32, turns: int = 8, engines: Optional[Mapping[str, int]] = None,
                     profiles: Optional[Mapping[str, PoolProfile]] = None, seed: int = 0,
                     workload: Optional[AgenticWorkload] = None,
                     prefill_heavy_ratio: float = DEFAULT_PREFILL_HEAVY_RATIO,
                     spill_outstanding: Optional[int] = None) -> dict:
    """Affinity vs uniform routing on the same seeded workload (RollArc §4 hardware-affinity mapping;
    the paper's 1.35-2.05x is end-to-end RollArc vs monolithic — routing is one of its parts).

    Also runs a same-hardware control: both pools given the ``gpu_compute`` profile, so any gain of
    affinity there would come from the router's partitioning, not from hardware affinity.

    Args:
        n_trajectories, turns: workload size (>= 1 each).
        engines: pool -> engine count, default {"gpu_compute": 2, "gpu_bandwidth": 2}.
        profiles: pool -> ``PoolProfile``, default ``DEFAULT_PROFILES`` (H800-class / H20-class).
        seed: workload seed; workload: its parameters (default ``AgenticWorkload()``).
        prefill_heavy_ratio, spill_outstanding: as ``RequestRouter``.
    Returns: {"affinity": ..., "uniform": ..., "speedup_affinity_vs_uniform": makespan ratio
        uniform / affinity, "same_hardware": {"affinity", "uniform", "speedup_affinity_vs_uniform"},
        "workload": parameters and token totals, "engines", "profiles", "reference"}; each policy entry is
        ``simulate``'s dict without the per-request list.
    Raises: ValueError: profiles without ``gpu_compute``, or as ``AgenticWorkload.draw`` and ``simulate``.
    """
    engines = dict(engines or {"gpu_compute": 2, "gpu_bandwidth": 2})
    profiles = dict(profiles or DEFAULT_PROFILES)
    wl = workload or AgenticWorkload()
    drawn = wl.draw(n_trajectories, turns, seed)
    if "gpu_compute" not in profiles:
        raise ValueError("profiles needs a 'gpu_compute' entry (the same-hardware control uses it for both pools)")
    same = {p: profiles["gpu_compute"] for p in ROUTED_POOLS}

    def pair(prof: Mapping[str, PoolProfile]) -> dict:
        res = {pol: simulate(drawn, engines, prof, pol, prefill_heavy_ratio, spill_outstanding, wl.max_new_tokens)
               for pol in ("affinity", "uniform")}
        for r in res.values():
            r.pop("served")
        res["speedup_affinity_vs_uniform"] = res["uniform"]["makespan_s"] / res["affinity"]["makespan_s"]
        return res

    out = pair(profiles)
    out["same_hardware"] = pair(same)
    turns_all = [t for tr in drawn for t in tr]
    out["workload"] = {**asdict(wl), "n_trajectories": n_trajectories, "turns": turns, "seed": seed,
                       "requests": len(turns_all), "prefill_tokens": sum(t.prefill_tokens for t in turns_all),
                       "decode_tokens": sum(t.decode_tokens for t in turns_all)}
    out["engines"] = engines
    out["profiles"] = {p: asdict(v) for p, v in profiles.items()}
    out["reference"] = ("RollArc (arXiv 2512.22560): 1.35-2.05x end-to-end vs monolithic synchronous RL; "
                        "hardware-affinity routing is one of its parts")
    return out
