"""The worker side of a launch: only rank 0 talks to Dagster (FACTS.md: when every rank opens the
Pipes channel the step fails with "multiple materialize results").

A script started by ``resources.compute.ComputeResource.run`` does::

    with rank0_pipes() as pipes:
        pipes.log.info("...")
        pipes.report_custom_message({"step": 10, "loss": 2.3})

On other ranks, or when the script runs by hand without Dagster, ``pipes`` is a stand-in with the
same methods that logs to stderr and reports nothing. No Dagster import: only ``dagster_pipes``.
"""

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def rank() -> int:
    """This process's global rank (``RANK`` as set by torchrun/accelerate; 0 when launched alone)."""
    return int(os.environ.get("RANK", "0"))


class _LocalPipes:
    """What non-zero ranks (and hand-run scripts) get instead of a Pipes context."""

    def __init__(self, rank: int):
        self.log = logging.getLogger(f"crucible.rank{rank}")
        if not self.log.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter(f"[rank {rank}] %(message)s"))
            self.log.addHandler(h)
            self.log.setLevel(logging.INFO)
        self.extras: dict[str, Any] = {}
        self.partition_key = None

    def report_custom_message(self, payload: Any) -> None:
        pass

    def report_asset_materialization(self, *args: Any, **kwargs: Any) -> None:
        pass

    def report_asset_check(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextmanager
def rank0_pipes() -> Iterator[Any]:
    """Yield the Dagster Pipes context on rank 0 of a Pipes launch, else a local stand-in."""
    r = rank()
    if r == 0 and os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            yield pipes
    else:
        yield _LocalPipes(r)


def data_parallel(global_batch: int):
    """The accelerate ``Accelerator`` of a data-parallel worker started by ``ComputeResource`` (CPU when
    ``ACCELERATE_USE_CPU`` is set, as the embedded profile does), with the global batch split evenly.

    Returns:
        (accelerator, world_size, rank, local_batch) with local_batch = global_batch / world_size.
    Raises:
        ValueError: ``global_batch`` is not a multiple of the number of processes.
    """
    from accelerate import Accelerator

    acc = Accelerator(cpu=os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true"))
    world = acc.num_processes
    if global_batch % world:
        raise ValueError(f"global_batch {global_batch} is not a multiple of the {world} processes")
    return acc, world, acc.process_index, global_batch // world


def crash_after(env_var: str, unit: str) -> "int | None":
    """Fault injection shared by the training launches: the integer N in ``env_var`` (kill the launch
    after N ``unit``), or None when it is unset. Raises ValueError naming the variable when it is not
    an integer."""
    raw = os.environ.get(env_var, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{env_var} must be an integer ({unit} before the simulated crash), got {raw!r}") from None
