"""Lineage audit from the Dagster instance alone: "where did this table's data come from?"

Starting at an asset's latest materialization (or a given one), follow the
``dagster/input_event_pointer/<parent>`` tags Dagster writes on every materialization to the exact
upstream materializations that were read, and list per step: partition, run id, storage id, data
version, code version, row counts, the asset checks evaluated in that run, and the stage's key
figures (e.g. decontamination recall/precision). No side files: nothing here can drift from the
run history. For a partitioned parent, every partition's latest materialization before the child
is listed.
"""

import datetime as dt

import dagster as dg

KEY_FIGURES = ("rows_in", "rows_out", "removed", "math500_recall", "math500_precision", "near_duplicates_removed",
               "verified", "verified_teacher", "quarantined", "strata", "shortfall",
               # mixture: the ratio chosen (and used downstream), the law form behind it
               "tradeoff_r_d", "mixture_ratio", "chosen_form", "probe_points",
               # training runs
               "rows", "loss_general", "loss_domain",
               "final_auc", "samples_per_s", "world_size", "run_scope", "claim_verdict", "max_staleness")
POINTER = "dagster/input_event_pointer/"


def _checks(instance: dg.DagsterInstance, graph, key: dg.AssetKey, run_id: str) -> dict[str, str]:
    out = {}
    for ck in graph.asset_check_keys:
        if ck.asset_key != key:
            continue
        status = "not run in this run"
        for rec in instance.event_log_storage.get_asset_check_execution_history(ck, limit=20):
            if rec.run_id == run_id:
                status = rec.status.value
                break
        out[ck.name] = status
    return out


def _row(instance, graph, rec) -> dict:
    mat = rec.asset_materialization
    md = mat.metadata
    return {
        "asset": mat.asset_key.to_user_string(),
        "partition": mat.partition,
        "run_id": rec.run_id,
        "storage_id": rec.storage_id,
        "materialized_at": dt.datetime.fromtimestamp(rec.timestamp, dt.timezone.utc).isoformat(timespec="seconds"),
        # a partition of a range run carries its own version in its metadata (Dagster tags one
        # version for every partition of a step; case partition-data-versions)
        "data_version": md["partition_data_version"].value if "partition_data_version" in md
        else mat.tags.get("dagster/data_version"),
        "step_data_version": mat.tags.get("dagster/data_version"),
        "code_version": mat.tags.get("dagster/code_version"),
        "figures": {k: md[k].value for k in KEY_FIGURES if k in md},
        "checks": _checks(instance, graph, mat.asset_key, rec.run_id),
        # an input Dagster recorded as "NULL" had no materialization when this one ran (None here)
        "inputs": {k[len(POINTER):]: (int(v) if v.isdigit() else None) for k, v in mat.tags.items()
                   if k.startswith(POINTER)},
    }


def lineage_report(instance: dg.DagsterInstance, graph, asset: str, storage_id: int | None = None) -> list[dict]:
    """Rows from ``asset`` upstream to the sources, each upstream step once.

    Args:
        graph: the resolved asset graph (``defs.resolve_asset_graph()``).
        asset: asset key as a string (``sft_dataset``).
        storage_id: a specific materialization; default the latest.
    Raises:
        ValueError: unknown asset, or it was never materialized in this instance.
    """
    key = dg.AssetKey.from_user_string(asset)
    if key not in graph.get_all_asset_keys():
        raise ValueError(f"unknown asset {asset!r}; known: {sorted(k.to_user_string() for k in graph.get_all_asset_keys())}")
    flt = dg.AssetRecordsFilter(asset_key=key, storage_ids=[storage_id] if storage_id else None)
    records = instance.fetch_materializations(flt, limit=1).records
    if not records:
        raise ValueError(f"{asset} has no materialization in the Dagster instance at $DAGSTER_HOME")
    rows, seen, queue = [], set(), [records[0]]
    while queue:
        rec = queue.pop(0)
        if rec.storage_id in seen:
            continue
        seen.add(rec.storage_id)
        row = _row(instance, graph, rec)
        rows.append(row)
        for parent in sorted(graph.get(rec.asset_key).parent_keys, key=lambda k: k.to_user_string()):
            pointer = row["inputs"].get(parent.to_user_string())
            node = graph.get(parent)
            if node.partitions_def is not None:
                # the instance holds dynamic partitions (raw_problems' sources: assets/sources.py)
                for part in node.partitions_def.get_partition_keys(dynamic_partitions_store=instance):
                    got = instance.fetch_materializations(
                        dg.AssetRecordsFilter(asset_key=parent, asset_partitions=[part], before_storage_id=rec.storage_id), limit=1
                    ).records
                    queue.extend(got)
            elif pointer:
                queue.extend(instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=parent, storage_ids=[pointer]), limit=1).records)
    return rows


def format_report(rows: list[dict]) -> str:
    """A plain-text table of :func:`lineage_report` rows."""
    lines = []
    for r in rows:
        name = r["asset"] + (f"[{r['partition']}]" if r["partition"] else "")
        figs = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["figures"].items())
        checks = ", ".join(f"{k}: {v}" for k, v in r["checks"].items()) or "-"
        lines.append(f"{name}\n  run {r['run_id']}  at {r['materialized_at']}  data_version {r['data_version']}  "
                     f"code_version {r['code_version']}\n  {figs}\n  checks: {checks}")
    return "\n".join(lines)
