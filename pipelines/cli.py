"""``crucible`` command line: run the main job against the Dagster instance in ``$DAGSTER_HOME``.

    crucible setup                     # the data packages, the converted teacher model, compiled kernels, $DAGSTER_HOME
    crucible setup --check             # only say what is missing (exit 1 if anything is)
    crucible demo                      # the whole lifecycle at the demo preset's sizes (minutes)
    crucible demo --preset small       # the same at the assets' own CPU defaults (longer)
    crucible demo --per-module 5       # a smaller generated source
    crucible demo --skip curation      # reuse the curated data already in the lake
    crucible sources                   # list source partitions
    crucible lineage sft_dataset       # every upstream step: run, data/code version, figures, checks
    crucible lake vacuum --dry-run     # Delta VACUUM of the lake's tables (168 h retention)

Runs are recorded in the instance, so ``dagster dev`` shows them, their metadata and checks.
"""

import argparse
import os
import sys
import time
from pathlib import Path


def ensure_dagster_home() -> Path:
    """``$DAGSTER_HOME`` (default ``./.dagster_home``) with a ``dagster.yaml`` (telemetry off)."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path.cwd() / ".dagster_home"))).resolve()
    os.environ["DAGSTER_HOME"] = str(home)
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    return home


RUN_RETRIES = """run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
"""
"""Added once to ``dagster.yaml`` by ``crucible setup``: a run that failed without a step failure
(its run worker died: SIGKILL, OOM, a killed ``make demo``; run monitoring marks such a run failed,
:func:`run_monitoring_yaml`) is re-executed from failure, twice at most, and the re-executed launch
resumes from its last checkpoint (same run folder: ``assets.launch``). A run whose step failed is
not retried (launch deaths inside a live step are retried by ``resources.retry``). Retries and
monitoring need the daemon (``dagster dev`` runs it; or ``dagster-daemon run``); a run executed in
the CLI's own process (``crucible demo``) is marked failed but cannot be re-executed by the daemon
(it has no code location to launch from). No pool or run-queue limits on the embedded instance
(deploy/helm/values.yaml has them)."""

RUN_MONITORING_POLL_S = 30
"""Seconds between the daemon's run-monitoring checks in the instance ``crucible setup`` writes:
a run whose worker died is marked failed within about this bound."""


def run_monitoring_yaml(poll_interval_s: int = RUN_MONITORING_POLL_S) -> str:
    """The ``run_monitoring`` and ``run_launcher`` sections of the embedded instance (Dagster 1.13
    keys, docs.dagster.io "Detect and restart crashed workers with run monitoring"): monitoring on,
    polled every ``poll_interval_s`` s; a run stuck STARTING/CANCELING fails after 180 s; no resume
    in place (``max_resume_run_attempts: 0``: the local launcher cannot resume a worker, the run
    retry re-executes instead); pool slots of a run that ended without releasing them are freed
    after 60 s; and ``pipelines.run_launcher.LocalRunLauncher``, which tells the monitoring whether
    a run's worker process lives (Dagster's default launcher cannot, so a killed run stayed STARTED).
    A run past its job's ``dagster/max_runtime`` tag (pipelines/jobs.py) is terminated and failed."""
    return (f"run_monitoring:\n  enabled: true\n  poll_interval_seconds: {int(poll_interval_s)}\n"
            "  start_timeout_seconds: 180\n  cancel_timeout_seconds: 180\n  max_resume_run_attempts: 0\n"
            "  free_slots_after_run_end_seconds: 60\n"
            "run_launcher:\n  module: pipelines.run_launcher\n  class: LocalRunLauncher\n")


def _has_section(text: str, name: str) -> bool:
    return any(line.startswith(f"{name}:") for line in text.splitlines())


def ensure_run_retries(home: Path) -> bool:
    """Append :data:`RUN_RETRIES` to ``home/dagster.yaml`` unless it has a ``run_retries`` section.
    True when it was added."""
    cfg = home / "dagster.yaml"
    text = cfg.read_text(encoding="utf-8") if cfg.exists() else ""
    if _has_section(text, "run_retries"):
        return False
    cfg.write_text(text + ("" if not text or text.endswith("\n") else "\n") + RUN_RETRIES, encoding="utf-8")
    return True


