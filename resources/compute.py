"""Compute: how training assets launch their worker processes (docs/architecture.md, "Launching out-of-process work").

The embedded default launches CPU processes with ``accelerate launch``; production swaps this
resource's config (a GPU accelerate config file, more processes, mixed precision), never the code.
The argv and the ranks' environment are built by ``ops.launcher.Launcher`` (no Dagster; the
benchmarks use it directly) from this resource's launch fields, which take their defaults from it.
Workers are started through Dagster Pipes (``dg.open_pipes_session``) so that rank 0 streams logs,
custom messages and the materialization back to the step. Every launch has a wall-clock timeout.
"""

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Optional

import dagster as dg

from ops.docstrings import describe_fields
from ops.launcher import Launcher


@describe_fields  # the attribute docstrings are the UI descriptions
class ComputeResource(dg.ConfigurableResource):
    """Where and how training workers run."""

    launcher: Literal["accelerate", "torchrun"] = Launcher.launcher
    """``accelerate`` (``accelerate launch``) or ``torchrun``."""
    num_processes: int = Launcher.num_processes
    """Processes per launch (ranks; >= 1). On CPU each is one gloo rank. With ``accelerate_config_file``
    accelerate starts the file's process count, while the assets still size their launches and global
    batches by this field: keep the two equal."""
    cpu: bool = Launcher.cpu
    """Force CPU training (the embedded default). Multi-process CPU runs need ``ACCELERATE_USE_CPU=true``
    *and* ``--multi_gpu``: ``accelerate launch --cpu --num_processes 2`` silently starts a single process
    (docs/platform-notes.md, "accelerate on CPU")."""
    accelerate_config_file: Optional[str] = Launcher.accelerate_config_file
    """An accelerate YAML config (production GPU profile); when set it replaces
    ``--multi_gpu/--num_processes/--mixed_precision`` on the command line."""
    mixed_precision: Literal["no", "fp16", "bf16"] = Launcher.mixed_precision
    """``no`` | ``fp16`` | ``bf16``; ignored on CPU, with ``torchrun`` and when ``accelerate_config_file``
    is set (the file's setting applies)."""
    threads_per_process: int = Launcher.threads_per_process
    """``OMP_NUM_THREADS`` for each rank (CPU oversubscription guard)."""
    launch_timeout_s: float = 1800.0
    """Fallback wall-clock limit of a launch (s) whose caller gives none; the process group is killed (a
    Ray job stopped) after it. Every asset passes its run config's own limit (``timeout_s`` /
    ``run_timeout_s``), which wins, so this does not bound the assets' launches."""
    ray_address: Optional[str] = None
    """Ray cluster for the RL assets (None = a local instance the driver starts) when the driver is
    launched on the Dagster step's machine (``run``, no ``ray_jobs_address``; it then connects as a Ray
    driver: use a GCS address ``host:6379`` from a cluster node)."""
    ray_jobs_address: Optional[str] = None
    """The Ray Jobs API of a cluster (its dashboard, ``http://head:8265``). When set, the RL drivers are
    submitted as Ray Jobs (``run_ray_job``): the installed crucible packages travel as the job's
    ``runtime_env`` py_modules (``crucible_py_modules``), the driver runs on the cluster and connects to
    it, and ``ray_address`` is ignored. The lake must be a filesystem the cluster shares."""
    ray_job_poll_s: float = 1.0
    """Seconds between Ray job status polls."""
    rl_engine_gpus: float = 0.0
    """GPUs each RL engine actor requests from Ray (``num_gpus``; 0 = CPU, the embedded default; the prod
    profile's default is 1, pipelines/profiles.py). The model then runs on the CUDA device Ray assigns
    (``ops.rl.runs.PolicySpec``)."""
    rl_trainer_gpus: float = 0.0
    """GPUs each RL trainer actor requests from Ray (``num_gpus``; 0 = CPU, the embedded default; the prod
    profile's default is 1, pipelines/profiles.py). The model then runs on the CUDA device Ray assigns
    (``ops.rl.runs.PolicySpec``)."""
    tracking_uri: Optional[str] = Launcher.tracking_uri
    """An MLflow tracking URI (``http://mlflow:5000``); None = no experiment tracking (the default). When
    set, every launched driver logs its training curves there, one MLflow run per launch (``ops.tracking``;
    docs/operations.md, "Experiment tracking")."""
    tracking_experiment: str = Launcher.tracking_experiment
    """The MLflow experiment those runs go to."""

    def launcher_settings(self) -> Launcher:
        """This resource's launch fields as an ``ops.launcher.Launcher`` (the one argv/env builder)."""
        return Launcher(launcher=self.launcher, num_processes=self.num_processes, cpu=self.cpu,
                        accelerate_config_file=self.accelerate_config_file, mixed_precision=self.mixed_precision,
                        threads_per_process=self.threads_per_process, tracking_uri=self.tracking_uri,
                        tracking_experiment=self.tracking_experiment)

    def launch_command(self, script: str, args: Sequence[str] = (), num_processes: Optional[int] = None,
                       port: Optional[int] = None, module: bool = False) -> list[str]:
        """The argv that starts ``script`` on ``num_processes`` ranks (default: ``self.num_processes``);
        with ``module=True`` ``script`` is a module name run as with ``python -m`` on every rank
        (``ops.launcher.Launcher.command``).

        Raises:
            ValueError: ``num_processes < 1``.
        """
        return self.launcher_settings().command(script, args, num_processes, port=port, module=module)

    def launch_env(self) -> dict[str, str]:
        """The environment every rank gets on top of the caller's (``ops.launcher.Launcher.env``)."""
        return self.launcher_settings().env()

    def run(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str] = (), *,
            extras: Optional[Mapping[str, Any]] = None, num_processes: Optional[int] = None,
            env: Optional[Mapping[str, str]] = None, timeout_s: Optional[float] = None,
            command: Optional[Sequence[str]] = None) -> dg.PipesClientCompletedInvocation:
        """Launch ``script`` (or an explicit ``command``) in a Pipes session and wait for it.

        Only rank 0 of the workers may open the Pipes channel (see ``ops.launch.rank0_pipes``).
        Nothing of the launch outlives this call or this process (``start_guarded``): when the
        launch ends, what is left in its process group is killed; when the step process dies, the
        launcher, its ranks and a local Ray cluster they started die within about a second.

        Raises:
            dg.Failure: the launch exited non-zero or ran past ``timeout_s`` (its whole process
                group is killed first, so no rank is left behind).
        """
        cmd = list(command) if command is not None else self.launch_command(script, args, num_processes)
        limit = self.launch_timeout_s if timeout_s is None else timeout_s
        with dg.open_pipes_session(context=context, context_injector=dg.PipesTempFileContextInjector(),
                                   message_reader=dg.PipesTempFileMessageReader(), extras=extras) as session:
            full_env = {**os.environ, **self.launch_env(), **(env or {}), **session.get_bootstrap_env_vars()}
            context.log.info(f"launch: {' '.join(cmd)}")
            proc, watch = start_guarded(cmd, full_env)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise dg.Failure(f"launch ran past its {limit:.0f} s timeout and was killed: {' '.join(cmd)}")
            except BaseException:
                _kill_group(proc)
                raise
            finally:
                _kill_group(proc)                   # what the launch left in its group (a local Ray cluster's agents)
                _stop_watch(watch)
            if rc != 0:
                raise dg.Failure(f"launch exited with code {rc}: {' '.join(cmd)}", metadata={"exit_code": rc})
        return dg.PipesClientCompletedInvocation(session)


    def run_ray_job(self, context: dg.AssetExecutionContext, module: str, args: Sequence[str], *,
                    messages_path: str, extras: Optional[Mapping[str, Any]] = None,
                    env: Optional[Mapping[str, str]] = None, timeout_s: Optional[float] = None,
                    working_dir: Optional[str] = None,
                    metadata: Optional[Mapping[str, str]] = None) -> dg.PipesClientCompletedInvocation:
        """Submit ``python -m module args`` as a Ray Job at ``ray_jobs_address`` inside a Pipes
        session, and wait for it.

        The Pipes context travels in the job's environment (``PipesEnvContextInjector``), and
        messages come back through ``messages_path`` (``PipesFileMessageReader``: a file in the run
        folder, on the shared lake). The job's ``runtime_env`` carries ``py_modules`` = the crucible
        packages this process imports (``crucible_py_modules``: pipelines, assets, ops, resources,
        ~3 MB, wherever they are installed: a wheel's site-packages or a checkout; never the parent
        folder of a module, which in a wheel install is the whole site-packages), an optional
        ``working_dir`` (a caller's own files only) and the launch environment, so the driver and every
        actor it starts import the code this step runs; the cluster's Python must have the third-party
        dependencies (the project's image). The job id is
        ``crucible-<first 8 chars of the run id>-r<retry>-<random>``. A head whose job agent is not up yet ("try again
        later") is retried for up to 120 s.

        Raises:
            ValueError: ``ray_jobs_address`` is not set.
            dg.Failure: the submission failed, the job failed or was stopped (the tail of its logs is in the message),
                or ran past ``timeout_s`` (it is stopped first).
        """
        import shlex
        import time
        import uuid

        from ray.job_submission import JobStatus, JobSubmissionClient

        if not self.ray_jobs_address:
            raise ValueError("compute.ray_jobs_address is not set: no Ray Jobs API to submit to")
        limit = self.launch_timeout_s if timeout_s is None else timeout_s
        runtime_env: dict[str, Any] = {"py_modules": crucible_py_modules(), "excludes": ["__pycache__", "*.pyc"]}
        if working_dir:
            runtime_env["working_dir"] = working_dir
        entrypoint = shlex.join(["python", "-m", module, *args])
        client = JobSubmissionClient(self.ray_jobs_address)
        job_id = f"crucible-{context.run.run_id[:8]}-r{context.retry_number}-{uuid.uuid4().hex[:6]}"
        terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=dg.PipesFileMessageReader(messages_path), extras=extras) as session:
            env_vars = {**self.launch_env(), **(env or {}), **session.get_bootstrap_env_vars()}
            submit_by = time.monotonic() + 120.0
            while True:     # a head that just started answers 500 "No available agent ... try again later"
                try:
                    client.submit_job(entrypoint=entrypoint, submission_id=job_id,
                                      runtime_env={**runtime_env, "env_vars": env_vars},
                                      metadata={"dagster_run_id": context.run.run_id,
                                                "asset": context.asset_key.to_user_string(), **(metadata or {})})
                    break
                except RuntimeError as e:
                    if "try again later" not in str(e) or time.monotonic() > submit_by:
                        raise dg.Failure(f"Ray job submission to {self.ray_jobs_address} failed: {e}") from e
                    context.log.info(f"Ray Jobs API not ready ({e}); retrying")
                    time.sleep(2.0)
            context.log.info(f"launch: Ray job {job_id} at {self.ray_jobs_address}: {entrypoint} "
                             f"(py_modules {', '.join(runtime_env['py_modules'])})")
            deadline = time.monotonic() + limit
            try:
                while (status := client.get_job_status(job_id)) not in terminal:
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    time.sleep(self.ray_job_poll_s)
            except TimeoutError:
                _stop_job(client, job_id)
                raise dg.Failure(f"Ray job {job_id} ran past its {limit:.0f} s timeout and was stopped: {entrypoint}")
            except BaseException:
                _stop_job(client, job_id)
                raise
            if status != JobStatus.SUCCEEDED:
                tail = "\n".join(client.get_job_logs(job_id).splitlines()[-30:])
                raise dg.Failure(f"Ray job {job_id} ended {status.value}: {entrypoint}\n{tail}",
                                 metadata={"ray_job_id": job_id, "ray_job_status": status.value})
        return dg.PipesClientCompletedInvocation(session)


