"""Synchronous data-parallel training with all-reduce: GBA's baseline (arXiv 2205.11048 §2, §5).

W ranks (gloo on CPU) each take an equal share of every global batch of G samples (M / W local
batches of the shared sample stream, ``ops.gba.data``), compute per-sample-summed gradients, then
all-reduce: dense gradients averaged over G, sparse rows (sharded by ID over the ranks,
``ops.sparse.shard``) averaged over the samples that touched them — the same rule and the same
optimizers (``ops.gba.aggregate``, ``ops.sparse.train.CTRModel``) as the parameter server, so
switching a job between ``sync`` and ``gba`` changes no hyper-parameter.

Launch: ``accelerate launch --multi_gpu --num_processes W -m ops.gba.launch_sync --spec ... --out ...``
with ``ACCELERATE_USE_CPU=true`` (``resources.compute.ComputeResource`` builds it). Each rank checks
that it got the world size and distributed type it was asked for (``check_launch``): ``accelerate
launch --cpu --num_processes 2`` silently runs one process (docs/platform-notes.md, "accelerate on CPU"). The straggler trace slows
rank r as it slows PS worker r — by real extra forward/backward passes of the DeepFM head over its
local batches (``ops.gba.trace``; the lookups are collectives and are not repeated); every other
rank then waits at the all-reduce.

Checkpoints (``ops.gba.checkpoint``) every ``cluster.checkpoint_every`` global steps: the sparse
rows are sharded over the ranks, so every rank writes its shard of the tables, its copy of the
dense parameters and Adam state, its RNG (dropout) state and the curves; after a barrier rank 0
commits. A launch with the same ``--out``, spec and world size resumes from the last committed
checkpoint: the sample stream is a function of the global step and the trace of (rank, local
batch), so the resumed run applies exactly the updates of an uninterrupted one. A finished launch
removes its checkpoints (its ``result.json`` is the record).

Hand-over (``ops.gba.handover``; the all-reduce <-> PS switch of GBA §1, §3): with ``spec.stop_at``
the run stops after that global step and every rank writes its rows into ``spec.handover_to`` (rank
0: the manifest, dense state, every rank's RNG, the record); with ``spec.handover_from`` it starts
from one (written by W ranks or by a PS with any num_ps), training the hand-over's ``reissue``
batches first. Row gradients are divided per ``spec.row_grad_norm`` (``aggregate.row_mean``).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from ops.sparse.shard import ShardedEmbeddingCollection
from ops.sparse.train import CTRModel

from . import handover, report
from .aggregate import dense_mean, row_mean
from .checkpoint import Checkpoints, load_state, save_state
from .config import RunSpec, hyper_parameters, load_spec, validate
from .control import GradientCounts
from .data import CTRData, SampleStream, take
from .errors import LaunchError
from .model import dense_pass, loss_sum, metrics, repeat


def check_launch(world_size: int, distributed_type: str, workers: int) -> None:
    """Raise LaunchError unless ``world_size == workers`` and the distributed type is MULTI_CPU
    (NO for a single worker)."""
    want = "MULTI_CPU" if workers > 1 else "NO"
    if world_size != workers or distributed_type != want:
        raise LaunchError(f"sync launch gave world size {world_size} with distributed type {distributed_type}, but the run asked "
                          f"for {workers} rank(s) ({want}); `accelerate launch --cpu --num_processes N` starts one process: "
                          f"launch with --multi_gpu and ACCELERATE_USE_CPU=true")


class _TimedExchange:
    """The collection's exchanger, timing its collectives (so a straggler's slowdown multiplies its
    local compute only, as on a PS worker, not the waits for other ranks)."""

    def __init__(self, x):
        self.x, self.seconds = x, 0.0

    def __call__(self, send):
        t = time.perf_counter()
        try:
            return self.x(send)
        finally:
            self.seconds += time.perf_counter() - t

    def __getattr__(self, name):
        return getattr(self.x, name)


class CountingShardedCollection(ShardedEmbeddingCollection):
    """Sharded tables whose row gradients are averaged over the whole global batch by ``row_norm``
    (the samples that touched each row, or G): each rank sends [grad sum | occurrences] to the row's
    owner."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.x = _TimedExchange(self.x)

    row_norm = "occurrences"
    """``RunSpec.row_grad_norm``: rows divided by their occurrences or by the global batch."""
    global_batch = 0
    """G, the denominator of ``row_norm = "global_batch"``."""

    def expect(self, counts: dict[str, torch.Tensor]) -> None:
        """Occurrences [U] of the next forward's unique ids per table (``unique_ids`` of the batch)."""
        self._counts = counts

    def apply_gradients(self) -> None:
        pending, self._pending = self._pending, []
        for tname, (rows, inv, sizes, pos), leaf in pending:
            table = self.tables[tname]
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            gc = torch.cat([grad, self._counts[tname].to(grad.dtype)[:, None]], dim=1)       # [U, d + 1]
            s = torch.zeros(len(rows), table.dim + 1).index_add(0, inv, torch.cat(self.x([gc[p] for p in pos])))
            table.apply_gradients(rows, row_mean(s[:, :table.dim], s[:, table.dim], self.global_batch, self.row_norm))


