"""Tail batching (RollPacker, arXiv 2509.21009 §4.1) and the synchronous baseline, engine-agnostic.

A training step needs P0 prompts x R0 responses, all from the current policy. The synchronous
baseline (veRL) generates exactly that and waits for the longest response. Tail batching instead
runs two kinds of rounds:

* short round (the default): launch ceil(eta*P0) prompts x ceil(eta*R0) responses; accept, per
  prompt, the first R0 responses to finish, and the first P0 prompts to collect R0; then abort
  everything still generating. The prompts not accepted go, whole, to a FIFO long-prompt queue.
* long round: as soon as the queue holds P0 prompts, run its first P0 with R0 responses each and no
  speculation, to full length.

No prompt is ever dropped: at the end of an epoch the fresh prompts left over (fewer than P0) join
the queue, and since every step trains exactly P0 prompts and the epoch is a multiple of P0, the
queue then holds exactly P0. Over an epoch every prompt is trained exactly once, as in the
baseline; only the order changes. Every response is generated in the round that trains it, so every
step is on-policy. With a steady length distribution a short round queues (eta-1)*P0 prompts, so a
long round follows every 1/(eta-1) short rounds (4 for eta = 1.25).

The engine is anything with ``generate(prompts, n, max_new_tokens, stop, timeout_s, on_finish)``
(``ops.rl.engine``): the transformers engine, vLLM, the Ray engine pool or the simulated engine of
``sim.des`` (``DESEngine``; benchmarks and tests only).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ops.rl.types import Completion, Prompt, RolloutBatch


class SchedulerConfigError(ValueError):
    """A tail-batching parameter is out of range (the message names the field)."""


@dataclass(frozen=True)
class TailBatching:
    """Parameters of tail batching (paper §4.1; defaults from the paper where it gives one). Raises
    SchedulerConfigError (a ValueError naming ``tail_batching.<field>``) when one is out of range."""

    prompts_per_step: int
    """P0: prompts trained per step (>= 1)."""
    responses_per_prompt: int
    """R0: responses per prompt = the GRPO group size (>= 1)."""
    eta: float = 1.25
    """Over-provisioning factor of short rounds, in [1, 4] (the paper uses 1.25): a short round launches
    ceil(eta*P0) prompts x ceil(eta*R0) responses. eta = 1 turns speculation off (short rounds then equal
    the baseline)."""
    enabled: bool = True
    """False runs the synchronous veRL-style baseline (P0 x R0, wait for all)."""

    def __post_init__(self):
        if self.prompts_per_step < 1:
            raise SchedulerConfigError(f"tail_batching.prompts_per_step (P0) must be >= 1, got {self.prompts_per_step}")
        if self.responses_per_prompt < 1:
            raise SchedulerConfigError(f"tail_batching.responses_per_prompt (R0) must be >= 1, got {self.responses_per_prompt}")
        if not (1.0 <= self.eta <= 4.0):
            raise SchedulerConfigError(f"tail_batching.eta must be in [1, 4], got {self.eta}")

    @property
    def short_prompts(self) -> int:
        """Prompts launched in a short round: ceil(eta * P0)."""
        return math.ceil(self.eta * self.prompts_per_step - 1e-9)

    @property
    def short_responses(self) -> int:
        """Responses per prompt launched in a short round: ceil(eta * R0)."""
        return math.ceil(self.eta * self.responses_per_prompt - 1e-9)


@dataclass
class RoundPlan:
    """One round: ``prompts`` are launched with ``n`` responses each; ``accept_prompts`` (P0) groups
    of ``accept_responses`` (R0) are trained."""

    step: int
    """The training step this round feeds (0-based, counted over the epoch)."""
    kind: str
    """``short`` (over-provisioned, aborted early), ``long`` (queued prompts, to full length) or ``sync``."""
    prompts: list[Prompt]
    """The prompts launched."""
    n: int
    """Responses launched per prompt (ceil(eta*R0) in a short round, else R0)."""
    accept_prompts: int
    """P0: groups trained from the round (the first prompts to collect accept_responses)."""
    accept_responses: int
    """R0: responses accepted per prompt (the first to finish)."""


class RoundPlanner:
    """Decides what each step rolls out, keeping the long-prompt queue (paper §4.1).

    Args:
        prompts: the epoch's prompts in data-loader order; their count must be a multiple of P0
            (as in the baseline, which trains whole steps only).
        cfg: TailBatching.
    Raises:
        SchedulerConfigError: the epoch is empty or not a multiple of P0, or prompt uids repeat.
    """

    def __init__(self, prompts: Sequence[Prompt], cfg: TailBatching):
        p0 = cfg.prompts_per_step
        if not prompts or len(prompts) % p0:
            raise SchedulerConfigError(f"the epoch has {len(prompts)} prompts: it must be a non-zero multiple of "
                                       f"tail_batching.prompts_per_step ({p0})")
        if len({p.uid for p in prompts}) != len(prompts):
            raise SchedulerConfigError("prompt uids must be unique within an epoch")
        self.cfg = cfg
        self.fresh: deque[Prompt] = deque(prompts)
        self.long_queue: deque[Prompt] = deque()
        self.step = 0

    def done(self) -> bool:
        return not self.fresh and not self.long_queue

    def next_round(self) -> Optional[RoundPlan]:
        """The next round, or None when the epoch is finished."""
        c = self.cfg
        p0, r0 = c.prompts_per_step, c.responses_per_prompt
        if self.done():
            return None
        if not c.enabled:
            plan = RoundPlan(self.step, "sync", [self.fresh.popleft() for _ in range(p0)], r0, p0, r0)
        else:
            if len(self.long_queue) < p0 and len(self.fresh) < p0:
                self.long_queue.extend(self.fresh)          # the epoch's tail: fewer than P0 fresh prompts left
                self.fresh.clear()
            if len(self.long_queue) >= p0:
                plan = RoundPlan(self.step, "long", [self.long_queue.popleft() for _ in range(p0)], r0, p0, r0)
            else:
                k = min(c.short_prompts, len(self.fresh))
                plan = RoundPlan(self.step, "short", [self.fresh.popleft() for _ in range(k)], c.short_responses, p0, r0)
        self.step += 1
        return plan

    def requeue(self, prompts: Sequence[Prompt]) -> None:
        """Put the prompts a short round did not accept at the back of the long-prompt queue (FIFO)."""
        self.long_queue.extend(prompts)


@dataclass
class Group:
    """The R0 accepted responses of one prompt (a GRPO group), in finish order."""

    prompt: Prompt
    """The prompt of the group."""
    completions: list[Completion]
    """Its R0 accepted responses, in finish order."""


@dataclass
class RoundResult:
    """What a round produced: the accepted groups (P0 of R0, in acceptance order), the prompts it
    aborted (for the long-prompt queue), the engine batch and the round's metrics."""

    plan: RoundPlan
    """The round that was run."""
    groups: list[Group]
    """The accepted groups (P0 of R0 responses), in acceptance order."""
    aborted: list[Prompt]
    """The launched prompts not accepted (they go, whole, to the long-prompt queue)."""
    batch: RolloutBatch
    """The engine's batch: every response generated, aborted ones included, and its timings."""
    metrics: dict = field(default_factory=dict)
    """The round's figures (``round_metrics``: lengths in tokens, rollout s, bubble ratio, finish reasons)."""