SHIPPED_PACKAGES = ("pipelines", "assets", "ops", "resources")
"""The packages of the crucible distribution (pyproject.toml ``packages.find``)."""


def crucible_py_modules() -> list[str]:
    """The folders of the crucible packages as this interpreter imports them (``SHIPPED_PACKAGES``),
    for a Ray job's ``runtime_env["py_modules"]``: Ray zips each folder and puts it on the driver's and
    every worker's ``PYTHONPATH`` (ahead of whatever the cluster's Python has installed).

    Raises:
        RuntimeError: a package is not importable or is a namespace spread over several folders.
    """
    import importlib.util

    out = []
    for name in SHIPPED_PACKAGES:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if len(locations) != 1 or not (Path(locations[0]) / "__init__.py").is_file():
            raise RuntimeError(f"crucible package {name!r} is not one importable folder here ({locations}): "
                               "install crucible (pip install crucible) before submitting Ray jobs")
        out.append(str(Path(locations[0]).resolve()))
    return out


def ray_job_probe() -> None:
    """``python -m resources.compute ray-probe``: a Ray job driver that checks what a job ships. It
    connects to its cluster, runs one task (0 CPUs), and reports through Pipes (materialization
    metadata) where the driver and the task imported each crucible package from and which Python ran
    them. Used by tests/test_packaging.py and after a deployment (docs/operations.md, "Ray clusters")."""
    import sys

    import ray
    from dagster_pipes import open_dagster_pipes

    def where() -> dict:
        import importlib

        return {"python": sys.executable,
                **{name: str(Path(importlib.import_module(name).__file__).resolve().parent) for name in SHIPPED_PACKAGES}}

    with open_dagster_pipes() as pipes:
        ray.init(address="auto")
        try:
            task = ray.get(ray.remote(num_cpus=0)(where).remote(), timeout=120)
        finally:
            ray.shutdown()
        driver = where()
        pipes.log.info(f"ray-probe: driver imports crucible from {driver['pipelines']}, a task from {task['pipelines']}")
        pipes.report_asset_materialization(metadata={"driver": {"raw_value": driver, "type": "json"},
                                                     "task": {"raw_value": task, "type": "json"}})