class SyncModel(CTRModel):
    """CTRModel over CountingShardedCollection, data-parallel dense parameters (one all-reduce)."""

    def __init__(self, fields: list[str], cfg, group=None):
        super().__init__(fields, cfg, collection_cls=CountingShardedCollection, group=group, exchange="auto")
        self.group = group
        self.params = list(self.net.parameters())

    def backward(self, batch: dict, labels: torch.Tensor, extra: list[int] | None = None, local_batch: int = 0) -> float:
        """Forward + backward of this rank's share [B] (``len(extra)`` local batches of ``local_batch``
        samples); returns its BCE sum. ``extra[j]`` > 0: the straggler computes local batch j's
        DeepFM forward/backward that many more times and discards them (``ops.gba.trace``; the
        embedding lookups are collectives, so they are not repeated)."""
        self.ec.expect({t: c for t, (_, c) in self.ec.unique_ids(batch).items()})
        out: dict = {}
        bce, reg = loss_sum(self, batch, labels, out)
        self.opt.zero_grad()
        (bce + reg).backward()
        for j, n in enumerate(extra or []):
            sl = slice(j * local_batch, (j + 1) * local_batch)
            repeat(n, lambda: dense_pass(self, out["e"][sl], labels[sl]))
        return bce.item()

    def reduce_and_apply(self, bce_sum: float, samples: int, global_batch: int) -> float:
        """All-reduce, average (``ops.gba.aggregate``), one optimizer step. Returns the mean global
        training loss. Raises RuntimeError when the ranks' samples do not add up to the global batch."""
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [torch.tensor([bce_sum, float(samples)])])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        if int(flat[-1]) != global_batch:
            raise RuntimeError(f"sync step covered {int(flat[-1])} samples, expected the global batch {global_batch}")
        dense = dense_mean(flat[:-2], global_batch)
        off = 0
        for p in self.params:
            p.grad = dense[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        self.opt.step()
        self.ec.apply_gradients()
        self.ec.end_step()
        return float(flat[-2]) / global_batch


class SyncTrainer:
    """The sync run on one rank (the process group must be initialised; world 1 is fine).

    Args:
        spec: the run (mode ``sync``). data: the encoded CTR data.
        on_eval: rank 0: called with each evaluation point (a dict).
        checkpoints: where to checkpoint and resume from (the same folder on every rank; None: neither).
        on_checkpoint: every rank: called with each checkpoint's record once rank 0 committed it.
        on_resume: rank 0: called with the resume record (checkpoint, global step) before training.
        on_progress: rank 0: called with 0 when the training loop starts, then with the samples of
            each applied global step.
    Raises LaunchError (world size), ValueError (mode), CheckpointError (unreadable checkpoint).
    """

    def __init__(self, spec: RunSpec, data: CTRData, on_eval=None, checkpoints: Checkpoints | None = None,
                 on_checkpoint=None, on_resume=None, on_progress=None):
        self.spec, self.data, self.on_eval = validate(spec), data, on_eval
        if spec.mode != "sync":
            raise ValueError(f"SyncTrainer runs mode 'sync', got {spec.mode!r}")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != spec.cluster.workers:
            raise LaunchError(f"process group has {self.world} ranks, the run asked for cluster.workers = {spec.cluster.workers}")
        self.model = SyncModel(data.fields, spec.train)
        self.model.ec.row_norm, self.model.ec.global_batch = spec.row_grad_norm, spec.global_batch
        # data position this launch started from (a hand-over; fresh: batch 0): step s trains the
        # M batches (s - base_step) * M .. of ``reissue + [next_batch, ...]`` (ops.gba.handover)
        self.base = {"step": 0, "next_batch": 0, "reissue": [], "trace": [0] * spec.cluster.workers}
        self.handover_in: dict | None = None
        self.handover_out: dict | None = None
        self.applied: list[int] = []
        self.stream = SampleStream(data.n_train, spec.local_batch, spec.train.seed)
        torch.manual_seed(spec.train.seed * 1000 + self.rank + 1)       # dropout stream of this rank (as PS worker r)
        self.curve, self.loss_curve, self.eval_s = [], [], 0.0
        self.checkpoints = checkpoints if spec.cluster.checkpoint_every else None
        self.on_checkpoint, self.on_resume, self.on_progress = on_checkpoint, on_resume, on_progress
        self.ckpt_count, self.resumes = 0, []
        self.before = {"train_s": 0.0, "eval_s": 0.0, "ckpt_s": 0.0}

    def _checkpoint(self, step: int, train_s: float, eval_s: float, ckpt_s: float) -> None:
        """Every rank writes its state into the staged folder; rank 0 commits after a barrier."""
        ck = self.checkpoints
        samples = step * self.spec.global_batch
        folder = ck.root / f"step-{samples:012d}"
        if self.rank == 0:
            folder = ck.stage(samples)
        dist.barrier()
        state = {"net": self.model.net.state_dict(), "opt": self.model.opt.state_dict(), "rng": torch.get_rng_state(),
                 "step": step, "curve": self.curve, "loss_curve": self.loss_curve, "count": self.ckpt_count + 1,
                 "train_s": train_s, "eval_s": self.before["eval_s"] + eval_s, "ckpt_s": self.before["ckpt_s"] + ckpt_s,
                 "resumes": self.resumes, "world": self.world, "base": self.base, "handover_in": self.handover_in,
                 "applied": self.applied}
        save_state(folder, f"rank{self.rank}", state, self.model.ec)
        dist.barrier()
        self.ckpt_count += 1
        rec = {"count": self.ckpt_count, "samples": samples, "global_step": step, "optimizer_steps": step,
               "writers": [f"rank{r}" for r in range(self.world)]}
        if self.rank == 0:
            rec = ck.commit(folder, rec)
        dist.barrier()
        if self.on_checkpoint:
            self.on_checkpoint(rec)

    def _restore(self) -> int:
        """Load this rank's part of the last committed checkpoint, if any. Returns the global step to
        continue from (0: none)."""
        rec = self.checkpoints.find() if self.checkpoints is not None else None
        if rec is None:
            return self._from_handover() if self.spec.handover_from else 0
        st = load_state(self.checkpoints.folder(rec), f"rank{self.rank}", self.model.ec)
        if st["world"] != self.world:
            raise LaunchError(f"checkpoint {self.checkpoints.folder(rec)} was written by {st['world']} ranks, this launch "
                              f"has {self.world}: the sparse rows are sharded by rank")
        self.model.net.load_state_dict(st["net"])
        self.model.opt.load_state_dict(st["opt"])
        torch.set_rng_state(st["rng"])
        self.curve, self.loss_curve, self.ckpt_count = st["curve"], st["loss_curve"], st["count"]
        self.before = {"train_s": st["train_s"], "eval_s": st["eval_s"], "ckpt_s": st["ckpt_s"]}
        resumed = {"checkpoint": rec["count"], "samples": rec["samples"], "global_step": st["step"],
                   "optimizer_steps": st["step"], "reissued_batches": 0}
        self.resumes = list(st["resumes"]) + [resumed]
        self.base, self.handover_in = st.get("base", self.base), st.get("handover_in")
        self.applied = list(st.get("applied", []))
        if self.rank == 0 and self.on_resume:
            self.on_resume(resumed)
        return st["step"]

    def _from_handover(self) -> int:
        """Start from ``spec.handover_from`` (``ops.gba.handover``): this rank's rows (key % W == rank)
        with their SparseAdagrad state, dense parameters and Adam state, the RNG of worker = this rank,
        the data position. Returns the global step to continue from. Raises HandoverError."""
        folder = Path(self.spec.handover_from)
        rec = handover.read(folder)
        handover.check(rec, self.spec, self.data.n_train, folder)
        step = rec["global_step"]
        if step != int(step):
            raise handover.HandoverError(f"hand-over {folder}: global step {step} is not whole; sync continues from a "
                                         f"global-step boundary")
        handover.load_tables(folder, self.model.ec, self.rank, self.world)
        st = handover.load_state(folder)
        self.model.net.load_state_dict(st["net"])
        self.model.opt.load_state_dict(st["opt"])
        if self.rank < len(st["rng"]) and st["rng"][self.rank] is not None:
            torch.set_rng_state(st["rng"][self.rank])
        tp = list(rec["trace_position"]) + [0] * self.world
        self.base = {"step": int(step), "next_batch": rec["next_batch"], "reissue": list(rec["reissue"]),
                     "trace": tp[:self.world]}
        self.handover_in = {"folder": str(folder), "from_mode": rec["from_mode"], "global_step": step,
                            "next_batch": rec["next_batch"], "reissue": list(rec["reissue"])}
        return int(step)

    def step_batches(self, s: int) -> list[int]:
        """The M local batch numbers global step ``s`` trains (rank r takes the r-th W-th of them)."""
        b, M = self.base, self.spec.local_batches_per_step
        return handover.batches(b["next_batch"], b["reissue"], (s - b["step"]) * M, M)

    def _write_handover(self, step: int) -> dict:
        """Every rank writes its rows into ``spec.handover_to`` (one reshardable file per rank, rows
        key % W == rank); rank 0 writes the manifest, the dense state with every rank's RNG and, last,
        the record. A collective. Returns the record."""
        from ops.sparse.checkpoint import save_shard, write_manifest

        folder = Path(self.spec.handover_to)
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        entry = save_shard(self.model.ec, folder, self.rank, self.world, prefix=handover.TABLES)
        got = [None] * self.world
        dist.all_gather_object(got, (entry, torch.get_rng_state()))
        rec = None
        if self.rank == 0:
            write_manifest(folder, [e for e, _ in got], prefix=handover.TABLES)
            b, M, share = self.base, self.spec.local_batches_per_step, self.spec.local_batches_per_step // self.world
            nb, re = handover.advance(b["next_batch"], b["reissue"], (step - b["step"]) * M)
            rec = handover.write(folder, self.spec, net=self.model.net.state_dict(), opt=self.model.opt.state_dict(),
                                 rng=[r for _, r in got], global_step=step, optimizer_steps=step, next_batch=nb,
                                 reissue=re, trace_position=[t + (step - b["step"]) * share for t in b["trace"]],
                                 n_train=self.data.n_train, writers=[f"rank{r}" for r in range(self.world)])
        got = [rec]
        dist.broadcast_object_list(got, src=0)
        return got[0]

    def _evaluate(self, step: int, train_s: float) -> float:
        """Test metrics at global step ``step`` (every rank predicts: the lookups are collectives;
        rank 0 scores). Returns the seconds it took."""
        t = time.perf_counter()
        scores = self.model.predict(self.data.test)
        if self.rank == 0:
            m = metrics(self.data.y_test, scores)
            point = {"mode": "sync", "global_step": step, "samples": step * self.spec.global_batch, "train_s": train_s, **m}
            self.curve.append(point)
            if self.on_eval:
                self.on_eval(point)
        return time.perf_counter() - t

    def run(self) -> dict:
        spec, W, r = self.spec, self.world, self.rank
        G, M = spec.global_batch, spec.local_batches_per_step
        share = M // W
        steps = spec.global_steps(self.data.n_train)
        if spec.stop_at:
            steps = min(steps, spec.stop_at)
        start = self._restore()
        if start == self.base["step"] and not self.resumes:
            self._evaluate(start, 0.0)
        every = spec.cluster.checkpoint_every if self.checkpoints is not None else 0
        dist.barrier()
        if self.on_progress:
            self.on_progress(0)
        t0, eval_s, ckpt_s = time.perf_counter(), 0.0, 0.0
        clock = lambda: self.before["train_s"] + time.perf_counter() - t0 - eval_s - ckpt_s  # noqa: E731
        for s in range(start, steps):
            nums = self.step_batches(s)
            self.applied.extend(nums)
            idx = torch.cat([self.stream.indices(n) for n in nums[r * share:(r + 1) * share]])
            k0 = self.base["trace"][r] + (s - self.base["step"]) * share
            extra = [spec.trace.passes(r, k0 + j, W) - 1 for j in range(share)]
            bce = self.model.backward(take(self.data.train, idx), self.data.y_train[idx], extra, spec.local_batch)
            loss = self.model.reduce_and_apply(bce, len(idx), G)
            self.loss_curve.append([(s + 1) * G, loss])
            if self.on_progress:
                self.on_progress(G)
            if (s + 1) % spec.cluster.eval_every == 0 or s + 1 == steps:
                eval_s += self._evaluate(s + 1, clock())
            if every and (s + 1) % every == 0 and s + 1 < steps:
                t = time.perf_counter()
                self._checkpoint(s + 1, clock(), eval_s, ckpt_s)
                ckpt_s += time.perf_counter() - t
        train_s = clock()
        if spec.stop_at:
            self.handover_out = self._write_handover(steps)
        done = steps - self.base["step"]
        res = {
            "mode": "sync", "workers": W, "world_size": W, "trace": spec.trace.kind, "spec": json.loads(spec.to_json()),
            "hyper_parameters": hyper_parameters(spec), "global_steps_target": steps, "global_steps": steps,
            "optimizer_steps": steps, "samples_applied": steps * G, "samples_computed": done * G,
            "gradients": asdict(GradientCounts(pushed=done * M, applied=done * M)),
            "staleness_histogram": {0: done * M}, "staleness_unit": "global steps",
            "batches_by_worker": {f"worker{w}": done * share for w in range(W)}, "lost_workers": [], "failure": None,
            "start_global_step": self.base["step"], "batches_applied": self.applied,
            "handover": {"from": self.handover_in, "to": self.handover_out},
            "curve": self.curve, "loss_curve": self.loss_curve, "final": self.curve[-1] if self.curve else None,
            "eval_seconds": self.before["eval_s"] + eval_s, "backend": dist.get_backend(), "exchange": self.model.ec.x.mode,
            "checkpoints": {"every_global_steps": every, "written": self.ckpt_count,
                            "seconds": self.before["ckpt_s"] + ckpt_s, "resumes": self.resumes},
        }
        return report.finish(res, done * G, train_s, spec.cluster.target_auc)


def run(spec: RunSpec, out: Path, fp: str, pipes) -> dict | None:
    """One rank of a sync launch (the ``run`` of ``ops.launch.worker_main``): check the world the
    launcher started, train from the last checkpoint under ``out`` (if any), report through
    ``pipes`` on rank 0. Returns the result on rank 0 (its checkpoints removed: the result is the
    record), None on the other ranks. Raises LaunchError for a world other than ``cluster.workers``
    ranks, CheckpointError for an unreadable checkpoint."""
    from accelerate import PartialState

    from ops.progress import Progress

    from .checkpoint import crash_if_asked, fingerprint
    from .data import load

    torch.set_num_threads(spec.cluster.threads)
    timeout = datetime.timedelta(seconds=spec.cluster.rpc_timeout_s)
    state = PartialState(cpu=True, timeout=timeout)       # the sparse engine keeps its tables in CPU memory
    dtype = str(state.distributed_type).split(".")[-1]
    check_launch(state.num_processes, dtype, spec.cluster.workers)
    own_group = not dist.is_initialized()
    if own_group:                                         # a single rank: a world-1 gloo group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    try:
        def on_eval(point: dict) -> None:
            pipes.report_custom_message(point)
            pipes.log.info(f"sync: global step {point['global_step']}, {point['train_s']:.1f} s, test AUC {point['auc']:.4f}")

        data = load(spec.events_path, spec.train.crosses, spec.data_cache)
        ckpts = Checkpoints(out, fingerprint(spec))
        retry = getattr(pipes, "retry_number", "n/a")
        steps = spec.global_steps(data.n_train)
        total = (min(steps, spec.stop_at) if spec.stop_at else steps) * spec.global_batch
        start = 0
        if spec.handover_from:                            # the hand-over's samples are not this launch's
            from .handover import read

            start = int(read(spec.handover_from)["samples"])
        prog: dict = {"line": None, "done": start, "label": "sync: training"}

        def on_progress(n: int) -> None:                  # 0 once when the training loop starts
            if prog["line"] is None:
                prog["line"] = Progress(total - prog["done"], prog["label"], pipes.log.info, unit="samples")
            if n:
                prog["line"].update(n)

        rank0 = state.process_index == 0
        quiet = lambda _line: None  # noqa: E731

        def on_checkpoint(rec: dict) -> None:            # every rank
            if rank0:
                pipes.log.info(f"sync: checkpoint {rec['count']} at global step {rec['global_step']}")
            crash_if_asked(rec["count"], pipes.log.info if rank0 else quiet)

        def on_resume(r: dict) -> None:
            pipes.log.info(f"sync: resuming from checkpoint {r['checkpoint']} at global step {r['global_step']} "
                           f"({r['samples']} of {total} samples applied) on Dagster retry {retry}")
            prog.update(done=r["samples"], label=f"sync: training (resumed at global step {r['global_step']})")

        if rank0 and ckpts.find() is None and ckpts.skipped:
            pipes.log.warning(f"sync: {ckpts.skipped}")
        res = SyncTrainer(spec, data, on_eval=on_eval, checkpoints=ckpts, on_checkpoint=on_checkpoint,
                          on_resume=on_resume, on_progress=on_progress if rank0 else None).run()
        if not rank0:
            return None
        res.update(distributed_type=dtype, launcher="accelerate launch" if "ACCELERATE_DYNAMO_BACKEND" in os.environ
                   else "torch.distributed.run")
        pipes.log.info(f"sync: {res['optimizer_steps']} global steps on {res['world_size']} ranks ({dtype}), "
                       f"{res['samples_per_s']:.0f} samples/s, final AUC {res['final']['auc']:.4f}")
        return res
    finally:
        if own_group:       # a launch's group is the launch's: its ranks leave through ops.launch.exit_worker
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """One rank of a sync launch: ``python -m ops.gba.launch_sync --spec SPEC --out DIR
    [--fingerprint FP]`` on every rank (``ops.launch.worker_main``; rank 0 writes ``result.json``)."""
    from ops.launch import worker_main

    return worker_main(load_spec, run, argv, description=__doc__, scratch=("checkpoints",))
