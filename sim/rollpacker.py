"""A trace-driven simulated rollout engine, so the unchanged tail-batching scheduler can run at
paper scale (RollPacker, arXiv 2509.21009 §6) on a CPU.

The engine models ``instances`` inference servers (one per GPU, or per tensor-parallel group), each
continuously batching up to ``max_seqs`` sequences (vLLM-style): a decode step advances every
running sequence by one token and takes ``step_s(a) = step_base_s + step_per_seq_s * a`` seconds for
``a`` running sequences (decode is memory-bound: weights are read once per step, KV per sequence).
Requests are spread round-robin over the instances; a finished sequence's slot takes the next
queued request of its instance. The simulation jumps from one finish to the next, so its cost is
O(responses x running sequences), independent of the lengths.

Lengths come from a trace: ``LogNormalTrace`` draws a per-prompt difficulty (log-normal) and a
per-response spread, so a hard prompt tends to produce long responses every time it is rolled out —
the effect tail batching exploits. ``ScriptedTrace`` replays fixed lengths (tests). [open] The
paper gives no length model; the defaults give max/median of about 25-30 over a 1,024-response step.
Simplifications: prefill and the growth of attention cost with context length are not modelled.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

from ops.rl.types import Completion, OnFinish, Prompt, RolloutBatch

from .traces import LogNormalLaw


class ScriptedTrace:
    """Fixed lengths: ``lengths[uid][i]`` is the length of sample i of that prompt, every time it is
    rolled out (samples beyond the list repeat its last value; ``default`` for unknown uids)."""

    def __init__(self, lengths: dict[str, Sequence[int]], default: int = 1):
        self.lengths = {k: list(v) for k, v in lengths.items()}
        self.default = default

    def sample(self, uid: str, n: int) -> list[int]:
        got = self.lengths.get(uid) or [self.default]
        return [got[min(i, len(got) - 1)] for i in range(n)]


@dataclass(frozen=True)
class LogNormalTrace(LogNormalLaw):
    """Heavy-tailed response lengths (``sim.traces.LogNormalLaw``: log L = log(median) + z_prompt *
    sigma_prompt + z * sigma_response, clipped to [min_len, max_len]).

    z_prompt is fixed per prompt uid (hashed with ``seed``); z is fresh for every response and every
    rollout (one sequential stream seeded with ``seed``). With the defaults (sigma 0.75 / 0.75,
    total ~1.06) the longest of 1,024 responses is ~25-30x the median.
    """

    seed: int = 0
    """Seed of the prompt difficulty hash (z_prompt) and of the sequential response stream (z)."""

    def __post_init__(self):
        object.__setattr__(self, "_rng", random.Random(self.seed))      # the draw stream (state, not a field)

    def prompt_z(self, uid: str) -> float:
        h = hashlib.sha256(f"{self.seed}:{uid}".encode()).digest()
        u1 = (int.from_bytes(h[:8], "big") + 1) / 2**64
        u2 = int.from_bytes(h[8:16], "big") / 2**64
        return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)

    def sample(self, uid: str, n: int) -> list[int]:
        return self.draw_lengths(self.prompt_z(uid), self._rng, n)


class SimEngine:
    """The Engine interface (``ops.rl.engine.Engine``) over simulated time.

    Args:
        trace: ScriptedTrace | LogNormalTrace (anything with ``sample(uid, n) -> lengths``).
        instances: inference servers (>= 1).
        max_seqs: running sequences per instance (continuous-batching slots, >= 1).
        step_base_s, step_per_seq_s: the decode-step time model (seconds).
    Attributes:
        version: the policy version stamped on responses (the trainer bumps it).
        clock_s: simulated seconds spent generating so far.
    Raises:
        ValueError: a parameter out of range (named).
    """

    def __init__(self, trace, instances: int = 1, max_seqs: int = 1 << 30, step_base_s: float = 0.012,
                 step_per_seq_s: float = 0.00025):
        if instances < 1:
            raise ValueError(f"sim.instances must be >= 1, got {instances}")
        if max_seqs < 1:
            raise ValueError(f"sim.max_seqs must be >= 1, got {max_seqs}")
        if step_base_s <= 0 or step_per_seq_s < 0:
            raise ValueError(f"sim.step_base_s must be > 0 and sim.step_per_seq_s >= 0, got {step_base_s}, {step_per_seq_s}")
        self.trace, self.instances, self.max_seqs = trace, instances, max_seqs
        self.step_base_s, self.step_per_seq_s = step_base_s, step_per_seq_s
        self.version: Optional[int] = 0
        self.clock_s = 0.0
        self.calls = 0

    def step_s(self, running: int) -> float:
        """Seconds of one decode step with ``running`` sequences."""
        return self.step_base_s + self.step_per_seq_s * running

    def _simulate(self, reqs: list[tuple[int, int]], horizon: float):
        """One instance up to ``horizon`` seconds: reqs = [(request id, length)] in queue order.
        Returns (finish events [(t, request id, tokens)], busy slot-seconds, slots filled at the
        start, the time it ran to, {request id: tokens generated} for the unfinished)."""
        queue = list(reversed(reqs))
        total = dict(reqs)
        running: dict[int, int] = {}                       # request id -> tokens still to generate
        t, busy, events = 0.0, 0.0, []
        while queue and len(running) < self.max_seqs:
            rid, n = queue.pop()
            running[rid] = n
        slots0 = len(running)
        while running:
            a = len(running)
            dt = self.step_s(a)
            k = min(running.values())                       # decode steps to the next finish
            if t + k * dt > horizon:
                k = int((horizon - t) // dt)
                if k <= 0:
                    break
            t += k * dt
            busy += a * k * dt
            for rid in list(running):
                running[rid] -= k
                if running[rid] == 0:
                    del running[rid]
                    events.append((t, rid, total[rid]))
            while queue and len(running) < self.max_seqs:
                rid, n = queue.pop()
                running[rid] = n
        partial = {rid: total[rid] - left for rid, left in running.items()} | {rid: 0 for rid, _ in queue}
        return events, busy, slots0, t, partial

    def _run(self, per_inst, horizon: float):
        events, busy, slots, drain, partial = [], 0.0, 0, [], {}
        for q in per_inst:
            ev, b, s0, t_end, part = self._simulate(q, horizon)
            events += ev
            busy += b
            slots += s0
            drain.append(t_end)
            partial.update(part)
        events.sort()
        return events, busy, slots, drain, partial

    def generate(self, prompts: Sequence[Prompt], n: int, max_new_tokens: int, stop: Optional[list] = None,
                 timeout_s: float = float("inf"), on_finish: Optional[OnFinish] = None) -> RolloutBatch:
        """Simulate ``prompts`` x ``n`` responses (lengths from the trace, capped at max_new_tokens;
        a capped response ends with ``length``); call ``on_finish`` in finish-time order; stop at the
        first True (the rest: ``abort``) or at ``timeout_s`` simulated seconds (``timeout``).

        Raises:
            ValueError: n < 1 or max_new_tokens < 1.
        """
        if n < 1 or max_new_tokens < 1:
            raise ValueError(f"generate needs n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}")
        self.calls += 1
        meta = []
        for p in prompts:
            for i, L in enumerate(self.trace.sample(p.uid, n)):
                meta.append((p.uid, i, min(L, max_new_tokens), L > max_new_tokens))
        per_inst: list[list[tuple[int, int]]] = [[] for _ in range(self.instances)]
        for rid, (_, _, L, _) in enumerate(meta):
            per_inst[rid % self.instances].append((rid, L))
        events, busy, slots, drain, partial = self._run(per_inst, timeout_s)
        out: dict[int, Completion] = {}
        stopped_at = None
        for t, rid, ntok in events:
            uid, i, _, capped = meta[rid]
            out[rid] = c = Completion(uid, i, [], [], "length" if capped else "stop", self.version, t_finish_s=t,
                                      num_tokens=ntok)
            if on_finish is not None and on_finish(c):
                stopped_at = t
                break
        if stopped_at is not None:
            t_end = stopped_at
            _, busy, slots, drain, partial = self._run(per_inst, t_end)
            reason = "abort"
        else:
            t_end = max(drain, default=0.0) if len(out) == len(meta) else timeout_s
            reason = "timeout"
        for rid, (uid, i, L, _) in enumerate(meta):
            if rid not in out:
                out[rid] = c = Completion(uid, i, [], [], reason, self.version, t_finish_s=t_end,
                                          num_tokens=partial.get(rid, L))
                if reason == "timeout" and on_finish is not None:
                    on_finish(c)
        cap = slots * t_end
        self.clock_s += t_end
        timings = {"wall_s": t_end, "slot_steps_busy": busy, "slot_steps_total": cap,
                   "bubble_ratio": max(0.0, 1.0 - busy / cap) if cap > 0 else 0.0,
                   "instance_drain_s": [min(d, t_end) for d in drain]}
        return RolloutBatch([out[rid] for rid in range(len(meta))], timings)
