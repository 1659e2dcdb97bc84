"""A discrete-event simulator of synchronous and asynchronous RL post-training on a virtual clock:
RollPacker's tail batching (arXiv 2509.21009) and RollArc's trajectory-level asynchrony (arXiv
2512.22560) against their baselines, every method on the same GPU count. See docs/rollpacker.md
and docs/rollarc.md, section "Simulator".

Mechanics (no sleeping, no threads; a run is deterministic given its seed and takes seconds):

* ``EventLoop``: a heapq of (time, sequence number, callback); ties run in scheduling order.
* ``Instance``: one inference engine (``tp`` GPUs) with continuous batching, vLLM-style: up to
  ``max_seqs`` running sequences, FCFS admission while the KV cache has room, chunked prefill
  (admitted prompts are prefilled in the same pass as one decode step of the running sequences),
  recompute preemption of the newest sequence when the KV cache is full. Iteration times come
  from ``sim.roofline.Roofline`` (decode bandwidth-bound at small batch: weights + the batch's KV
  read every step; prefill compute-bound). Between events (a finish, an admission, a preemption,
  an abort, a weight-sync stall) the batch is fixed, so a run of decode steps is costed in closed
  form (``DecodeRun``): the cost is O(events), not O(tokens).
* RollPacker (``simulate_rollpacker``): the production round planner and acceptance rule
  (``ops.rl.rollpacker.scheduler``: ``RoundPlanner``, ``run_round``) drive ``DESEngine``; on top,
  per step, rewards on a pool of CPU workers (adaptive timeout with the reward scheduler),
  training from the roofline (6·N·tokens FLOPs + the log-prob pass), the stream trainer on GPUs
  of drained instances, and a weight sync. Methods: ``baseline`` (veRL-style synchronous),
  ``tail_batching``, ``tail_batching+reward``, ``rollpacker`` (+ stream trainer).
* RollArc (``simulate_rollarc``): the scheduling rules of ``ops.rl.rollarc.core`` re-expressed as
  events: ``monolithic`` (lock-step turns, waits for the slowest env step, rewards after the batch),
  ``traj_async_r0`` (trajectory-level asynchrony, async_ratio 0, colocated: rollout and training
  time-share every GPU), ``rollarc_r1`` / ``rollarc_r2`` (async_ratio 1 / 2, redundant rollouts, a
  trainer pool disaggregated from the rollout pool). Every method owns the same GPUs
  (``Allocation``); the disaggregated split is chosen by a pilot on a separate seed.

Resource accounting: every method reports ``gpu_seconds_budget`` = GPUs x makespan and the busy
GPU-seconds of each pool (never above the budget); the equal-resources check is that every method of
a comparison has the same GPU count.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Optional, Sequence

from ops.rl.rollpacker.scheduler import RoundPlanner, TailBatching, run_round
from ops.rl.types import Completion, Prompt, RolloutBatch

from .roofline import Calibration, Roofline, get_model, get_profile
from .traces import AgenticTurns, LogNormalLengths, keyed_normal, keyed_uniform, success_probability


# ------------------------------------------------------------------------------------ event loop

class EventLoop:
    """A virtual clock. ``at(t, fn, *args)`` schedules ``fn(t, *args)``; ``run()`` pops events in
    (time, scheduling order) until none is left or ``stop()`` was called."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._stopped = False
        self.events = 0

    def at(self, t: float, fn: Callable, *args) -> None:
        if t < self.now - 1e-9:
            raise RuntimeError(f"event scheduled in the past: {t} < {self.now}")
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def stop(self) -> None:
        self._stopped = True

    def run(self) -> float:
        while self._heap and not self._stopped:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            self.events += 1
            fn(t, *args)
        return self.now


# ------------------------------------------------------------------------------------ engine

class Request:
    """One generation request: ``new`` tokens to prefill after ``cached`` tokens of cached prefix,
    then ``decode`` tokens to generate. ``on_done(t, req)`` is called when the last token is out.
    ``prefix``: a key for the instance's prefix cache (samples of one prompt share it)."""

    __slots__ = ("rid", "new", "cached", "decode", "on_done", "meta", "prefix", "admitted_at", "version",
                 "finished_at", "generated")

    def __init__(self, rid, new: int, cached: int, decode: int, on_done: Optional[Callable] = None, meta=None,
                 prefix=None):
        if decode < 1 or new < 0 or cached < 0 or new + cached < 1:
            raise ValueError(f"request {rid}: need decode >= 1 and a non-empty prompt, got new={new} "
                             f"cached={cached} decode={decode}")
        self.rid, self.new, self.cached, self.decode = rid, new, cached, decode
        self.on_done, self.meta, self.prefix = on_done, meta, prefix
        self.admitted_at = None
        self.version = None
        self.finished_at = None
        self.generated = 0


