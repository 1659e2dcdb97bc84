"""The DeepFM CTR model of ``ops.sparse`` split for a parameter server (GBA, arXiv 2205.11048 §3):
the server holds the sparse tables and the dense parameters (``ServerModel``); a worker holds a
parameter-free replica that computes one local batch's gradient from rows and dense parameters it
pulled (``WorkerModel``). The sync trainer uses the same loss (``loss_sum``).

Sharded tables (``Cluster.num_ps`` > 1): the rows of namespaced id u live on PS process
``u % num_ps`` (the rule of ``ops.sparse.shard``); process 0 keeps shard 0 beside the dense
parameters, each other process one ``TableShard``. ``ServerModel`` routes lookups, updates,
evaluation reads and checkpoints to the owners through shard clients (``ops.gba.ps`` gives RPC
clients; tests give ``TableShard`` objects directly). Rows are initialised from their id
(``ops.sparse.table.init_rows``), so a sharded run starts from the same tables as an unsharded one.

Straggler passes (``ops.gba.trace``): ``repeat`` runs the extra forward/backward passes of a slowed
worker and discards them, restoring the RNG so the kept gradient is that of an unslowed worker.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ops.sparse.collection import EmbeddingCollection
from ops.sparse.config import TrainConfig
from ops.sparse.train import CTRModel

from .aggregate import Gradient, Update


def loss_sum(model: CTRModel, batch: dict, labels: torch.Tensor, out: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over the batch [B] of per-sample BCE, emb_l2 x summed squared norm of the looked-up
    embeddings): scalars whose backward gives per-sample-summed gradients, averaged later by
    ``ops.gba.aggregate`` (sums, not means, so that any split of a global batch adds up). With
    ``out`` given, ``out["e"]`` is the stacked embeddings [B, F, dim + 1] (for ``dense_pass``)."""
    model.net.train()
    emb = model.ec(batch, train=True)
    e = torch.stack([emb[f] for f in model.fields], dim=1)                 # [B, F, dim + 1]
    if out is not None:
        out["e"] = e
    return _head(model, e, labels)


