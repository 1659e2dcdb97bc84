"""What one GBA comparison run is (torch-free, so the Dagster asset reads it at load time).

One ``RunSpec`` per launch: the training ``mode``, the hyper-parameters (``train``, one
``TrainConfig`` shared by every mode), the cluster shape, the mode policies and the straggler trace.
Switching a run between modes is ``spec.with_mode("gba")``: it changes the mode and nothing else,
which is the GBA paper's claim made structural (arXiv 2205.11048 §1, §3: switching between
synchronous all-reduce and GBA needs no hyper-parameter change).

Field terms (GBA paper §3): the **global batch** G = ``train.batch_size`` samples make one
synchronous optimizer step; a worker computes one gradient over a **local batch** of b =
``local_batch`` samples, so a global step aggregates M = G / b local batches; a **token** is the
global step a worker pulled its parameters at; **staleness** tau = global step at push - token.

The ``gba_run`` asset's Launchpad config mirrors ``RunSpec`` field for field, nested parts as nested
config (``assets._config.fields_of``; defaults ``JOB``'s): the user sets ``policy.decay.threshold``
and an error names ``policy.decay.threshold``. The asset builds the mode's spec from it and validates
it (``RunSpec.validate``), the asset's one check; ``load_spec`` is the launched process's one check
(docs/gba.md, docs/architecture.md "Configuration").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ops.lm.spec import JsonSpec
from ops.sparse.config import TrainConfig

from .errors import GBAConfigError
from .staleness import StalenessDecay
from .switching import SwitchAt, Switching
from .trace import StragglerTrace

__all__ = ["MODES", "ROW_GRAD_NORMS", "ROW_STALENESS", "GLOBAL_BATCH", "LOCAL_BATCH", "GBAConfigError", "Policy", "Cluster", "RunSpec", "JOB",
           "SwitchAt", "Switching", "hyper_parameters", "load_spec", "validate"]

ROW_GRAD_NORMS = ("occurrences", "global_batch")
"""How an embedding row's gradient is averaged (docs/gba.md, "Two choices"): ``occurrences`` = the
row's summed gradient / the samples of the update that contain its ID (``ops.gba.aggregate``, the
default); ``global_batch`` = / the samples of the update (G in sync and GBA: the conventional
data-parallel mean of the batch loss)."""
ROW_STALENESS = ("global", "per_row")
"""How GBA's staleness is counted for embedding rows (``Policy.row_staleness``)."""

MODES = ("sync", "async", "gba", "ssp", "hopbw", "auto")
"""sync: all-reduce data parallel; async: plain async PS; gba: global batch aggregation with token
control; ssp: stale synchronous parallel (bounded staleness); hopbw: backup workers; auto: one PS
run that starts synchronous (lock-step on the PS) and switches to ``switching.target`` when the
straggler detector fires, or per ``switching.schedule`` (``ops.gba.switching``)."""


GLOBAL_BATCH = 512
"""G of a run unless configured: samples per synchronous optimizer step (2 local batches)."""
LOCAL_BATCH = 256
"""b of a run unless configured: samples per worker gradient."""


@dataclass(frozen=True)
class Policy:
    """The knobs that define each mode (not model hyper-parameters: they never change the optimizer)."""

    decay: StalenessDecay = field(default_factory=StalenessDecay)
    """GBA's staleness decay f(tau) (token control, GBA §3.2); see ``StalenessDecay``. Any callable
    ``int -> [0, 1]`` works in-process; launched runs serialize a StalenessDecay."""
    ssp_bound: int = 3
    """SSP's staleness bound s, in local batches (>= 0; Ho et al., NeurIPS 2013): a worker may run at most
    s local batches ahead of the slowest live worker; beyond that its pull waits."""
    backup_workers: int = 1
    """Hop-BW's backup workers, in [0, W) (Chen et al. 2016, "Revisiting distributed synchronous SGD";
    Luo et al., ASPLOS 2019, Hop): each global step waits for W - backup_workers workers, drops the rest."""
    row_staleness: str = "global"
    """How GBA measures the staleness of an embedding row's gradient (``ROW_STALENESS``; docs/gba.md,
    "Two choices"): ``global`` = the gradient's one staleness tau (global steps since its token) decays
    every row it carries (the paper's token, GBA §3.2); ``per_row`` = each row is decayed by f of the
    number of optimizer steps since the token that updated that row (a row nobody updated since the pull
    is fresh). Dense parameters always use the global tau."""