def ensure_run_monitoring(home: Path, poll_interval_s: int = RUN_MONITORING_POLL_S) -> bool:
    """Append :func:`run_monitoring_yaml` to ``home/dagster.yaml`` unless it has a ``run_monitoring``
    section (an instance with its own ``run_launcher`` keeps it and gets only ``run_monitoring``).
    True when something was added."""
    cfg = home / "dagster.yaml"
    text = cfg.read_text(encoding="utf-8") if cfg.exists() else ""
    if _has_section(text, "run_monitoring"):
        return False
    add = run_monitoring_yaml(poll_interval_s)
    if _has_section(text, "run_launcher"):
        add = add[:add.index("run_launcher:")]
    cfg.write_text(text + ("" if not text or text.endswith("\n") else "\n") + add, encoding="utf-8")
    return True


def run_setup(check: bool) -> int:
    """``crucible setup``: fetch the data packages (ops/data_packages.py), compile the MinHash kernels
    into Numba's on-disk cache (:func:`ops.curation.minhash.compile_kernels`) and prepare
    ``$DAGSTER_HOME``. With ``check``, change nothing (nothing compiled) and exit 1 when something is
    missing."""
    from ops import data_packages

    if check:       # every data package: pin, SHA-256 (the wheel is hashed), folder, state
        lines = data_packages.report()
        print("\n".join(("ok: " if ready else "missing: ") + line for line, ready in lines))
        todo = [line for line, ready in lines if not ready]
        print(f"crucible: {len(todo)} item(s) missing; run `crucible setup`" if todo else "crucible: set up (nothing missing)")
        return 1 if todo else 0
    try:
        data_packages.setup(log=lambda msg: print(f"crucible setup: {msg}", flush=True))
    except (RuntimeError, FileNotFoundError) as e:
        print(f"crucible setup: {e}", file=sys.stderr)
        return 1
    # the MinHash kernels (Numba, cache=True): compiled here once, so the first demo's dedup and
    # decontamination steps load machine code instead of compiling it (~25 s on 2 cores)
    from ops.curation import minhash

    t = time.monotonic()
    minhash.compile_kernels()
    print(f"crucible setup: compiled the {len(minhash.KERNELS)} MinHash kernels into Numba's cache "
          f"({time.monotonic() - t:.1f} s)", flush=True)
    home = ensure_dagster_home()
    ensure_run_retries(home)
    ensure_run_monitoring(home)
    print(f"crucible: set up (data packages, {data_packages.default_models_dir() / data_packages.MODEL_NAME}, "
          f"DAGSTER_HOME={home})")
    return 0


def _failure_summary(res) -> str:
    """One line per failed step: the step and its error message (no traceback)."""
    lines = []
    for ev in res.all_events:
        if ev.event_type_value == "STEP_FAILURE":
            err = ev.step_failure_data.error if ev.step_failure_data else None
            msg = err.message.strip() if err else ev.message
            if err and err.cause:
                msg = err.cause.message.strip() or msg
            lines.append(f"  {ev.step_key}: {msg}")
    try:  # a failed blocking check: say which check and why (its description names the cause)
        for ev in res.get_asset_check_evaluations():
            if not ev.passed:
                lines.append(f"  check {ev.asset_key.to_user_string()}.{ev.check_name}: {ev.description or 'failed'}")
    except Exception:  # noqa: BLE001 - the summary must never hide the original failure
        pass
    return "\n".join(lines) or "  (no step failure recorded; see the run in the UI)"


def _run(job, instance, label: str, loggers: dict, partition_key: str | None = None,
         partition_range: tuple[str, str] | None = None, run_config: dict | None = None,
         tags: dict | None = None) -> bool:
    """Execute one job in process; print its outcome (and the failed steps). True when it succeeded.
    ``tags`` are added to the run's (and replace the job's own of the same name)."""
    t = time.monotonic()
    tags = {**(tags or {}), **({"dagster/asset_partition_range_start": partition_range[0],
                                "dagster/asset_partition_range_end": partition_range[1]} if partition_range else {})}
    res = job.execute_in_process(instance=instance, partition_key=partition_key, tags=tags or None,
                                 run_config={**(run_config or {}), "loggers": loggers}, raise_on_error=False)
    print(f"{label}: {'ok' if res.success else 'FAILED'} in {time.monotonic() - t:.1f}s (run {res.run_id})")
    if not res.success:
        print(f"\n{label} failed:\n{_failure_summary(res)}", file=sys.stderr)
    else:  # a failed non-blocking (WARN) check does not stop the run; say so
        for ev in res.get_asset_check_evaluations():
            if not ev.passed:
                print(f"  warning: check {ev.asset_key.to_user_string()}.{ev.check_name}: {ev.description or 'failed'}")
    return res.success


