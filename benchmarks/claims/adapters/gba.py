"""``run_seed`` of the GBA claims (arXiv 2205.11048 §5): one seed, every arm a fresh launch exactly as
``benchmarks/gba_bench.py`` launches it (``gba_bench.launch``: sync through ``accelerate launch``, the PS
modes and ``auto`` through ``ops/gba/launch_ps.py``), on MovieLens-100k (time split), one set of
hyper-parameters for every arm, a persistent straggler of real compute (no sleeps).

Arms (names of the ``switching`` section of gba_bench): ``sync`` (never switched, all-reduce),
``sync_to_gba`` and ``sync_to_async`` (mode ``auto`` switched at ``switch_at`` of the run's global
steps: lock-step sync on the PS, then the target, inside one PS launch); also the plain modes ``gba``
and ``async``. ``sync_handover_gba`` is the switch the paper means (issue 38 item 3b): an all-reduce
``sync`` launch stops at ``switch_at`` of the global steps and writes the hand-over
(``ops.gba.handover``: dense weights, Adam state, every embedding row with its SparseAdagrad state,
global step, data position, RNG), then a ``gba`` PS launch continues from it to the end, with the
same hyper-parameters; its ``train_s`` and ``launch_wall_s`` are the two launches' sums. The seed is the training seed and the straggler
trace's seed of every arm. Returned per arm: ``final_auc`` (test AUC after training, unitless),
``final_logloss``, ``samples_per_s``, ``train_s`` and ``launch_wall_s`` (seconds, process start-up
included)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ARMS = ("sync", "sync_to_gba", "sync_to_async", "gba", "async", "sync_handover_gba")


def run_seed(seed: int, arm_order: list[str], workdir: Path, workers: int = 16, local_batch: int = 128,
             dense_lr: float = 3e-3, sparse_lr: float = 3e-2, epochs: float = 2.0, num_ps: int = 2,
             slowdown: float = 4.0, switch_at: float = 0.5, eval_every: int = 16, target_auc: float = 0.69,
             timeout_minutes: float = 30.0) -> dict:
    """Every arm of ``arm_order`` (names in ``ARMS``) for one seed. Raises ValueError for an unknown
    arm, RuntimeError when a launch fails (its stderr tail)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gba_bench as gb

    from ops.gba.config import Cluster, RunSpec
    from ops.gba.report import summarize
    from ops.gba.switching import Switching
    from ops.gba.trace import StragglerTrace
    from ops.sparse.config import TrainConfig
    from ops.sparse.data import movielens_events, time_split

    bad = [a for a in arm_order if a not in ARMS]
    if bad:
        raise ValueError(f"gba run_seed: unknown arms {bad}; known {ARMS}")
    events = workdir / "ctr_events.parquet"
    time_split(movielens_events()).write_parquet(events)
    base = RunSpec(train=TrainConfig(batch_size=workers * local_batch, epochs=epochs, dense_lr=dense_lr,
                                     sparse_lr=sparse_lr, seed=seed),
                   local_batch=local_batch,
                   cluster=Cluster(workers=workers, eval_every=eval_every, target_auc=target_auc, num_ps=num_ps,
                                   checkpoint_every=0),
                   trace=StragglerTrace(kind="persistent", slowdown=slowdown, seed=seed),
                   events_path=str(events), data_cache=str(workdir / "cache"))
    at = max(1, int(round(switch_at * base.global_steps(gb._n_train(events, workdir)))))
    out = {}
    for arm in arm_order:
        if arm == "sync_handover_gba":
            ho = workdir / f"handover-seed{seed}"
            first = gb.launch(dataclasses.replace(base.with_mode("sync"), stop_at=at, handover_to=str(ho)), workdir,
                              timeout_s=timeout_minutes * 60, name=f"{arm}-sync-seed{seed}")
            res = gb.launch(dataclasses.replace(base.with_mode("gba"), handover_from=str(ho)), workdir,
                            timeout_s=timeout_minutes * 60, name=f"{arm}-gba-seed{seed}")
            s0, s = summarize(first), summarize(res)
            out[arm] = {"final_auc": res["final"]["auc"], "final_logloss": res["final"]["logloss"],
                        "samples_per_s": res["samples_applied"] / (s0["train_s"] + s["train_s"]),
                        "train_s": s0["train_s"] + s["train_s"],
                        "launch_wall_s": first["launch_wall_s"] + res["launch_wall_s"], "switch_at_global_step": at,
                        "handover_global_step": res["start_global_step"]}
            continue
        if arm in ("sync", "gba", "async"):
            spec = base.with_mode(arm)
        else:
            to = arm.split("_to_")[1]
            spec = dataclasses.replace(base.with_mode("auto"), switching=Switching(schedule=((at, to),)))
        res = gb.launch(spec, workdir, timeout_s=timeout_minutes * 60, name=f"{arm}-seed{seed}")
        s = summarize(res)
        out[arm] = {"final_auc": res["final"]["auc"], "final_logloss": res["final"]["logloss"],
                    "samples_per_s": s["samples_per_s"], "train_s": s["train_s"],
                    "launch_wall_s": res["launch_wall_s"], "switch_at_global_step": at if "_to_" in arm else None}
    return out