@dataclass(frozen=True)
class Cluster:
    """Processes, timeouts and reporting of a run."""

    workers: int = 2
    """W worker processes, >= 1 (PS modes add the parameter-server processes; sync runs W ranks)."""
    rpc_timeout_s: float = 30.0
    """Timeout of every RPC (torch.distributed.rpc) and collective (gloo), in s (> 0)."""
    wait_timeout_s: float = 60.0
    """Longest a worker may wait for permission to pull (SSP, Hop-BW) or for the start, in s (> 0); past
    it the worker fails with an error naming the wait."""
    start_timeout_s: float = 120.0
    """How long the RPC world (PS + every worker) may take to assemble, in s (> 0); a process whose world
    is not up by then exits with an error (so does a worker whose PS died)."""
    stop_timeout_s: float = 30.0
    """How long the PS waits at the end for live workers to collect their stop, in s (> 0)."""
    run_timeout_s: float = 600.0
    """Wall-clock limit of the training loop, in s (> 0; the launch adds its own limit)."""
    eval_every: int = 16
    """Evaluate the test AUC every this many global steps, >= 1 (in samples: eval_every x G)."""
    target_auc: float = 0.68
    """The test AUC whose first crossing gives "time to target"."""
    threads: int = 1
    """torch intra-op threads per process (also its OMP_NUM_THREADS)."""
    checkpoint_every: int = 16
    """Write a checkpoint every this many global steps, >= 0 (in samples: checkpoint_every x G;
    ``ops.gba.checkpoint``); a relaunch with the same run directory resumes from the last one. 0 = never."""
    num_ps: int = 1
    """Parameter-server processes of PS modes (>= 1; 1 = one PS holds all): sparse tables are sharded by ID
    over them (owner = namespaced id % num_ps); process 0 also holds the dense parameters and token control."""


