"""Single-process CTR training: DeepFM on the dynamic-table engine, binary cross-entropy, evaluated
on the time-split test set (AUC and log loss with scikit-learn, GAUC per user), and a scikit-learn
logistic-regression baseline on the same features one-hot encoded.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import torch

from .collection import EmbeddingCollection, FeatureSpec
from .config import TrainConfig
from .data import CTRDataError, encode_features, feature_columns
from .deepfm import DeepFM
from .optim import SparseAdagrad


def tensors(df: pl.DataFrame, fields: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    enc = encode_features(df, [f for f in fields if "*" not in f], [f for f in fields if "*" in f])
    return {k: (torch.from_numpy(ids), torch.from_numpy(lens)) for k, (ids, lens) in enc.items()}


def take(feats: dict, idx: torch.Tensor) -> dict:
    """The samples ``idx`` [n] of encoded features {name: (ids [N, L], lengths [N][, weights [N, L]])}."""
    return {k: tuple(t[idx] for t in v) for k, v in feats.items()}


DEEPFM_FEATURE_DEFAULTS = {"pooling": "mean"}
"""FeatureSpec fields DeepFM's tables take unless ``feature_kw`` says otherwise: mean pooling of the
multi-hot genres (the engine's own default is RecIS's sum; DeepFM keeps the mean it was measured with)."""


class CTRModel:
    """DeepFM whose field embeddings live in an EmbeddingCollection (the sparse engine).

    ``feature_kw``: FeatureSpec fields for every field's table, over the defaults
    ``DEEPFM_FEATURE_DEFAULTS`` (SparseAdagrad at ``cfg.sparse_lr``, mean pooling, Uniform(+-0.01)
    init): e.g. ``{"pooling": "sum", "init": "zeros", "optimizer": SparseAdamW(...)}`` (RecIS's)."""

    def __init__(self, fields: list[str], cfg: TrainConfig, collection_cls=EmbeddingCollection,
                 feature_kw: dict | None = None, **collection_kw):
        torch.manual_seed(cfg.seed)
        self.fields, self.cfg = fields, cfg
        kw = {**DEEPFM_FEATURE_DEFAULTS, "optimizer": SparseAdagrad(lr=cfg.sparse_lr), **(feature_kw or {})}
        specs = [FeatureSpec(f, dim=cfg.dim + 1, **kw) for f in fields]
        self.ec = collection_cls(specs, coalesce=cfg.coalesce, seed=cfg.seed, **collection_kw)
        self.net = DeepFM(len(fields), cfg.dim, cfg.hidden, cfg.dropout)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.dense_lr)

    def logits(self, batch: dict, train: bool) -> torch.Tensor:
        emb = self.ec(batch, train=train)
        return self.net(torch.stack([emb[f] for f in self.fields], dim=1))

    def train_step(self, batch: dict, labels: torch.Tensor, loss_scale: float | None = None) -> float:
        """One step: BCE (mean over the batch, or sum * loss_scale), backward, dense + sparse updates."""
        self.net.train()
        emb = self.ec(batch, train=True)
        e = torch.stack([emb[f] for f in self.fields], dim=1)
        z = self.net(e)
        if loss_scale is None:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels)
            reg = self.cfg.emb_l2 * e.pow(2).sum() / len(labels)
        else:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels, reduction="sum") * loss_scale
            reg = self.cfg.emb_l2 * e.pow(2).sum() * loss_scale
        self.opt.zero_grad()
        (loss + reg).backward()
        self._reduce_dense_grads()
        self.opt.step()
        self.ec.apply_gradients()
        self.ec.end_step()
        return float(loss.detach())

    def _reduce_dense_grads(self) -> None:
        """Hook for data-parallel training (the sharded model all-reduces here)."""

    @torch.no_grad()
    def predict(self, feats: dict, batch_size: int = 4096) -> np.ndarray:
        """Click probabilities [N]; unseen IDs read zeros (lookups do not admit at eval)."""
        self.net.eval()
        n = len(next(iter(feats.values()))[1])
        out = [torch.sigmoid(self.logits(take(feats, torch.arange(i, min(i + batch_size, n))), train=False))
               for i in range(0, n, batch_size)]
        return torch.cat(out).numpy()


