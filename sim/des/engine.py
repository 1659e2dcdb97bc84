"""The discrete-event engine shared by both simulated systems (``sim.des``): the virtual clock
(``EventLoop``: a heapq of (time, sequence number, callback)), one inference engine with
continuous batching, KV-cache admission, chunked prefill and recompute preemption costed in closed
form between events (``Request``, ``Instance``, ``make_instances``), the GPUs a method owns
(``Allocation``) and its accounting, and ``ServedModel`` (model, GPUs and roofline, the base of both
systems' configs). The package docstring describes the mechanics.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Optional

from sim.roofline import Calibration, Roofline, get_model, get_profile


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


# ------------------------------------------------------------------------------------ served model

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
