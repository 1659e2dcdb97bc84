"""A launched driver for test_launch_guard: every rank writes ``<out>/ready-<rank>`` and then
"trains" (sleeps) until killed. With spec {"ray": true} rank 0 first starts a local Ray instance
through ops.launch.init_ray (gcs_server, raylet, agents) and one actor, as the RL drivers do.
Ends through exit_worker (it never gets there before the test kills it)."""

import json
import sys
import time

from ops.launch import exit_worker, rank, worker_main


def run(spec, out, fingerprint, pipes):
    if spec.get("ray") and rank() == 0:
        import os

        import ray

        from ops.launch import init_ray

        init_ray(None, num_cpus=1, threads=1)

        @ray.remote(num_cpus=0)
        class Holder:
            def pid(self) -> int:
                return os.getpid()

        h = Holder.remote()
        (out / "actor-pid").write_text(str(ray.get(h.pid.remote(), timeout=120)))
    (out / f"ready-{rank()}").write_text("1")
    time.sleep(float(spec.get("sleep_s", 300)))
    return {"slept": True} if rank() == 0 else None


if __name__ == "__main__":
    exit_worker(worker_main(json.loads, run, sys.argv[1:]))
