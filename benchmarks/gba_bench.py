"""GBA against synchronous all-reduce, async PS, SSP and Hop-BW under a straggler, and switching a
running job between them (arXiv 2205.11048 §5; docs/gba.md, "How it is measured").

Every run is a fresh launch exactly as the ``gba_run`` asset launches it (sync: ``accelerate
launch``, the command ``ComputeResource`` builds, from ``ops.launcher.Launcher``, so the benchmark
needs no Dagster; the PS modes and ``auto``: ``ops/gba/launch_ps.py``, num_ps PS
processes + W workers over torch.distributed.rpc), on MovieLens-100k (time split) with one set of
hyper-parameters (one ``RunSpec``, ``with_mode``). Compute is real: the forward/backward pass is
the work, and the straggler is slowed by real extra passes (``ops.gba.trace``), no sleeps.

Sections (``--sections``, merged into the output file, other sections kept):

- ``modes``: the five modes once each (samples/s, time to target AUC, final AUC, staleness, ...).
- ``switching``: per seed, never-switched ``sync`` (all-reduce), ``sync_to_gba`` and
  ``sync_to_async`` (mode ``auto`` with ``switch_at: [{step: S, to: gba|async}]``, S = the middle
  of the run), and with ``--switch-kinds ...,sync_handover_gba`` the all-reduce -> PS switch (a sync
  launch to S writes the hand-over, a GBA launch continues from it: ``ops.gba.handover``), same
  hyper-parameters, a persistent straggler; final test AUC mean and 95% CI
  (Student t over seeds) per run kind, and every switch event.
- ``tune_lr``: the synchronous baseline's learning rates chosen as a practitioner would before
  switching anything: never-switched ``sync`` at W for each (dense, sparse) pair of ``--tune-lrs``
  and ``--tune-seeds`` seeds, trained on the first 80% (by time) of the training window and scored
  on the last 20% (a validation split: the test split is never looked at); the pair with the best
  mean validation AUC becomes the learning rates of every later section of the same invocation
  (the paper's precondition: hyper-parameters tuned for synchronous training at the global batch).
- ``throughput``: for each W in ``--throughput-workers`` and s in ``--slowdowns``: sync vs gba
  samples/s under one persistent straggler of slowdown s, ``measured_ratio`` next to the ideal
  (W - 1 + 1/s) / (W / s) (fast workers never wait in GBA; every sync step waits for the straggler).

The switching section records per-seed paired differences (``paired``); ``--first-seed`` runs a
replication on new seeds and ``--pool a.json,b.json --out c.json`` pools such runs (no training).

    .venv/bin/python benchmarks/gba_bench.py --seeds 5          # -> benchmarks/results/gba.json
    .venv/bin/python benchmarks/gba_bench.py --quick            # 1 seed, small -> benchmarks/results/gba_quick.json
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import RESULTS, ROOT, bench_parser, command_line, previous_results, write_results  # noqa: E402


def launch(spec, workdir: Path, timeout_s: float, name: str | None = None) -> dict:
    """Run one spec in fresh processes (folder ``workdir/name``, default the mode); returns its
    result.json plus the launch wall time. Raises RuntimeError with the launch's stderr tail."""
    from ops.gba.config import validate
    from ops.launcher import Launcher

    validate(spec)
    out = workdir / (name or spec.mode)
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(spec.to_json())
    compute = Launcher(num_processes=spec.cluster.workers)     # = ComputeResource(num_processes=W)'s, without Dagster
    args = ["--spec", str(spec_path), "--out", str(out)]
    if spec.mode == "sync":
        cmd = compute.command(str(ROOT / "ops" / "gba" / "launch_sync.py"), args)
    else:
        cmd = [sys.executable, str(ROOT / "ops" / "gba" / "launch_ps.py"), *args]
    env = {**os.environ, **compute.env(), "TORCH_CPP_LOG_LEVEL": "ERROR"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, timeout=timeout_s, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{spec.mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads((out / "result.json").read_text())
    res["launch_wall_s"] = wall
    res["command"] = " ".join(cmd)
    return res


def pool_switching(paths: list[Path], out_path: Path, argv=None) -> int:
    """Pool the ``switching`` runs of several results files (a run and its replication on new seeds)
    into one ``switching`` record at ``out_path``: AUC per kind and the paired differences over all
    seeds. Raises ValueError naming the file when a file has no switching section, the files' setups
    (W, b, G, learning rates, epochs, trace, switch point) differ, a seed appears twice, or a seed
    lacks one of the run kinds (the differences are paired by seed)."""
    keys = ("workers", "local_batch", "global_batch", "dense_lr", "sparse_lr", "epochs", "trace", "switch_at_fraction", "num_ps")
    setup, runs, sources = None, [], []
    for p in paths:
        sw = json.loads(p.read_text()).get("switching")
        if not sw:
            raise ValueError(f"{p}: no 'switching' section to pool")
        this = {k: sw.get(k) for k in keys}
        if setup is not None and this != setup:
            raise ValueError(f"{p}: switching setup {this} differs from {paths[0]}'s {setup}")
        setup = this
        runs += sw["runs"]
        sources.append({"file": str(p), "seeds": sorted({r["seed"] for r in sw["runs"]})})
    seen = [s for src in sources for s in src["seeds"]]
    if len(seen) != len(set(seen)):
        raise ValueError(f"{paths}: a seed appears in more than one file ({sorted(seen)}); pool disjoint seeds only")
    kinds = list(dict.fromkeys(r["run"] for r in runs))  # in the order the benchmark ran them
    by = {(r["run"], r["seed"]): r["final_auc"] for r in runs}
    for seed in sorted(seen):
        missing = [k for k in kinds if (k, seed) not in by]
        if missing:
            src = next(src["file"] for src in sources if seed in src["seeds"])
            raise ValueError(f"{src}: seed {seed} has no {missing} run; every seed needs every kind {kinds} to pair")
    aucs = {k: [by[k, seed] for seed in sorted(seen)] for k in kinds}
    paired = paired_differences(aucs)
    write_results({"benchmark": "GBA switching, pooled over runs on disjoint seeds", "command": command_line(__file__, argv),
                   "sources": sources,
                   "switching": {**setup, "seeds": len(seen), "auc": {k: ci95(v) for k, v in aucs.items()},
                                 "paired": paired}}, out_path)
    print(json.dumps(paired), flush=True)
    return 0


def paired_differences(aucs: dict[str, list[float]]) -> dict:
    """Per-seed AUC differences of the switching runs and their 95% CI (Student t over seeds).

    Runs of one seed share the data order, the initialisation and the straggler trace, so the
    difference within a seed removes that seed's draw; ``aucs`` maps run kind -> final AUC per seed
    (same seed order). Returns ``{"sync_to_gba_minus_sync": ci95, "sync_to_gba_minus_sync_to_async":
    ci95}`` (each with ``values`` and ``n``)."""
    pairs = {"sync_to_gba_minus_sync": ("sync_to_gba", "sync"),
             "sync_to_gba_minus_sync_to_async": ("sync_to_gba", "sync_to_async"),
             "sync_handover_gba_minus_sync": ("sync_handover_gba", "sync")}
    return {name: ci95([x - y for x, y in zip(aucs[a], aucs[b])]) for name, (a, b) in pairs.items()
            if a in aucs and b in aucs}


def ci95(xs: list[float]) -> dict:
    """Mean and 95% confidence interval (Student t, n - 1 degrees of freedom) of ``xs``; with one
    value the interval is the value itself (``n`` says so)."""
    import numpy as np
    from scipy import stats

    x = np.asarray(xs, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return {"mean": round(m, 5), "ci95": [round(m, 5), round(m, 5)], "n": len(x), "values": [round(v, 5) for v in xs]}
    h = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return {"mean": round(m, 5), "ci95": [round(m - h, 5), round(m + h, 5)], "n": len(x), "values": [round(v, 5) for v in xs]}


def ideal_ratio(workers: int, slowdown: float) -> float:
    """GBA vs sync throughput with one straggler s times slower: (W - 1 + 1/s) / (W / s)."""
    return (workers - 1 + 1 / slowdown) / (workers / slowdown)


def _curve(r: dict) -> list[dict]:
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items() if k != "mode"} for p in r["curve"]]


def main(argv=None) -> int:
    import dataclasses

    from ops.gba.config import MODES, Cluster, RunSpec
    from ops.gba.report import summarize
    from ops.gba.switching import Switching
    from ops.gba.trace import StragglerTrace
    from ops.sparse.config import TrainConfig
    from ops.sparse.data import movielens_events, time_split

    ap = bench_parser(__doc__, seeds=5, seeds_help="seeds of the switching section (train and trace seed)",
                      quick="1 seed, 1 epoch, W = 4 throughput only, no modes section")
    ap.add_argument("--sections", default="modes,switching,throughput")
    ap.add_argument("--modes", default=",".join(m for m in MODES if m != "auto"))
    ap.add_argument("--workers", type=int, default=4, help="W of the modes and switching sections")
    ap.add_argument("--num-ps", type=int, default=2, help="PS processes (sparse tables sharded by id over them)")
    ap.add_argument("--local-batch", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=None, help="default W x local batch")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--dense-lr", type=float, default=TrainConfig.dense_lr, help="Adam lr (one value for every mode)")
    ap.add_argument("--sparse-lr", type=float, default=TrainConfig.sparse_lr, help="SparseAdagrad lr (every mode)")
    ap.add_argument("--trace", default="persistent", choices=["none", "persistent", "random"])
    ap.add_argument("--slowdown", type=float, default=4.0)
    ap.add_argument("--target-auc", type=float, default=0.69)
    ap.add_argument("--eval-every", type=int, default=16)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="switching section: seeds first-seed .. first-seed + seeds - 1 (a replication on new seeds)")
    ap.add_argument("--switch-at", type=float, default=0.5, help="switch point as a fraction of the run's global steps")
    ap.add_argument("--switch-kinds", default="sync_to_gba,sync_to_async",
                    help="switching section: run kinds beside never-switched sync; sync_to_gba / sync_to_async (auto, "
                         "in one PS launch), sync_handover_gba (all-reduce launch to the switch point, hand-over, GBA "
                         "PS launch from it: ops.gba.handover)")
    ap.add_argument("--tune-lrs", default="3e-4:3e-3,1e-3:1e-2,3e-3:3e-2,1e-2:1e-1",
                    help="tune_lr section: comma-separated dense_lr:sparse_lr pairs")
    ap.add_argument("--tune-seeds", type=int, default=2, help="tune_lr section: seeds per pair")
    ap.add_argument("--throughput-workers", default="4,8")
    ap.add_argument("--slowdowns", default="4")
    ap.add_argument("--throughput-epochs", type=float, default=0.5)
    ap.add_argument("--throughput-local-batch", type=int, default=128)
    ap.add_argument("--out", default=None, help="default benchmarks/results/gba.json (--quick: gba_quick.json)")
    ap.add_argument("--pool", default=None, help="no training: pool the switching runs of these comma-separated results "
                    "files (disjoint seeds, same setup) into --out")
    a = ap.parse_args(argv)
    if a.pool:
        return pool_switching([Path(p) for p in a.pool.split(",")], Path(a.out or RESULTS / "gba_pooled.json"), argv)
    if a.quick:
        a.seeds, a.epochs, a.throughput_workers, a.throughput_epochs = 1, 1.0, "4", 0.25
        if a.sections == ap.get_default("sections"):
            a.sections = "switching,throughput"
    out_path = Path(a.out or RESULTS / ("gba_quick.json" if a.quick else "gba.json"))
    sections = a.sections.split(",")

    work = Path(tempfile.mkdtemp(prefix="gba-bench-"))
    events = work / "ctr_events.parquet"
    time_split(movielens_events()).write_parquet(events)
    G = a.global_batch or a.workers * a.local_batch

    def spec(workers: int, local_batch: int, global_batch: int, epochs: float, seed: int = 0, slowdown: float = a.slowdown,
             trace: str = a.trace) -> RunSpec:
        return RunSpec(train=TrainConfig(batch_size=global_batch, epochs=epochs, dense_lr=a.dense_lr, sparse_lr=a.sparse_lr,
                                         seed=seed),
                       local_batch=local_batch,
                       cluster=Cluster(workers=workers, eval_every=a.eval_every, target_auc=a.target_auc, num_ps=a.num_ps,
                                       checkpoint_every=0),
                       trace=StragglerTrace(kind=trace, slowdown=slowdown, seed=seed),
                       events_path=str(events), data_cache=str(work / "cache"))

    def show(label: str, res: dict) -> None:
        s = summarize(res)
        ev = res.get("switching", {}).get("events", [])
        print(f"{label:24s} {s['samples_per_s']:9.0f} samples/s  train {s['train_s']:6.1f} s  to AUC {a.target_auc}: "
              f"{s['time_to_target_s']}  final AUC {s['final_auc']:.4f}  logloss {s['final_logloss']:.4f}  "
              f"decayed {s['decayed']} dropped {s['dropped']}  switches {[(e['from'], e['to'], e['global_step']) for e in ev]}  "
              f"(launch {res['launch_wall_s']:.1f} s)", flush=True)

    out = previous_results(out_path)
    out.update({
        "benchmark": "GBA vs sync all-reduce, async PS, SSP, Hop-BW under stragglers, and switching a running job (arXiv 2205.11048)",
        "command": command_line(__file__, argv),
        "args": vars(a), "quick": a.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "slowdowns": "real compute (ops.gba.trace): the straggler computes each local batch's forward/backward floor(s) "
                     "(+1 with probability frac(s)) times and keeps the first gradient; no sleeps",
        "paper": {"gba_vs_sync_speedup": ">= 2.4x under strained resources", "gba_auc_vs_async_derived": "up to +0.2%",
                  "gba_vs_sync_auc": "matches (tuning-free switching)"},
    })
    try:
        if "tune_lr" in sections:
            import polars as pl

            val_events = work / "ctr_events_val.parquet"
            time_split(pl.read_parquet(events).filter(pl.col("split") == "train").drop("split")).write_parquet(val_events)
            pairs = [tuple(float(x) for x in p.split(":")) for p in a.tune_lrs.split(",")]
            grid = []
            for dense_lr, sparse_lr in pairs:
                aucs = []
                for seed in range(a.tune_seeds):
                    sp = dataclasses.replace(spec(a.workers, a.local_batch, G, a.epochs, seed=seed).with_mode("sync"),
                                             events_path=str(val_events))
                    sp = dataclasses.replace(sp, train=dataclasses.replace(sp.train, dense_lr=dense_lr, sparse_lr=sparse_lr))
                    res = launch(sp, work, timeout_s=1800, name=f"tune-{dense_lr:g}-{sparse_lr:g}-seed{seed}")
                    show(f"sync lr {dense_lr:g}/{sparse_lr:g} s{seed}", res)
                    aucs.append(res["final"]["auc"])
                grid.append({"dense_lr": dense_lr, "sparse_lr": sparse_lr, "val_auc": ci95(aucs)})
            best = max(grid, key=lambda g: g["val_auc"]["mean"])
            a.dense_lr, a.sparse_lr = best["dense_lr"], best["sparse_lr"]
            out["tune_lr"] = {"workers": a.workers, "global_batch": G, "epochs": a.epochs, "seeds": a.tune_seeds,
                              "split": "train window split again by time: first 80% train, last 20% validation",
                              "grid": grid, "chosen": {"dense_lr": a.dense_lr, "sparse_lr": a.sparse_lr}}
            print(json.dumps(out["tune_lr"], default=float), flush=True)

        if "modes" in sections:
            base = spec(a.workers, a.local_batch, G, a.epochs)
            results = {}
            for mode in a.modes.split(","):
                results[mode] = res = launch(base.with_mode(mode), work, timeout_s=1800)
                show(mode, res)
            out["hyper_parameters"] = results[next(iter(results))]["hyper_parameters"]
            claims = {}
            if "gba" in results and "sync" in results:
                g, s = results["gba"], results["sync"]
                claims["gba_vs_sync_throughput"] = round(g["samples_per_s"] / s["samples_per_s"], 3)
                if g["time_to_target_s"] and s["time_to_target_s"]:
                    claims["gba_vs_sync_time_to_target"] = round(s["time_to_target_s"] / g["time_to_target_s"], 3)
                claims["gba_minus_sync_final_auc"] = round(g["final"]["auc"] - s["final"]["auc"], 4)
            for other in ("async", "ssp", "hopbw"):
                if "gba" in results and other in results:
                    claims[f"gba_minus_{other}_final_auc"] = round(results["gba"]["final"]["auc"] - results[other]["final"]["auc"], 4)
            out["claims"] = claims
            out["modes"] = {m: {**summarize(r), "launch_wall_s": round(r["launch_wall_s"], 1), "command": r["command"],
                                "staleness_histogram": r["staleness_histogram"], "staleness_unit": r["staleness_unit"],
                                "batches_by_worker": r["batches_by_worker"], "curve": _curve(r)}
                            for m, r in results.items()}

        if "switching" in sections:
            known = {"sync_to_gba": "gba", "sync_to_async": "async", "sync_handover_gba": "handover"}
            asked = [k for k in a.switch_kinds.split(",") if k]
            if [k for k in asked if k not in known]:
                raise SystemExit(f"--switch-kinds: unknown {[k for k in asked if k not in known]}; known {list(known)}")
            kinds = {"sync": None, **{k: known[k] for k in asked}}
            aucs = {k: [] for k in kinds}
            evs, runs = [], []
            n_train = _n_train(events, work)
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                base = spec(a.workers, a.local_batch, G, a.epochs, seed=seed)
                steps = base.global_steps(n_train)
                at = max(1, int(round(a.switch_at * steps)))
                for kind, to in kinds.items():
                    if to == "handover":           # the all-reduce <-> PS switch: two launches
                        ho = work / f"{kind}-seed{seed}-handover"
                        first = launch(dataclasses.replace(base.with_mode("sync"), stop_at=at, handover_to=str(ho)), work,
                                       timeout_s=1800, name=f"{kind}-seed{seed}-sync")
                        res = launch(dataclasses.replace(base.with_mode("gba"), handover_from=str(ho)), work,
                                     timeout_s=1800, name=f"{kind}-seed{seed}-gba")
                        res["launch_wall_s"] += first["launch_wall_s"]
                        res["train_seconds"] += first["train_seconds"]
                        res["samples_per_s"] = res["samples_applied"] / res["train_seconds"]
                        res["curve"] = first["curve"] + res["curve"][1:]
                        evs.append({"run": kind, "seed": seed, "global_step": at, "from": "sync (all-reduce)",
                                    "to": "gba (PS)", "reason": "hand-over at switch_at"})
                    else:
                        sp = base.with_mode("sync") if to is None else dataclasses.replace(
                            base.with_mode("auto"), switching=Switching(schedule=((at, to),)))
                        res = launch(sp, work, timeout_s=1800, name=f"{kind}-seed{seed}")
                    show(f"{kind} seed {seed}", res)
                    aucs[kind].append(res["final"]["auc"])
                    for e in res.get("switching", {}).get("events", []):
                        evs.append({"run": kind, "seed": seed, **{k: (round(v, 4) if isinstance(v, float) else v)
                                                                   for k, v in e.items()}})
                    runs.append({"run": kind, "seed": seed, **summarize(res), "launch_wall_s": round(res["launch_wall_s"], 1),
                                 "curve": _curve(res)})
            auc = {k: ci95(v) for k, v in aucs.items()}
            out["switching"] = {
                "seeds": a.seeds, "first_seed": a.first_seed, "workers": a.workers, "dense_lr": a.dense_lr, "sparse_lr": a.sparse_lr,
                "lr_source": "tune_lr section of this run" if "tune_lr" in sections else "--dense-lr / --sparse-lr", "num_ps": a.num_ps, "global_batch": G, "local_batch": a.local_batch,
                "epochs": a.epochs, "switch_at_fraction": a.switch_at, "trace": {"kind": a.trace, "slowdown": a.slowdown},
                "auc": auc, "events": evs, "runs": runs,
                **{name: round(auc[x]["mean"] - auc[y]["mean"], 5) for name, x, y in (
                    ("sync_to_gba_minus_sync", "sync_to_gba", "sync"),
                    ("sync_to_gba_minus_sync_to_async", "sync_to_gba", "sync_to_async"),
                    ("sync_handover_gba_minus_sync", "sync_handover_gba", "sync")) if x in auc and y in auc},
                "paired": paired_differences(aucs),
            }

        if "throughput" in sections:
            rows = []
            for W in [int(x) for x in a.throughput_workers.split(",")]:
                for s in [float(x) for x in a.slowdowns.split(",")]:
                    b = a.throughput_local_batch
                    base = spec(W, b, W * b, a.throughput_epochs, slowdown=s, trace="persistent")
                    rs = {m: launch(base.with_mode(m), work, timeout_s=1800, name=f"tp-{m}-W{W}-s{s}") for m in ("sync", "gba")}
                    for m, r in rs.items():
                        show(f"throughput {m} W={W} s={s}", r)
                    meas = rs["gba"]["samples_per_s"] / rs["sync"]["samples_per_s"]
                    ideal = ideal_ratio(W, s)
                    rows.append({"workers": W, "slowdown": s, "num_ps": a.num_ps, "local_batch": b, "global_batch": W * b,
                                 "sync_samples_per_s": round(rs["sync"]["samples_per_s"], 1),
                                 "gba_samples_per_s": round(rs["gba"]["samples_per_s"], 1),
                                 "measured_ratio": round(meas, 3), "ideal_ratio": round(ideal, 3),
                                 "measured_over_ideal": round(meas / ideal, 3),
                                 "batches_by_worker_gba": rs["gba"]["batches_by_worker"],
                                 "step_time_s_gba": rs["gba"].get("step_time_s")})
            out["throughput"] = rows
    finally:
        shutil.rmtree(work, ignore_errors=True)

    write_results(out, out_path)
    print(json.dumps({k: out[k] for k in ("claims", "throughput") if k in out}, indent=1))
    if "switching" in out:
        print(json.dumps(out["switching"]["auc"], indent=1))
    return 0


def _n_train(events: Path, work: Path) -> int:
    from ops.gba.data import load
    from ops.sparse.config import TrainConfig

    return load(str(events), TrainConfig().crosses, str(work / "cache")).n_train


if __name__ == "__main__":
    sys.exit(main())