class _Acceptor:
    """The on_finish callback of a round: first R0 responses of the first P0 prompts win."""

    def __init__(self, plan: RoundPlan, on_response: Optional[Callable[[Completion], None]],
                 on_group: Optional[Callable[[Group], None]]):
        self.plan = plan
        self.by_uid = {p.uid: p for p in plan.prompts}
        self.finished: dict[str, list[Completion]] = {p.uid: [] for p in plan.prompts}
        self.groups: list[Group] = []
        self.on_response, self.on_group = on_response, on_group

    def full(self) -> bool:
        return len(self.groups) >= self.plan.accept_prompts

    def __call__(self, c: Completion) -> bool:
        if c.finish_reason == "abort" or self.full() or c.prompt_uid not in self.finished:
            return self.full()                                # (a late response of an abandoned call: ignored)
        got = self.finished[c.prompt_uid]
        if len(got) >= self.plan.accept_responses:
            return False                                      # a surplus response of an accepted prompt
        got.append(c)
        if self.on_response is not None:
            self.on_response(c)
        if len(got) == self.plan.accept_responses:
            g = Group(self.by_uid[c.prompt_uid], list(got))
            self.groups.append(g)
            if self.on_group is not None:
                self.on_group(g)
        return self.full()


def run_round(engine, plan: RoundPlan, max_new_tokens: int, timeout_s: float, stop: Sequence[str] = (),
              on_response: Optional[Callable[[Completion], None]] = None,
              on_group: Optional[Callable[[Group], None]] = None) -> RoundResult:
    """Roll out one round and apply the acceptance rule.

    ``on_response`` is called with each response the round will train, as soon as it finishes (the
    reward scheduler scores it then); ``on_group`` with each accepted group (the stream trainer
    starts its gradients then). Both run on the engine's callback thread and must be quick.

    Responses that end by ``length`` or ``timeout`` count as finished (the step must end: case
    ``rollout-never-ends``); only ``abort`` responses are discarded.

    Raises:
        RuntimeError: the engine returned fewer than P0 complete groups (it lost responses).
    """
    acc = _Acceptor(plan, on_response, on_group)
    batch = engine.generate(plan.prompts, plan.n, max_new_tokens, stop=list(stop), timeout_s=timeout_s, on_finish=acc)
    if not acc.full():
        raise RuntimeError(f"round {plan.step} ({plan.kind}): only {len(acc.groups)} of {plan.accept_prompts} prompts "
                           f"collected {plan.accept_responses} responses; the engine returned "
                           f"{sum(c.finish_reason != 'abort' for c in batch.completions)} non-aborted responses")
    accepted = {g.prompt.uid for g in acc.groups}
    aborted = [p for p in plan.prompts if p.uid not in accepted]
    return RoundResult(plan, acc.groups, aborted, batch, round_metrics(plan, acc.groups, batch))


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def round_metrics(plan: RoundPlan, groups: list[Group], batch: RolloutBatch) -> dict:
    """Per-round figures: kind, rollout seconds, max / p99 / median trained response length
    (tokens), max generated length (aborted included), bubble ratio, responses by finish reason,
    and the policy versions of the trained responses."""
    trained = [c for g in groups for c in g.completions]
    lens = [c.length for c in trained]
    reasons = {r: 0 for r in ("stop", "length", "timeout", "abort")}
    for c in batch.completions:
        reasons[c.finish_reason] += 1
    return {
        "step": plan.step, "round": plan.kind, "launched_prompts": len(plan.prompts),
        "launched_responses": len(plan.prompts) * plan.n, "trained_responses": len(trained),
        "rollout_s": float(batch.timings.get("wall_s", 0.0)),
        "max_response_len": max(lens, default=0), "p99_response_len": _percentile(lens, 0.99),
        "median_response_len": _percentile(lens, 0.5),
        "max_generated_len": max((c.length for c in batch.completions), default=0),
        "bubble_ratio": float(batch.timings.get("bubble_ratio", 0.0)),
        **{f"finish_{r}": n for r, n in reasons.items()},
        "trained_timeout": sum(c.finish_reason == "timeout" for c in trained),
        "trained_length": sum(c.finish_reason == "length" for c in trained),
        "policy_versions": sorted({c.policy_version for c in trained}, key=lambda v: -1 if v is None else v),
    }


def run_epoch(engine, planner: RoundPlanner, max_new_tokens: int, timeout_s: float,
              before_round: Optional[Callable[[RoundPlan], None]] = None,
              after_round: Optional[Callable[[RoundResult], None]] = None, max_steps: Optional[int] = None,
              **round_kw) -> list[RoundResult]:
    """Run rounds until the planner's epoch is done (or ``max_steps``): aborted prompts go back to
    the long-prompt queue after every short round. ``after_round`` trains (and bumps the policy
    version); without it this is a rollout-only epoch (the scheduler tests and the simulator)."""
    out = []
    while (max_steps is None or len(out) < max_steps) and (plan := planner.next_round()) is not None:
        if before_round is not None:
            before_round(plan)
        res = run_round(engine, plan, max_new_tokens, timeout_s, **round_kw)
        planner.requeue(res.aborted)
        if after_round is not None:
            after_round(res)
        out.append(res)
    return out