def gauc(users: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> float:
    """Impression-weighted mean of per-user AUC over users with both classes in the set (Zhou et al.
    2018, DIN §5). Returns nan when no user has both classes."""
    from sklearn.metrics import roc_auc_score

    df = pl.DataFrame({"u": users, "y": labels, "s": scores})
    num = den = 0.0
    for (_, ), g in df.group_by(["u"]):
        y = g["y"].to_numpy()
        if 0 < y.sum() < len(y):
            num += len(y) * roc_auc_score(y, g["s"].to_numpy())
            den += len(y)
    return num / den if den else float("nan")


def evaluate(labels: np.ndarray, scores: np.ndarray, users: np.ndarray) -> dict:
    from sklearn.metrics import log_loss, roc_auc_score

    return {"auc": float(roc_auc_score(labels, scores)), "logloss": float(log_loss(labels, np.clip(scores, 1e-7, 1 - 1e-7))),
            "gauc": float(gauc(users, labels, scores))}


def split_frames(events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    for c in ("click", "split", "user_id"):
        if c not in events.columns:
            raise CTRDataError(f"events table is missing column {c!r}")
    train, test = events.filter(pl.col("split") == "train"), events.filter(pl.col("split") == "test")
    if not train.height or not test.height:
        raise CTRDataError(f"events need train and test rows, got {train.height} train and {test.height} test")
    return train, test


def train_ctr(events: pl.DataFrame, cfg: TrainConfig = TrainConfig(), log=None, feature_kw: dict | None = None) -> dict:
    """Train DeepFM on the ``split == "train"`` rows of a CTR events table, evaluate on ``test``.

    Returns metrics: test auc/logloss/gauc, train_seconds, samples_per_s, table size history,
    lookups with/without coalescing, final train loss. Raises CTRDataError on a bad table.
    """
    prev = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_ctr(events, cfg, log, feature_kw)
    finally:
        torch.set_num_threads(prev)


def _train_ctr(events: pl.DataFrame, cfg: TrainConfig, log, feature_kw: dict | None = None) -> dict:
    train, test = split_frames(events)
    fields = feature_columns(events) + list(cfg.crosses)
    ftr, fte = tensors(train, fields), tensors(test, fields)
    ytr = torch.tensor(train["click"].to_numpy(), dtype=torch.float32)
    model = CTRModel(fields, cfg, feature_kw=feature_kw)
    g = torch.Generator().manual_seed(cfg.seed)
    t0, losses, n_seen = time.perf_counter(), [], 0
    for epoch in range(int(cfg.epochs)):
        perm = torch.randperm(train.height, generator=g)
        for i in range(0, train.height, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            losses.append(model.train_step(take(ftr, idx), ytr[idx]))
            n_seen += len(idx)
        if log:
            log(f"epoch {epoch}: mean train loss {np.mean(losses[-(train.height // cfg.batch_size):]):.4f}, "
                f"table rows {model.ec.size()}")
    secs = time.perf_counter() - t0
    scores = model.predict(fte)
    metrics = evaluate(test["click"].to_numpy(), scores, test["user_id"].to_numpy())
    hist = [(s, sum(t.size_history[min(s, len(t.size_history) - 1)][1] for t in model.ec.tables.values()))
            for s in range(0, model.ec.tables["table0"].step + 1)]
    return {**metrics, "train_seconds": secs, "samples_per_s": n_seen / secs, "steps": len(losses),
            "final_train_loss": float(np.mean(losses[-50:])), "fields": fields, "table_rows": model.ec.size(),
            "tables": len(model.ec.tables), "size_history": hist, "lookups": model.ec.lookups,
            "lookups_uncoalesced": model.ec.lookups_uncoalesced, "model": model, "test_scores": scores}


def logistic_regression_baseline(events: pl.DataFrame, fields: list[str], C: float = 1.0) -> dict:
    """scikit-learn LogisticRegression on the same features one-hot encoded (train vocabulary; unseen
    test values dropped). Returns test auc/logloss/gauc and the column count."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    train, test = split_frames(events)

    def onehot(df, vocab, grow):
        enc = encode_features(df, [f for f in fields if "*" not in f], [f for f in fields if "*" in f])
        rows, cols = [], []
        for f, (ids, lens) in enc.items():
            for j in range(ids.shape[1]):
                present = np.flatnonzero(lens > j)
                for r, v in zip(present.tolist(), ids[present, j].tolist()):
                    c = vocab.get((f, v))
                    if c is None and grow:
                        c = vocab[(f, v)] = len(vocab)
                    if c is not None:
                        rows.append(r)
                        cols.append(c)
        return rows, cols

    vocab: dict = {}
    r, c = onehot(train, vocab, True)
    xtr = sparse.csr_matrix((np.ones(len(r)), (r, c)), shape=(train.height, len(vocab)))
    r, c = onehot(test, vocab, False)
    xte = sparse.csr_matrix((np.ones(len(r)), (r, c)), shape=(test.height, len(vocab)))
    lr = LogisticRegression(C=C, max_iter=2000).fit(xtr, train["click"].to_numpy())
    scores = lr.predict_proba(xte)[:, 1]
    return {**evaluate(test["click"].to_numpy(), scores, test["user_id"].to_numpy()), "columns": len(vocab)}