STAGES = ("curation", "training", "mixture", "posttrain")
DEFAULT_PRESET = "demo"
"""``crucible demo``'s (and ``make demo``'s) size set: pipelines/presets.py ``PRESETS``."""


def demo_sizes(preset: str, per_module: int | None = None, target_size: int | None = None,
               limit: int | None = None) -> dict:
    """The sizes ``crucible demo --preset`` passes to its runs (op -> field -> value): the size set
    ``preset`` made complete against the active profile's code-location defaults
    (``presets.preset_sizes``), with the command's ``--per-module`` / ``--target-size`` / ``--limit``
    over it where given. Raises ValueError (unknown preset), presets.SizesError (a preset naming an
    op or field the code location does not have), profiles.ProfileError."""
    import dagster as dg

    from pipelines.definitions import ASSET_MODULES, PROFILE
    from pipelines.presets import merge_sizes, preset_sizes

    sizes = preset_sizes(preset, dg.load_assets_from_modules(ASSET_MODULES), PROFILE.size_set(), PROFILE.sizes)
    raw = {k: v for k, v in (("mathematics_dataset_per_module", per_module), ("limit", limit)) if v is not None}
    over = {"raw_problems": raw, "sft_dataset": {"target_size": target_size} if target_size is not None else {}}
    return merge_sizes(sizes, {op: v for op, v in over.items() if v})


