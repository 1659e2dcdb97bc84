"""The errors of the GBA package (docs/gba.md), in a module of their own that imports nothing, so
that every other module of ``ops.gba`` can raise them without importing another (``config`` imports
``staleness`` and ``trace``; they raise ``GBAConfigError`` from here, not from ``config``)."""


class GBAConfigError(ValueError):
    """A run specification that cannot run; the message names the field (``cluster.workers``,
    ``policy.decay.rate``, ``trace.kind``, ...)."""


class CheckpointError(RuntimeError):
    """A committed checkpoint cannot be read (a file is missing or does not match); names the file."""


class LaunchError(RuntimeError):
    """The launcher started a different world than the run asked for (world size, distributed type)."""


class RunFailed(RuntimeError):
    """A launched run that could not finish (every worker lost, the run's time limit); its
    checkpoints are kept, so a relaunch over the same folder resumes from the last one."""
