"""The launch protocol: how every asset that trains out of process starts, resumes and finishes its
run (docs/architecture.md, "Launching out-of-process work"). The worker side is
``ops.launch.worker_main``.

A Pipes asset reads like a short recipe::

    spec = build_and_validate(config)                       # the driver's spec (a dict or JSON text)
    with launch(context, compute, base=lake.base, asset="rollpacker_run",
                module="ops.rl.rollpacker.driver", spec=spec.to_json(),
                fingerprint=spec_fingerprint(spec_dict, data_path), timeout_s=config.run_timeout_s,
                saved=describe_saved_state) as run:
        ...                                                  # run.result -> tables and metadata
        return dg.MaterializeResult(metadata={**run.metadata(), ...})

What the protocol guarantees:
- **Run folder per run lineage**: ``<base>/<asset>/.run-[<key>-]<root run id>``; the root run id is
  the run's own id, or for a re-execution or a run-level retry the id of the run it re-executes, so
  a step retry (``resources.retry.RetryingComputeResource`` after a launch death), a re-execution
  from failure and a run retry all relaunch over the same folder. A new materialization starts in
  a new folder.
- **Resume**: the driver finds what it saved in that folder and continues after it; ``saved(run_dir)``
  describes the saved state for the log.
- **Reuse**: a finished launch's ``result.json`` whose fingerprint equals this spec's is reused
  without launching (its step failed later, e.g. while writing metadata); another spec's result is
  deleted first so it can never pass for this launch's.
- **Pipes**: the launch runs in a Dagster Pipes session (``ComputeResource.run``): rank 0 streams
  logs and custom messages; the Dagster retry number travels in the Pipes extras.
- **Time limit**: a wall-clock timeout, after which the launch's whole process group is killed.
- **Commit by the step only**: a driver writes only into its run folder; an output it makes for the
  lake goes to ``staged(run_dir, name)`` (``<run folder>/outputs/<name>``, the path the asset puts
  in the spec), and the step moves it onto its lake path (``outputs``: name -> path) only when the
  ``with`` block finishes without an exception, i.e. after the driver's result was found with this
  spec's fingerprint and the asset validated it and wrote its tables. So a killed run, a failed
  step or a late worker never changes a committed output (case orchestrator-killed-mid-training);
  and with ``resources.compute.start_guarded`` no worker outlives its step anyway.
- **Cleanup**: the folder is removed when the ``with`` block finishes without an exception, i.e.
  once the asset's outputs are written; on an exception it stays for the retry.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import dagster as dg

from ops.lake import write_json_atomic


@dataclass
class Launched:
    """The outcome of one launch (or of the finished launch it reused).

    Attributes:
        result: the driver's ``result.json`` (with ``fingerprint`` and ``retry_number``).
        messages: the Pipes custom messages of this attempt (empty when reused).
        run_dir: the run folder.
        reused: True when a finished launch's result was reused and nothing was launched.
        retry_number: Dagster's retry number of this step attempt (0 on the first attempt).
        saved: what ``saved(run_dir)`` said before the launch (``""`` when nothing was saved).
    """

    result: dict
    messages: list = field(default_factory=list)
    run_dir: Path = Path(".")
    reused: bool = False
    retry_number: int = 0
    saved: str = ""

    def metadata(self) -> dict[str, dg.MetadataValue]:
        """The launch's own metadata entries: retry number, Pipes messages, reuse, what it resumed from."""
        return {"retry_number": dg.MetadataValue.int(self.retry_number),
                "pipes_messages": dg.MetadataValue.int(len(self.messages)),
                "reused_finished_launch": dg.MetadataValue.bool(self.reused),
                "resumed_from_saved": dg.MetadataValue.text(self.saved or "none")}


def run_dir_for(context: dg.AssetExecutionContext, base: str | Path, asset: str, key: str = "") -> Path:
    """``<base>/<asset>/.run-[<key>-]<root run id>``: the same folder for every attempt of this asset
    (and partition ``key``) within one run lineage."""
    root = context.run.root_run_id or context.run.run_id
    return Path(base) / asset / f".run-{key + '-' if key else ''}{root}"


