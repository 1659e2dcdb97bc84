"""Launch retries: re-run a training step, with exponential backoff, only when its launch died.

A launch *dies* when the launcher process is killed by a signal (node preemption, OOM killer, pod
eviction: exit code ``-N``, or ``128 + N`` through a shell) — retrying such a step resumes from its
last checkpoint. A launch that *fails* (non-zero exit of the training code, a wall-clock timeout, a
bad config) is not retried: it would fail again. Workers see the attempt number through Dagster
Pipes (``PipesContext.get().retry_number``), so they can log that they resume.

Run-level crashes (the run worker or its pod dies, so no step can ask for a retry) are handled by
the instance: run monitoring marks the run failed (embedded: ``pipelines.run_launcher.LocalRunLauncher``
tells the daemon the worker is gone; without it the run stayed STARTED and was never retried), then
``run_retries`` with ``retry_on_asset_or_op_failure: false`` re-executes it from failure over the
same run folder (``crucible setup``: pipelines/cli.py; deploy/helm/values.yaml). Both need the
daemon (docs/operations.md, "Killed runs, monitoring and retries").
"""

import re
import signal
from collections.abc import Sequence
from typing import Any, Optional

import dagster as dg

from ops.docstrings import describe_fields

from .compute import ComputeResource

_EXIT = re.compile(r"launch exited with code (-?\d+)")


def launch_exit_code(err: BaseException) -> Optional[int]:
    """The exit code of a ``ComputeResource.run`` failure (its ``exit_code`` metadata), or None (a
    timeout or another error)."""
    meta = getattr(err, "metadata", None) or {}
    code = meta.get("exit_code")
    if code is not None:
        return int(getattr(code, "value", code))
    m = _EXIT.search(str(getattr(err, "description", None) or err))
    return int(m.group(1)) if m else None


def is_launch_death(code: Optional[int], signals: Sequence[int]) -> bool:
    """True when ``code`` says the launcher was killed by one of ``signals`` (``-N`` or ``128 + N``)."""
    return code is not None and any(code in (-s, 128 + s) for s in signals)


@describe_fields  # the attribute docstrings are the UI descriptions
class RetryingComputeResource(ComputeResource):
    """``ComputeResource`` whose ``run`` asks Dagster to retry the step when the launch died."""

    launch_retries: int = 2
    """Retries of one step after launch deaths (0 disables)."""
    retry_backoff_s: float = 30.0
    """Wait before the first retry (s); doubles on each further retry."""
    retry_signals: list[int] = [int(signal.SIGKILL), int(signal.SIGTERM), int(signal.SIGBUS)]
    """Signal numbers whose death of the launcher counts as a launch death (exit code ``-N`` or ``128 + N``;
    default SIGKILL, SIGTERM, SIGBUS)."""

    def retry_wait_s(self, retry_number: int) -> float:
        """Seconds to wait before retry ``retry_number + 1`` (exponential backoff)."""
        return self.retry_backoff_s * (2 ** retry_number)

    def run(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str] = (), **kwargs: Any
            ) -> dg.PipesClientCompletedInvocation:
        """``ComputeResource.run``; on a launch death raises ``dg.RetryRequested`` (with backoff) until
        ``launch_retries`` is spent, then the original failure."""
        try:
            return super().run(context, script, args, **kwargs)
        except dg.Failure as err:
            code = launch_exit_code(err)
            attempt = context.retry_number
            if is_launch_death(code, self.retry_signals) and attempt < self.launch_retries:
                wait = self.retry_wait_s(attempt)
                context.log.warning(f"launch died (exit code {code}); retry {attempt + 1}/{self.launch_retries} "
                                    f"in {wait:.0f} s, resuming from the last checkpoint")
                raise dg.RetryRequested(max_retries=self.launch_retries, seconds_to_wait=wait) from err
            raise