def run_demo(per_module: int | None, target_size: int | None, limit: int | None, skip: tuple[str, ...] = (),
             preset: str = DEFAULT_PRESET) -> int:
    """``crucible demo``: the lifecycle (pipelines/jobs.py ``LIFECYCLE``) in this process, every run
    with the size set ``preset`` as run config and tagged with it (``crucible/preset``, and the
    ``dagster/max_runtime`` of its launches at those sizes). 0 on success, 1 when a run failed, 2 on
    a bad preset."""
    home = ensure_dagster_home()
    import dagster as dg

    from pipelines.definitions import defs
    from pipelines.jobs import preset_run_tags
    from pipelines.presets import SizesError, preset_partitions, preset_run_config
    from pipelines.profiles import ProfileError, sources_file
    from resources.lake import default_root
    from resources.sources import source_partition_keys

    try:
        sizes = demo_sizes(preset, per_module, target_size, limit)
        gba_modes = preset_partitions(preset, "gba_job", defs.resolve_job_def("gba_job").partitions_def.get_partition_keys())
    except (ValueError, SizesError, ProfileError) as e:
        print(f"crucible demo: {e}", file=sys.stderr)
        return 2
    print(f"crucible demo: preset {preset} (sizes: pipelines/presets.py; "
          + ("; ".join(f"{op} {v}" for op, v in sizes.items()) or "the assets' own defaults") + ")", flush=True)
    instance = dg.DagsterInstance.get()
    loggers = {"console": {"config": {"log_level": "INFO"}}}

    def run(name: str, label: str, **kw) -> bool:
        j = defs.resolve_job_def(name)
        ops = [n.name for n in j.graph.nodes]
        return _run(j, instance, label, loggers, run_config=preset_run_config(sizes, ops),
                    tags=preset_run_tags(name, preset, sizes), **kw)

    t0 = time.monotonic()
    if "curation" not in skip:
        from assets.sources import sync_source_partitions

        # raw_problems' partitions are dynamic (assets/sources.py): no sensor runs here, so add the
        # declared sources (and drop undeclared ones) before materializing each of them
        sync_source_partitions(instance, source_partition_keys(sources_file()))
        for key in preset_partitions(preset, "sources_job", source_partition_keys(sources_file())):
            if not run("sources_job", f"raw_problems[{key}]", partition_key=key):
                return 1
        if not run("curation_job", "curation graph"):
            return 1
    if "training" not in skip:
        if not run("training_job", "training (ctr_events, ctr_model)"):
            return 1
        for mode in gba_modes:
            if not run("gba_job", f"gba_run[{mode}]", partition_key=mode):
                return 1
        if not run("rollpacker_job", "rollpacker_run (baseline vs tail batching)"):
            return 1
        if not run("rollarc_job", "rollarc_run (monolithic vs RollArc)"):
            return 1
    if "mixture" not in skip:
        for name, label in (("mixture_data_job", "mixture: corpora + tokenizer"),
                            ("cpt_base_job", "mixture: base models (all sizes, one launch)"),
                            ("cpt_probe_job", "mixture: CPT probe runs (all partitions, one launch)"),
                            ("mixture_job", "mixture: D-CPT law fit, mixture plan, closed-loop validation")):
            j = defs.resolve_job_def(name)
            keys = j.partitions_def.get_partition_keys() if j.partitions_def else None
            if not run(name, label, partition_range=(keys[0], keys[-1]) if keys else None):
                return 1
    if "posttrain" not in skip:
        if not run("posttrain_job", "post-training: stage 1, failure regions, synthesis, stage 2 + control"):
            return 1
    root = Path(default_root()).resolve()
    print(f"\nmain job done in {time.monotonic() - t0:.1f}s (preset {preset})")
    print(f"SFT dataset:     {root / 'sft_dataset'}  (datasets.load_dataset('parquet', data_dir=...))")
    print(f"CTR model:       {root / 'ctr_model'}  (test predictions + sparse tables in safetensors)")
    print(f"GBA comparison:  {root / 'gba_run'}  (one folder per training mode: curve + run record)")
    print(f"Mixture plan:    {root / 'mixture_plan' / 'plan.json'}  (D-CPT law fit: {root / 'dcpt_law_fit' / 'fit.json'})")
    print(f"Post-training:   {root / 'failure_driven_comparison'}  (stage 1 vs targeted vs random, with CIs)")
    print(f"DuckDB catalog:  {root / 'catalog.duckdb'}  (one view per asset)")
    print(f"Dagster UI:      make dev  ->  http://127.0.0.1:3000  (runs recorded in {home})")
    return 0


def run_lake_vacuum(args) -> int:
    """``crucible lake vacuum``: Delta VACUUM of every table of the lake (``LakeResource.vacuum``);
    prints the files removed per table (local and object-store roots alike), then the worker snapshots
    of versions no longer current (``LakeResource.prune_snapshots``). Exit 2 with one line on a refused
    retention."""
    from ops.lake import DEFAULT_VACUUM_RETENTION_HOURS
    from pipelines.profiles import ProfileError, load_profile

    try:
        lake = load_profile().resources["lake"]
    except ProfileError as e:
        print(f"crucible lake vacuum: {e}", file=sys.stderr)
        return 2
    changes = {k: v for k, v in (("root", args.root), ("endpoint_url", args.endpoint_url), ("region", args.region))
               if v is not None}
    if changes:
        lake = lake.model_copy(update=changes)
    try:
        removed = lake.vacuum(args.retention_hours, args.dry_run, not args.no_enforce_retention)
    except ValueError as e:
        print(f"crucible lake vacuum: {e}", file=sys.stderr)
        return 2
    verb = "would remove" if args.dry_run else "removed"
    hours = args.retention_hours if args.retention_hours is not None else f"the tables' own ({DEFAULT_VACUUM_RETENTION_HOURS} by default)"
    snapshots = removed.pop(str(lake.base / ".lake-tables"), [])
    print(f"lake {lake.root or lake.base}: {len(removed)} Delta tables, retention {hours} h")
    for table, files in removed.items():
        print(f"{table}: {verb} {len(files)} files" + "".join(f"\n  {f}" for f in files))
    if snapshots:
        print(f"{lake.base / '.lake-tables'} (worker snapshots of versions no longer current): {verb} {len(snapshots)} files"
              + "".join(f"\n  {f}" for f in snapshots))
    print(f"total: {verb} {sum(len(f) for f in removed.values()) + len(snapshots)} files")
    return 0


