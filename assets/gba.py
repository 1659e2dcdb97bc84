"""GBA training runs (docs/gba.md; Su et al., NeurIPS 2022, arXiv 2205.11048): the DeepFM CTR model
of ``ctr_model`` trained with global-batch gradient aggregation over a parameter server, and the
baselines — synchronous all-reduce, plain async PS, bounded staleness (SSP), backup workers
(Hop-BW) — under one seeded straggler trace. One partition per mode; every partition runs with the
same run config, so switching modes changes no hyper-parameter. torch loads only in the launched
processes (``ops.gba``).

Launch and resume follow the launch protocol (``assets.launch``, docs/operations.md, "Retries and
resume"): each partition trains in ``<lake>/gba_run/.run-<mode>-<root run id>``, one folder per run
lineage, so a step retry (``RetryingComputeResource`` after a launch death), a re-execution from
failure and a run retry relaunch over the same folder and continue from its last checkpoint
(``ops.gba.checkpoint``; the launched process logs the Dagster retry number and the global step it
resumes from); a new materialization starts from step 0. The folder is removed once the partition
is materialized; a launch that finished but whose step failed later is not retrained: its result
file is reused."""

import json
from pathlib import Path
from typing import Optional

import dagster as dg
import polars as pl

from ops import figures
from ops import lake as lakeio
from ops.gba.checkpoint import Checkpoints, fingerprint
from ops.gba.config import JOB, MODES, Cluster, RunSpec
from ops.gba.report import summarize
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors, to_spec
from ._meta import image, md_table, table_result
from .launch import launch

gba_modes = dg.StaticPartitionsDefinition(list(MODES))

SET_BY_ASSET = ("mode", "events_path", "data_cache", "stop_at", "handover_to", "handover_from")
"""RunSpec fields the Launchpad does not offer: the partition is the mode, the paths are the lake's
and the cache's, hand-overs are the benchmarks' (benchmarks/gba_bench.py)."""


@mirrors(RunSpec)
class GBARunConfig(fields_of(RunSpec, defaults=JOB, exclude=SET_BY_ASSET, replace={"cluster.workers": (
        Optional[int], None, "W worker processes (sync: ranks; PS modes: workers beside the parameter servers), "
        ">= 1; unset = the launcher's process count (compute.num_processes).")})):
    """One configuration for every mode (the partition picks the mode; nothing else changes): the
    Launchpad face of ``ops.gba.config.RunSpec``, nested as the spec is (``train``, ``cluster``,
    ``policy``, ``trace``, ``switching``), defaults ``ops.gba.config.JOB``'s; meanings and checks
    are the ops dataclasses' and an error names the path set here (``policy.decay.threshold``)."""

    def spec(self, mode: str, workers: Optional[int] = None, events_path: str = "", data_cache: str = "") -> RunSpec:
        """The validated RunSpec of ``mode``: the same hyper-parameters for every mode; an unset
        ``cluster.workers`` is ``workers`` (the launcher's process count; neither: ``Cluster.workers``).
        Raises GBAConfigError naming the field by its Launchpad path."""
        cluster = self.cluster.model_dump()
        if cluster["workers"] is None:
            cluster["workers"] = workers if workers is not None else Cluster.workers
        return to_spec(self.model_copy(update={"cluster": type(self.cluster)(**cluster)}),
                       mode=mode, events_path=events_path, data_cache=data_cache)


def saved_checkpoint(spec: RunSpec, fp: str):
    """``saved(run_dir)`` of the launch: the last checkpoint of this spec in the run folder, described
    ("" when there is none or checkpoints are off)."""
    def saved(run_dir: Path) -> str:
        ckpt = Checkpoints(run_dir, fp).find() if spec.cluster.checkpoint_every else None
        return f"checkpoint {ckpt['count']} at global step {ckpt['global_step']:.1f}" if ckpt else ""
    return saved


def comparison(lake: LakeResource, pending: Optional[dict[str, dict]] = None) -> tuple[pl.DataFrame, dict[str, dict]]:
    """The summary row and the run record of every mode materialized so far (their result files),
    with ``pending`` (mode -> record) in place of a mode's committed file (the step's own record,
    not yet committed)."""
    rows, results = [], {}
    for m in MODES:
        p = lake.path("gba_run", m, "result.json")
        if m in (pending or {}) or p.exists():
            results[m] = r = (pending or {}).get(m) or json.loads(p.read_text())
            rows.append({**summarize(r), "epochs": r["hyper_parameters"]["epochs"]})
    return pl.DataFrame(rows), results


@dg.asset(partitions_def=gba_modes, deps=["ctr_events"], group_name="training", code_version="1",
          kinds={"pytorch", "parquet"}, pool="gpu")
