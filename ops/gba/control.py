"""Token control and scheduling of the parameter-server modes (pure Python; no tensors, no RPC).

GBA (arXiv 2205.11048 §3.2): every pull hands the worker a token, the global step its parameters
are at; the gradient comes back with it; staleness tau = global step now - token; the gradient is
weighted by f(tau) (0 drops it) and counted into the global batch; when the accepted gradients
cover exactly G samples the server applies one optimizer step. Workers never wait for each other;
a lost worker's token and its batch are dropped (invariants 1-4 in docs/gba.md, "Invariants").

Baselines on the same server:
- ``async``: every gradient is applied on arrival (one optimizer step per local batch).
- ``ssp`` (Ho et al., NeurIPS 2013): async, but a worker whose clock (gradients pushed) is more
  than ``ssp_bound`` ahead of the slowest live worker waits at its pull.
- ``hopbw`` (backup workers; Chen et al. 2016; Luo et al., ASPLOS 2019): synchronous global steps;
  each worker gets M / W tokens per step; the step is applied as soon as the gradients of
  W - backup_workers workers' shares have arrived; later gradients of that step are dropped.

Samples come from one shared stream: the server hands out local batch numbers in order (at
``hello`` and with every push), so faster workers take more batches. The run ends when
``total_samples`` samples have been applied; the last pulls get ``STOP``.

Staleness is counted in optimizer steps (model versions): global steps for GBA and Hop-BW,
local-batch updates for async and SSP.

Phases (mode ``auto``, ``ops.gba.switching``): ``mode`` is the rule in force; an auto run starts in
``sync`` — lock-step synchronous training on the server: Hop-BW's schedule with no backup worker,
so every global step waits for all M = G / b local batches (M / W per worker) computed at that
step's parameters, then applies them with the one averaging rule, as all-reduce sync does —
and ``switch(to)`` changes the rule at a global-step boundary (nothing pending), keeping every
counter, the parameters and the data position. Gradients computed before a switch into a
lock-step phase (token < ``phase_start``) are not applied; their batches are handed out again
first (``dropped_at_switch``), so a switch skips no sample. Into GBA, async or SSP they are
ordinary stale gradients.

Resume (``state``/``restore``, taken right after an optimizer step, when nothing is pending): the
scheduling position is the next fresh batch number plus the batches handed out but not applied
at that point; a restored run hands those out again first, so a relaunch skips no sample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .config import RunSpec


@dataclass(frozen=True)
class Work:
    """Pull granted: compute on parameters at global step ``token``."""

    token: int
    """Global step (optimizer steps applied) of the parameters the worker pulls; staleness counts from it."""


@dataclass(frozen=True)
class Wait:
    """Pull refused for now: ask again after ``seconds``."""

    seconds: float
    """How long the worker waits before asking again, in s (``Control.poll_s``)."""
    reason: str
    """Why the pull is refused (start barrier, SSP bound, lock-step tokens used up), for errors and logs."""


STOP = "stop"


@dataclass(frozen=True)
class PushVerdict:
    """What the server does with a pushed gradient."""

    tau: int
    """Staleness of the gradient: optimizer steps now - its token (>= 0)."""
    weight: float
    """Its weight in the aggregate, f(tau) in [0, 1]; 0 = dropped."""
    apply: bool
    """The aggregate is complete: apply one optimizer step now."""
    next_batch: int | None
    """The worker's next local batch number, or None = stop."""


@dataclass
class GradientCounts:
    """What became of the gradients of one run: the result's ``gradients`` (``asdict``), the same keys
    for every mode. Counts of gradients (one per local batch)."""

    pushed: int = 0
    """Gradients pushed, every one counted."""
    applied: int = 0
    """Gradients accepted into an aggregate (weight > 0)."""
    decayed: int = 0
    """Accepted gradients with weight < 1 (GBA's staleness decay)."""
    dropped: int = 0
    """Gradients dropped with weight 0 (GBA: f(tau) = 0, e.g. past drop_after; lock-step: an old step's)."""
    discarded_at_end: int = 0
    """Gradients pushed after the run was done or by a worker declared lost (not counted in ``taus``)."""


