"""Compute: how training assets launch their worker processes (docs/architecture.md, "Launching out-of-process work").

The embedded default launches CPU processes with ``accelerate launch``; production swaps this
resource's config (a GPU accelerate config file, more processes, mixed precision), never the code.
Workers are started through Dagster Pipes (``dg.open_pipes_session``) so that rank 0 streams logs,
custom messages and the materialization back to the step. Every launch has a wall-clock timeout.
"""

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional

import dagster as dg


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (for the rendezvous of one launch)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComputeResource(dg.ConfigurableResource):
    """Where and how training workers run.

    Attributes:
        launcher: ``accelerate`` (``accelerate launch``) or ``torchrun``.
        num_processes: processes per launch (ranks). On CPU each is one gloo rank.
        cpu: force CPU training (the embedded default). Multi-process CPU runs need
            ``ACCELERATE_USE_CPU=true`` *and* ``--multi_gpu``: ``accelerate launch --cpu
            --num_processes 2`` silently starts a single process (docs/platform-notes.md, "accelerate on CPU").
        accelerate_config_file: an accelerate YAML config (production GPU profile); when set it
            replaces ``--multi_gpu/--num_processes/--mixed_precision`` on the command line.
        mixed_precision: ``no`` | ``fp16`` | ``bf16`` (ignored on CPU).
        threads_per_process: ``OMP_NUM_THREADS`` for each rank (CPU oversubscription guard).
        launch_timeout_s: wall-clock limit of one launch; the process group is killed after it.
        ray_address: Ray cluster for the RL assets (``None`` = a local instance).
    """

    launcher: Literal["accelerate", "torchrun"] = "accelerate"
    num_processes: int = 2
    cpu: bool = True
    accelerate_config_file: Optional[str] = None
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    threads_per_process: int = 1
    launch_timeout_s: float = 1800.0
    ray_address: Optional[str] = None

    def launch_command(self, script: str, args: Sequence[str] = (), num_processes: Optional[int] = None,
                       port: Optional[int] = None, module: bool = False) -> list[str]:
        """The argv that starts ``script`` on ``num_processes`` ranks (default: ``self.num_processes``);
        with ``module=True`` ``script`` is a module name run as with ``python -m`` on every rank.

        Raises:
            ValueError: ``num_processes < 1``.
        """
        n = self.num_processes if num_processes is None else num_processes
        if n < 1:
            raise ValueError(f"compute.num_processes must be >= 1, got {n}")
        port = port or free_port()
        if self.launcher == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(n),
                    "--master_addr", "127.0.0.1", "--master_port", str(port), *(["-m"] if module else []), script, *args]
        cmd = [sys.executable, "-m", "accelerate.commands.launch"]
        if self.accelerate_config_file:
            cmd += ["--config_file", self.accelerate_config_file]
        else:
            if n > 1:
                cmd += ["--multi_gpu"]
            cmd += ["--num_processes", str(n), "--num_machines", "1", "--dynamo_backend", "no",
                    "--mixed_precision", "no" if self.cpu else self.mixed_precision]
            if self.cpu and n == 1:
                cmd += ["--cpu"]
        cmd += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *(["-m"] if module else []), script, *args]
        return cmd

    def launch_env(self) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": str(self.threads_per_process), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1"}
        if self.cpu:
            env["ACCELERATE_USE_CPU"] = "true"
        return env

    def run(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str] = (), *,
            extras: Optional[Mapping[str, Any]] = None, num_processes: Optional[int] = None,
            env: Optional[Mapping[str, str]] = None, timeout_s: Optional[float] = None,
            command: Optional[Sequence[str]] = None) -> dg.PipesClientCompletedInvocation:
        """Launch ``script`` (or an explicit ``command``) in a Pipes session and wait for it.

        Only rank 0 of the workers may open the Pipes channel (see ``ops.launch.rank0_pipes``).

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
            proc = subprocess.Popen(cmd, env=full_env, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise dg.Failure(f"launch ran past its {limit:.0f} s timeout and was killed: {' '.join(cmd)}")
            except BaseException:
                _kill_group(proc)
                raise
            if rc != 0:
                raise dg.Failure(f"launch exited with code {rc}: {' '.join(cmd)}", metadata={"exit_code": rc})
        return dg.PipesClientCompletedInvocation(session)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