class Instance:
    """One continuous-batching inference engine of ``gpus`` GPUs (module docstring).

    Args:
        loop: the EventLoop. cost: its Roofline. max_seqs: running-sequence limit (vLLM default 256).
        kv_capacity: KV-cache tokens (default: ``cost.kv_capacity_tokens()``).
        token_budget: prefill tokens admitted per iteration (vLLM's max_num_batched_tokens; a single
            longer prompt is still admitted alone).
        max_run_steps: longest decode run between re-costings (the calibration factor is evaluated
            at the start of a run).
    Attributes: busy_s (seconds with work), seq_s (integral of running sequences over time),
        preemptions, drained_at (when it last became idle), version (weights it serves).
    """

    def __init__(self, loop: EventLoop, cost: Roofline, index: int = 0, max_seqs: int = 256,
                 kv_capacity: Optional[int] = None, token_budget: int = 16384, max_run_steps: int = 4096,
                 prefix_cache: bool = True):
        self.loop, self.cost, self.index = loop, cost, index
        self.gpus = cost.tp
        self.max_seqs, self.token_budget, self.max_run_steps = max_seqs, token_budget, max_run_steps
        self.kv_capacity = cost.kv_capacity_tokens() if kv_capacity is None else kv_capacity
        self.prefix_cache = prefix_cache
        self.watermark = int(0.01 * self.kv_capacity)      # vLLM keeps 1% of the KV blocks free at admission
        self.waiting: deque = deque()
        self.running: dict = {}            # rid -> [req, end_step, base, admit_no]
        self._fin: list = []               # heap (end_step, admit_no, rid)
        self._admit_no = itertools.count()
        self.k = 0                         # decode steps done (exact at t0)
        self.s_base = 0                    # sum(base): context sum at step k is s_base + a k
        self.t0 = 0.0
        self.state = "idle"                # idle | run | iter | stall
        self.gen = 0
        self.target = 0
        self.run_cost = None
        self.iter_admit: list = []
        self.pending_abort: set = set()
        self.stall_for: Optional[float] = None
        self.stall_done: Optional[Callable] = None
        self._in_boundary = False
        self.prefixes: set = set()
        self.version = 0
        self.busy_s = 0.0
        self.seq_s = 0.0
        self.preemptions = 0
        self.drained_at = 0.0
        self.outstanding = 0

    # -- helpers
    def _ctx_sum(self) -> int:
        return self.s_base + len(self.running) * self.k

    def _schedule(self, t_end: float) -> None:
        self.gen += 1
        self.loop.at(t_end, self._boundary, self.gen)

    # -- public
    def submit(self, t: float, req: Request) -> None:
        """Queue ``req`` at time ``t``; an engine in a decode run admits it at its next step boundary."""
        self.waiting.append(req)
        self.outstanding += 1
        if self._in_boundary:
            return
        if self.state == "idle":
            self.state, self.t0, self.target, self.run_cost = "run", t, self.k, None
            self._schedule(t)
        elif self.state == "run" and len(self.running) < self.max_seqs:
            self._cut(t)

    def abort(self, t: float, rid) -> bool:
        """Cancel request ``rid`` (queued or running). Returns whether it was here."""
        for i, r in enumerate(self.waiting):
            if r.rid == rid:
                del self.waiting[i]
                self.outstanding -= 1
                return True
        if rid in self.running or any(r.rid == rid for r in self.iter_admit):
            self.pending_abort.add(rid)
            if not self._in_boundary and self.state == "run":
                self._cut(t)
            return True
        return False

    def stall(self, t: float, seconds: float, done: Optional[Callable] = None) -> None:
        """Stop generating for ``seconds`` from the next step boundary (a weight swap); ``done(t)``
        is called when it resumes."""
        self.stall_for, self.stall_done = seconds, done
        if self.state == "idle":
            self.state, self.t0, self.target, self.run_cost = "run", t, self.k, None
            self._schedule(t)
        elif self.state == "run" and not self._in_boundary:
            self._cut(t)

    def generated_by(self, t: float, rid) -> int:
        """Tokens request ``rid`` has generated by time ``t`` (for aborted responses)."""
        ent = self.running.get(rid)
        if ent is None:
            return 0
        req, end, base, _ = ent
        k = self.k
        if self.state == "run" and self.run_cost is not None:
            k += self.run_cost.done_by(t - self.t0, self.target - self.k)
        return max(0, req.decode - (end - k))

    # -- internals
    def _cut(self, t: float) -> None:
        """End the current decode run at the first step boundary at or after ``t``."""
        if self.run_cost is None:
            return
        n = self.run_cost.steps_by(t - self.t0, self.target - self.k)
        if self.k + n < self.target:
            self.target = self.k + n
            self._schedule(self.t0 + self.run_cost.cum_s(n))

    def _boundary(self, t: float, gen: int) -> None:
        if gen != self.gen:
            return
        elapsed = t - self.t0
        a = len(self.running)
        if self.state in ("run", "iter"):
            if elapsed > 0:
                self.busy_s += elapsed
                self.seq_s += elapsed * (a + (len(self.iter_admit) if self.state == "iter" else 0))
            if self.state == "run":
                self.k = self.target
            else:
                self.k += 1
                for req in self.iter_admit:
                    self._join(req)
                self.iter_admit = []
        elif self.state == "stall":
            self.stall_for = None
            cb, self.stall_done = self.stall_done, None
            if cb is not None:
                self._in_boundary = True
                cb(t)
                self._in_boundary = False
        self._in_boundary = True
        if self.pending_abort:
            for rid in list(self.pending_abort):
                ent = self.running.pop(rid, None)
                if ent is not None:
                    self.s_base -= ent[2]
                    self.outstanding -= 1
            self.pending_abort.clear()
        done = []
        while self._fin and self._fin[0][0] <= self.k:
            _, no, rid = heapq.heappop(self._fin)
            ent = self.running.get(rid)
            if ent is None or ent[3] != no:
                continue                                              # aborted or preempted
            del self.running[rid]
            self.s_base -= ent[2]
            self.outstanding -= 1
            ent[0].finished_at = t
            ent[0].generated = ent[0].decode
            done.append(ent[0])
        for req in done:
            if req.on_done is not None:
                req.on_done(t, req)
        self._in_boundary = False
        if self.stall_for is not None and self.state != "stall":
            self.state, self.t0, self.run_cost = "stall", t, None
            self._schedule(t + self.stall_for)
            return
        self._plan(t)

    def _join(self, req: Request) -> None:
        """A prefilled request joins the running batch at step ``k`` with its first token out."""
        if req.rid in self.pending_abort:
            self.pending_abort.discard(req.rid)
            self.outstanding -= 1
            return
        ctx = req.cached + req.new + 1
        left = req.decode - 1
        no = next(self._admit_no)
        end = self.k + left
        base = ctx - self.k
        self.running[req.rid] = [req, end, base, no]
        self.s_base += base
        heapq.heappush(self._fin, (end, no, req.rid))

    def _admit(self) -> list:
        out, budget = [], self.token_budget
        ctx = self._ctx_sum() + len(self.running)
        while self.waiting and len(self.running) + len(out) < self.max_seqs:
            req = self.waiting[0]
            new, cached = req.new, req.cached
            if self.prefix_cache and req.prefix is not None and req.prefix in self.prefixes and req.cached == 0:
                new, cached = 1, req.new - 1                          # a sibling sample: prompt already cached
            need = cached + new + 1
            if ctx + need + self.watermark > self.kv_capacity:
                if not self.running and not out:
                    raise ValueError(f"request {req.rid} needs {need} KV tokens, more than the instance's "
                                     f"capacity ({self.kv_capacity})")
                break
            if out and new > budget:
                break
            self.waiting.popleft()
            req.new, req.cached = new, cached
            if req.prefix is not None:
                self.prefixes.add(req.prefix)
            req.admitted_at = self.loop.now
            req.version = self.version
            out.append(req)
            budget -= new
            ctx += need
        return out

    def _preempt(self) -> None:
        """Recompute preemption of the newest running sequence: its context goes back to the queue's
        front, to be prefilled again; the tokens it generated are kept."""
        rid = max(self.running, key=lambda r: self.running[r][3])
        req, end, base, _ = self.running.pop(rid)
        self.s_base -= base
        ctx = base + self.k
        req.cached, req.new = 0, ctx
        req.decode = end - self.k + 1           # the re-prefill emits the next token again
        self.waiting.appendleft(req)
        self.preemptions += 1

    def _plan(self, t: float) -> None:
        self.t0 = t
        admit = self._admit() if self.waiting else []
        if admit:
            a = len(self.running)
            dt = self.cost.iteration_s(a, self._ctx_sum(), [(r.new, r.cached) for r in admit])
            self.state, self.iter_admit, self.run_cost = "iter", admit, None
            self._schedule(t + dt)
            return
        while self.running:
            a = len(self.running)
            s = self._ctx_sum()
            n_cap = (self.kv_capacity - s) // a
            if n_cap >= 1:
                break
            self._preempt()
        if not self.running:
            if self.waiting:                       # everything was preempted: admit again
                self._plan(t)
                return
            self.state, self.run_cost = "idle", None
            self.drained_at = t
            return
        n_fin = self._fin[0][0] - self.k
        while n_fin <= 0:                          # stale heap entries of aborted / preempted sequences
            heapq.heappop(self._fin)
            n_fin = self._fin[0][0] - self.k
        n = min(n_fin, n_cap, self.max_run_steps)
        self.run_cost = self.cost.decode_run(a, s)
        self.state, self.target = "run", self.k + n
        self._schedule(t + self.run_cost.cum_s(n))