def start_guarded(cmd: Sequence[str], env: Mapping[str, str]) -> "tuple[subprocess.Popen, Optional[subprocess.Popen]]":
    """Start a launch so that nothing of it outlives the calling (step) process: the launch runs in
    a process group of its own (so a timeout kills it whole) and gets ``PR_SET_PDEATHSIG`` SIGKILL
    (``ops.launch.pdeathsig_preexec``); its ranks ask for the same at start (``worker_main``); and
    a watchdog (``python -m ops.launch watch``, ``ops.launch.watch_launch``) SIGKILLs the launch's
    whole tree and group within about a second when this process dies (a SIGKILLed or OOM-killed
    step), which is what reaches a local Ray cluster's agents. The caller must stop the watchdog
    (``_stop_watch``) when the launch is over.

    Returns:
        (the launch's process, the watchdog's process or None off Linux).
    """
    import sys

    from ops.launch import pdeathsig_preexec

    proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True, preexec_fn=pdeathsig_preexec())
    watch = None
    if sys.platform.startswith("linux"):
        root = str(Path(__file__).resolve().parents[1])
        watch = subprocess.Popen([sys.executable, "-m", "ops.launch", "watch", str(os.getpid()), str(proc.pid)],
                                 cwd=root, env={**os.environ, "PYTHONPATH": root}, start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return proc, watch


def _stop_watch(watch: "Optional[subprocess.Popen]") -> None:
    if watch is None:
        return
    try:
        watch.kill()
        watch.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _stop_job(client, job_id: str, wait_s: float = 30.0) -> None:
    """Stop a Ray job and wait (bounded) until it is terminal."""
    import time

    from ray.job_submission import JobStatus

    try:
        client.stop_job(job_id)
        deadline = time.monotonic() + wait_s
        while client.get_job_status(job_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            if time.monotonic() > deadline:
                return
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 - best effort: the job may already be gone
        pass


if __name__ == "__main__":
    import sys as _sys

    if _sys.argv[1:] != ["ray-probe"]:
        raise SystemExit("usage: python -m resources.compute ray-probe   (a Ray job driver; see ray_job_probe)")
    ray_job_probe()