class ProtocolError(RuntimeError):
    """A worker broke the pull/push protocol (pushed without a token, wrong batch); names the worker."""


@dataclass
class Control:
    """The scheduling state of one PS run. Not thread-safe: the server calls it under its lock."""

    spec: RunSpec
    """The run (mode, W, G, b, policies)."""
    total_samples: int
    """Applied samples that end the run."""
    poll_s: float = 0.002
    """How long a refused pull waits before asking again, in s."""
    step: int = 0
    """Optimizer steps applied so far: the global step (async, SSP: one per applied local batch)."""
    samples_applied: int = 0
    """Samples covered by the optimizer steps applied so far."""
    next_batch_no: int = 0
    """The next fresh local batch number of the shared sample stream."""
    registered: set = field(default_factory=set)
    """Workers that said ``hello`` (the start barrier waits for every worker)."""
    live: set = field(default_factory=set)
    """Workers not declared lost (set to every worker at construction)."""
    lost: dict = field(default_factory=dict)
    """Worker -> reason it was declared lost."""
    claimed: dict = field(default_factory=dict)
    """Worker -> batch number handed out, not yet pushed."""
    outstanding: dict = field(default_factory=dict)
    """Worker -> (token, batch) pulled, not yet pushed."""
    clock: list = field(default_factory=list)
    """SSP: gradients pushed per worker."""
    slots: list = field(default_factory=list)
    """Hop-BW (and sync on the server): tokens of the current global step per worker."""
    pending_samples: int = 0
    """Samples of the accepted gradients not yet applied (GBA applies at exactly G)."""
    pending_gradients: int = 0
    """Accepted gradients not yet applied."""
    taus: list = field(default_factory=list)
    """Staleness of every gradient pushed while the run was live (not discarded at the end or at a switch)."""
    gradients: GradientCounts = field(default_factory=GradientCounts)
    """What became of every pushed gradient (the result's ``gradients``)."""
    batches_by_worker: list = field(default_factory=list)
    """Local batches pushed per worker."""
    lost_work: list = field(default_factory=list)
    """(worker, token or None, batch) dropped with a lost worker."""
    reissue: list = field(default_factory=list)
    """Batch numbers to hand out before fresh ones (resume; batches dropped at a switch)."""
    done: bool = False
    """``total_samples`` have been applied: the run is over and pulls get STOP."""
    mode: str = ""
    """The rule in force (spec.mode; auto: the phase)."""
    phase_start: int = 0
    """Optimizer step the current phase began at."""
    dropped_at_switch: int = 0
    """Pre-switch gradients not applied (their batch handed out again)."""

    def __post_init__(self):
        w = self.spec.cluster.workers
        self.live = set(range(w))
        self.clock, self.slots, self.batches_by_worker = [0] * w, [0] * w, [0] * w
        self.m = self.spec.local_batches_per_step
        self.share = self.m // w if self.spec.mode in ("hopbw", "auto") else self.m
        self.mode = "sync" if self.spec.mode == "auto" else self.spec.mode

    @property
    def lockstep(self) -> bool:
        """The rule in force waits for every step's shares (Hop-BW, and sync on the server)."""
        return self.mode in ("hopbw", "sync")

    def switch(self, to: str) -> None:
        """Change the rule in force to ``to`` at this global-step boundary (see the module
        docstring). Raises ProtocolError for a run not in mode auto or with gradients pending."""
        if self.spec.mode != "auto":
            raise ProtocolError(f"only an auto run switches modes (this run is {self.spec.mode!r})")
        if self.pending_samples or self.pending_gradients:
            raise ProtocolError(f"switch to {to!r} with {self.pending_gradients} gradient(s) pending; switch at a global step")
        self.mode, self.phase_start = to, self.step
        self.slots = [0] * len(self.slots)

    # -- hand-outs -------------------------------------------------------------------------------
    def _claim(self, w: int) -> int:
        if self.reissue:
            n = self.reissue.pop(0)
        else:
            n = self.next_batch_no
            self.next_batch_no += 1
        self.claimed[w] = n
        return n

    # -- resume ----------------------------------------------------------------------------------
    _COUNTERS = ("step", "samples_applied", "next_batch_no", "taus", "batches_by_worker", "mode", "phase_start",
                 "dropped_at_switch")

    def state(self) -> dict:
        """The scheduling state a resumed run needs: counters, the next fresh batch number and the
        batches to hand out again (claimed or pulled, not pushed; plus any re-issues left).
        Raises ProtocolError when gradients are pending (take it right after an optimizer step)."""
        if self.pending_samples or self.pending_gradients:
            raise ProtocolError(f"control state taken with {self.pending_gradients} gradient(s) pending; "
                                "checkpoint right after an optimizer step")
        st = {k: getattr(self, k) for k in self._COUNTERS}
        st["taus"], st["batches_by_worker"] = list(self.taus), list(self.batches_by_worker)
        st["gradients"] = asdict(self.gradients)
        st["reissue"] = sorted(set(self.claimed.values()) | set(self.reissue))
        return st

    def restore(self, st: dict) -> None:
        """Continue from ``state()`` output, with every worker fresh (live, unregistered, nothing
        claimed). Raises ProtocolError when the worker count differs or the run is already done."""
        if len(st["batches_by_worker"]) != self.spec.cluster.workers:
            raise ProtocolError(f"checkpoint has {len(st['batches_by_worker'])} workers, this run "
                                f"{self.spec.cluster.workers}")
        if st["samples_applied"] >= self.total_samples:
            raise ProtocolError(f"checkpoint at {st['samples_applied']} samples is past the run's end ({self.total_samples})")
        for k in self._COUNTERS:
            setattr(self, k, st.get(k, getattr(self, k)))
        self.taus, self.batches_by_worker = list(st["taus"]), list(st["batches_by_worker"])
        self.gradients = GradientCounts(**st["gradients"])
        self.reissue = list(st["reissue"])

    def start_at(self, step: int, samples: int, next_batch: int, reissue: list[int]) -> None:
        """Continue from a hand-over (``ops.gba.handover``): ``step`` optimizer steps and ``samples``
        applied, fresh batches from ``next_batch``, ``reissue`` handed out first. Every counter of this
        run (gradients, staleness, batches per worker) starts at zero. Raises ProtocolError once
        started."""
        if self.registered or self.step or self.samples_applied:
            raise ProtocolError("start_at: the run has already started")
        self.step, self.phase_start, self.samples_applied = step, step, samples
        self.next_batch_no, self.reissue = next_batch, list(reissue)
        self.done = self.samples_applied >= self.total_samples

    def hello(self, w: int) -> int | Wait | str:
        """Register worker ``w``; its first batch number once every worker has registered (the
        start barrier), else Wait; STOP if the run is over or the worker was declared lost."""
        self._check_worker(w)
        if self.done or w in self.lost:
            return STOP
        self.registered.add(w)
        if len(self.registered | set(self.lost)) < self.spec.cluster.workers:
            return Wait(self.poll_s, "start: waiting for every worker to register")
        return self.claimed[w] if w in self.claimed else self._claim(w)

    @property
    def started(self) -> bool:
        return len(self.registered | set(self.lost)) >= self.spec.cluster.workers

    def pull(self, w: int, batch: int) -> Work | Wait | str:
        """Worker ``w`` asks for parameters to compute local batch ``batch``: Work(token), Wait or STOP."""
        self._check_worker(w)
        if self.done or w not in self.live:
            return STOP
        if self.claimed.get(w) != batch:
            raise ProtocolError(f"worker{w} pulled for batch {batch}, but holds batch {self.claimed.get(w)}")
        if w in self.outstanding:
            raise ProtocolError(f"worker{w} pulled twice without pushing (token {self.outstanding[w][0]})")
        mode = self.mode
        if mode == "ssp":
            slowest = min(self.clock[v] for v in self.live)
            if self.clock[w] - slowest > self.spec.policy.ssp_bound:
                return Wait(self.poll_s, f"ssp: worker{w} at clock {self.clock[w]} is more than "
                                         f"{self.spec.policy.ssp_bound} ahead of the slowest ({slowest})")
        if self.lockstep:
            if self.slots[w] >= self.share:
                return Wait(self.poll_s, f"{mode}: worker{w} has its {self.share} token(s) of global step {self.step}")
            self.slots[w] += 1
        self.outstanding[w] = (self.step, batch)
        return Work(self.step)

    def _needed(self) -> int:
        """Hop-BW: gradients that complete a global step (capped by what the live workers can send)."""
        want = self.m - (self.spec.policy.backup_workers if self.mode == "hopbw" else 0) * self.share
        return max(1, min(want, len(self.live) * self.share))

    def push(self, w: int, token: int, batch: int, samples: int) -> PushVerdict:
        """Worker ``w`` returns its gradient of ``batch`` computed at ``token`` over ``samples`` samples.
        Raises ProtocolError for a push without a matching pull."""
        self._check_worker(w)
        if self.outstanding.get(w) != (token, batch):
            raise ProtocolError(f"worker{w} pushed (token {token}, batch {batch}) but holds {self.outstanding.get(w)}")
        del self.outstanding[w]
        self.claimed.pop(w, None)
        self.gradients.pushed += 1
        self.clock[w] += 1
        self.batches_by_worker[w] += 1
        tau = self.step - token
        if self.done or w not in self.live:
            self.gradients.discarded_at_end += 1
            return PushVerdict(tau, 0.0, False, None)
        mode = self.mode
        if self.lockstep and token < self.phase_start:                 # computed before the switch
            self.dropped_at_switch += 1
            self.reissue.append(batch)
            return PushVerdict(tau, 0.0, False, self._claim(w))
        self.taus.append(tau)
        if mode == "gba":
            weight = float(self.spec.policy.decay(tau))
        elif self.lockstep:
            weight = 1.0 if token == self.step else 0.0
        else:
            weight = 1.0
        if weight <= 0.0:
            self.gradients.dropped += 1
        else:
            self.pending_samples += samples
            self.pending_gradients += 1
            self.gradients.applied += 1
            self.gradients.decayed += weight < 1.0
        apply = weight > 0.0 and self._complete()
        if apply:
            self._advance()
        return PushVerdict(tau, weight, apply, None if self.done else self._claim(w))

    def _complete(self) -> bool:
        mode = self.mode
        if mode == "gba":
            if self.pending_samples > self.spec.global_batch:
                raise ProtocolError(f"global batch overshoot: {self.pending_samples} > {self.spec.global_batch} samples "
                                    f"(local batches must have exactly {self.spec.local_batch} samples)")
            return self.pending_samples == self.spec.global_batch
        if self.lockstep:
            return self.pending_gradients >= self._needed()
        return True                                                     # async, ssp

    def _advance(self) -> None:
        self.step += 1
        self.samples_applied += self.pending_samples
        self.pending_samples = self.pending_gradients = 0
        self.slots = [0] * len(self.slots)
        if self.samples_applied >= self.total_samples:
            self.done = True

    def worker_lost(self, w: int, reason: str) -> bool:
        """Declare worker ``w`` dead: its outstanding token and claimed batch are dropped (recorded in
        ``lost_work``); SSP stops waiting for it; Hop-BW needs fewer gradients. Returns True when
        that completes the pending Hop-BW step (the caller applies it)."""
        self._check_worker(w)
        if w in self.lost:
            return False
        self.lost[w] = reason
        self.live.discard(w)
        self.registered.discard(w)
        tok = self.outstanding.pop(w, None)
        batch = self.claimed.pop(w, None)
        if tok is not None or batch is not None:
            self.lost_work.append((w, tok[0] if tok else None, batch))
        if self.lockstep and not self.done and self.pending_gradients and self._complete():
            self._advance()
            return True
        return False

    def _check_worker(self, w: int) -> None:
        if not 0 <= w < self.spec.cluster.workers:
            raise ProtocolError(f"unknown worker index {w} (workers: {self.spec.cluster.workers})")