def staged(run_dir: str | Path, name: str) -> Path:
    """Where a driver writes the output ``name`` (a file or a folder) that the step commits
    (``launch(outputs=...)``): ``<run_dir>/outputs/<name>``."""
    return Path(run_dir) / "outputs" / name


def stage_committed(committed: str | Path, stage: str | Path, reusable: bool, log: Optional[Callable[[str], None]] = None) -> bool:
    """Put a committed output (a folder or a file) back into the run's staging path so that the
    driver (which sees only its run folder) can reuse it instead of retraining, and the commit moves
    the same bytes back.

    Args:
        committed: the output's lake folder or file.
        stage: its staging path (``staged(run_dir, name)``).
        reusable: the caller's verdict that the committed folder is this spec's finished result
            (e.g. its ``metrics.json`` carries this run's fingerprint and its files exist). Only
            then is anything staged: a driver that retrains writes new files and never rewrites a
            hard-linked committed file in place.
        log: where to say that the folder was staged.
    Returns:
        True when the folder was staged (hard links; copies where links fail); False when it was
        not reusable, missing, or already staged (a retry over the same run folder).
    """
    src, dst = Path(committed), Path(stage)
    if not reusable or dst.exists() or not src.exists():
        return False

    def link(a, b):
        import os

        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    tmp = dst.parent / f".{dst.name}.linking"
    shutil.rmtree(tmp, ignore_errors=True)
    if tmp.is_file():
        tmp.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, tmp, copy_function=link)
    else:
        link(src, tmp)
    tmp.rename(dst)
    if log is not None:
        log(f"{src}: the committed output matches this spec; staged for reuse at {dst}")
    return True


