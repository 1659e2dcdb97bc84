"""The training loop of the LM substrate: one data-parallel causal-LM loop with checkpoints and resume.

A worker builds its model and optimizer, wraps them in a ``Trainer`` with its batches and loss, and
composes ``train`` (optimizer steps up to a step), ``evaluate`` (a hook on the unwrapped model in
eval mode, no gradients), ``save`` (a checkpoint) and ``finish`` (the checkpoint removed once the
run is published). Each optimizer step takes the global batch of ``MixedBatches``, gives each rank
its slice, and runs backward, gradient clipping (norm 1.0), AdamW and the learning-rate schedule
(accelerate data parallel: gloo on CPU, NCCL on GPU). A checkpoint holds model, optimizer,
scheduler, step, every rank's RNG state, the data position and the run's history; a run resumed from
it reaches the result of an uninterrupted run (docs/mixture.md, "Probe grid"; docs/posttrain.md,
"Stage-1 SFT").
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .checkpoint import LMState, rng_state, set_rng_state


class SimulatedCrash(RuntimeError):
    """Raised after a checkpoint when a fault-injection variable asks for it (``crash_if_asked``)."""


def crash_if_asked(env_var: str, reached: int, unit: str, what: str, log: Callable[[str], None], *,
                   since: int = 0, kill: Optional[Callable[[], None]] = None) -> None:
    """Fault injection of the resume tests: when ``env_var`` holds N (``ops.launch.crash_after``) with
    ``since`` < N <= ``reached`` (``reached``: ``unit`` saved now; ``since``: what the checkpoint
    held when this launch started, so a relaunch that resumed at or past N is not stopped again),
    stop like a dead launch: ``kill()`` (``DataParallel.kill_launch``: SIGKILL, as a preemption
    would) or, without it, raise ``SimulatedCrash``. Nothing happens when the variable is unset."""
    from ops.launch import crash_after

    n = crash_after(env_var, unit)
    if n is None or not since < n <= reached:
        return
    log(f"{what}: fault injection ({env_var}={n}): simulated crash after {reached} {unit}")
    if kill is not None:
        kill()
    raise SimulatedCrash(f"{what}: simulated crash after {reached} {unit}")


def check_global_batch(global_batch: int, processes: Optional[int]) -> None:
    """Raise ValueError when ``global_batch`` (sequences per optimizer step) does not split evenly
    over ``processes`` ranks (None: not known yet, nothing checked)."""
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    if processes is not None and global_batch % processes:
        raise ValueError(f"global_batch {global_batch} is not a multiple of compute.num_processes {processes}")


@dataclass
class DataParallel:
    """The ranks of one launch (``ops.launch.data_parallel``): the accelerate ``Accelerator``, world
    size, this rank and its share of the global batch (``local_batch`` sequences)."""

    acc: Any
    """The accelerate ``Accelerator`` of this process."""
    world: int
    """World size: the number of ranks (processes) of the launch."""
    rank: int
    """This process's rank, in [0, world)."""
    local_batch: int
    """This rank's share of the global batch (sequences per optimizer step: global batch / world)."""
    launcher_group: Optional[int] = None
    """Process group id of the accelerate/torchrun launcher (None: not started by one), which
    ``kill_launch`` kills."""
    is_solo: bool = False
    """True for ``solo()``'s view: this rank trains a run alone (world 1, the whole global batch,
    no gradient all-reduce), while the launch's other ranks train other runs."""

    @classmethod
    def start(cls, global_batch: int) -> "DataParallel":
        """The Accelerator of this process, the global batch split over the ranks. Raises
        ValueError when ``global_batch`` is not a multiple of the number of processes."""
        from ops.launch import data_parallel

        # under accelerate/torchrun each rank has its own session: the launch is the launcher's
        # process group, recorded now while the launcher is surely this rank's parent
        group = os.getpgid(os.getppid()) if "TORCHELASTIC_RUN_ID" in os.environ else None
        return cls(*data_parallel(global_batch), launcher_group=group)

    def solo(self) -> "DataParallel":
        """This rank as a world of its own: world 1, rank 0, ``local_batch`` = the global batch; the
        model is not wrapped for data parallelism, so training exchanges no gradients and ``barrier``
        and the sums are local. Used to train independent runs on different ranks of one launch
        (``ops.mixture.probe``, parallelism "runs"). ``kill_launch`` still kills the whole launch."""
        import dataclasses

        return dataclasses.replace(self, world=1, rank=0, local_batch=self.local_batch * self.world, is_solo=True)

    def prepare(self, model, optimizer):
        """``(model, optimizer)`` ready to train: accelerate's ``prepare`` (data-parallel wrapper),
        or for a solo rank the model moved to this rank's device with the optimizer's state following."""
        if not self.is_solo:
            return self.acc.prepare(model, optimizer)
        model.to(self.acc.device)
        optimizer.load_state_dict(optimizer.state_dict())        # casts Adam moments to the parameters' device
        return model, optimizer

    def backward(self, loss) -> None:
        if self.is_solo:
            loss.backward()
        else:
            self.acc.backward(loss)

    def clip_grad_norm_(self, parameters, max_norm: float):
        """Clip the global gradient norm to ``max_norm`` (accelerate's, or torch's for a solo rank)."""
        if self.is_solo:
            import torch

            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return self.acc.clip_grad_norm_(parameters, max_norm)

    def kill_launch(self) -> None:
        """SIGKILL the whole launch, as a node preemption would: the launcher's process group (when
        started by accelerate/torchrun), then this process."""
        import signal

        if self.launcher_group is not None:
            try:
                os.killpg(self.launcher_group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    def describe(self) -> dict:
        """``{"world_size", "distributed_type"}`` (what a worker records in ``launch.json``)."""
        return {"world_size": self.world, "distributed_type": str(self.acc.distributed_type)}

    def record(self, folder) -> None:
        """Rank 0 writes ``describe()`` to ``<folder>/launch.json`` (atomically)."""
        if self.rank == 0:
            from pathlib import Path

            from ops.lake import write_json_atomic

            write_json_atomic(self.describe(), Path(folder) / "launch.json", indent=1)

    def local(self, rows: np.ndarray) -> np.ndarray:
        """This rank's slice of a global batch (rows ``rank * local_batch`` onwards)."""
        return rows[self.rank * self.local_batch:(self.rank + 1) * self.local_batch]

    def barrier(self) -> None:
        if not self.is_solo:
            self.acc.wait_for_everyone()

    def all_sum(self, tensor):
        """``tensor`` summed over the ranks, in place."""
        if self.world > 1:
            import torch

            torch.distributed.all_reduce(tensor)
        return tensor

    def gather(self, rows: list) -> list:
        """Every rank's ``rows`` (picklable), concatenated in rank order, on every rank."""
        if self.world == 1:
            return rows
        import torch

        parts = [None] * self.world
        torch.distributed.all_gather_object(parts, rows)
        return [r for p in parts for r in p]

    def unwrap(self, model):
        return model if self.is_solo else self.acc.unwrap_model(model)


# --------------------------------------------------------------------------- optimizer and schedules


def adamw(model, lr: float, weight_decay: float, init_state=None):
    """AdamW over ``model``'s parameters. ``init_state``: an ``optimizer.pt`` to continue from (its
    Adam moments), with the learning rate reset to ``lr``; ignored when None or missing."""
    from pathlib import Path

    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    if init_state is not None and Path(init_state).exists():
        opt.load_state_dict(torch.load(init_state, map_location="cpu", weights_only=False))
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] = lr
    return opt


