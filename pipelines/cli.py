"""``crucible`` command line: run the main job against the Dagster instance in ``$DAGSTER_HOME``.

    crucible demo                      # every source partition, then the curation graph
    crucible demo --per-module 5       # a smaller generated source
    crucible sources                   # list source partitions
    crucible lineage sft_dataset       # every upstream step: run, data/code version, figures, checks

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
    return "\n".join(lines) or "  (no step failure recorded; see the run in the UI)"


def run_demo(per_module: int, target_size: int, limit: int | None) -> int:
    home = ensure_dagster_home()
    import dagster as dg

    from pipelines.definitions import defs
    from resources.lake import default_root
    from resources.sources import source_partition_keys

    instance = dg.DagsterInstance.get()
    sources_job = defs.resolve_job_def("sources_job")
    curation_job = defs.resolve_job_def("curation_job")
    raw_cfg = {"mathematics_dataset_per_module": per_module, "limit": limit}
    loggers = {"console": {"config": {"log_level": "INFO"}}}
    t0 = time.monotonic()
    for key in source_partition_keys():
        t = time.monotonic()
        res = sources_job.execute_in_process(
            instance=instance, partition_key=key, run_config={"ops": {"raw_problems": {"config": raw_cfg}}, "loggers": loggers},
            raise_on_error=False
        )
        print(f"raw_problems[{key}]: {'ok' if res.success else 'FAILED'} in {time.monotonic() - t:.1f}s (run {res.run_id})")
        if not res.success:
            print(f"\nraw_problems[{key}] failed:\n{_failure_summary(res)}", file=sys.stderr)
            return 1
    t = time.monotonic()
    res = curation_job.execute_in_process(
        instance=instance, run_config={"ops": {"sft_dataset": {"config": {"target_size": target_size}}}, "loggers": loggers},
        raise_on_error=False
    )
    print(f"curation graph: {'ok' if res.success else 'FAILED'} in {time.monotonic() - t:.1f}s (run {res.run_id})")
    if not res.success:
        print(f"\ncuration graph failed:\n{_failure_summary(res)}", file=sys.stderr)
        return 1
    t = time.monotonic()
    res = defs.resolve_job_def("training_job").execute_in_process(instance=instance, run_config={"loggers": loggers}, raise_on_error=False)
    print(f"training (ctr_events, ctr_model): {'ok' if res.success else 'FAILED'} in {time.monotonic() - t:.1f}s (run {res.run_id})")
    if not res.success:
        print(f"\ntraining failed:\n{_failure_summary(res)}", file=sys.stderr)
        return 1
    root = Path(default_root()).resolve()
    print(f"\nmain job done in {time.monotonic() - t0:.1f}s")
    print(f"SFT dataset:     {root / 'sft_dataset'}  (datasets.load_dataset('parquet', data_dir=...))")
    print(f"CTR model:       {root / 'ctr_model'}  (test predictions + sparse tables in safetensors)")
    print(f"DuckDB catalog:  {root / 'catalog.duckdb'}  (one view per asset)")
    print(f"Dagster UI:      make dev  ->  http://127.0.0.1:3000  (runs recorded in {home})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crucible", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="materialize every source partition, then the curation graph")
    demo.add_argument("--per-module", type=int, default=20, help="mathematics_dataset problems per module and difficulty")
    demo.add_argument("--target-size", type=int, default=2000, help="rows in the SFT dataset")
    demo.add_argument("--limit", type=int, default=None, help="cap rows per source (smoke runs)")
    sub.add_parser("sources", help="list raw_problems partitions (built-in and from $CRUCIBLE_SOURCES)")
    lin = sub.add_parser("lineage", help="where did an asset's data come from (from the Dagster instance alone)")
    lin.add_argument("asset", help="asset key, e.g. sft_dataset")
    lin.add_argument("--storage-id", type=int, default=None, help="a specific materialization (default: latest)")
    lin.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        return run_demo(args.per_module, args.target_size, args.limit)
    if args.cmd == "lineage":
        ensure_dagster_home()
        import json

        import dagster as dg

        from pipelines.definitions import defs
        from pipelines.lineage import format_report, lineage_report

        try:
            rows = lineage_report(dg.DagsterInstance.get(), defs.resolve_asset_graph(), args.asset, args.storage_id)
        except ValueError as e:
            print(f"crucible lineage: {e}", file=sys.stderr)
            return 2
        print(json.dumps(rows, indent=2, default=str) if args.json else format_report(rows))
        return 0
    if args.cmd == "sources":
        from resources.sources import source_partition_keys

        print("\n".join(source_partition_keys()))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