def _head(model: CTRModel, e: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = model.net(e)                                                        # [B]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(z, labels, reduction="sum")
    return bce, model.cfg.emb_l2 * e.pow(2).sum()


def repeat(extra: int, fn) -> None:
    """Run ``fn()`` ``extra`` more times and discard its results: a straggler's extra forward/backward
    passes (``ops.gba.trace``). The CPU RNG (dropout) is restored afterwards."""
    if extra <= 0:
        return
    with torch.random.fork_rng(devices=[]):
        for _ in range(extra):
            fn()


def dense_pass(model: CTRModel, e: torch.Tensor, labels: torch.Tensor) -> None:
    """One more forward/backward of the DeepFM head over embeddings ``e`` [B, F, dim + 1] already
    looked up, its gradients computed and discarded (nothing accumulates in ``.grad``): the sync
    trainer's straggler pass, whose lookups are collectives and cannot be repeated by one rank."""
    leaf = e.detach().requires_grad_(True)
    bce, reg = _head(model, leaf, labels)
    torch.autograd.grad(bce + reg, [leaf, *model.net.parameters()])


class PulledCollection(EmbeddingCollection):
    """Worker-side embeddings: the tables are never read; each lookup returns the rows the worker
    pulled from the server for exactly these unique ids (``serve`` them before the forward)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._served: dict[str, torch.Tensor] = {}

    def serve(self, rows: dict[str, torch.Tensor]) -> None:
        self._served = rows

    def _lookup_unique(self, tname: str, uids: torch.Tensor, train: bool, counts: torch.Tensor | None = None) -> torch.Tensor:
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
                 dense: torch.Tensor | None, passes: int = 1) -> Gradient:
        """Gradient sums of one local batch [B] at the pulled parameters (dense [P] or None = unchanged).
        ``passes`` > 1: the forward/backward is computed that many times and only the first kept
        (a straggler's real slowdown, ``ops.gba.trace``)."""
        g = self._gradient(batch, labels, ids, rows, dense)
        repeat(passes - 1, lambda: self._gradient(batch, labels, ids, rows, None))
        return g

    def _gradient(self, batch, labels, ids, rows, dense) -> Gradient:
        if dense is not None:
            vector_to_parameters(dense, self.params)
        self.model.ec.serve(rows)
        bce, reg = loss_sum(self.model, batch, labels)
        for p in self.params:
            p.grad = None
        (bce + reg).backward()
        g = torch.cat([p.grad.reshape(-1) for p in self.params])
        return Gradient(g, self.model.ec.gradients({t: c for t, (_, c) in ids.items()}), len(labels), bce.item())


class TableShard:
    """One shard of the sparse tables (the ids a PS process owns), with their SparseAdagrad rows:
    the tables ``CTRModel`` builds, holding only the rows of the ids routed here. The methods are
    what a shard client offers (``ops.gba.ps`` serves them over RPC)."""

    def __init__(self, fields: list[str], cfg: TrainConfig):
        self.ec = CTRModel(fields, cfg).ec

    def rows(self, ids: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows [U, d] of unique ids [U] per table, admitting unseen ids (training lookups)."""
        out = {}
        for t, uids in ids.items():
            table = self.ec.tables[t]
            out[t] = table.read(table.rows_for(uids, train=True))
        return out

    def read(self, ids: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows [U, d] of unique ids [U] per table, zeros for ids without a row (no admission)."""
        return {t: self.ec.tables[t].read(self.ec.tables[t].rows_for(uids, train=False)) for t, uids in ids.items()}

    def apply(self, sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """SparseAdagrad on the rows of ``sparse`` {table: (ids [U], grads [U, d])}, then end the step."""
        for t, (uids, grads) in sparse.items():
            table = self.ec.tables[t]
            table.apply_gradients(table.rows_for(uids, train=False), grads)
        self.ec.end_step()

    def save(self, folder: str, name: str) -> None:
        from .checkpoint import save_state

        save_state(Path(folder), name, {"shard": name}, self.ec)

    def load(self, folder: str, name: str) -> None:
        from .checkpoint import load_state

        load_state(Path(folder), name, self.ec)

    def save_handover(self, folder: str, k: int, num_ps: int) -> dict:
        """Write this shard's rows (key % num_ps == k) into a hand-over folder (``ops.gba.handover``);
        returns the manifest entry."""
        from ops.sparse.checkpoint import save_shard

        from .handover import TABLES

        return save_shard(self.ec, folder, k, num_ps, prefix=TABLES)

    def load_handover(self, folder: str, k: int, num_ps: int) -> None:
        """Load the rows key % num_ps == k of a hand-over (written at any world size)."""
        from .handover import load_tables

        load_tables(folder, self.ec, k, num_ps)


class ServedCollection(EmbeddingCollection):
    """Evaluation-side embeddings over rows read from every shard: ``serve({table: (sorted ids [U],
    rows [U, d])})`` once, then lookups of any subset (no gradients)."""

    def serve(self, rows: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._rows = rows

    def _lookup_unique(self, tname: str, uids: torch.Tensor, train: bool, counts: torch.Tensor | None = None) -> torch.Tensor:
        ids, rows = self._rows[tname]
        pos = torch.searchsorted(ids, uids)
        if len(uids) and (pos.max() >= len(ids) or not torch.equal(ids[pos], uids)):
            raise ValueError(f"table {tname}: evaluation looked up ids that were not served")
        return rows[pos]


class ServerModel:
    """The parameter server's state: dynamic tables with SparseAdagrad rows and the DeepFM dense
    parameters with Adam, built exactly as ``ops.sparse.train.CTRModel`` builds them.

    Args:
        shards: clients of PS processes 1 .. num_ps - 1 (objects with TableShard's methods); empty:
            this process holds every row. With shards, this process's own tables hold shard 0.
    """

    def __init__(self, fields: list[str], cfg: TrainConfig, shards: list | None = None):
        self.model = CTRModel(fields, cfg)
        self.params = list(self.model.net.parameters())
        self.shards = list(shards or [])
        self.num_ps = 1 + len(self.shards)
        self._eval: CTRModel | None = None

    def dense(self) -> torch.Tensor:
        """Dense parameters flattened [P]."""
        return parameters_to_vector(self.params).detach().clone()

    def _split(self, per_table: dict) -> list[tuple[dict, dict]]:
        """Per PS process k: ({table: positions [n_k] in the table's ids}, {table: ids [n_k]})."""
        out = [({}, {}) for _ in range(self.num_ps)]
        for t, v in per_table.items():
            uids = v[0] if isinstance(v, tuple) else v
            owner = uids % self.num_ps
            for k in range(self.num_ps):
                pos = torch.nonzero(owner == k).flatten()
                out[k][0][t], out[k][1][t] = pos, uids[pos]
        return out

    def _gather(self, ids: dict[str, torch.Tensor], local, remote: str) -> dict[str, torch.Tensor]:
        if not self.shards:
            return local(ids)
        parts = self._split(ids)
        got = [local(parts[0][1])] + [getattr(c, remote)(parts[k + 1][1]) for k, c in enumerate(self.shards)]
        out = {}
        for t, uids in ids.items():
            rows = torch.empty(len(uids), self.model.ec.tables[t].dim)
            for k in range(self.num_ps):
                rows[parts[k][0][t]] = got[k][t]
            out[t] = rows
        return out

    def rows(self, ids: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Embedding rows [U, d] for unique ids [U] per table, from their owning shards; unseen ids
        are admitted per the table's policy (training lookups)."""
        def local(ids):
            out = {}
            for t, uids in ids.items():
                table = self.model.ec.tables[t]
                out[t] = table.read(table.rows_for(uids, train=True))
            return out
        return self._gather(ids, local, "rows")

    def apply(self, up: Update) -> None:
        """One optimizer step: Adam on the dense parameters, SparseAdagrad on the rows in the update
        (each shard updates its own rows)."""
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = up.dense[off:off + n].view_as(p).clone()
            off += n
        self.model.opt.step()
        parts = self._split(up.sparse) if self.shards else [({}, {})]
        for t, (uids, grads) in up.sparse.items():
            if self.shards:
                pos = parts[0][0][t]
                uids, grads = uids[pos], grads[pos]
            table = self.model.ec.tables[t]
            table.apply_gradients(table.rows_for(uids, train=False), grads)
        self.model.ec.end_step()
        for k, c in enumerate(self.shards):
            c.apply({t: (up.sparse[t][0][pos], up.sparse[t][1][pos]) for t, pos in parts[k + 1][0].items()})

    def evaluate(self, feats: dict, labels: torch.Tensor) -> dict:
        if not self.shards:
            return evaluate(self.model, feats, labels)
        if self._eval is None:                      # the test set's ids, once
            self._eval = CTRModel(self.model.fields, self.model.cfg, collection_cls=ServedCollection)
            self._eval_ids = {t: u for t, (u, _) in self._eval.ec.unique_ids(feats).items()}
        self._eval.net = self.model.net
        local = lambda ids: {t: self.model.ec.tables[t].read(self.model.ec.tables[t].rows_for(u, train=False))  # noqa: E731
                             for t, u in ids.items()}
        rows = self._gather(self._eval_ids, local, "read")
        self._eval.ec.serve({t: (self._eval_ids[t], rows[t]) for t in rows})
        return evaluate(self._eval, feats, labels)

    def save_handover(self, folder) -> list[dict]:
        """Every PS process writes its rows into the hand-over folder; returns the manifest entries."""
        from ops.sparse.checkpoint import save_shard

        from .handover import TABLES

        entries = [save_shard(self.model.ec, folder, 0, self.num_ps, prefix=TABLES)]
        return entries + [c.save_handover(str(folder), k + 1, self.num_ps) for k, c in enumerate(self.shards)]

    def load_handover(self, folder) -> None:
        """Every PS process loads its rows (key % num_ps == k) of a hand-over."""
        from .handover import load_tables

        load_tables(folder, self.model.ec, 0, self.num_ps)
        for k, c in enumerate(self.shards):
            c.load_handover(str(folder), k + 1, self.num_ps)

    def save_shards(self, folder) -> list[str]:
        """Each shard process writes its tables into ``folder`` (writer ``ps<k>``). Returns the writers."""
        for k, c in enumerate(self.shards):
            c.save(str(folder), f"ps{k + 1}")
        return [f"ps{k + 1}" for k in range(len(self.shards))]

    def load_shards(self, folder) -> None:
        for k, c in enumerate(self.shards):
            c.load(str(folder), f"ps{k + 1}")


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
