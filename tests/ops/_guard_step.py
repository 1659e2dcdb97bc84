"""Stands in for a Dagster step process in test_launch_guard: starts one launch the way
ComputeResource.run does (resources.compute.start_guarded), prints the launch's and the
watchdog's pids, and waits for the launch (the test SIGKILLs this process meanwhile).

    python -m tests.ops._guard_step SPEC OUT RANKS
"""

import os
import sys

from ops.launcher import Launcher
from resources.compute import start_guarded

spec, out, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
args = ["--spec", spec, "--out", out]
if ranks:
    cmd = Launcher(launcher="torchrun").command("tests.ops._guard_driver", args, num_processes=ranks, module=True)
else:
    cmd = [sys.executable, "-m", "tests.ops._guard_driver", *args]
proc, watch = start_guarded(cmd, {**os.environ, **Launcher().env(), "RAY_USAGE_STATS_ENABLED": "0"})
print(f"launch {proc.pid} watch {watch.pid if watch else 0}", flush=True)
sys.exit(proc.wait(timeout=600))
