"""How a launch is started: the argv of ``accelerate launch`` / ``torchrun`` and the environment of
its ranks (docs/architecture.md, "Launching out-of-process work"). No Dagster: this is the one
builder, used by ``resources.compute.ComputeResource`` (whose fields take their defaults from
``Launcher``) and by the benchmarks that launch workers without a Dagster instance
(``benchmarks/gba_bench.py``), so they run where only torch and accelerate are installed.

On CPU, a multi-process launch is ``--multi_gpu --num_processes N`` with ``ACCELERATE_USE_CPU=true``
in the environment, and ``--cpu`` only for a single process: ``accelerate launch --cpu
--num_processes 2`` silently starts one process (docs/platform-notes.md, "accelerate on CPU").
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (for the rendezvous of one launch)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Launcher:
    """The launch settings of ``ComputeResource`` (same names, same meaning, same defaults; its
    field docstrings describe them)."""

    launcher: Literal["accelerate", "torchrun"] = "accelerate"
    num_processes: int = 2
    cpu: bool = True
    accelerate_config_file: Optional[str] = None
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    threads_per_process: int = 1
    tracking_uri: Optional[str] = None
    tracking_experiment: str = "crucible"

    def command(self, script: str, args: Sequence[str] = (), num_processes: Optional[int] = None,
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

    def env(self) -> dict[str, str]:
        """The environment every rank of a launch gets on top of the caller's: threads per process,
        ``ACCELERATE_USE_CPU`` on CPU, and the tracking variables when tracking is on."""
        env = {"OMP_NUM_THREADS": str(self.threads_per_process), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONUNBUFFERED": "1"}
        if self.cpu:
            env["ACCELERATE_USE_CPU"] = "true"
        from ops.tracking import tracking_env

        env.update(tracking_env(self.tracking_uri, self.tracking_experiment))
        return env