def lambda_lr(optimizer, multiplier: Callable[[int], float]):
    """``torch.optim.lr_scheduler.LambdaLR`` with ``multiplier`` (``ops.lm.schedule.LrSchedule.multiplier``)."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


# --------------------------------------------------------------------------------------------- losses


def token_mean_loss(model, ids, mask):
    """Mean next-token cross-entropy (nats/token) over every token of the batch (transformers'
    causal-LM loss, ``labels = ids``); ``mask`` is not used: every token of a corpus block counts."""
    return model(input_ids=ids, labels=ids).loss


def sequence_loss(logits, ids, mask):
    """Mean over sequences of the per-sequence mean cross-entropy on loss tokens (nats).

    logits (B, T, V), ids (B, T) int64, mask (B, T) float: mask[t] = 1 when token t carries loss
    (predicted from position t - 1). Sequences without a loss token count zero.
    """
    import torch.nn.functional as F

    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none")
    ce = ce.view(ids.size(0), -1)
    m = mask[:, 1:]
    per_seq = (ce * m).sum(1) / m.sum(1).clamp(min=1.0)
    return per_seq.mean()


def sequence_mean_loss(model, ids, mask):
    """``sequence_loss`` of ``model``'s logits: every sequence weighs equally, within a sequence
    the loss tokens do (the SFT loss, docs/posttrain.md "Student and data")."""
    return sequence_loss(model(input_ids=ids).logits, ids, mask)


# ----------------------------------------------------------------------------------------- the loop


@contextmanager
def evaluating(model) -> Iterator[Any]:
    """``model`` in eval mode without gradients for the block; back in train mode after it."""
    import torch

    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train()


class Trainer:
    """One training run on the ranks of ``dp`` (see the module docstring).

    Args:
        dp: the ranks.
        model, optimizer, scheduler: built by the worker (not yet prepared); when ``state`` holds a
            checkpoint of this run, their states, the RNG, the data position, ``step`` and
            ``history`` are restored from it before accelerate prepares model and optimizer.
        batches: ``ops.lm.data.MixedBatches`` (global batches by step).
        loss: ``loss(model, ids, mask)`` -> scalar tensor (``token_mean_loss``, ``sequence_mean_loss``).
        state: where checkpoints go (``ops.lm.checkpoint.LMState``); None = no checkpoints.
        history: the run's record at step 0 (JSON), replaced by the saved one on a resume.
        name: the run's name in log lines and errors.
        log: where log lines go (rank 0's ``pipes.log.info``).
    Attributes:
        step: optimizer steps done; resumed_from: the step a checkpoint restored (None: none).
    """

    def __init__(self, dp: DataParallel, model, optimizer, scheduler, batches, loss: Callable, *,
                 state: Optional[LMState] = None, history: Any = None, name: str = "run",
                 log: Callable[[str], None] = print, clip_norm: float = 1.0):
        import torch

        self.dp, self.scheduler, self.batches, self.loss = dp, scheduler, batches, loss
        self.state, self.history, self.name, self.log, self.clip_norm = state, history, name, log, clip_norm
        self.step, self.resumed_from = 0, None
        if state is not None and state.load():
            saved = torch.load(state.dir / state.model_file, map_location="cpu", weights_only=False)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            if dp.rank < len(state.rng_files) and (state.dir / state.rng_files[dp.rank]).exists():
                set_rng_state(torch.load(state.dir / state.rng_files[dp.rank], map_location="cpu", weights_only=False))
            batches.seek(state.data)
            self.step = self.resumed_from = state.step
            self.history = state.history
            state.resumes.append({"step": state.step})
            log(f"{name}: resumed at step {state.step}")
        elif state is not None and state.skipped:
            log(f"{name}: {state.skipped}; starting from step 0")
        self.model, self.optimizer = dp.prepare(model, optimizer)

    @property
    def unwrapped(self):
        """The model without its data-parallel wrapper."""
        return self.dp.unwrap(self.model)

    def train(self, stop: int, on_step: Optional[Callable[[int, float], None]] = None) -> None:
        """Optimizer steps ``step`` .. ``stop - 1``; ``on_step(steps_done, loss)`` after each (the
        loss of this rank's slice, nats). Raises FloatingPointError on a non-finite loss."""
        import torch

        self.model.train()
        for step in range(self.step, stop):
            ids, mask = self.batches.take(step)
            x = torch.from_numpy(np.ascontiguousarray(self.dp.local(ids))).to(self.dp.acc.device)
            mk = torch.from_numpy(np.ascontiguousarray(self.dp.local(mask))).to(self.dp.acc.device)
            loss = self.loss(self.model, x, mk)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{self.name}: non-finite training loss {loss.item()} at step {step}")
            self.dp.backward(loss)
            self.dp.clip_grad_norm_(self.model.parameters(), self.clip_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step = step + 1
            if on_step is not None:
                on_step(self.step, float(loss.detach()))

    def log_loss(self, loss: float, every: int, last: int, curve: str = "curve") -> Optional[dict]:
        """The logged training loss, averaged over a window (call from ``on_step``): ``loss`` joins
        ``history["window"]``; at every ``every``-th step and at step ``last`` the point ``{"step",
        "loss": the window's mean (nats), "lr": the scheduler's current rate}`` is appended to
        ``history[curve]``, the window restarts and the point is returned; None between."""
        h = self.history
        h["window"].append(loss)
        if self.step % every and self.step != last:
            return None
        point = {"step": self.step, "loss": float(np.mean(h["window"])), "lr": self.scheduler.get_last_lr()[0]}
        h["window"] = []
        h[curve].append(point)
        return point

    def evaluate(self, hook: Callable[[Any], Any]) -> Any:
        """``hook(model)`` on the unwrapped model in eval mode without gradients (every rank calls
        it; the hook sums or gathers over ``dp``)."""
        with evaluating(self.unwrapped) as m:
            return hook(m)

    def save(self) -> None:
        """Checkpoint at ``step``: each rank saves its RNG state, then rank 0 the model, optimizer
        and scheduler and commits ``state.json`` (with ``history`` and the data position); every
        rank waits for the commit. Nothing when the trainer has no ``state``."""
        if self.state is None:
            return
        import torch

        from ops.lake import atomic_path

        t0 = time.monotonic()
        rng_files = [f"rng-{self.step:08d}-rank{r}.pt" for r in range(self.dp.world)]
        with atomic_path(self.state.dir / rng_files[self.dp.rank]) as tmp:
            torch.save(rng_state(), tmp)
        self.dp.barrier()
        if self.dp.rank == 0:
            model_file = f"step-{self.step:08d}.pt"
            with atomic_path(self.state.dir / model_file) as tmp:
                torch.save({"model": self.unwrapped.state_dict(), "optimizer": self.optimizer.state_dict(),
                            "scheduler": self.scheduler.state_dict()}, tmp)
            st = self.state
            st.step, st.history, st.data, st.model_file, st.rng_files = (self.step, self.history, self.batches.position(),
                                                                          model_file, rng_files)
            st.commit(t0, keep_files={model_file, *rng_files})
        self.dp.barrier()

    def finish(self) -> None:
        """Remove the run's checkpoint (rank 0; the run is published, its record is the result)."""
        if self.state is not None and self.dp.rank == 0:
            shutil.rmtree(self.state.dir, ignore_errors=True)
            try:
                self.state.dir.parent.rmdir()                # the run's folder, when nothing else is in it
            except OSError:
                pass
        self.dp.barrier()
