"""Optional experiment tracking: the training curves of every launched driver in MLflow.

Off by default. ``ComputeResource.tracking_uri`` (the prod profile's ``compute.tracking_uri``) puts
``CRUCIBLE_TRACKING_URI`` (and ``CRUCIBLE_TRACKING_EXPERIMENT``) into every launch's environment;
``ops.launch.worker_main`` then opens one MLflow run per launch on rank 0 and logs every Pipes
custom message the driver reports — the same points the Dagster metadata plots are drawn from —
as MLflow metrics. One hook covers the probe and SFT trainers, the RL warm start, GBA (sync and
parameter-server modes) and both RL drivers, because they all report through the launch protocol.

Mapping of a message to metrics (``flatten_message``):
- numeric leaves become metrics (bools as 0/1); strings, lists and ``None`` are left out;
- nested dicts are joined with ``.`` (``{"eval": {"accuracy": ..}}`` -> ``eval.accuracy``);
- a ``run`` (probe/SFT run key) or ``method`` (RL method) field prefixes the names, so the methods
  of one RollPacker launch are separate curves (``tail_batching/reward_mean``);
- the step is the message's ``step``, else ``global_step``, else ``tokens`` (probe checkpoints), else
  a per-series counter.

Resume: the MLflow run id is kept in ``<run folder>/tracking.json``, so a retried launch over the
same run folder (the launch protocol's resume) appends to the same MLflow run.

Failures never stop training: an unreachable server or a rejected batch is logged once as a
warning and tracking is switched off for the rest of the launch (MLflow's own HTTP retries are
capped at 2 and its request timeout at 10 s unless the environment sets them).

mlflow is imported only when tracking is on (the ``tracking`` extra: ``pip install ".[tracking]"``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

URI_ENV = "CRUCIBLE_TRACKING_URI"
EXPERIMENT_ENV = "CRUCIBLE_TRACKING_EXPERIMENT"
STEP_KEYS = ("step", "global_step", "tokens")
PREFIX_KEYS = ("run", "method")


def tracking_env(uri: Optional[str], experiment: str) -> dict[str, str]:
    """The environment a launch needs for tracking (empty when ``uri`` is None: tracking off)."""
    return {URI_ENV: uri, EXPERIMENT_ENV: experiment} if uri else {}


def flatten_message(msg: Mapping[str, Any]) -> tuple[Optional[str], Optional[float], dict[str, float]]:
    """``(series prefix, step, metrics)`` of one Pipes custom message (rules in the module docstring).

    >>> flatten_message({"method": "baseline", "step": 3, "reward_mean": 0.5, "round": "long", "sync": {"version": 4}})
    ('baseline', 3.0, {'reward_mean': 0.5, 'sync.version': 4.0})
    """
    prefix = next((str(msg[k]) for k in PREFIX_KEYS if isinstance(msg.get(k), str)), None)
    step = next((_number(msg[k]) for k in STEP_KEYS if _number(msg.get(k)) is not None), None)
    out: dict[str, float] = {}

    def walk(d: Mapping[str, Any], path: str) -> None:
        for k, v in d.items():
            if isinstance(v, Mapping):
                walk(v, f"{path}{k}.")
            elif (x := _number(v)) is not None:
                out[f"{path}{k}"] = x

    walk({k: v for k, v in msg.items() if k not in PREFIX_KEYS and k not in STEP_KEYS}, "")
    if step is None:                                     # {"eval": {"step": ..}}: the nested step is the step
        nested = next((k for s in STEP_KEYS for k in out if k.endswith(f".{s}")), None)
        if nested is not None:
            step = out.pop(nested)
    return prefix, step, out


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


def _params(spec: Any, limit: int = 100) -> dict[str, str]:
    """Scalar fields of a driver spec (dataclass, pydantic model, dict or JSON text) as MLflow params
    (dotted names, values cut to 500 characters, at most ``limit``)."""
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump()
    elif hasattr(spec, "__dataclass_fields__"):
        import dataclasses

        spec = dataclasses.asdict(spec)
    elif isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return {}
    out: dict[str, str] = {}

    def walk(d: Mapping[str, Any], path: str) -> None:
        for k, v in d.items():
            if len(out) >= limit:
                return
            if isinstance(v, Mapping):
                walk(v, f"{path}{k}.")
            elif isinstance(v, (str, int, float, bool)) or v is None:
                out[f"{path}{k}"] = str(v)[:500]

    if isinstance(spec, Mapping):
        walk(spec, "")
    return out


class Tracker:
    """One MLflow run for one launch (rank 0), written through ``mlflow.MlflowClient``.

    Args:
        uri: the MLflow tracking URI (``http://mlflow:5000``, ``sqlite:///...``).
        experiment: experiment name (created when missing).
        run_name: the MLflow run name (``<asset>[<partition>]``).
        run_dir: the launch's run folder; ``tracking.json`` there keeps the MLflow run id for a resume.
        tags: run tags (Dagster run id, asset, partition, retry number).
        params: logged once, when the MLflow run is created.
        warn: where the one warning goes when tracking fails.
        flush_every_s: metrics are sent in batches at most this often (and at ``close``).
    """

    def __init__(self, uri: str, experiment: str, run_name: str, run_dir: Path, *, tags: Mapping[str, str] = {},
                 params: Mapping[str, str] = {}, warn: Callable[[str], None] = print, flush_every_s: float = 5.0):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow import MlflowClient

        self.warn, self.flush_every_s, self.uri = warn, flush_every_s, uri
        self.client = MlflowClient(tracking_uri=uri)
        self._pending: list = []
        self._counters: dict[Optional[str], int] = {}
        self._last_flush = time.monotonic()
        self.active = True
        record = Path(run_dir) / "tracking.json"
        saved = json.loads(record.read_text()) if record.exists() else {}
        if saved.get("uri") == uri and saved.get("run_id"):
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            self.resumed = True
        else:
            exp = self.client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
            run = self.client.create_run(exp_id, run_name=run_name, tags=dict(tags))
            self.run_id, self.resumed = run.info.run_id, False
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[i:i + 100])
            from ops.lake import write_json_atomic

            write_json_atomic({"uri": uri, "run_id": self.run_id, "experiment": experiment}, record)

    def log_message(self, msg: Any) -> None:
        """Queue the metrics of one Pipes custom message (non-dict payloads are ignored)."""
        if not self.active or not isinstance(msg, Mapping):
            return
        from mlflow.entities import Metric

        prefix, step, metrics = flatten_message(msg)
        if not metrics:
            return
        if step is None:
            step = self._counters.get(prefix, 0)
            self._counters[prefix] = int(step) + 1
        ts = int(time.time() * 1000)
        name = (lambda k: f"{prefix}/{k}") if prefix else (lambda k: k)
        self._pending.extend(Metric(name(k), v, ts, int(step)) for k, v in metrics.items())
        if time.monotonic() - self._last_flush >= self.flush_every_s or len(self._pending) >= 900:
            self.flush()

    def flush(self) -> None:
        """Send the queued metrics (MLflow takes at most 1,000 per batch)."""
        if not self.active:
            return
        try:
            while self._pending:
                batch, self._pending = self._pending[:1000], self._pending[1000:]
                self.client.log_batch(self.run_id, metrics=batch)
        except Exception as e:                            # tracking never stops training
            self._off(e)
        self._last_flush = time.monotonic()

    def close(self, failed: bool = False) -> None:
        """Flush and mark the MLflow run FINISHED (or FAILED)."""
        self.flush()
        if self.active:
            try:
                self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
            except Exception as e:
                self._off(e)

    def _off(self, e: Exception) -> None:
        self.active, self._pending = False, []
        self.warn(f"experiment tracking at {self.uri} failed ({type(e).__name__}: {str(e)[:300]}); "
                  "tracking is off for the rest of this launch (training goes on)")


def open_tracker(run_dir: Path, spec: Any, pipes: Any) -> Optional[Tracker]:
    """The launch's ``Tracker`` when ``CRUCIBLE_TRACKING_URI`` is set (rank 0 only), else None.
    Names and tags come from the Pipes context when there is one. A server that cannot be reached
    gives one warning and None."""
    uri = os.environ.get(URI_ENV)
    if not uri or int(os.environ.get("RANK", "0")) != 0:
        return None
    ctx = {k: _context_value(pipes, k) for k in ("run_id", "asset_key", "partition_key")}
    asset = ctx["asset_key"] or Path(run_dir).parent.name
    name = f"{asset}[{ctx['partition_key']}]" if ctx["partition_key"] else str(asset)
    tags = {"dagster.run_id": str(ctx["run_id"] or ""), "dagster.asset": str(asset),
            "dagster.partition": str(ctx["partition_key"] or ""), "crucible.run_dir": str(run_dir)}
    warn = pipes.log.warning if hasattr(pipes.log, "warning") else print
    try:
        tracker = Tracker(uri, os.environ.get(EXPERIMENT_ENV, "crucible"), name, run_dir, tags=tags,
                          params=_params(spec), warn=warn)
    except Exception as e:
        warn(f"experiment tracking at {uri} could not start ({type(e).__name__}: {str(e)[:300]}); "
             "this launch runs without it")
        return None
    pipes.log.info(f"tracking: MLflow run {tracker.run_id} at {uri}" + (" (resumed)" if tracker.resumed else ""))
    return tracker


def _context_value(pipes: Any, name: str) -> Any:
    """A Pipes context property, or None where the step has none (Pipes raises for an undefined one,
    e.g. ``partition_key`` of an unpartitioned step)."""
    try:
        return getattr(pipes, name, None)
    except Exception:
        return None


class TrackedPipes:
    """A Pipes context whose custom messages also go to a ``Tracker``; everything else is the
    wrapped context's."""

    def __init__(self, pipes: Any, tracker: Tracker):
        self._pipes, self._tracker = pipes, tracker

    def report_custom_message(self, payload: Any) -> None:
        self._pipes.report_custom_message(payload)
        self._tracker.log_message(payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipes, name)
