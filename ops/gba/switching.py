"""Switching a running job between training modes (GBA, arXiv 2205.11048 §1, §3: a job moves from
synchronous training to GBA when the cluster is strained and back when it recovers, keeping the
synchronous hyper-parameters). Pure Python, no tensors: the switch policy (``Switching``), the
straggler detector on per-worker step times (``StragglerDetector``) and the switch schedule of
experiments (``due``). The parameter server (``ops.gba.server``) applies the switches.

Step time of a worker: the wall seconds its local batch's forward/backward passes took, measured
by the worker and sent with the gradient (``Gradient.compute_s``; waits at the start barrier, the
SSP bound or a lock-step step and the transfers are not in it, so a straggler looks as slow in every
phase; the PS's own latency does not count against a worker).

Detector rule (docs/gba.md, "Switching"), evaluated when a window closes, every ``window``
global steps of applied samples:

- each live worker's statistic x_w = the median of its last ``history`` step times; for a worker
  that finished no batch in the window, the larger of that and the elapsed time (at the PS) of the
  batch it holds: this catches a worker so slow it finished nothing and keeps it from looking
  recovered meanwhile;
- its ratio r_w = x_w / median(x_v for the other live workers v != w); r = max_w r_w;
- phase ``normal`` (sync): a window with r > ``k_on`` counts; ``patience`` consecutive such windows
  switch to ``target`` (reason: the worker and its ratio); any other window resets the count;
- phase ``straggling`` (target mode): a window with r < ``k_off`` (< ``k_on``: the hysteresis band)
  counts; ``patience`` consecutive such windows switch back to sync.

Fewer than two live workers with a measurement: no verdict, counts unchanged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median

from .errors import GBAConfigError

SWITCH_TARGETS = ("sync", "gba", "async", "ssp", "hopbw")
"""Phases an ``auto`` run can be in (each trains by that mode's rules on the parameter server)."""


@dataclass(frozen=True)
class SwitchAt:
    """One entry of an ``auto`` run's switch schedule: at global step ``step`` switch to mode ``to``.
    Unpacks and indexes as the pair ``(step, to)``."""

    step: int
    """Global step at which the switch happens (>= 1, increasing along the schedule; the run starts in sync)."""
    to: str
    """Mode switched to: sync | gba | async | ssp | hopbw."""

    def __iter__(self):
        return iter((self.step, self.to))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return (self.step, self.to)[i]


@dataclass(frozen=True)
class Switching:
    """The switch policy of an ``auto`` run (ignored by the other modes)."""

    target: str = "gba"
    """The mode the detector switches to when a straggler appears (back to ``sync`` when it recovers):
    gba | async | ssp | hopbw."""
    schedule: tuple[SwitchAt, ...] = ()
    """Experiments: ``[{step, to}, ...]`` (``SwitchAt``; a ``(step, to)`` pair is taken too), steps >= 1 and
    increasing; when given it replaces the detector (the detector still measures, its verdicts are not applied)."""
    window: int = 2
    """Detector window, in global steps of applied samples (>= 1)."""
    k_on: float = 2.0
    """Straggler ratio threshold: r > k_on counts toward a switch to ``target`` (k_on > k_off: hysteresis)."""
    k_off: float = 1.3
    """Recovery ratio threshold: r < k_off counts toward the switch back to sync (1 <= k_off < k_on)."""
    patience: int = 2
    """Consecutive windows beyond a threshold before a switch (>= 1; m in the rule)."""
    history: int = 3
    """Step times per worker in the median x_w (>= 1)."""

    def __post_init__(self):
        pairs = tuple(SwitchAt(*x) if not isinstance(x, SwitchAt) and isinstance(x, (tuple, list)) and len(x) == 2 else x
                      for x in self.schedule)
        object.__setattr__(self, "schedule", pairs)

    def check(self) -> None:
        """Raises GBAConfigError naming the field: unknown target or schedule mode, a schedule whose
        steps are not increasing and >= 1, window / patience / history < 1, not 1 <= k_off < k_on."""
        if self.target not in SWITCH_TARGETS or self.target == "sync":
            raise GBAConfigError(f"switching.target must be one of {SWITCH_TARGETS[1:]}, got {self.target!r}")
        last = 0
        for i, item in enumerate(self.schedule):
            if len(item) != 2:
                raise GBAConfigError(f"switching.schedule[{i}] must be (step, mode), got {item!r}")
            step, to = item
            if to not in SWITCH_TARGETS:
                raise GBAConfigError(f"switching.schedule[{i}].to must be one of {SWITCH_TARGETS}, got {to!r}")
            if not isinstance(step, int) or step <= last:
                raise GBAConfigError(f"switching.schedule[{i}].step must be an integer global step > {last} "
                                     f"(increasing, the run starts in sync at step 0), got {step!r}")
            last = step
        for name in ("window", "patience", "history"):
            if getattr(self, name) < 1:
                raise GBAConfigError(f"switching.{name} must be >= 1, got {getattr(self, name)}")
        if not 1.0 <= self.k_off < self.k_on:
            raise GBAConfigError(f"switching needs 1 <= k_off < k_on (hysteresis), got k_off {self.k_off}, k_on {self.k_on}")


@dataclass(frozen=True)
class Verdict:
    """A switch the detector asks for."""

    to: str
    """The mode to switch to (``target``, or ``sync`` on recovery)."""
    worker: int | None
    """The straggler's worker index; None when recovering."""
    ratio: float
    """The straggler ratio r at the deciding window (max over workers of x_w / median of the others)."""
    reason: str
    """A readable reason for the switch (for the record and the log)."""


class StragglerDetector:
    """The rule of the module docstring over ``workers`` workers.

    ``observe(w, seconds)`` after each local batch; ``close_window(running)`` when a window ends
    (``running``: worker -> elapsed seconds of its batch in progress); it returns a Verdict when a
    switch is due, else None. ``state``: "normal" | "straggling"; ``windows``: every closed window
    (ratio, straggler, counts), for the record.
    """

    def __init__(self, workers: int, policy: Switching):
        self.policy = policy
        self.times: list[deque] = [deque(maxlen=policy.history) for _ in range(workers)]
        self.live = set(range(workers))
        self.state, self.on_count, self.off_count = "normal", 0, 0
        self.windows: list[dict] = []
        self.fresh: set[int] = set()                 # workers that finished a batch in the open window

    def observe(self, worker: int, seconds: float) -> None:
        self.times[worker].append(float(seconds))
        self.fresh.add(worker)

    def lost(self, worker: int) -> None:
        self.live.discard(worker)

    def stats(self, running: dict[int, float] | None = None) -> dict[int, float]:
        """x_w of every live worker with a measurement (see the rule)."""
        running = running or {}
        out = {}
        for w in sorted(self.live):
            t = list(self.times[w])
            x = median(t) if t else 0.0
            if w not in self.fresh:
                x = max(x, running.get(w, 0.0))
            if x > 0:
                out[w] = x
        return out

    def ratio(self, running: dict[int, float] | None = None) -> tuple[float, int | None]:
        """(r, the worker attaining it); (0.0, None) with fewer than two measured workers."""
        x = self.stats(running)
        if len(x) < 2:
            return 0.0, None
        best, who = 0.0, None
        for w, v in x.items():
            r = v / median([u for k, u in x.items() if k != w])
            if r > best:
                best, who = r, w
        return best, who

    def close_window(self, running: dict[int, float] | None = None, step: float | None = None) -> Verdict | None:
        p = self.policy
        r, w = self.ratio(running)
        self.fresh = set()
        verdict = None
        if w is not None:
            if self.state == "normal":
                self.on_count = self.on_count + 1 if r > p.k_on else 0
                if self.on_count >= p.patience:
                    self.state, self.on_count = "straggling", 0
                    verdict = Verdict(p.target, w, r, f"detector: worker{w}'s step time is {r:.2f}x the median of the "
                                                      f"others (> k_on {p.k_on}) for {p.patience} windows")
            else:
                self.off_count = self.off_count + 1 if r < p.k_off else 0
                if self.off_count >= p.patience:
                    self.state, self.off_count = "normal", 0
                    verdict = Verdict("sync", None, r, f"detector: the slowest worker is {r:.2f}x the others "
                                                       f"(< k_off {p.k_off}) for {p.patience} windows: recovered")
        self.windows.append({"step": step, "ratio": round(r, 3), "worker": w, "state": self.state,
                             "switch": verdict.to if verdict else None})
        return verdict

    def state_dict(self) -> dict:
        return {"times": [list(t) for t in self.times], "live": sorted(self.live), "fresh": sorted(self.fresh), "state": self.state,
                "on_count": self.on_count, "off_count": self.off_count, "windows": self.windows}

    def load_state_dict(self, st: dict) -> None:
        for q, t in zip(self.times, st["times"]):
            q.clear()
            q.extend(t)
        self.live, self.fresh = set(st["live"]), set(st.get("fresh", []))
        self.state, self.on_count, self.off_count = st["state"], st["on_count"], st["off_count"]
        self.windows = list(st["windows"])


def due(schedule: tuple[tuple[int, str], ...], done: int, samples_applied: int, global_batch: int) -> list[tuple[int, str]]:
    """The schedule entries past entry ``done`` whose global step has been reached (``samples_applied
    >= step x G``), in order."""
    return [s for s in schedule[done:] if samples_applied >= s[0] * global_batch]
