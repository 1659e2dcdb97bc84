"""RollArc on the discrete-event engine (arXiv 2512.22560): ``RollArcConfig``, the methods
(``RA_METHODS``), the lock-step baseline and the trajectory-level asynchronous scheduler re-expressed
as events, the pilot that chooses the trainer split and ``simulate_rollarc``. The package docstring
(``sim.des``) describes the model.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from sim.roofline import Roofline
from sim.traces import AgenticTurns, keyed_uniform, success_probability

from .engine import Allocation, EventLoop, Request, ServedModel, _accounting, make_instances


@dataclass(frozen=True)
class RollArcConfig(ServedModel):
    """One RollArc comparison (defaults: docs/rollarc.md, "Simulator"); model, hardware, tp,
    calibration and hw_overrides are ``ServedModel``'s.
    """

    gpus: int = 32
    """GPUs every method owns (a multiple of tp, >= 2)."""
    steps: int = 8
    """Training steps (>= 1)."""
    groups_per_step: int = 16
    """G: groups trained per step (>= 1)."""
    group_size: int = 8
    """R: trajectories trained per group (>= 1)."""
    redundancy: int = 1
    """Extra trajectories launched per group, RollArc's methods only (>= 0); the first group_size to be
    rewarded complete the group, the rest are cancelled."""
    max_turns: int = 10
    """LLM turns after which an episode is truncated (>= 1)."""
    env_latency: str = "medium"
    """Environment latency law: ``low`` | ``medium`` | ``heavy`` | ``none``."""
    env_mean_s: float = 1.0
    """Mean environment step latency (s)."""
    turn_timeout_s: float = 30.0
    """An env step past it ends the trajectory ``timeout``, for every method (s; the real driver's 30 s)."""
    reward_s: float = 0.5
    """One call of the stateless verifier pool (s). [assumption] 0.5 s."""
    reward_workers: int = 64
    """Workers of the stateless verifier pool (>= 1). [assumption] 64."""
    turns: AgenticTurns = field(default_factory=AgenticTurns)
    """Token shapes and episode lengths (``traces.AgenticTurns``)."""
    trainer_gpus: Optional[int] = None
    """GPUs of the disaggregated trainer pool, in [tp, gpus - tp]; None: chosen by a pilot
    (``choose_trainer_gpus``)."""
    max_seqs: int = 256
    """Running sequences per engine (vLLM's default 256)."""
    sync_fixed_s: float = 2.0
    """Per-publish fixed cost (reshard / engine reload) besides moving the bytes (s); colocated: over
    NVLink, disaggregated: over ``network_bytes_s``."""
    network_bytes_s: float = 50e9
    """Link the disaggregated methods publish weights over (bytes/s; 400 Gb/s RDMA, 50 GB/s)."""
    swap_s: float = 0.5
    """Engines' pause to swap in published weights (s; disaggregated; the transfer itself overlaps
    generation). [assumption] 0.5 s."""

    def __post_init__(self):
        if self.gpus < 2 or self.gpus % self.tp:
            raise ValueError(f"RollArcConfig.gpus ({self.gpus}) must be a multiple of tp ({self.tp}) and >= 2")
        for f in ("steps", "groups_per_step", "group_size", "max_turns", "reward_workers"):
            if getattr(self, f) < 1:
                raise ValueError(f"RollArcConfig.{f} must be >= 1, got {getattr(self, f)}")
        if self.redundancy < 0:
            raise ValueError(f"RollArcConfig.redundancy must be >= 0, got {self.redundancy}")
        if self.trainer_gpus is not None and not (self.tp <= self.trainer_gpus <= self.gpus - self.tp):
            raise ValueError(f"RollArcConfig.trainer_gpus must leave a rollout engine, got {self.trainer_gpus}")



#: name -> (lock-step or async, async_ratio, uses the config's redundancy, colocated); any
#: ``rollarc_a<k>`` (k >= 1) is RollArc at async_ratio k. The names are the driver's
#: (``ops.rl.rollarc.spec.METHODS``); ``async0`` runs here without redundancy and colocated.
RA_METHODS = {
    "monolithic": ("lockstep", 0, False, True),
    "async0": ("async", 0, False, True),
    "rollarc_a1": ("async", 1, True, False),
    "rollarc_a2": ("async", 2, True, False),
}


def ra_method(name: str) -> tuple:
    """(kind, async_ratio, uses redundancy, colocated) of a RollArc-side method name.
    Raises ValueError: unknown name."""
    if name in RA_METHODS:
        return RA_METHODS[name]
    if name.startswith("rollarc_a") and name[9:].isdigit() and int(name[9:]) >= 1:
        return ("async", int(name[9:]), True, False)
    raise ValueError(f"unknown RollArc method {name!r}; known: {list(RA_METHODS)} or rollarc_a<k>")


class _Trajectory:
    __slots__ = ("gid", "member", "turns", "planned", "k", "rid", "inst", "versions", "cancelled", "status",
                 "reward", "end_t", "tokens")

    def __init__(self, gid, member, turns, planned):
        self.gid, self.member, self.turns, self.planned = gid, member, turns, planned
        self.k = 0
        self.rid = None
        self.inst = None
        self.versions: list = []
        self.cancelled = False
        self.status = None
        self.reward = None
        self.end_t = None
        self.tokens = 0


class _ArcSim:
    """Shared state of one RollArc-side run (engines, reward pool, trajectories)."""

    def __init__(self, cfg: RollArcConfig, seed: int, rollout_gpus: int, cost: Roofline,
                 episodes: Optional[dict] = None):
        self.cfg, self.seed, self.cost = cfg, seed, cost
        self.episodes = {} if episodes is None else episodes
        self.loop = EventLoop()
        self.insts = make_instances(self.loop, cost, rollout_gpus // cfg.tp, max_seqs=cfg.max_seqs, prefix_cache=False)
        self.rid = itertools.count()
        self.reward_free = [0.0] * cfg.reward_workers
        self.trained_tokens = 0
        self.train_busy = 0.0
        self.llm_calls = 0
        self.version = 0

    def trajectory(self, task: str, member: int) -> _Trajectory:
        c = self.cfg
        key = (self.seed, task, member, c.max_turns, c.env_latency, c.env_mean_s, c.turn_timeout_s, c.turns)
        got = self.episodes.get(key)
        if got is None:
            got = self.episodes[key] = c.turns.episode(self.seed, task, member, c.max_turns, c.env_latency,
                                                       c.env_mean_s, c.turn_timeout_s)
        return _Trajectory(task, member, got[0], got[1])

    def llm(self, t: float, tr: _Trajectory, on_done: Callable) -> None:
        """Submit the trajectory's current turn to the engine with the fewest outstanding requests."""
        turn = tr.turns[tr.k]
        inst = self.insts[0]
        for i in self.insts:
            if i.outstanding < inst.outstanding:
                inst = i
        tr.rid, tr.inst = next(self.rid), inst
        self.llm_calls += 1
        inst.submit(t, Request(tr.rid, turn.new, turn.cached, turn.decode, on_done, tr))

    def reward_at(self, t: float) -> float:
        """Queue one reward request at ``t`` on the verifier pool; returns its completion time."""
        start = max(t, heapq.heappop(self.reward_free))
        end = start + self.cfg.reward_s
        heapq.heappush(self.reward_free, end)
        return end

    def finish_status(self, tr: _Trajectory) -> None:
        """The episode is over: its status and the tokens it trains (the final context)."""
        last = tr.turns[-1]
        tr.status = tr.planned
        tr.tokens = last.context + last.decode

    def reward_value(self, tr: _Trajectory) -> Optional[float]:
        if tr.status == "timeout":
            return None
        if tr.status != "ok":
            return 0.0
        p = success_probability(self.seed, tr.gid)
        return 1.0 if keyed_uniform("reward", self.seed, tr.gid, tr.member) < p else 0.0

    def rollout_busy_gpu_s(self) -> float:
        return sum(i.busy_s for i in self.insts) * self.cfg.tp


def _task(seed: int, n: int) -> str:
    return f"s{seed}-task{n}"


def _run_lockstep(cfg: RollArcConfig, seed: int, cost: Roofline, episodes: Optional[dict] = None) -> dict:
    """The monolithic baseline (``ops.rl.rollarc.monolithic.run_monolithic``): per step, G x R trajectories
    advance turn by turn together (one batched LLM call per turn, then every env step, waiting for
    the slowest), rewards after the batch, training on every GPU, then the weight sync."""
    sim = _ArcSim(cfg, seed, cfg.gpus, cost, episodes)
    loop = sim.loop
    st = {"step": 0, "task": 0, "steps": []}
    sync = cost.weight_sync_s(cost.hw.link_bytes_s, cfg.sync_fixed_s)

    def start_step(t):
        trajs = []
        for _ in range(cfg.groups_per_step):
            task = _task(seed, st["task"])
            st["task"] += 1
            trajs += [sim.trajectory(task, m) for m in range(cfg.group_size)]
        st["trajs"], st["t_start"] = trajs, t
        st["active"] = list(trajs)
        turn(t)

    def turn(t):
        active = st["active"]
        if not active:
            return rewards(t)
        st["pending"] = len(active)
        for tr in active:
            sim.llm(t, tr, llm_done)

    def llm_done(t, req):
        st["pending"] -= 1
        req.meta.versions.append(req.version)
        if st["pending"] == 0:
            env_end = t + max(tr.turns[tr.k].env_s for tr in st["active"])
            loop.at(env_end, env_done)

    def env_done(t):
        nxt = []
        for tr in st["active"]:
            tr.k += 1
            if tr.k == len(tr.turns):
                sim.finish_status(tr)
                tr.end_t = t
            else:
                nxt.append(tr)
        st["active"] = nxt
        turn(t)

    def rewards(t):
        end = t
        for tr in st["trajs"]:
            tr.reward = sim.reward_value(tr)
            if tr.status != "timeout":
                end = max(end, sim.reward_at(t))
        loop.at(end, train)

    def train(t):
        toks = [tr.tokens for tr in st["trajs"]]
        g = cost.train_gpu_s(toks)
        sim.train_busy += g
        sim.trained_tokens += sum(toks)
        loop.at(t + g / cfg.gpus + sync, published)

    def published(t):
        st["steps"].append({"step": st["step"], "end_s": t, "rollout_s": None})
        st["step"] += 1
        sim.version = st["step"]
        for i in sim.insts:
            i.version = sim.version
        if st["step"] < cfg.steps:
            start_step(t)

    loop.at(0.0, start_step)
    makespan = loop.run()
    return _arc_result("monolithic", cfg, sim, Allocation(colocated=cfg.gpus), makespan, st["steps"],
                       staleness={0: cfg.steps * cfg.groups_per_step}, discarded=0,
                       generated=cfg.steps * cfg.groups_per_step * cfg.group_size, dropped=0)


def _run_async(cfg: RollArcConfig, seed: int, cost: Roofline, async_ratio: int, redundancy: int,
               alloc: Allocation, episodes: Optional[dict] = None) -> dict:
    """Trajectory-level asynchrony (``ops.rl.rollarc.core.run_rollarc``): a producer creating groups
    within the staleness budget, ``group_size + redundancy`` trajectories per group each advancing
    on its own (LLM call, env step, ..., reward), a group complete with its first ``group_size``
    rewarded members (the rest cancelled), and a trainer taking the oldest fresh groups. Colocated
    (async_ratio 0 only): training and rollout time-share the GPUs. Disaggregated: the trainer pool
    trains while the rollout pool generates; a publish moves the weights over the network and each
    engine pauses ``swap_s`` to swap them in."""
    colocated = alloc.colocated > 0
    if colocated and async_ratio != 0:
        raise ValueError("a colocated method time-shares its GPUs: only async_ratio 0 is possible")
    sim = _ArcSim(cfg, seed, alloc.colocated or alloc.rollout, cost, episodes)
    loop = sim.loop
    train_gpus = alloc.colocated or alloc.trainer
    G, R = cfg.groups_per_step, cfg.group_size
    if colocated:
        sync = cost.weight_sync_s(cost.hw.link_bytes_s, cfg.sync_fixed_s)
    else:
        sync = cost.weight_sync_s(cfg.network_bytes_s, cfg.sync_fixed_s)
    st = {"step": 0, "created": 0, "training": False, "buffer": [], "discarded": 0, "steps": [],
          "stale": {}, "generated": 0, "dropped": 0, "done": False}
    groups: dict = {}

    def produce(t):
        while (not st["done"] and st["created"] - st["discarded"] < (st["step"] + 1 + async_ratio) * G):
            n = st["created"]
            st["created"] += 1
            task = _task(seed, n)
            grp = {"gid": task, "created_step": st["step"], "members": [], "good": [], "bad": [],
                   "complete": False, "n": n}
            groups[task] = grp
            for m in range(R + redundancy):
                tr = sim.trajectory(task, m)
                grp["members"].append(tr)
                st["generated"] += 1
                sim.llm(t, tr, llm_done)

    def llm_done(t, req):
        tr = req.meta
        if tr.cancelled:
            return
        tr.versions.append(req.version)
        tr.rid = None
        loop.at(t + tr.turns[tr.k].env_s, env_done, tr)

    def env_done(t, tr):
        if tr.cancelled:
            return
        tr.k += 1
        if tr.k < len(tr.turns):
            sim.llm(t, tr, llm_done)
            return
        sim.finish_status(tr)
        tr.reward = sim.reward_value(tr)
        if tr.status == "timeout":
            traj_done(t, tr)
        else:
            loop.at(sim.reward_at(t), traj_done, tr)

    def traj_done(t, tr):
        if tr.cancelled:
            return
        tr.end_t = t
        grp = groups[tr.gid]
        if grp["complete"]:
            return
        (grp["good"] if tr.reward is not None else grp["bad"]).append(tr)
        if len(grp["good"]) == R or len(grp["good"]) + len(grp["bad"]) == len(grp["members"]):
            grp["complete"], grp["finished_at"] = True, t
            grp["kept"] = (grp["good"] + grp["bad"])[:R]
            for m in grp["members"]:
                if m not in grp["kept"] and m.end_t is None:
                    m.cancelled = True
                    st["dropped"] += 1
                    if m.rid is not None:
                        m.inst.abort(t, m.rid)
            st["dropped"] += sum(1 for m in grp["members"] if m not in grp["kept"] and not m.cancelled)
            grp["oldest_version"] = min(v for m in grp["kept"] for v in m.versions)
            st["buffer"].append(grp)
            try_train(t)

    def try_train(t):
        if st["training"] or st["done"]:
            return
        step = st["step"]
        keep = []
        for g in st["buffer"]:
            if step - g["oldest_version"] > async_ratio:
                st["discarded"] += 1
            else:
                keep.append(g)
        st["buffer"] = keep
        if len(keep) < G:
            produce(t)                       # discards free producer budget
            return
        keep.sort(key=lambda g: (g["created_step"], g["finished_at"], g["n"]))
        batch, st["buffer"] = keep[:G], keep[G:]
        for g in batch:
            s = step - g["oldest_version"]
            st["stale"][s] = st["stale"].get(s, 0) + 1
        toks = [m.tokens for g in batch for m in g["kept"]]
        gs = cost.train_gpu_s(toks)
        sim.train_busy += gs
        sim.trained_tokens += sum(toks)
        st["training"] = True
        loop.at(t + gs / train_gpus + sync, published)

    def published(t):
        st["training"] = False
        st["steps"].append({"step": st["step"], "end_s": t})
        st["step"] += 1
        sim.version = st["step"]
        if st["step"] >= cfg.steps:
            st["done"] = True
            loop.stop()
            return
        if colocated:
            for i in sim.insts:
                i.version = sim.version
        else:
            for i in sim.insts:
                i.stall(t, cfg.swap_s, lambda _t, inst=i, v=sim.version: setattr(inst, "version", v))
        produce(t)
        try_train(t)

    loop.at(0.0, produce)
    makespan = loop.run()
    name = "async0" if colocated else f"rollarc_a{async_ratio}"
    return _arc_result(name, cfg, sim, alloc, makespan, st["steps"], st["stale"], st["discarded"], st["generated"],
                       st["dropped"])


def _arc_result(name, cfg, sim, alloc, makespan, steps, staleness, discarded, generated, dropped) -> dict:
    ends = [s["end_s"] for s in steps]
    steady = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else None
    return {"method": name, "total_s": makespan, "steps": len(steps), "mean_step_s": makespan / max(1, len(steps)),
            "steady_step_s": steady, "staleness_hist": {str(k): v for k, v in sorted(staleness.items())},
            "discarded_groups": discarded, "generated_trajectories": generated, "dropped_trajectories": dropped,
            "trained_tokens": sim.trained_tokens, "llm_calls": sim.llm_calls,
            "preemptions": sum(i.preemptions for i in sim.insts), "events": sim.loop.events,
            **_accounting(alloc, makespan, sim.rollout_busy_gpu_s(), sim.train_busy)}


def rollarc_allocation(cfg: RollArcConfig, method: str, trainer_gpus: Optional[int] = None) -> Allocation:
    """The GPUs of ``method``: all colocated, or ``trainer_gpus`` (default ``cfg.trainer_gpus``) for
    the trainer and the rest for rollout. Raises ValueError: unknown method, no trainer split."""
    if ra_method(method)[3]:
        return Allocation(colocated=cfg.gpus)
    tg = trainer_gpus if trainer_gpus is not None else cfg.trainer_gpus
    if tg is None:
        raise ValueError(f"{method}: the trainer pool size is not set (trainer_gpus)")
    return Allocation(rollout=cfg.gpus - tg, trainer=tg)


def run_rollarc_method(cfg: RollArcConfig, method: str, seed: int = 0, trainer_gpus: Optional[int] = None,
                       episodes: Optional[dict] = None) -> dict:
    """One method of the RollArc comparison on ``cfg`` (times in simulated seconds). ``episodes``:
    a dict shared between calls to reuse the keyed episode draws (they are the same for every
    method). Raises ValueError: unknown method, no trainer split for a disaggregated one."""
    kind, ratio, uses_red, _ = ra_method(method)
    alloc = rollarc_allocation(cfg, method, trainer_gpus)
    cost = cfg.roofline()
    if kind == "lockstep":
        return _run_lockstep(cfg, seed, cost, episodes)
    return _run_async(cfg, seed, cost, ratio, cfg.redundancy if uses_red else 0, alloc, episodes)


def trainer_split_candidates(cfg: RollArcConfig) -> list[int]:
    """Trainer pool sizes tried by the pilot: 1/4 ... 3/4 of the GPUs in eighths (multiples of tp)."""
    out = []
    for frac in (1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4):
        g = max(cfg.tp, int(round(cfg.gpus * frac / cfg.tp)) * cfg.tp)
        if g <= cfg.gpus - cfg.tp and g not in out:
            out.append(g)
    return out


PILOT_SEED = 1_000_003


def choose_trainer_gpus(cfg: RollArcConfig, method: str = "rollarc_a1", pilot_seed: int = PILOT_SEED,
                        pilot_steps: int = 3) -> dict:
    """The trainer pool size for the disaggregated methods: the candidate with the shortest pilot
    run (``pilot_steps`` steps on ``pilot_seed``, never one of the measured seeds) — what an operator
    does with a profiling run. Returns {"trainer_gpus", "pilot": {gpus: total_s}}."""
    pc = replace(cfg, steps=pilot_steps)
    ep: dict = {}
    res = {g: run_rollarc_method(pc, method, pilot_seed, g, ep)["total_s"] for g in trainer_split_candidates(cfg)}
    best = min(res, key=lambda g: (res[g], g))
    return {"trainer_gpus": best, "pilot": res, "pilot_seed": pilot_seed, "pilot_steps": pilot_steps,
            "pilot_method": method}


def simulate_rollarc(cfg: RollArcConfig, seed: int = 0, methods: Sequence[str] = tuple(RA_METHODS),
                     trainer_gpus: Optional[int] = None) -> dict:
    """Every method of ``methods`` on ``cfg`` and ``seed``. Returns {"methods": {name: result},
    "speedup_vs_monolithic", "speedup_vs_async0", "trainer_gpus"}."""
    tg = trainer_gpus if trainer_gpus is not None else cfg.trainer_gpus
    if tg is None and any(not ra_method(m)[3] for m in methods):
        tg = choose_trainer_gpus(cfg)["trainer_gpus"]
    ep: dict = {}
    out = {m: run_rollarc_method(cfg, m, seed, tg, ep) for m in methods}
    res = {"methods": out, "trainer_gpus": tg}
    for ref in ("monolithic", "async0"):
        if ref in out:
            res[f"speedup_vs_{ref}"] = {m: out[ref]["total_s"] / v["total_s"] for m, v in out.items()}
    return res
