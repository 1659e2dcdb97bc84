"""The parameter server of the PS modes (async, SSP, Hop-BW, GBA), transport-free.

``ParameterServer`` combines token control (``control.Control``), gradient aggregation
(``aggregate.Aggregator``) and the model (``model.ServerModel``) behind four thread-safe calls —
``hello``, ``pull``, ``push``, ``worker_lost`` — that ``ops.gba.ps`` exposes over
torch.distributed.rpc and that tests drive in-process. It also keeps the clock (training seconds,
evaluation excluded), evaluates the test AUC every ``eval_every`` global steps of applied samples,
and assembles the result record (``ops.gba.report``).

Dense parameters live here; the sparse tables too, or, with ``shards`` (``Cluster.num_ps`` > 1),
sharded by ID over this process (shard 0) and the shard processes (``ops.gba.model.ServerModel``).

Mode ``auto`` (``ops.gba.switching``): the run starts in phase ``sync`` and the server switches the
token control's rule (``Control.switch``) at global-step boundaries, by the straggler detector on
the workers' step times (pull granted -> push received, measured here) or by the switch schedule.
A switch touches nothing else — the same ServerModel (dense parameters with Adam state, tables
with SparseAdagrad rows), the same data position, the same RNG and the same hyper-parameters
continue — and is recorded in ``events`` (global step, optimizer step, training seconds, wall
time, from, to, reason).

Checkpoints (``ops.gba.checkpoint``): with ``checkpoints`` given, the server writes one right after
the optimizer step that crosses each ``cluster.checkpoint_every`` global steps of applied samples
(so nothing is pending): dense parameters and Adam state, the sparse tables with their
SparseAdagrad rows, the token-control state (global step, data position: next batch number and
the batches handed out but not applied, counters, staleness list), the curves, the training clock
and the torch RNG. A server built over a run directory that holds a checkpoint of the same run
spec resumes from it instead of starting at step 0 (``resumed_from``). The checkpoint is written
under the server lock (workers' calls wait; its time is excluded from training seconds and
reported as ``checkpoints.seconds``). Work done after the last checkpoint by a killed run is lost.

Hand-over (``ops.gba.handover``): with ``spec.handover_from`` (and no checkpoint of its own) the
server starts from a hand-over written by the all-reduce trainer or another PS run; with
``spec.stop_at`` it stops after that global step and writes one (rows from every PS process, the
workers' last reported RNG, batches in flight to be handed out again). ``Policy.row_staleness =
"per_row"`` weighs each row of a GBA gradient by f(updates of that row since the token).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict

from . import report
from .aggregate import Aggregator, Gradient
from .checkpoint import Checkpoints
from .config import RunSpec, hyper_parameters, validate
from .control import STOP, Control, Wait
from .data import CTRData
from .model import ServerModel
from .staleness import histogram
from .switching import StragglerDetector, due


class ParameterServer:
    """Thread-safe PS core for one run.

    Args:
        spec: the run (``spec.mode`` in async | ssp | hopbw | gba). data: the encoded CTR data.
        on_eval: called with each evaluation point (a dict) — rank 0 forwards it to Dagster Pipes.
        clock: seconds (monotonic), injectable for tests.
        checkpoints: where to write checkpoints and resume from (None: neither).
        on_checkpoint: called with each committed checkpoint's record (under the server lock).
        on_progress: called with the samples each optimizer step applied (under the server lock).
        shards: clients of the shard processes 1 .. num_ps - 1 (``ops.gba.model.ServerModel``).
        on_switch: called with each switch event (mode auto; under the server lock).
    Raises GBAConfigError for a bad spec, ValueError for mode ``sync`` (no server),
    CheckpointError / ValueError for a committed checkpoint that cannot be read.
    """

    def __init__(self, spec: RunSpec, data: CTRData, on_eval: Callable[[dict], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter, checkpoints: Checkpoints | None = None,
                 on_checkpoint: Callable[[dict], None] | None = None, on_progress: Callable[[int], None] | None = None,
                 shards: list | None = None, on_switch: Callable[[dict], None] | None = None):
        validate(spec)
        if spec.mode == "sync":
            raise ValueError("mode 'sync' trains by all-reduce (ops.gba.sync), not on a parameter server")
        self.spec, self.data, self.on_eval, self.clock = spec, data, on_eval, clock
        self.checkpoints, self.on_checkpoint, self.on_progress = checkpoints, on_checkpoint, on_progress
        self.steps_target = spec.global_steps(data.n_train)
        if spec.stop_at:
            self.steps_target = min(self.steps_target, spec.stop_at)
        self.control = Control(spec, total_samples=self.steps_target * spec.global_batch)
        self.agg = Aggregator(row_norm=spec.row_grad_norm)
        if len(shards or []) != spec.cluster.num_ps - 1:
            raise ValueError(f"cluster.num_ps = {spec.cluster.num_ps} needs {spec.cluster.num_ps - 1} shard client(s), "
                             f"got {len(shards or [])}")
        self.model = ServerModel(data.fields, spec.train, shards)
        self.on_switch = on_switch
        W = spec.cluster.workers
        self.granted: dict[int, float] = {}                 # worker -> clock when its pull was granted
        self.step_time = [[0, 0.0] for _ in range(W)]      # per worker: batches timed, seconds
        self.detector = StragglerDetector(W, spec.switching) if spec.mode == "auto" else None
        self.events: list[dict] = []
        self.sched_done = 0
        self.next_window = spec.switching.window * spec.global_batch
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.stopped: set[int] = set()
        self.version = 0
        self._dense = self.model.dense()
        self.curve: list[dict] = []
        self.loss_curve: list[list[float]] = []
        self.t0: float | None = None
        self.eval_s = 0.0
        self.t_end: float | None = None
        self.next_eval = spec.cluster.eval_every * spec.global_batch
        self.failure: str | None = None
        # checkpoints; the clock of earlier attempts (a resumed run adds its own on top)
        self.ckpt_every = spec.cluster.checkpoint_every * spec.global_batch
        self.next_ckpt = self.ckpt_every
        self.ckpt_count, self.ckpt_s = 0, 0.0
        self.before = {"train_s": 0.0, "eval_s": 0.0, "ckpt_s": 0.0}
        self.resumes: list[dict] = []
        self.resumed_from: dict | None = None
        # hand-over (ops.gba.handover): per-worker RNG, trace counters, batches applied, in and out
        self.worker_rng: list = [None] * W
        self.trace_base, self.bbw0 = [0] * W, [0] * W
        self.applied: list[int] = []
        self._pending_batches: list[int] = []
        self.start_samples = 0
        self.handover_in: dict | None = None
        self.handover_out: dict | None = None
        # per-row staleness (Policy.row_staleness = "per_row"): (optimizer step, {table: ids updated})
        self.row_history: list[tuple[int, dict]] = []
        rec = checkpoints.find() if checkpoints is not None and self.ckpt_every else None
        if rec is not None:
            self._restore(rec)
        elif spec.handover_from:
            self._from_handover()
            self._evaluate(self.control.samples_applied)
            if self.control.done:                       # nothing to train: pass the state on unchanged
                self._write_handover()
        else:
            self._evaluate(0)

    # -- clock and evaluation --------------------------------------------------------------------
    def train_seconds(self) -> float:
        """Wall seconds of training over every attempt, evaluation and checkpoint writes excluded."""
        if self.t0 is None:
            return self.before["train_s"]
        end = self.t_end if self.t_end is not None else self.clock()
        return self.before["train_s"] + end - self.t0 - self.eval_s - self.ckpt_s

    def _evaluate(self, samples: int) -> None:
        t = self.clock()
        m = self.model.evaluate(self.data.test, self.data.y_test)
        point = {"mode": self.spec.mode, "global_step": samples / self.spec.global_batch, "samples": samples,
                 "train_s": self.train_seconds(), **m}
        if self.spec.mode == "auto":
            point["phase"] = self.control.mode
        if self.t0 is not None and self.t_end is None:
            self.eval_s += self.clock() - t
        self.curve.append(point)
        if self.on_eval:
            self.on_eval(point)

    # -- the four calls --------------------------------------------------------------------------
    def hello(self, w: int):
        """("go", first batch number) | ("wait", seconds, reason) | ("stop",)."""
        with self.lock:
            r = self.control.hello(w)
            if self.control.started and self.t0 is None:
                self.t0 = self.clock()
            return self._reply(w, r)

    def pull(self, w: int, batch: int, ids: dict, have_version: int):
        """("work", token, rows {table: [U, d]}, dense [P] or None when ``have_version`` is current,
        version) | ("wait", seconds, reason) | ("stop",)."""
        with self.lock:
            r = self.control.pull(w, batch)
            if r == STOP or isinstance(r, Wait):
                return self._reply(w, r)
            rows = self.model.rows(ids)
            self.granted[w] = self.clock()
            dense = None if have_version == self.version else self._dense
            return ("work", r.token, rows, dense, self.version)

    def push(self, w: int, token: int, batch: int, grad: Gradient):
        """("go", next batch number) | ("stop",). Applies an optimizer step when the token control
        says the aggregate is complete; evaluates at the eval cadence."""
        with self.lock:
            t = self.granted.pop(w, None)
            if t is not None:
                dt = grad.compute_s if grad.compute_s > 0 else self.clock() - t
                self.step_time[w][0] += 1
                self.step_time[w][1] += dt
                if self.detector is not None:
                    self.detector.observe(w, dt)
            if grad.rng is not None and not self.control.done:
                self.worker_rng[w] = grad.rng
            v = self.control.push(w, token, batch, grad.samples)
            if v.weight > 0:
                rw = self._row_weights(token, grad) if self._per_row() else None
                self.agg.add(grad, v.weight, rw)
                self._pending_batches.append(batch)
            if v.apply:
                self._apply()
            return self._reply(w, STOP if v.next_batch is None else v.next_batch)

    def worker_lost(self, w: int, reason: str) -> None:
        """A worker process died: drop its token and batch; finish if no worker is left."""
        with self.lock:
            self.granted.pop(w, None)
            if self.detector is not None:
                self.detector.lost(w)
            if self.control.worker_lost(w, reason):
                self._apply()
            if not self.control.live and not self.control.done:
                self.failure = f"every worker was lost ({self.control.lost})"
                self.t_end = self.clock()
                self.finished.set()
            self._check_finished()

    # -- internals -------------------------------------------------------------------------------
    def _per_row(self) -> bool:
        return self.spec.policy.row_staleness == "per_row" and self.control.mode == "gba"

    def _row_weights(self, token: int, grad) -> dict:
        """Per table, f(tau_row) [U] of the gradient's rows: tau_row = the optimizer steps after
        ``token`` whose update touched the row (0 for a row nobody updated since the pull)."""
        import torch

        out = {}
        for t, (ids, _, _) in grad.sparse.items():
            tau = torch.zeros(len(ids), dtype=torch.int64)
            for step, upd in self.row_history:
                if step > token and t in upd:
                    tau += torch.isin(ids, upd[t]).to(torch.int64)
            f = self.spec.policy.decay
            out[t] = torch.tensor([f(int(x)) for x in tau.tolist()], dtype=torch.float32) if len(ids) else torch.zeros(0)
        return out

    def _apply(self) -> None:
        up = self.agg.take()
        self.model.apply(up)
        self.version += 1
        self._dense = self.model.dense()
        c = self.control
        self.applied.extend(self._pending_batches)
        self._pending_batches = []
        if self.spec.policy.row_staleness == "per_row":
            self.row_history.append((c.step, {t: ids for t, (ids, _) in up.sparse.items()}))
            oldest = min((tok for tok, _ in c.outstanding.values()), default=c.step)
            self.row_history = [(s, u) for s, u in self.row_history if s > oldest]
        self.loss_curve.append([c.samples_applied, up.loss])
        if self.on_progress:
            self.on_progress(up.samples)
        if c.done:
            self.t_end = self.clock()
            self._evaluate(c.samples_applied)
            if self.spec.stop_at:
                self._write_handover()
            return
        if self.spec.mode == "auto":
            self._switch_point()
        if c.samples_applied >= self.next_eval:
            self._evaluate(c.samples_applied)
            while self.next_eval <= c.samples_applied:
                self.next_eval += self.spec.cluster.eval_every * self.spec.global_batch
        if self.checkpoints is not None and self.ckpt_every and c.samples_applied >= self.next_ckpt:
            while self.next_ckpt <= c.samples_applied:
                self.next_ckpt += self.ckpt_every
            self._checkpoint()

    # -- switching (mode auto) -------------------------------------------------------------------
    def _switch_point(self) -> None:
        """After an optimizer step: close detector windows that ended; apply a due verdict or a due
        schedule entry (the schedule, when given, replaces the detector's verdicts)."""
        c, sw, G = self.control, self.spec.switching, self.spec.global_batch
        while c.samples_applied >= self.next_window:
            self.next_window += sw.window * G
            now = self.clock()
            v = self.detector.close_window({w: now - t for w, t in self.granted.items()}, step=c.samples_applied / G)
            if v is not None and not sw.schedule and v.to != c.mode:
                self.switch(v.to, v.reason)
        for step, to in due(sw.schedule, self.sched_done, c.samples_applied, G):
            self.sched_done += 1
            if to != c.mode:
                self.switch(to, f"schedule: switch_at step {step}")

    def switch(self, to: str, reason: str) -> dict:
        """Switch the run's rule to ``to`` now (call right after an optimizer step, under the lock:
        nothing is pending). Changes nothing but the rule; returns the recorded event. Raises
        ProtocolError outside mode auto or with gradients pending."""
        c = self.control
        ev = {"global_step": c.samples_applied / self.spec.global_batch, "optimizer_step": c.step,
              "samples": c.samples_applied, "train_s": self.train_seconds(), "wall_time": time.time(),
              "from": c.mode, "to": to, "reason": reason}
        c.switch(to)
        self.events.append(ev)
        if self.on_switch:
            self.on_switch(ev)
        return ev

    # -- checkpoints -----------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        """Write and commit a checkpoint of the state right after an optimizer step."""
        import torch

        from .checkpoint import save_state

        t = self.clock()
        c, m = self.control, self.model.model
        folder = self.checkpoints.stage(c.samples_applied)
        server = {"version": self.version, "curve": self.curve, "loss_curve": self.loss_curve,
                  "next_eval": self.next_eval, "next_ckpt": self.next_ckpt, "count": self.ckpt_count + 1,
                  "train_s": self.train_seconds(), "eval_s": self.before["eval_s"] + self.eval_s,
                  "ckpt_s": self.before["ckpt_s"] + self.ckpt_s, "resumes": self.resumes,
                  "events": self.events, "sched_done": self.sched_done, "next_window": self.next_window,
                  "detector": self.detector.state_dict() if self.detector is not None else None}
        save_state(folder, "ps", {"net": m.net.state_dict(), "opt": m.opt.state_dict(), "control": c.state(),
                                  "server": server, "rng": torch.get_rng_state()}, m.ec)
        writers = ["ps", *self.model.save_shards(folder)]
        self.ckpt_count += 1
        rec = self.checkpoints.commit(folder, {"count": self.ckpt_count, "samples": c.samples_applied,
                                               "global_step": c.samples_applied / self.spec.global_batch,
                                               "optimizer_steps": c.step, "writers": writers})
        if self.t0 is not None:
            self.ckpt_s += self.clock() - t
        if self.on_checkpoint:
            self.on_checkpoint(rec)

    def _restore(self, rec: dict) -> None:
        import torch

        from .checkpoint import load_state

        m = self.model.model
        st = load_state(self.checkpoints.folder(rec), "ps", m.ec)
        self.model.load_shards(self.checkpoints.folder(rec))
        m.net.load_state_dict(st["net"])
        m.opt.load_state_dict(st["opt"])
        self.control.restore(st["control"])
        s = st["server"]
        self.version, self.curve, self.loss_curve = s["version"], s["curve"], s["loss_curve"]
        self.next_eval, self.next_ckpt, self.ckpt_count = s["next_eval"], s["next_ckpt"], s["count"]
        self.before = {"train_s": s["train_s"], "eval_s": s["eval_s"], "ckpt_s": s["ckpt_s"]}
        self.events, self.sched_done = list(s.get("events", [])), s.get("sched_done", 0)
        self.next_window = s.get("next_window", self.next_window)
        if self.detector is not None and s.get("detector"):
            self.detector.load_state_dict(s["detector"])
        self._dense = self.model.dense()
        torch.set_rng_state(st["rng"])
        self.resumed_from = {"checkpoint": rec["count"], "samples": rec["samples"], "global_step": rec["global_step"],
                             "optimizer_steps": rec["optimizer_steps"], "reissued_batches": len(self.control.reissue)}
        self.resumes = list(s["resumes"]) + [self.resumed_from]

    # -- hand-over (ops.gba.handover) ------------------------------------------------------------
    def _from_handover(self) -> None:
        """Start from ``spec.handover_from``: every PS process loads its rows (key % num_ps), PS 0
        the dense parameters and Adam state; the token control continues at the hand-over's global
        step and data position. Raises HandoverError."""
        from pathlib import Path

        from . import handover

        folder = Path(self.spec.handover_from)
        rec = handover.read(folder)
        handover.check(rec, self.spec, self.data.n_train, folder)
        m = self.model.model
        self.model.load_handover(folder)
        st = handover.load_state(folder)
        m.net.load_state_dict(st["net"])
        m.opt.load_state_dict(st["opt"])
        W = self.spec.cluster.workers
        self.worker_rng = [st["rng"][w] if w < len(st["rng"]) else None for w in range(W)]
        tp = list(rec["trace_position"]) + [0] * W
        self.trace_base = tp[:W]
        per_global = self.spec.local_batches_per_step if self.control.mode in ("async", "ssp") else 1
        self.control.start_at(step=int(round(rec["global_step"] * per_global)), samples=rec["samples"],
                              next_batch=rec["next_batch"], reissue=rec["reissue"])
        self.start_samples = rec["samples"]
        self.next_eval = (int(rec["samples"] // (self.spec.cluster.eval_every * self.spec.global_batch)) + 1) \
            * self.spec.cluster.eval_every * self.spec.global_batch
        self.next_ckpt = (rec["samples"] // self.ckpt_every + 1) * self.ckpt_every if self.ckpt_every else 0
        self.next_window = rec["samples"] + self.spec.switching.window * self.spec.global_batch
        self._dense = self.model.dense()
        self.handover_in = {"folder": str(folder), "from_mode": rec["from_mode"], "global_step": rec["global_step"],
                            "next_batch": rec["next_batch"], "reissue": list(rec["reissue"])}

    def _write_handover(self) -> None:
        """Write the hand-over at the run's stop (right after its last optimizer step: nothing
        pending): every PS process's rows, PS 0's dense state, each worker's last reported RNG, the
        data position (batches in flight are to be handed out again)."""
        from pathlib import Path

        from ops.sparse.checkpoint import write_manifest

        from . import handover

        c, m = self.control, self.model.model
        folder = Path(self.spec.handover_to)
        folder.mkdir(parents=True, exist_ok=True)
        write_manifest(folder, self.model.save_handover(folder), prefix=handover.TABLES)
        st = c.state()
        trace = [b + n - n0 for b, n, n0 in zip(self.trace_base, c.batches_by_worker, self.bbw0)]
        self.handover_out = handover.write(
            folder, self.spec, net=m.net.state_dict(), opt=m.opt.state_dict(), rng=self.worker_rng,
            global_step=c.samples_applied / self.spec.global_batch, optimizer_steps=c.step,
            next_batch=st["next_batch_no"], reissue=st["reissue"], trace_position=trace, n_train=self.data.n_train,
            writers=[f"ps{k}" for k in range(self.model.num_ps)])

    def _reply(self, w: int, r):
        if r == STOP:
            self.stopped.add(w)
            self._check_finished()
            return ("stop",)
        if isinstance(r, Wait):
            return ("wait", r.seconds, r.reason)
        return ("go", r)

    def _check_finished(self) -> None:
        if self.control.done and self.control.live <= self.stopped:
            self.finished.set()

    def stop_all(self) -> None:
        """End the run now (run timeout): remaining pulls get stop."""
        with self.lock:
            if not self.control.done:
                self.failure = self.failure or "stopped before the configured global steps"
                self.control.done = True
                self.t_end = self.clock()

    # -- result ----------------------------------------------------------------------------------
    def result(self) -> dict:
        """The run record (see ``ops.gba.report``); call after ``finished``."""
        with self.lock:
            c = self.control
            spec = self.spec
            names = [f"worker{w}" for w in range(spec.cluster.workers)]
            lost = [{"worker": names[w], "reason": why,
                     "dropped_tokens": [t for v, t, _ in c.lost_work if v == w and t is not None],
                     "dropped_batches": [b for v, _, b in c.lost_work if v == w and b is not None]}
                    for w, why in sorted(c.lost.items())]
            res = {
                "mode": spec.mode, "workers": spec.cluster.workers, "world_size": spec.cluster.workers + spec.cluster.num_ps,
                "num_ps": spec.cluster.num_ps,
                "launcher": f"ops.gba.ps ({spec.cluster.num_ps} PS + W workers, torch.distributed.rpc / TensorPipe)",
                "distributed_type": "PS_RPC", "trace": spec.trace.kind, "spec": _spec_dict(spec),
                "hyper_parameters": hyper_parameters(spec),
                "global_steps_target": self.steps_target,
                "global_steps": c.samples_applied / spec.global_batch,
                "optimizer_steps": c.step, "samples_applied": c.samples_applied,
                "samples_computed": c.gradients.pushed * spec.local_batch, "gradients": asdict(c.gradients),
                "staleness_histogram": histogram(c.taus), "staleness_unit": "global steps" if spec.mode in ("gba", "hopbw") else "optimizer steps",
                "batches_by_worker": dict(zip(names, c.batches_by_worker)),
                "step_time_s": {n: (t / k if k else None) for n, (k, t) in zip(names, self.step_time)},
                "lost_workers": lost, "failure": self.failure,
                "curve": self.curve, "loss_curve": self.loss_curve, "final": self.curve[-1] if self.curve else None,
                "eval_seconds": self.before["eval_s"] + self.eval_s,
                "checkpoints": {"every_global_steps": spec.cluster.checkpoint_every if self.checkpoints else 0,
                                "written": self.ckpt_count, "seconds": self.before["ckpt_s"] + self.ckpt_s,
                                "resumes": self.resumes},
            }
            res["start_global_step"] = self.start_samples / spec.global_batch
            res["batches_applied"] = self.applied
            res["handover"] = {"from": self.handover_in, "to": self.handover_out}
            res["row_staleness"] = spec.policy.row_staleness
            if spec.mode == "auto":
                res["switching"] = {"policy": _spec_dict(spec)["switching"], "events": self.events,
                                    "final_phase": c.mode, "dropped_at_switch": c.dropped_at_switch,
                                    "windows": self.detector.windows}
            return report.finish(res, c.samples_applied - self.start_samples, self.train_seconds(), spec.cluster.target_auc)


def _spec_dict(spec: RunSpec) -> dict:
    import json

    return json.loads(spec.to_json())
