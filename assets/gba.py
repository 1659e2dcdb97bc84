"""GBA training runs (SEEDS.md §3; Su et al., NeurIPS 2022, arXiv 2205.11048): the DeepFM CTR model
of ``ctr_model`` trained with global-batch gradient aggregation over a parameter server, and the
baselines — synchronous all-reduce, plain async PS, bounded staleness (SSP), backup workers
(Hop-BW) — under one seeded straggler trace. One partition per mode; every partition runs with the
same run config, so switching modes changes no hyper-parameter. torch loads only in the launched
processes (``ops.gba``).

Resume: each partition of a run trains in ``<lake>/gba_run/.run-<mode>-<root run id>``, one folder
per run lineage (the root run id is the run's own id, or for a re-execution or run-level retry the
id of the run it re-executes). A step retry (``RetryingComputeResource`` after a launch death), a
re-execution from failure and a run retry therefore relaunch over the same folder and continue
from its last checkpoint (``ops.gba.checkpoint``; the launched process logs the Dagster retry
number and the global step it resumes from); a new materialization starts from step 0. The folder
is removed once the partition is materialized; a launch that finished but whose step failed later
is not retrained: its result file is reused."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import dagster as dg
import polars as pl

from ops import figures
from ops.gba.checkpoint import Checkpoints, fingerprint
from ops.gba.config import MODES, Cluster, Policy, RunSpec, validate
from ops.gba.report import summarize, write_json
from ops.gba.staleness import StalenessDecay
from ops.gba.trace import StragglerTrace
from ops.sparse.config import TrainConfig
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._meta import image, md_table, table_result

gba_modes = dg.StaticPartitionsDefinition(list(MODES))

_T, _C, _P, _D, _S = TrainConfig(), Cluster(), Policy(), StalenessDecay(), StragglerTrace()


class GBARunConfig(dg.Config):
    """One configuration for every mode (the partition picks the mode; nothing else changes).
    Model hyper-parameter defaults come from ops.sparse.config.TrainConfig."""

    workers: Optional[int] = None
    """Workers W (sync: ranks; PS modes: worker processes beside the PS). None = compute.num_processes."""
    global_batch: int = 512
    """G: samples per synchronous optimizer step; GBA aggregates exactly this many."""
    local_batch: int = 256
    """b: samples per worker gradient; G must be a multiple (sync and Hop-BW: of W x b)."""
    epochs: float = 1.0
    """Passes over the train split, counted in applied samples."""
    dim: int = _T.dim
    hidden: list[int] = list(_T.hidden)
    dropout: float = _T.dropout
    sparse_lr: float = _T.sparse_lr
    dense_lr: float = _T.dense_lr
    emb_l2: float = _T.emb_l2
    crosses: list[str] = list(_T.crosses)
    seed: int = _T.seed
    straggler: str = "persistent"
    """Straggler trace: none | persistent (one worker slowdown x slower) | random (every worker, random delays)."""
    slowdown: float = _S.slowdown
    slow_worker: int = _S.slow_worker
    delay_distribution: str = _S.distribution
    """random trace: exponential | pareto extra time, as a multiple of compute time."""
    mean_extra: float = _S.mean_extra
    base_delay_ms: float = 0.0
    """Simulated compute per local batch (a sleep), every worker, every mode."""
    trace_seed: int = _S.seed
    staleness_threshold: int = _D.threshold
    """GBA: gradients with staleness above this many global steps are decayed."""
    staleness_decay: float = _D.rate
    """GBA: f(tau) = staleness_decay ** (tau - threshold) above the threshold."""
    drop_after: Optional[int] = None
    """GBA: drop gradients staler than this (None: never drop, only decay)."""
    ssp_bound: int = _P.ssp_bound
    backup_workers: int = _P.backup_workers
    eval_every: int = _C.eval_every
    """Evaluate the test AUC every this many global steps."""
    checkpoint_every: int = _C.checkpoint_every
    """Checkpoint every this many global steps (0: never); a retried launch resumes from the last one."""
    target_auc: float = _C.target_auc
    rpc_timeout_s: float = _C.rpc_timeout_s
    run_timeout_s: float = _C.run_timeout_s

    def spec(self, mode: str, workers: int, events_path: str = "", data_cache: str = "") -> RunSpec:
        """The RunSpec of ``mode``: the same hyper-parameters for every mode. Raises GBAConfigError."""
        train = TrainConfig(dim=self.dim, hidden=tuple(self.hidden), dropout=self.dropout, epochs=self.epochs,
                            batch_size=self.global_batch, sparse_lr=self.sparse_lr, dense_lr=self.dense_lr,
                            emb_l2=self.emb_l2, crosses=list(self.crosses), seed=self.seed)
        return validate(RunSpec(
            mode=mode, train=train, local_batch=self.local_batch, events_path=events_path, data_cache=data_cache,
            cluster=Cluster(workers=workers, rpc_timeout_s=self.rpc_timeout_s, run_timeout_s=self.run_timeout_s,
                            eval_every=self.eval_every, target_auc=self.target_auc,
                            checkpoint_every=self.checkpoint_every),
            policy=Policy(decay=StalenessDecay(self.staleness_threshold, self.staleness_decay, self.drop_after),
                          ssp_bound=self.ssp_bound, backup_workers=self.backup_workers),
            trace=StragglerTrace(kind=self.straggler, slowdown=self.slowdown, slow_worker=self.slow_worker,
                                 distribution=self.delay_distribution, mean_extra=self.mean_extra,
                                 base_delay_s=self.base_delay_ms / 1000.0, seed=self.trace_seed)))


def _entry(name: str) -> str:
    return importlib.util.find_spec(f"ops.gba.{name}").origin


def run_dir_for(context: dg.AssetExecutionContext, lake: LakeResource, mode: str) -> Path:
    """``<lake>/gba_run/.run-<mode>-<root run id>``: the same folder for every attempt of this
    partition within one run lineage (step retries, re-execution, run retries)."""
    root = context.run.root_run_id or context.run.run_id
    return lake.base / "gba_run" / f".run-{mode}-{root}"


def _launch(context, spec: RunSpec, run_dir: Path, compute: ComputeResource) -> dg.PipesClientCompletedInvocation:
    spec_path = run_dir / "spec.json"
    tmp = run_dir / ".spec.json.tmp"
    tmp.write_text(spec.to_json())
    tmp.replace(spec_path)
    args = ["--spec", str(spec_path), "--out", str(run_dir)]
    timeout = spec.cluster.run_timeout_s + 120.0                 # + process start and teardown
    if spec.mode == "sync":
        return compute.run(context, _entry("launch_sync"), args, num_processes=spec.cluster.workers, timeout_s=timeout)
    # TensorPipe logs a warning per closed pipe when the RPC world shuts down without a barrier (which a
    # dead worker would block); keep C++ logs at errors.
    return compute.run(context, "", command=[sys.executable, _entry("launch_ps"), *args], timeout_s=timeout,
                       env={"TORCH_CPP_LOG_LEVEL": "ERROR"})


def comparison(lake: LakeResource) -> tuple[pl.DataFrame, dict[str, dict]]:
    """The summary row and the run record of every mode materialized so far (their result files)."""
    rows, results = [], {}
    for m in MODES:
        p = lake.path("gba_run", m, "result.json")
        if p.exists():
            results[m] = r = json.loads(p.read_text())
            rows.append({**summarize(r), "epochs": r["hyper_parameters"]["epochs"]})
    return pl.DataFrame(rows), results


@dg.asset(partitions_def=gba_modes, deps=["ctr_events"], group_name="training", code_version="1",
          kinds={"pytorch", "parquet"}, pool="gpu")
def gba_run(context: dg.AssetExecutionContext, config: GBARunConfig, lake: LakeResource,
            compute: ComputeResource) -> dg.MaterializeResult:
    """DeepFM on MovieLens-100k CTR events trained in one mode — sync (all-reduce, accelerate
    launch), async, gba, ssp or hopbw (1 parameter server + W workers on torch.distributed.rpc) —
    under the configured straggler trace. Rank 0 streams evaluation points through Dagster Pipes
    and writes the run record; the table holds the eval curve (global step, samples, training
    seconds, test AUC, log loss). Metadata: samples/s, time to target AUC, final AUC and log loss,
    global steps, staleness histogram, gradients decayed/dropped, lost workers, checkpoints written
    and their seconds, the global step(s) a retried launch resumed from and the retry number, and
    the comparison across every mode materialized so far (table and AUC-vs-time plot). A retried
    launch resumes from its last checkpoint (see the module docstring)."""
    mode = context.partition_key
    events = lake.path("ctr_events")
    if not events.exists():
        raise FileNotFoundError(f"ctr_events has no table at {events}: materialize ctr_events first")
    workers = compute.num_processes if config.workers is None else config.workers
    spec = config.spec(mode, workers, str(events), str(lake.path("gba_run", name="cache")))
    run_dir = run_dir_for(context, lake, mode)
    run_dir.mkdir(parents=True, exist_ok=True)
    fp = fingerprint(spec)
    res_path = run_dir / "result.json"
    done = json.loads(res_path.read_text()) if res_path.exists() else None
    if done is not None and done.get("fingerprint") == fp:
        context.log.info(f"gba_run[{mode}]: attempt {context.retry_number + 1} reuses the finished launch's result "
                         f"in {run_dir}")
        res, messages = done, []
    else:
        res_path.unlink(missing_ok=True)               # another spec's result must not pass for this launch's
        ckpt = Checkpoints(run_dir, fp).find() if spec.cluster.checkpoint_every else None
        context.log.info(f"gba_run[{mode}]: attempt {context.retry_number + 1} in {run_dir}: " + (
            f"checkpoint {ckpt['count']} at global step {ckpt['global_step']:.1f} found, the launch resumes from it"
            if ckpt else "no checkpoint, training from step 0"))
        inv = _launch(context, spec, run_dir, compute)
        if not res_path.exists():
            raise dg.Failure(f"gba_run[{mode}]: the launch finished without a result file at {res_path}")
        res = json.loads(res_path.read_text())
        messages = inv.get_custom_messages()
    write_json(res, lake.path("gba_run", mode, "result.json"))
    curve = pl.DataFrame(res["curve"]).select("global_step", "samples", "train_s", "auc", "logloss")
    path, version = lake.write(curve, "gba_run", mode)

    table, results = comparison(lake)
    s = summarize(res)
    curves = {m: r["curve"] for m, r in results.items()}
    hists = {m: r["staleness_histogram"] for m, r in results.items()}
    taus = sorted({int(t) for h in hists.values() for t in h})
    lost = ", ".join(f"{w['worker']} ({w['reason']}; dropped tokens {w['dropped_tokens']}, batches {w['dropped_batches']})"
                     for w in res["lost_workers"]) or "none"
    context.log.info(f"gba_run[{mode}]: {s['samples_per_s']:.0f} samples/s, final AUC {s['final_auc']:.4f}, lost workers: {lost}")
    ttt = res["time_to_target_s"]
    ck = res.get("checkpoints") or {"written": 0, "seconds": 0.0, "resumes": []}
    resumed = ", ".join(f"global step {r['global_step']:g}" for r in ck["resumes"]) or "none"
    result = table_result(
        None, path, version, curve.height, curve.height,
        mode=dg.MetadataValue.text(mode),
        workers=dg.MetadataValue.int(res["workers"]), world_size=dg.MetadataValue.int(res["world_size"]),
        distributed_type=dg.MetadataValue.text(res.get("distributed_type", "")),
        launcher=dg.MetadataValue.text(res.get("launcher", "")),
        samples_per_s=dg.MetadataValue.float(res["samples_per_s"]),
        train_seconds=dg.MetadataValue.float(res["train_seconds"]),
        time_to_target_s=dg.MetadataValue.float(ttt) if ttt is not None else dg.MetadataValue.text("not reached"),
        target_auc=dg.MetadataValue.float(res["target_auc"]),
        test_auc=dg.MetadataValue.float(res["final"]["auc"]), test_logloss=dg.MetadataValue.float(res["final"]["logloss"]),
        global_steps=dg.MetadataValue.float(float(res["global_steps"])),
        optimizer_steps=dg.MetadataValue.int(res["optimizer_steps"]),
        gradients_applied=dg.MetadataValue.int(res["gradients"]["applied"]),
        gradients_decayed=dg.MetadataValue.int(res["gradients"]["decayed"]),
        gradients_dropped=dg.MetadataValue.int(res["gradients"]["dropped"]),
        staleness_histogram=dg.MetadataValue.json({str(k): v for k, v in res["staleness_histogram"].items()}),
        staleness_unit=dg.MetadataValue.text(res["staleness_unit"]),
        lost_workers=dg.MetadataValue.text(lost),
        hyper_parameters=dg.MetadataValue.json(res["hyper_parameters"]),
        trace=dg.MetadataValue.json(res["spec"]["trace"]),
        pipes_messages=dg.MetadataValue.int(len(messages)),
        checkpoints_written=dg.MetadataValue.int(ck["written"]),
        checkpoint_seconds=dg.MetadataValue.float(round(ck["seconds"], 3)),
        resumed_from=dg.MetadataValue.text(resumed),
        retry_number=dg.MetadataValue.int(context.retry_number),
        comparison=md_table(table),
        figure=image(_auc_plot(curves, spec.cluster.target_auc), "AUC vs training time"),
        staleness=image(figures.grouped_bars([str(t) for t in taus],
                                             {m: [h.get(str(t), 0) / max(1, sum(h.values())) for t in taus] for m, h in hists.items()},
                                             "staleness of gradients (share per mode)", "share"), "staleness"),
    )
    shutil.rmtree(run_dir, ignore_errors=True)          # only now: every failure above may be retried over it
    return result


def _auc_plot(curves: dict, target: float) -> bytes:
    from ops.gba.plots import auc_vs_time

    return auc_vs_time(curves, target)