def make_instances(loop: EventLoop, cost: Roofline, n: int, **kw) -> list[Instance]:
    """``n`` engine instances (ids 0..n-1) on ``loop`` with step costs from ``cost``; ``kw`` goes to
    ``Instance`` (e.g. the KV-cache budget)."""
    return [Instance(loop, cost, i, **kw) for i in range(n)]


# ------------------------------------------------------------------------------------ allocation

@dataclass(frozen=True)
class Allocation:
    """The GPUs a method owns: colocated GPUs, or a rollout and a trainer pool (never both).

    Raises: ValueError: a negative count, both or neither kind, or a disaggregated pool without GPUs.
    """

    colocated: int = 0
    """GPUs time-shared between rollout and training (0 for a disaggregated method)."""
    rollout: int = 0
    """GPUs of the separate rollout pool (>= 1 when disaggregated; 0 when colocated)."""
    trainer: int = 0
    """GPUs of the separate trainer pool (>= 1 when disaggregated; 0 when colocated)."""

    def __post_init__(self):
        if min(self.colocated, self.rollout, self.trainer) < 0:
            raise ValueError(f"Allocation: GPU counts must be >= 0, got {self}")
        if bool(self.colocated) == bool(self.rollout or self.trainer):
            raise ValueError(f"Allocation: either colocated or rollout + trainer GPUs, got {self}")
        if not self.colocated and (self.rollout < 1 or self.trainer < 1):
            raise ValueError(f"Allocation: a disaggregated method needs rollout and trainer GPUs, got {self}")

    @property
    def gpus(self) -> int:
        return self.colocated + self.rollout + self.trainer

    def to_dict(self) -> dict:
        return {**asdict(self), "gpus": self.gpus}