@dataclass(frozen=True)
class RunSpec(JsonSpec):
    """One run: mode + hyper-parameters + cluster + policies + straggler trace (the GBA stage's spec;
    JSON in and out through ``JsonSpec``)."""

    mode: str = "gba"
    """Training mode, one of ``MODES``: sync | async | gba | ssp | hopbw | auto."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=GLOBAL_BATCH, epochs=1))
    """The one set of hyper-parameters every mode uses (``ops.sparse.config.TrainConfig``): ``batch_size``
    is the global batch G, ``epochs`` the passes over the train split (in applied samples)."""
    local_batch: int = LOCAL_BATCH
    """b: samples per worker gradient (>= 1); G must be a multiple (sync, Hop-BW, auto: of W x b)."""
    cluster: Cluster = field(default_factory=Cluster)
    """Processes, timeouts and reporting cadence (``Cluster``)."""
    policy: Policy = field(default_factory=Policy)
    """The mode policies: GBA's staleness decay, SSP's bound, Hop-BW's backup workers (``Policy``)."""
    trace: StragglerTrace = field(default_factory=StragglerTrace)
    """The seeded straggler trace every mode replays (``StragglerTrace``)."""
    switching: Switching = field(default_factory=Switching)
    """Mode ``auto`` only: the detector's rule and target, or a switch schedule."""
    events_path: str = ""
    """Parquet of CTR events with a ``split`` column (the ``ctr_events`` table)."""
    data_cache: str = ""
    """Folder for the encoded tensors shared by the processes of every run ("" = encode each time)."""
    row_grad_norm: str = "occurrences"
    """Denominator of embedding-row gradients, one of ``ROW_GRAD_NORMS``; the same rule in every mode
    (a hyper-parameter: ``hyper_parameters`` records it)."""
    stop_at: int = 0
    """Stop after this many global steps and write the mode-independent hand-over to ``handover_to``
    (``ops.gba.handover``; a switch between the all-reduce and the PS launch). 0 = train to the end."""
    handover_to: str = ""
    """Folder the hand-over is written to when the run stops at ``stop_at`` (required then)."""
    handover_from: str = ""
    """Hand-over folder to start from ("" = start fresh): dense weights, Adam state, every embedding row
    with its SparseAdagrad state, global step, data position, per-worker RNG (``ops.gba.handover``)."""

    @property
    def global_batch(self) -> int:
        return self.train.batch_size

    @property
    def local_batches_per_step(self) -> int:
        """M = G / b local batches per global step."""
        return self.global_batch // self.local_batch

    def with_mode(self, mode: str) -> RunSpec:
        """The same run in another mode: every hyper-parameter (``train``, ``local_batch``), the
        cluster and the trace are shared, not copied. Raises GBAConfigError for an unknown mode."""
        if mode not in MODES:
            raise GBAConfigError(f"mode must be one of {MODES}, got {mode!r}")
        return dataclasses.replace(self, mode=mode)

    def global_steps(self, n_train: int) -> int:
        """Global steps of the run: floor(epochs x train rows / G), at least 1."""
        return max(1, int(self.train.epochs * n_train) // self.global_batch)

    def validate(self) -> RunSpec:
        """``validate(self)``: returns the spec, raises GBAConfigError naming the field's path."""
        return validate(self)


JOB = RunSpec(trace=StragglerTrace(kind="persistent"))
"""The job the ``gba_run`` asset offers by default (its Launchpad defaults): ``RunSpec``'s defaults
with one persistent straggler (``StragglerTrace.slowdown`` x slower, the last worker), the situation
the modes are compared in (GBA paper §5.2). The partition sets ``mode``; ``cluster.workers`` left
unset in the Launchpad is the launcher's process count."""


def load_spec(text: str) -> RunSpec:
    """The RunSpec of a spec file's text (``RunSpec.to_json``), validated: what a launched process
    runs. Raises GBAConfigError naming the field, ValueError / KeyError for text that is not a spec."""
    return RunSpec.from_json(text)


def hyper_parameters(spec: RunSpec) -> dict:
    """The hyper-parameters a run trains with, as every trainer (sync ranks and the parameter
    server) records them: a function of ``spec.train`` and ``spec.local_batch`` only, never of the
    mode. Two runs of one job in different modes report equal dicts."""
    t = spec.train
    return {"global_batch": t.batch_size, "local_batch": spec.local_batch, "epochs": t.epochs, "dim": t.dim,
            "hidden": list(t.hidden), "dropout": t.dropout, "sparse_optimizer": "SparseAdagrad", "sparse_lr": t.sparse_lr,
            "dense_optimizer": "Adam", "dense_lr": t.dense_lr, "emb_l2": t.emb_l2, "crosses": list(t.crosses),
            "coalesce": t.coalesce, "seed": t.seed, "row_grad_norm": spec.row_grad_norm}


def validate(spec: RunSpec) -> RunSpec:
    """Check a spec before anything starts. Returns it; raises GBAConfigError naming the field:
    unknown mode, workers < 1, non-positive batches, global batch not a multiple of the local
    batch, sync/Hop-BW global batch not divisible into W equal shares of local batches, backup
    workers not in [0, W), negative SSP bound, non-positive timeouts or eval cadence, negative
    checkpoint cadence, bad trace."""
    if spec.mode not in MODES:
        raise GBAConfigError(f"mode must be one of {MODES}, got {spec.mode!r}")
    c, t = spec.cluster, spec.train
    if c.workers < 1:
        raise GBAConfigError(f"cluster.workers must be >= 1 (a run needs at least one worker), got {c.workers}")
    if spec.local_batch < 1:
        raise GBAConfigError(f"local_batch must be >= 1, got {spec.local_batch}")
    if t.batch_size < 1:
        raise GBAConfigError(f"train.batch_size (the global batch) must be >= 1, got {t.batch_size}")
    if t.batch_size % spec.local_batch:
        raise GBAConfigError(f"train.batch_size (global batch {t.batch_size}) must be a multiple of local_batch "
                             f"({spec.local_batch}): a global step aggregates whole local batches")
    if t.epochs <= 0:
        raise GBAConfigError(f"train.epochs must be > 0, got {t.epochs}")
    m = spec.local_batches_per_step
    if spec.mode in ("sync", "hopbw", "auto") and m % c.workers:
        raise GBAConfigError(f"mode {spec.mode!r}: the global batch ({t.batch_size} = {m} local batches of {spec.local_batch}) "
                             f"must split evenly over cluster.workers ({c.workers}): need train.batch_size to be a "
                             f"multiple of workers x local_batch = {c.workers * spec.local_batch}")
    if c.num_ps < 1:
        raise GBAConfigError(f"cluster.num_ps must be >= 1 parameter-server process, got {c.num_ps}")
    if spec.mode == "auto":
        spec.switching.check()
    hop = spec.mode == "hopbw" or (spec.mode == "auto" and "hopbw" in (spec.switching.target,
                                                                       *(t for _, t in spec.switching.schedule)))
    if hop and not 0 <= spec.policy.backup_workers < c.workers:
        raise GBAConfigError(f"policy.backup_workers must be in [0, workers={c.workers}), got {spec.policy.backup_workers}")
    if spec.policy.ssp_bound < 0:
        raise GBAConfigError(f"policy.ssp_bound must be >= 0, got {spec.policy.ssp_bound}")
    for name in ("rpc_timeout_s", "wait_timeout_s", "start_timeout_s", "stop_timeout_s", "run_timeout_s"):
        if getattr(c, name) <= 0:
            raise GBAConfigError(f"cluster.{name} must be > 0 (every wait has a timeout), got {getattr(c, name)}")
    if c.eval_every < 1:
        raise GBAConfigError(f"cluster.eval_every must be >= 1 global step, got {c.eval_every}")
    if c.checkpoint_every < 0:
        raise GBAConfigError(f"cluster.checkpoint_every must be >= 0 global steps (0: no checkpoints), got {c.checkpoint_every}")
    spec.trace.check(c.workers)
    spec.policy.decay.check()
    if spec.row_grad_norm not in ROW_GRAD_NORMS:
        raise GBAConfigError(f"row_grad_norm must be one of {ROW_GRAD_NORMS}, got {spec.row_grad_norm!r}")
    if spec.policy.row_staleness not in ROW_STALENESS:
        raise GBAConfigError(f"policy.row_staleness must be one of {ROW_STALENESS}, got {spec.policy.row_staleness!r}")
    if spec.stop_at < 0:
        raise GBAConfigError(f"stop_at must be >= 0 global steps (0: train to the end), got {spec.stop_at}")
    if spec.stop_at and not spec.handover_to:
        raise GBAConfigError(f"stop_at = {spec.stop_at} needs handover_to, the folder the hand-over is written to")
    if spec.stop_at and spec.mode == "auto":
        raise GBAConfigError("stop_at: an auto run switches inside one launch; hand-overs are written by sync, gba, "
                             "async, ssp or hopbw runs")
    return spec
