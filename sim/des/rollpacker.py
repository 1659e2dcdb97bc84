"""RollPacker on the discrete-event engine (arXiv 2509.21009): ``DESEngine`` (the ``ops.rl.engine``
interface on simulated instances, driven by the production round planner), ``RollPackerConfig``,
the methods (``RP_METHODS``), rewards on a CPU worker pool, the stream trainer and
``simulate_rollpacker``. The package docstring (``sim.des``) describes the model.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from ops.rl.rollpacker.scheduler import RoundPlanner, TailBatching, run_round
from ops.rl.types import Completion, Prompt, RolloutBatch

from sim.roofline import Roofline
from sim.traces import LogNormalLengths, keyed_normal, keyed_uniform

from .engine import Allocation, EventLoop, Request, ServedModel, _accounting, make_instances


class DESEngine:
    """The ``Engine`` interface (``ops.rl.engine``) on simulated instances, so the unchanged
    tail-batching scheduler (``ops.rl.rollpacker.scheduler.run_round``) drives it.

    Each ``generate`` call is a fresh rollout on ``instances`` engines: the requests, prompt-major,
    are split into contiguous chunks, one per instance (veRL's data-parallel dispatch: the samples
    of a prompt share an engine and its prefix cache). ``on_finish`` is called in finish order;
    its first True ends the call (the rest come back ``abort``). At ``timeout_s`` simulated seconds
    the unfinished responses come back ``timeout`` with the tokens generated so far, and
    ``on_finish`` sees each of them (request order), as ``ops.rl.engine`` engines do.

    Args: trace: ``LogNormalLengths`` | ``MeasuredLengths``. cost: Roofline. instances: engines.
        engine_kw: ``Instance`` options (max_seqs, token_budget, ...).
    """

    def __init__(self, trace, cost: Roofline, instances: int, **engine_kw):
        if instances < 1:
            raise ValueError(f"DESEngine.instances must be >= 1, got {instances}")
        self.trace, self.cost, self.instances, self.engine_kw = trace, cost, instances, engine_kw
        self.version: Optional[int] = 0
        self.draws: dict = {}
        self.calls = 0
        self.events = 0
        self.preemptions = 0

    def generate(self, prompts: Sequence[Prompt], n: int, max_new_tokens: int, stop=None,
                 timeout_s: float = math.inf, on_finish=None) -> RolloutBatch:
        """See ``ops.rl.engine.Engine.generate``. Raises ValueError: n < 1 or max_new_tokens < 1."""
        if n < 1 or max_new_tokens < 1:
            raise ValueError(f"generate needs n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}")
        self.calls += 1
        loop = EventLoop()
        insts = make_instances(loop, self.cost, self.instances, **self.engine_kw)
        meta, reqs = [], []
        out: dict = {}
        state = {"stopped": None, "timed_out": False}

        def done(t, req):
            if state["stopped"] is not None:
                return
            uid, i, capped, L = req.meta
            c = Completion(uid, i, [], [], "length" if capped else "stop", self.version, t_finish_s=t,
                           num_tokens=min(L, max_new_tokens))
            out[req.rid] = c
            if len(out) == total:
                state["all_done"] = t
            if on_finish is not None and on_finish(c):
                state["stopped"] = t
                loop.stop()

        for p in prompts:
            d = self.draws.get(p.uid, 0)
            self.draws[p.uid] = d + 1
            pt = self.trace.prompt_tokens(p.uid)
            for i, L in enumerate(self.trace.lengths(p.uid, n, d)):
                rid = len(meta)
                meta.append((p.uid, i, L > max_new_tokens, L))
                reqs.append(Request(rid, pt, 0, min(L, max_new_tokens), done, meta[-1], prefix=p.uid))
        total = len(reqs)
        chunk = [0] * self.instances
        for rid, r in enumerate(reqs):
            j = rid * self.instances // total
            chunk[j] += 1
            insts[j].submit(0.0, r)
        if math.isfinite(timeout_s):
            def on_timeout(t):
                if "all_done" not in state:
                    state.update(stopped=t, timed_out=True)
                    loop.stop()

            loop.at(timeout_s, on_timeout)
        loop.run()
        self.events += loop.events
        self.preemptions += sum(i.preemptions for i in insts)
        # a timer that fired after the last finish moved loop.now: the rollout ended at that finish
        t_end = state["stopped"] if state["stopped"] is not None else state.get("all_done", loop.now)
        reason = "timeout" if state["timed_out"] else "abort"
        where = {}
        for inst in insts:
            for rid in inst.running:
                where[rid] = inst
        for rid, r in enumerate(reqs):
            if rid not in out:
                inst = where.get(rid)
                ntok = inst.generated_by(t_end, rid) if inst is not None else 0
                uid, i, _, _ = meta[rid]
                out[rid] = c = Completion(uid, i, [], [], reason, self.version, t_finish_s=t_end, num_tokens=ntok)
                if reason == "timeout" and on_finish is not None:
                    on_finish(c)
        # seq_s counts running sequences up to each instance's last boundary: close the open runs
        seq_busy = 0.0
        busy = 0.0
        slots = 0
        drain = []
        for inst in insts:
            s, b = inst.seq_s, inst.busy_s
            if inst.state in ("run", "iter") and t_end > inst.t0:
                s += (t_end - inst.t0) * len(inst.running)
                b += t_end - inst.t0
            seq_busy += s
            busy += min(b, t_end)
            slots += min(inst.max_seqs, chunk[inst.index])
            drain.append(min(inst.drained_at if inst.state == "idle" else t_end, t_end))
        cap = slots * t_end
        timings = {"wall_s": t_end, "slot_steps_busy": seq_busy, "slot_steps_total": cap,
                   "bubble_ratio": max(0.0, 1.0 - seq_busy / cap) if cap > 0 else 0.0,
                   "instance_drain_s": drain, "events": loop.events,
                   "rollout_gpu_s_busy": busy * self.cost.tp}
        return RolloutBatch([out[rid] for rid in range(total)], timings)


@dataclass(frozen=True)
class RollPackerConfig(ServedModel):
    """One RollPacker comparison (defaults: docs/rollpacker.md, "Simulator"); model, hardware, tp,
    calibration and hw_overrides are ``ServedModel``'s.
    """

    gpus: int = 64
    """GPUs of every method, a positive multiple of tp (colocated: rollout and training time-share them)."""
    prompts_per_step: int = 128
    """P0: prompts trained per step (>= 1)."""
    responses_per_prompt: int = 8
    """R0: responses per prompt, the GRPO group size (>= 1)."""
    eta: float = 1.25
    """Tail batching's over-provisioning factor of short rounds, in [1, 4] (1.25, the paper's)."""
    steps: int = 20
    """Training steps (>= 1); the epoch is steps x P0 prompts, the same for every method."""
    max_new_tokens: int = 32768
    """Cap on every response (tokens); a longer drawn response ends ``length``."""
    max_seqs: int = 256
    """Running sequences per engine (>= 1; vLLM's default 256)."""
    token_budget: int = 16384
    """Prefill tokens per iteration (vLLM's max_num_batched_tokens for offline batches, 16,384)."""
    reward_workers: int = 64
    """CPU workers scoring responses (>= 1). [assumption] 64."""
    reward_median_s: float = 1.0
    """Median of a prompt's base verifier runtime (s; model: ``traces.reward_runtime``). [assumption] 1 s."""
    reward_sigma: float = 0.8
    """Log-normal sigma of a prompt's base verifier runtime (``traces.reward_runtime``). [assumption] 0.8."""
    reward_hang_fraction: float = 0.02
    """Share of responses whose verifier hangs until the timeout, in [0, 1). [assumption] 0.02."""
    t_min_s: float = 2.0
    """Adaptive reward timeout min(max(t_min, lambda x anchor), t_max): its floor (s; paper: 2 s)."""
    t_max_s: float = 30.0
    """The adaptive timeout's cap (s; paper: 30 s); the baseline always waits t_max for a hanging response."""
    timeout_lambda: float = 1.5
    """The adaptive timeout's lambda: multiple of the anchor, the prompt's slowest finished verifier run
    (paper: 1.5)."""
    sync_fixed_s: float = 2.0
    """Per-step weight reshard between training and inference besides moving the bytes over NVLink (s).
    [assumption] 2 s."""
    trace: object = field(default_factory=LogNormalLengths)
    """The length trace (``LogNormalLengths`` by default, or ``MeasuredLengths``; its seed is replaced by
    the run's)."""

    def __post_init__(self):
        if self.gpus < 1 or self.gpus % self.tp:
            raise ValueError(f"RollPackerConfig.gpus ({self.gpus}) must be a positive multiple of tp ({self.tp})")
        for f in ("steps", "reward_workers", "max_seqs"):
            if getattr(self, f) < 1:
                raise ValueError(f"RollPackerConfig.{f} must be >= 1, got {getattr(self, f)}")
        if not 0 <= self.reward_hang_fraction < 1:
            raise ValueError(f"RollPackerConfig.reward_hang_fraction must be in [0, 1), got {self.reward_hang_fraction}")

    def describe(self) -> dict:
        d = super().describe()
        d["trace"] = self.trace.describe() if hasattr(self.trace, "describe") else str(self.trace)
        return d


RP_METHODS = {  # name -> (tail batching, reward scheduler, stream trainer)
    "baseline": (False, False, False),
    "tail_batching": (True, False, False),
    "tail_batching+reward": (True, True, False),
    "rollpacker": (True, True, True),
}


def _reward_done(arrivals: list[float], costs: list[float], workers: int) -> list[float]:
    """FIFO list scheduling of jobs (arrival, cost) on ``workers`` servers: completion times."""
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    free = [0.0] * workers
    done = [0.0] * len(arrivals)
    for i in order:
        t = max(heapq.heappop(free), arrivals[i])
        done[i] = t + costs[i]
        heapq.heappush(free, done[i])
    return done


def _train_end(ready: list[float], work: list[float], drain: list[float], rollout_end: float, gpus: int,
               gpus_per_instance: int, stream: bool) -> float:
    """When the last group's training ends. Without the stream trainer, all work starts after the
    last reward on all GPUs. With it (RollPacker §4.3), a group starts once its rewards are in, on
    the GPUs of instances already drained, and on every GPU after the rollout; work is served FIFO
    by ready time at the piecewise-constant capacity (GPUs)."""
    if not work:
        return rollout_end
    if not stream:
        return max(max(ready), rollout_end) + sum(work) / gpus
    bps = sorted({d for d in drain if d < rollout_end} | {rollout_end})

    def cap(t: float) -> float:
        return float(gpus) if t >= rollout_end else float(gpus_per_instance * sum(d <= t for d in drain))

    jobs = sorted(zip(ready, work))
    t, k, q = 0.0, 0, 0.0
    while k < len(jobs) or q > 1e-12:
        if q <= 1e-12:
            t = max(t, jobs[k][0])
        while k < len(jobs) and jobs[k][0] <= t + 1e-12:
            q += jobs[k][1]
            k += 1
        nxt = min([b for b in bps if b > t + 1e-12] + ([jobs[k][0]] if k < len(jobs) else []) + [math.inf])
        c = cap(t)
        if c <= 0:
            t = nxt
            continue
        fin = t + q / c
        if fin <= nxt:
            t, q = fin, 0.0
        else:
            q -= (nxt - t) * c
            t = nxt
    return t


def reward_draws(rnd, seed: int, draws: dict) -> list[tuple[float, float, float]]:
    """The keyed (per-prompt normal, per-response normal, hang uniform) of each trained response of
    a round, in ``rollpacker_step``'s order; shared by every method and reward setting."""
    out = []
    for g in rnd.groups:
        for c in g.completions:
            d = draws.get(c.prompt_uid, 0)
            out.append((keyed_normal("reward_base", seed, c.prompt_uid), keyed_normal("reward_resp", seed, c.prompt_uid, c.index, d),
                        keyed_uniform("hang", seed, c.prompt_uid, c.index, d)))
    return out


def rollpacker_step(rnd, cfg: RollPackerConfig, cost: Roofline, reward_sched: bool, stream: bool,
                    prompt_tokens: Callable[[str], int], zs: list) -> dict:
    """Rewards, training and weight sync of one step on top of its rollout round (seconds); ``zs``:
    ``reward_draws`` of the round. A response's verifier runtime is inf (it hangs) when its uniform
    is below ``reward_hang_fraction``, else median x exp(sigma z_prompt) x exp(0.3 z_response)
    (``traces.reward_runtime``)."""
    rollout = float(rnd.batch.timings["wall_s"])
    drain = list(rnd.batch.timings["instance_drain_s"])
    comps = [(gi, c) for gi, g in enumerate(rnd.groups) for c in g.completions]
    anchor: dict = {}
    order = sorted(range(len(comps)), key=lambda j: comps[j][1].t_finish_s)
    costs = [0.0] * len(comps)
    lm = math.log(cfg.reward_median_s)
    for j in order:
        _, c = comps[j]
        zb, zr, u = zs[j]
        run = math.inf if u < cfg.reward_hang_fraction else math.exp(lm + cfg.reward_sigma * zb + 0.3 * zr)
        if reward_sched:
            a = anchor.get(c.prompt_uid)
            limit = cfg.t_max_s if a is None else min(max(cfg.t_min_s, cfg.timeout_lambda * a), cfg.t_max_s)
        else:
            limit = cfg.t_max_s
        costs[j] = min(run, limit)
        if run <= limit:
            anchor[c.prompt_uid] = max(anchor.get(c.prompt_uid, 0.0), run)
    arrivals = [c.t_finish_s if reward_sched else rollout for _, c in comps]
    done = _reward_done(arrivals, costs, cfg.reward_workers)
    ready = [0.0] * len(rnd.groups)
    seqs: list[list[int]] = [[] for _ in rnd.groups]
    for (gi, c), d in zip(comps, done):
        ready[gi] = max(ready[gi], d)
        seqs[gi].append(prompt_tokens(c.prompt_uid) + c.length)
    work = [cost.train_gpu_s(s) for s in seqs]
    reward_end = max(done, default=rollout)
    train_end = _train_end(ready, work, drain, rollout, cfg.gpus, cfg.tp, stream)
    end = max(rollout, reward_end, train_end)
    sync = cost.weight_sync_s(cost.hw.link_bytes_s, cfg.sync_fixed_s)
    return {"rollout_s": rollout, "reward_tail_s": max(0.0, reward_end - rollout),
            "train_tail_s": max(0.0, end - max(rollout, reward_end)), "sync_s": sync, "step_s": end + sync,
            "train_gpu_s": sum(work), "rollout_gpu_s_busy": rnd.batch.timings["rollout_gpu_s_busy"],
            "reward_worker_s": sum(costs)}


def rollpacker_rollouts(cfg: RollPackerConfig, seed: int = 0, tail_batching: Sequence[bool] = (False, True)) -> dict:
    """The rollout rounds of one epoch (``steps x P0`` prompts) for the baseline planner (False) and
    the tail-batching planner (True), on the same trace and GPUs: {flag: (rounds, draws, engine)}."""
    trace = replace(cfg.trace, seed=seed) if hasattr(cfg.trace, "seed") else cfg.trace
    cost = cfg.roofline()
    p0, r0 = cfg.prompts_per_step, cfg.responses_per_prompt
    prompts = [Prompt(f"p{i}") for i in range(cfg.steps * p0)]
    out = {}
    for tb in tail_batching:
        eng = DESEngine(trace, cost, cfg.gpus // cfg.tp, max_seqs=cfg.max_seqs, token_budget=cfg.token_budget)
        planner = RoundPlanner(prompts, TailBatching(p0, r0, cfg.eta, enabled=tb))
        rounds, draws_at = [], []
        while (plan := planner.next_round()) is not None:
            draws_at.append({p.uid: eng.draws.get(p.uid, 0) for p in plan.prompts})
            res = run_round(eng, plan, cfg.max_new_tokens, math.inf)
            planner.requeue(res.aborted)
            rounds.append(res)
        zs = [reward_draws(r, seed, d) for r, d in zip(rounds, draws_at)]
        ptoks = {p.uid: trace.prompt_tokens(p.uid) for p in prompts}
        out[tb] = (rounds, zs, eng, ptoks)
    return out


def _check_rp_methods(methods: Sequence[str]) -> None:
    for m in methods:
        if m not in RP_METHODS:
            raise ValueError(f"unknown RollPacker method {m!r}; known: {list(RP_METHODS)}")


def rollpacker_timelines(cfg: RollPackerConfig, rollouts: dict, seed: int = 0,
                         methods: Sequence[str] = tuple(RP_METHODS)) -> dict:
    """Rewards, training and sync on top of ``rollpacker_rollouts`` for each method; ``cfg`` may differ
    from the rollouts' in its reward / training / sync fields only (sensitivity runs).

    Returns: {"methods": {name: {total_s, steps, rollout_share, mean_step_s, max_response_len_mean,
        bubble_ratio_mean, long_rounds, GPU accounting ...}}, "speedup": {name: baseline total /
        method total}, "tail": statistics of the baseline's trained responses,
        "max_response_len_reduction": mean max length of baseline steps / of short rounds, "rounds"}.
    Raises: ValueError: an unknown method.
    """
    _check_rp_methods(methods)
    cost = cfg.roofline()
    alloc = Allocation(colocated=cfg.gpus)
    out: dict = {}
    for m in methods:
        tb, rs, st = RP_METHODS[m]
        rounds, zs, eng, ptoks = rollouts[tb]
        steps = [rollpacker_step(r, cfg, cost, rs, st, ptoks.__getitem__, z) for r, z in zip(rounds, zs)]
        total = sum(s["step_s"] for s in steps)
        rollout = sum(s["rollout_s"] for s in steps)
        kinds = ("sync",) if not tb else ("short",)
        mx = [r.metrics["max_response_len"] for r in rounds if r.plan.kind in kinds]
        out[m] = {"total_s": total, "steps": len(steps), "mean_step_s": total / len(steps),
                  "rollout_s": rollout, "rollout_share": rollout / total,
                  "reward_tail_s": sum(s["reward_tail_s"] for s in steps),
                  "train_tail_s": sum(s["train_tail_s"] for s in steps),
                  "sync_s": sum(s["sync_s"] for s in steps),
                  "long_rounds": sum(r.plan.kind == "long" for r in rounds),
                  "max_response_len_mean": sum(mx) / len(mx) if mx else None,
                  "bubble_ratio_mean": sum(r.metrics["bubble_ratio"] for r in rounds) / len(rounds),
                  "trained_responses": sum(len(g.completions) for r in rounds for g in r.groups),
                  "preemptions": eng.preemptions, "events": eng.events,
                  **_accounting(alloc, total, sum(s["rollout_gpu_s_busy"] for s in steps),
                                sum(s["train_gpu_s"] for s in steps))}
    base = out.get("baseline")
    speed = {m: base["total_s"] / v["total_s"] for m, v in out.items()} if base else {}
    res = {"methods": out, "speedup": speed, "rounds": {("tail_batching" if tb else "baseline"):
                                                        "".join({"sync": "B", "short": "S", "long": "L"}[r.plan.kind] for r in v[0])
                                                        for tb, v in rollouts.items()}}
    if False in rollouts:
        steps_max = [max(c.length for g in r.groups for c in g.completions) for r in rollouts[False][0]]
        meds = [sorted(c.length for g in r.groups for c in g.completions) for r in rollouts[False][0]]
        res["tail"] = {"max_over_median_per_step_mean":
                       sum(mx / m[len(m) // 2] for mx, m in zip(steps_max, meds)) / len(meds),
                       "median_tokens": sum(m[len(m) // 2] for m in meds) / len(meds)}
    if base and "tail_batching" in out and out["tail_batching"]["max_response_len_mean"]:
        res["max_response_len_reduction"] = base["max_response_len_mean"] / out["tail_batching"]["max_response_len_mean"]
    return res


def simulate_rollpacker(cfg: RollPackerConfig, seed: int = 0, methods: Sequence[str] = tuple(RP_METHODS)) -> dict:
    """Every method of ``methods`` over one epoch, same trace, same GPUs (``rollpacker_rollouts`` then
    ``rollpacker_timelines``; returns the latter's dict). Raises ValueError: an unknown method."""
    _check_rp_methods(methods)
    flags = tuple(sorted({RP_METHODS[m][0] for m in methods}))
    return rollpacker_timelines(cfg, rollpacker_rollouts(cfg, seed, flags), seed, methods)