def _accounting(alloc: Allocation, makespan: float, rollout_busy: float, train_busy: float) -> dict:
    budget = alloc.gpus * makespan
    return {"allocation": alloc.to_dict(), "gpu_seconds_budget": budget,
            "gpu_seconds_rollout_busy": rollout_busy, "gpu_seconds_train_busy": train_busy,
            "gpu_utilisation": (rollout_busy + train_busy) / budget if budget else 0.0}


# ------------------------------------------------------------------------------------ RollPacker

class DESEngine:
    """The ``Engine`` interface (``ops.rl.engine``) on simulated instances, so the unchanged
    tail-batching scheduler (``ops.rl.rollpacker.scheduler.run_round``) drives it.

    Each ``generate`` call is a fresh rollout on ``instances`` engines: the requests, prompt-major,
    are split into contiguous chunks, one per instance (veRL's data-parallel dispatch: the samples
    of a prompt share an engine and its prefix cache). ``on_finish`` is called in finish order;
    its first True ends the call (the rest come back ``abort``).

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
        state = {"stopped": None}

        def done(t, req):
            if state["stopped"] is not None:
                return
            uid, i, capped, L = req.meta
            c = Completion(uid, i, [], [], "length" if capped else "stop", self.version, t_finish_s=t,
                           num_tokens=min(L, max_new_tokens))
            out[req.rid] = c
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
            loop.at(timeout_s, lambda t: (state.__setitem__("stopped", t), loop.stop()))
        loop.run()
        self.events += loop.events
        self.preemptions += sum(i.preemptions for i in insts)
        t_end = state["stopped"] if state["stopped"] is not None else loop.now
        reason = "abort" if state["stopped"] is not None and len(out) < total else "timeout"
        where = {}
        for inst in insts:
            for rid in inst.running:
                where[rid] = inst
        for rid, r in enumerate(reqs):
            if rid not in out:
                inst = where.get(rid)
                ntok = inst.generated_by(t_end, rid) if inst is not None else 0
                uid, i, _, _ = meta[rid]
                out[rid] = Completion(uid, i, [], [], reason, self.version, t_finish_s=t_end, num_tokens=ntok)
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
class ServedModel:
    """The model a simulated comparison serves and trains, and the GPUs it runs on: the base of
    ``RollPackerConfig`` and ``RollArcConfig``, whose cost model is ``roofline()``.
    """

    model: str = "qwen2.5-7b"
    """The served / trained model, a ``sim.roofline.MODELS`` name."""
    hardware: str = "h800"
    """The GPU profile, a ``sim.roofline.PROFILES`` name."""
    tp: int = 1
    """GPUs per engine (tensor-parallel degree, >= 1)."""
    gpus: int = 1
    """GPUs of every method (each subclass sets its default and its lower bound)."""
    calibration: Optional[Calibration] = field(default=None, kw_only=True)
    """Keyword only: measured step times (``sim.roofline.Calibration``) or None."""
    hw_overrides: Optional[dict] = field(default=None, kw_only=True)
    """Keyword only: HardwareProfile fields to change (sensitivity runs), e.g. {"train_mfu": 0.2}."""

    def roofline(self) -> Roofline:
        """The cost model: ``hardware``'s profile with ``hw_overrides``, ``model``, ``tp``, ``calibration``.
        Raises ValueError naming the known profiles / models."""
        hw = get_profile(self.hardware)
        if self.hw_overrides:
            hw = replace(hw, **self.hw_overrides)
        return Roofline(hw, get_model(self.model), self.tp, self.calibration)

    def describe(self) -> dict:
        """The fields (``calibration`` left out) and the roofline's description (``roofline``)."""
        d = {k: v for k, v in asdict(self).items() if k != "calibration"}
        d["roofline"] = self.roofline().describe()
        return d


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