def committed_fingerprint(path: str | Path) -> Optional[str]:
    """The ``fingerprint`` of a committed result record (a JSON file), None when the file is missing
    or unreadable (then nothing is reused)."""
    try:
        return json.loads(Path(path).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def commit_outputs(run_dir: Path, outputs: Mapping[str, str | Path]) -> list[Path]:
    """Move every staged output of ``run_dir`` onto its lake path (a folder through
    ``ops.lake.replace_dir_atomic``: never partly written; a file through ``os.replace``). Returns
    the paths committed. Raises dg.Failure naming every output that is not staged (nothing is
    moved then)."""
    import os

    from ops.lake import replace_dir_atomic

    missing = [f"{n} ({staged(run_dir, n)})" for n in outputs if not staged(run_dir, n).exists()]
    if missing:
        raise dg.Failure(f"the driver finished without staging its outputs: {', '.join(missing)}")
    done = []
    for name, dest in outputs.items():
        src, dest = staged(run_dir, name), Path(dest)
        if src.is_dir():
            replace_dir_atomic(src, dest)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
        done.append(dest)
    return done


def worker_command(compute, module: str, args: list[str], processes: Optional[int]) -> list[str]:
    """The argv of a driver module: ``python -m module`` in one process when ``processes`` is None,
    else ``accelerate launch -m`` / ``torchrun -m`` on ``processes`` ranks (``compute``'s launcher)."""
    if processes is None:
        return [sys.executable, "-m", module, *args]
    return compute.launch_command(module, args, num_processes=processes, module=True)


@contextmanager
def launch(context: dg.AssetExecutionContext, compute, *, base: str | Path, asset: str, module: str,
           spec: str | Mapping[str, Any], fingerprint: str, timeout_s: float, key: str = "",
           saved: Optional[Callable[[Path], str]] = None, processes: Optional[int] = None,
           env: Optional[Mapping[str, str]] = None, extra_args: tuple[str, ...] = (),
           ray_job: bool = False, outputs: Optional[Mapping[str, str | Path]] = None) -> Iterator[Launched]:
    """Launch (or resume, or reuse) the driver ``module`` for this asset and yield its outcome.

    Args:
        context: the asset's execution context (run ids, retry number, Pipes session, log).
        compute: ``resources.compute.ComputeResource`` (launcher, environment, timeout handling).
        base: the lake root; the run folder lives under ``<base>/<asset>/``.
        asset: the asset name (folder and log prefix).
        module: the driver, run as ``python -m module --spec --out --fingerprint`` (it calls
            ``ops.launch.worker_main``).
        spec: the driver's spec, already validated (JSON text or a JSON-serialisable mapping).
        fingerprint: ``ops.launch.spec_fingerprint`` of what determines the run's steps.
        timeout_s: wall-clock limit of the launch (s); the process group is killed after it.
        key: partition (or other) key that separates run folders of one asset in one run.
        saved: ``saved(run_dir)`` -> a description of the saved state ("" when none), for the log.
        processes: None = one process; n = n ranks through the compute resource's launcher.
        env: extra environment variables for the launch.
        extra_args: extra command-line arguments for the driver.
        ray_job: the driver is a Ray driver; with ``compute.ray_jobs_address`` set it is submitted
            as a Ray Job (``ComputeResource.run_ray_job``; Pipes messages through a file in the run
            folder) instead of a local process.
        outputs: output name -> lake path. The driver writes each to ``staged(run_dir, name)``
            (the asset gives it that path: ``run_dir_for`` then ``staged``); they are committed
            (``commit_outputs``) when the block exits without an exception, before the run folder
            is removed. Outputs a driver writes straight into the lake are not protected.
    Yields:
        Launched. The run folder is removed when the block exits without an exception.
    Raises:
        dg.Failure: the launch failed, timed out, or finished without ``result.json`` or without a
            staged output (named).
    """
    name = f"{asset}[{key}]" if key else asset
    run_dir = run_dir_for(context, base, asset, key)
    run_dir.mkdir(parents=True, exist_ok=True)
    res_path = run_dir / "result.json"
    attempt = context.retry_number + 1
    done = json.loads(res_path.read_text()) if res_path.exists() else None
    if done is not None and done.get("fingerprint") == fingerprint:
        context.log.info(f"{name}: attempt {attempt} reuses the finished launch's result in {run_dir}")
        out = Launched(done, [], run_dir, True, context.retry_number, "")
    else:
        res_path.unlink(missing_ok=True)               # another spec's result must not pass for this launch's
        what = saved(run_dir) if saved is not None else ""
        context.log.info(f"{name}: attempt {attempt} in {run_dir}: " + (
            f"{what}; the driver resumes after it" if what else "nothing saved, starting from the first step"))
        spec_path = run_dir / "spec.json"
        if isinstance(spec, str):
            from ops.lake import atomic_path

            with atomic_path(spec_path) as tmp:
                tmp.write_text(spec)
        else:
            write_json_atomic(dict(spec), spec_path, indent=1)
        args = ["--spec", str(spec_path), "--out", str(run_dir), "--fingerprint", fingerprint, *extra_args]
        extras = {"retry_number": context.retry_number, "fingerprint": fingerprint}
        if ray_job and getattr(compute, "ray_jobs_address", None):
            messages = run_dir / f"pipes-messages-{context.retry_number}.jsonl"
            inv = compute.run_ray_job(context, module, args, messages_path=str(messages), extras=extras,
                                      env=dict(env or {}), timeout_s=timeout_s)
        else:
            inv = compute.run(context, "", command=worker_command(compute, module, args, processes), timeout_s=timeout_s,
                              env=dict(env or {}), extras=extras)
        if not res_path.exists():
            raise dg.Failure(f"{name}: the driver {module} finished without a result file at {res_path}")
        out = Launched(json.loads(res_path.read_text()), inv.get_custom_messages(), run_dir, False,
                       context.retry_number, what)
    if outputs:                                         # checked now: a retry must not find the result and no output
        missing = [n for n in outputs if not staged(run_dir, n).exists()]
        if missing:
            raise dg.Failure(f"{name}: the driver {module} finished without staging {missing} under {run_dir / 'outputs'}")
    yield out
    if outputs:                                         # the block (the asset's validation and tables) succeeded
        for dest in commit_outputs(run_dir, outputs):
            context.log.info(f"{name}: committed {dest}")
    shutil.rmtree(run_dir, ignore_errors=True)          # only now: every failure above may be retried over it
