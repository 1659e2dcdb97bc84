"""A launched driver for test_launch_worker: two gloo ranks under accelerate that all-reduce and
gather objects (what the probe worker does in "runs" mode) and end through ops.launch.exit_worker.
An atexit handler prints a marker that only an interpreter shutdown (not os._exit) runs. With spec
{"rank1_leaves": true} rank 1 leaves at once without the exit barrier, so rank 0's barrier
(``barrier_timeout_s`` from the spec) times out."""

import atexit
import json
import os
import sys

from ops.launch import exit_worker, worker_main


def run(spec, out, fingerprint, pipes):
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator

    Accelerator(cpu=True)                          # initialises the gloo group from torchrun's env
    x = torch.ones(1000) * (dist.get_rank() + 1)
    for _ in range(20):
        dist.all_reduce(x)                         # 20 sums of (1 + 2): 3 * 2^19
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": dist.get_rank(), "items": list(range(100))})
    print(f"rank {dist.get_rank()} sum {x[0].item():g}")
    return {"sum": float(x[0]), "ranks": [g["rank"] for g in gathered]} if dist.get_rank() == 0 else None


if __name__ == "__main__":
    atexit.register(lambda: print("interpreter shutdown ran", flush=True))
    code = worker_main(json.loads, run, sys.argv[1:])
    spec = json.loads(open(sys.argv[sys.argv.index("--spec") + 1]).read())
    if spec.get("rank1_leaves") and os.environ.get("RANK") == "1":
        os._exit(0)
    exit_worker(code, barrier_timeout_s=spec.get("barrier_timeout_s", 600.0))