# ------------------------------------------------------------------------------------ RollArc

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
#: ``rollarc_r<k>`` (k >= 1) is RollArc at async_ratio k.
RA_METHODS = {
    "monolithic": ("lockstep", 0, False, True),
    "traj_async_r0": ("async", 0, False, True),
    "rollarc_r1": ("async", 1, True, False),
    "rollarc_r2": ("async", 2, True, False),
}


def ra_method(name: str) -> tuple:
    """(kind, async_ratio, uses redundancy, colocated) of a RollArc-side method name.
    Raises ValueError: unknown name."""
    if name in RA_METHODS:
        return RA_METHODS[name]
    if name.startswith("rollarc_r") and name[9:].isdigit() and int(name[9:]) >= 1:
        return ("async", int(name[9:]), True, False)
    raise ValueError(f"unknown RollArc method {name!r}; known: {list(RA_METHODS)} or rollarc_r<k>")


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
    name = "traj_async_r0" if colocated else f"rollarc_r{async_ratio}"
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


def choose_trainer_gpus(cfg: RollArcConfig, method: str = "rollarc_r1", pilot_seed: int = PILOT_SEED,
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
    "speedup_vs_monolithic", "speedup_vs_traj_async_r0", "trainer_gpus"}."""
    tg = trainer_gpus if trainer_gpus is not None else cfg.trainer_gpus
    if tg is None and any(not ra_method(m)[3] for m in methods):
        tg = choose_trainer_gpus(cfg)["trainer_gpus"]
    ep: dict = {}
    out = {m: run_rollarc_method(cfg, m, seed, tg, ep) for m in methods}
    res = {"methods": out, "trainer_gpus": tg}
    for ref in ("monolithic", "traj_async_r0"):
        if ref in out:
            res[f"speedup_vs_{ref}"] = {m: out[ref]["total_s"] / v["total_s"] for m, v in out.items()}
    return res