def _count(minimum: int):
    """An argparse ``type``: an integer >= ``minimum``, so a bad size is refused before any run is launched."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {n}")
        return n
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crucible", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    setup = sub.add_parser("setup", help="fetch the data packages and the teacher model, prepare $DAGSTER_HOME (idempotent)")
    setup.add_argument("--check", action="store_true", help="change nothing; list what is missing (exit 1 if anything is)")
    demo = sub.add_parser("demo", help="the main job: sources, curation, training, mixture, post-training")
    from pipelines.presets import PRESETS

    demo.add_argument("--preset", choices=list(PRESETS), default=DEFAULT_PRESET,
                      help="size set of every run (pipelines/presets.py): demo = the whole lifecycle in minutes on "
                      "2 CPU cores, small = the assets' own CPU defaults (longer), full = production sizes (GPU); "
                      f"default {DEFAULT_PRESET}")
    demo.add_argument("--per-module", type=_count(1), default=None,
                      help="mathematics_dataset problems per module and difficulty (default: the preset's)")
    demo.add_argument("--target-size", type=_count(1), default=None, help="rows in the SFT dataset (default: the preset's)")
    demo.add_argument("--limit", type=_count(0), default=None,
                      help="at most this many rows per source, a content-keyed sample (smoke runs)")
    demo.add_argument("--skip", default="", help=f"comma-separated stages to skip: {', '.join(STAGES)} "
                      "(a skipped stage's inputs must already be in the lake)")
    sub.add_parser("sources", help="list raw_problems partitions (built-in and from $CRUCIBLE_SOURCES)")
    lin = sub.add_parser("lineage", help="where did an asset's data come from (from the Dagster instance alone)")
    lin.add_argument("asset", help="asset key, e.g. sft_dataset")
    lin.add_argument("--storage-id", type=int, default=None, help="a specific materialization (default: latest)")
    lin.add_argument("--json", action="store_true", help="print JSON instead of text")
    lake = sub.add_parser("lake", help="maintenance of the lake's Delta tables (the active profile's lake.root)")
    lake_sub = lake.add_subparsers(dest="lake_cmd", required=True)
    vac = lake_sub.add_parser("vacuum", help="Delta VACUUM of every table: delete files no version references "
                              "(killed writers' uploads, overwritten versions) older than the retention")
    vac.add_argument("--retention-hours", type=int, default=None,
                     help="keep unreferenced files younger than this (default: the tables' own, Delta's 168 h)")
    vac.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    vac.add_argument("--no-enforce-retention", action="store_true",
                     help="accept a retention below the tables' own (only when no writer is running)")
    vac.add_argument("--root", default=None, help="lake root URL (default: the active profile's lake.root)")
    vac.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (default: the profile's)")
    vac.add_argument("--region", default=None, help="S3 region (default: the profile's)")
    args = parser.parse_args(argv)
    if args.cmd == "lake":
        return run_lake_vacuum(args)
    if args.cmd == "setup":
        return run_setup(args.check)
    if args.cmd == "demo":
        skip = tuple(x.strip() for x in args.skip.split(",") if x.strip())
        bad = sorted(set(skip) - set(STAGES))
        if bad:
            print(f"crucible demo: argument --skip: unknown stage(s) {bad}; stages are {', '.join(STAGES)}", file=sys.stderr)
            return 2
        return run_demo(args.per_module, args.target_size, args.limit, skip, args.preset)
    if args.cmd == "lineage":
        ensure_dagster_home()
        import json

        import dagster as dg

        from pipelines.definitions import defs
        from pipelines.lineage import format_report, lineage_report

        try:
            rows = lineage_report(dg.DagsterInstance.get(), defs.resolve_asset_graph(), args.asset, args.storage_id)
        except ValueError as e:
            if args.json:                                   # a script reading --json gets JSON either way
                print(json.dumps({"error": str(e), "asset": args.asset}))
            print(f"crucible lineage: {e}", file=sys.stderr)
            return 2
        print(json.dumps(rows, indent=2, default=str) if args.json else format_report(rows))
        return 0
    if args.cmd == "sources":
        from pipelines.profiles import sources_file
        from resources.sources import source_partition_keys

        print("\n".join(source_partition_keys(sources_file())))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