def gba_run(context: dg.AssetExecutionContext, config: GBARunConfig, lake: LakeResource,
            compute: ComputeResource) -> dg.MaterializeResult:
    """DeepFM on MovieLens-100k CTR events trained in one mode — sync (all-reduce, accelerate
    launch), async, gba, ssp, hopbw (num_ps parameter servers + W workers on torch.distributed.rpc)
    or auto (the PS run that starts synchronous and switches to the target mode when the straggler
    detector fires, and back, recording the switches) — under the configured straggler trace. Rank 0 streams evaluation points through Dagster Pipes
    and writes the run record; the table holds the eval curve (global step, samples, training
    seconds, test AUC, log loss). Metadata: samples/s, time to target AUC, final AUC and log loss,
    global steps, staleness histogram, gradients decayed/dropped, lost workers, checkpoints written
    and their seconds, the global step(s) a retried launch resumed from and the retry number, and
    the comparison across every mode materialized so far (table and AUC-vs-time plot). A retried
    launch resumes from its last checkpoint (see the module docstring)."""
    mode = context.partition_key
    events = lake.table_path("ctr_events")      # object-store root: a local copy under work_dir
    # the encoded-data cache lives outside the lake (the shared cache, $CRUCIBLE_CACHE): a worker writes
    # only its run folder and that cache, never a lake file (issue 42 item 8)
    from ops.cache import default_cache_dir

    spec = config.spec(mode, compute.num_processes, str(events), str(default_cache_dir() / "gba-ctr"))
    fp = fingerprint(spec)
    # TensorPipe logs a warning per closed pipe when the RPC world shuts down without a barrier (which a
    # dead worker would block); keep C++ logs at errors.
    ps = {"module": "ops.gba.launch_ps", "processes": None, "env": {"TORCH_CPP_LOG_LEVEL": "ERROR"}}
    sync = {"module": "ops.gba.launch_sync", "processes": spec.cluster.workers, "env": {}}
    with launch(context, compute, base=lake.base, asset="gba_run", key=mode, spec=spec.to_json(), fingerprint=fp,
                timeout_s=spec.cluster.run_timeout_s + 120.0,           # + process start and teardown
                saved=saved_checkpoint(spec, fp), **(sync if mode == "sync" else ps)) as run:
        return _materialize(context, lake, mode, spec, run)


def _materialize(context, lake: LakeResource, mode: str, spec: RunSpec, run) -> dg.MaterializeResult:
    """The partition's outputs from the launch's result: the result file, the eval-curve table and
    the metadata (with the comparison across the modes materialized so far). The drivers write only
    their run folder; the step builds every metadata entry from the result first and writes the
    partition's table and result.json last (issue 42 item 8: a step that fails after its launch
    leaves the committed files as they were)."""
    res = run.result
    curve = pl.DataFrame(res["curve"]).select("global_step", "samples", "train_s", "auc", "logloss")

    table, results = comparison(lake, {mode: res})
    s = summarize(res)
    curves = {m: r["curve"] for m, r in results.items()}
    events = {m: r["switching"]["events"] for m, r in results.items() if r.get("switching")}
    hists = {m: r["staleness_histogram"] for m, r in results.items()}
    taus = sorted({int(t) for h in hists.values() for t in h})
    lost = ", ".join(f"{w['worker']} ({w['reason']}; dropped tokens {w['dropped_tokens']}, batches {w['dropped_batches']})"
                     for w in res["lost_workers"]) or "none"
    context.log.info(f"gba_run[{mode}]: {s['samples_per_s']:.0f} samples/s, final AUC {s['final_auc']:.4f}, lost workers: {lost}")
    ttt = res["time_to_target_s"]
    ck = res.get("checkpoints") or {"written": 0, "seconds": 0.0, "resumes": []}
    resumed = ", ".join(f"global step {r['global_step']:g}" for r in ck["resumes"]) or "none"
    meta = dict(
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
        checkpoints_written=dg.MetadataValue.int(ck["written"]),
        checkpoint_seconds=dg.MetadataValue.float(round(ck["seconds"], 3)),
        resumed_from=dg.MetadataValue.text(resumed),
        **run.metadata(),
        comparison=md_table(table),
        switches=dg.MetadataValue.json(res["switching"]["events"] if res.get("switching") else []),
        figure=image(_auc_plot(curves, spec.cluster.target_auc, events), "AUC vs training time", lake=lake, asset="gba_run"),
        staleness=image(figures.grouped_bars([str(t) for t in taus],
                                             {m: [h.get(str(t), 0) / max(1, sum(h.values())) for t in taus] for m, h in hists.items()},
                                             "staleness of gradients (share per mode)", "share"), "staleness", lake=lake, asset="gba_run"),
    )
    path, version = lake.write(curve, "gba_run", mode)                  # committed last
    lakeio.write_json_atomic(res, lake.path("gba_run", mode, "result.json"), indent=1)
    return table_result(None, path, version, curve.height, curve.height, **meta)


def _auc_plot(curves: dict, target: float, events: dict | None = None) -> bytes:
    from ops.gba.plots import auc_vs_time

    return auc_vs_time(curves, target, events=events)
