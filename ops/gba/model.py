"""The DeepFM CTR model of ``ops.sparse`` split for a parameter server (GBA, arXiv 2205.11048 §3):
the server holds the sparse tables and the dense parameters (``ServerModel``); a worker holds a
parameter-free replica that computes one local batch's gradient from rows and dense parameters it
pulled (``WorkerModel``). The sync trainer uses the same loss (``loss_sum``).
"""

from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ops.sparse.collection import EmbeddingCollection
from ops.sparse.config import TrainConfig
from ops.sparse.train import CTRModel

from .aggregate import Gradient, Update


def loss_sum(model: CTRModel, batch: dict, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over the batch [B] of per-sample BCE, emb_l2 x summed squared norm of the looked-up
    embeddings): scalars whose backward gives per-sample-summed gradients, averaged later by
    ``ops.gba.aggregate`` (sums, not means, so that any split of a global batch adds up)."""
    model.net.train()
    emb = model.ec(batch, train=True)
    e = torch.stack([emb[f] for f in model.fields], dim=1)                 # [B, F, dim + 1]
    z = model.net(e)                                                        # [B]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(z, labels, reduction="sum")
    return bce, model.cfg.emb_l2 * e.pow(2).sum()


class PulledCollection(EmbeddingCollection):
    """Worker-side embeddings: the tables are never read; each lookup returns the rows the worker
    pulled from the server for exactly these unique ids (``serve`` them before the forward)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._served: dict[str, torch.Tensor] = {}

    def serve(self, rows: dict[str, torch.Tensor]) -> None:
        self._served = rows

    def _lookup_unique(self, tname: str, uids: torch.Tensor, train: bool) -> torch.Tensor:
        rows = self._served[tname]
        if rows.shape[0] != len(uids):
            raise ValueError(f"table {tname}: served {rows.shape[0]} rows for {len(uids)} ids")
        leaf = rows.detach().clone()
        if train:
            leaf.requires_grad_(True)
            self._pending.append((tname, uids, leaf))
        return leaf

    def gradients(self, counts: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        pending, self._pending = self._pending, []
        return {t: (uids, leaf.grad if leaf.grad is not None else torch.zeros_like(leaf), counts[t])
                for t, uids, leaf in pending}


class WorkerModel:
    """A worker's replica: ``ids(batch)`` names the rows to pull; ``gradient(...)`` computes the sums."""

    def __init__(self, fields: list[str], cfg: TrainConfig, worker: int):
        self.model = CTRModel(fields, cfg, collection_cls=PulledCollection)
        self.params = list(self.model.net.parameters())
        self.gen_seed = cfg.seed * 1000 + worker + 1
        torch.manual_seed(self.gen_seed)                  # this worker's dropout stream

    def ids(self, batch: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per table: (unique ids [U], occurrences [U]) of the batch."""
        return self.model.ec.unique_ids(batch)

    def gradient(self, batch: dict, labels: torch.Tensor, ids: dict, rows: dict[str, torch.Tensor],
                 dense: torch.Tensor | None) -> Gradient:
        """Gradient sums of one local batch [B] at the pulled parameters (dense [P] or None = unchanged)."""
        if dense is not None:
            vector_to_parameters(dense, self.params)
        self.model.ec.serve(rows)
        bce, reg = loss_sum(self.model, batch, labels)
        for p in self.params:
            p.grad = None
        (bce + reg).backward()
        g = torch.cat([p.grad.reshape(-1) for p in self.params])
        return Gradient(g, self.model.ec.gradients({t: c for t, (_, c) in ids.items()}), len(labels), bce.item())


class ServerModel:
    """The parameter server's state: dynamic tables with SparseAdagrad rows and the DeepFM dense
    parameters with Adam, built exactly as ``ops.sparse.train.CTRModel`` builds them."""

    def __init__(self, fields: list[str], cfg: TrainConfig):
        self.model = CTRModel(fields, cfg)
        self.params = list(self.model.net.parameters())

    def dense(self) -> torch.Tensor:
        """Dense parameters flattened [P]."""
        return parameters_to_vector(self.params).detach().clone()

    def rows(self, ids: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Embedding rows [U, d] for unique ids [U] per table; unseen ids are admitted per the
        table's policy (training lookups)."""
        out = {}
        for t, uids in ids.items():
            table = self.model.ec.tables[t]
            out[t] = table.read(table.rows_for(uids, train=True))
        return out

    def apply(self, up: Update) -> None:
        """One optimizer step: Adam on the dense parameters, SparseAdagrad on the rows in the update."""
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = up.dense[off:off + n].view_as(p).clone()
            off += n
        self.model.opt.step()
        for t, (uids, grads) in up.sparse.items():
            table = self.model.ec.tables[t]
            table.apply_gradients(table.rows_for(uids, train=False), grads)
        self.model.ec.end_step()

    def evaluate(self, feats: dict, labels: torch.Tensor) -> dict:
        return evaluate(self.model, feats, labels)


def evaluate(model: CTRModel, feats: dict, labels: torch.Tensor) -> dict:
    """Test AUC and log loss of a CTR model on encoded features [N]."""
    return metrics(labels, model.predict(feats))


def metrics(labels: torch.Tensor, scores) -> dict:
    """AUC (Mann-Whitney U with average ranks for ties, as scikit-learn's roc_auc_score) and log loss
    (probabilities clipped to [1e-7, 1 - 1e-7]) of click probabilities [N] against 0/1 labels [N].
    numpy only, so the parameter server does not import scikit-learn. Raises ValueError when the
    labels hold one class."""
    import numpy as np

    y = labels.numpy().astype(np.float64)
    s = np.asarray(scores, dtype=np.float64)
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs both classes among the labels")
    _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks = (first + (counts + 1) / 2.0)[inv]                  # 1-based average ranks
    auc = (ranks[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg)
    p = np.clip(s, 1e-7, 1 - 1e-7)
    logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    return {"auc": float(auc), "logloss": float(logloss)}
