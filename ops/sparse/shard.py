"""Sharding dynamic tables across processes by ID (RecIS, arXiv 2509.20883 §3.3), on
torch.distributed (gloo on CPU). The owner of a (namespaced) ID is ``id % world_size``. Checkpoints:
``ops.sparse.checkpoint.save_sharded`` / ``load_sharded`` (saved at one world size, loaded at any).

Forward, per table: dedup the local IDs -> route each to its owning rank -> the owner dedups what it
received, looks up (admitting per policy) and returns the rows -> the rows are reassembled in local
order. Backward (``apply_gradients``): each rank sends the gradient of every row it looked up back
to the owner, which sums them per row and applies the sparse optimizer once. Dense parameters are
data-parallel (all-reduce of gradients).

Gradient scale across ranks (``grad_reduce``): "mean" (default, as RecIS and DistributedDataParallel)
divides the summed sparse and dense gradients by the world size, so ``train_step`` with its default
per-rank mean loss equals the single-process run on the global batch (equal local batches); "sum"
keeps the sum, for a loss already scaled by 1 / global batch (``loss_scale``). Either way a sharded
run equals the single-process run up to fp summation order.

Exchange: ``all_to_all_single`` when the backend has it; otherwise (``exchange="all_gather"``, or
``"auto"`` after all_to_all fails a probe) an all_gather of padded buffers. Collectives wait at most
the process group's timeout (set it in ``init_process_group(timeout=...)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collection import EmbeddingCollection, _by_table, merge_row_grads
from .train import CTRModel

GRAD_REDUCES = ("mean", "sum")


def _probe_all_to_all(group) -> bool:
    try:
        w = dist.get_world_size(group)
        out = torch.empty(w, dtype=torch.int64)
        dist.all_to_all_single(out, torch.arange(w, dtype=torch.int64), group=group)
        return True
    except (RuntimeError, NotImplementedError, ValueError):
        return False


class Exchanger:
    """Variable-size personalised exchange: ``send[r]`` ([n_r, ...] tensors) goes to rank r;
    returns ``recv[s]``, what rank s sent here. mode: "all_to_all" | "all_gather" | "auto"."""

    def __init__(self, group=None, mode: str = "auto"):
        if mode not in ("all_to_all", "all_gather", "auto"):
            raise ValueError(f"exchange mode must be all_to_all, all_gather or auto, got {mode!r}")
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.mode = mode if mode != "auto" else ("all_to_all" if _probe_all_to_all(group) else "all_gather")
        self.calls = 0

    def __call__(self, send: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls += 1
        tail = send[0].shape[1:]
        counts = torch.tensor([len(t) for t in send], dtype=torch.int64)
        flat = torch.cat(send).contiguous()
        if self.mode == "all_to_all":
            recv_counts = torch.empty(self.world, dtype=torch.int64)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            out = torch.empty((int(recv_counts.sum()), *tail), dtype=flat.dtype)
            dist.all_to_all_single(out, flat, output_split_sizes=recv_counts.tolist(), input_split_sizes=counts.tolist(),
                                   group=self.group)
            return list(torch.split(out, recv_counts.tolist()))
        # all_gather fallback: every rank's counts, then every rank's padded buffer; keep our slices
        all_counts = [torch.empty(self.world, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(all_counts, counts, group=self.group)
        width = max(int(c.sum()) for c in all_counts)
        buf = torch.zeros((width, *tail), dtype=flat.dtype)
        buf[:len(flat)] = flat
        bufs = [torch.empty_like(buf) for _ in range(self.world)]
        dist.all_gather(bufs, buf, group=self.group)
        out = []
        for src, c in enumerate(all_counts):
            start = int(c[:self.rank].sum())
            out.append(bufs[src][start:start + int(c[self.rank])])
        return out


class ShardedEmbeddingCollection(EmbeddingCollection):
    """An EmbeddingCollection whose tables hold only the IDs this rank owns (``id % world == rank``).
    Every rank must call forward and ``apply_gradients`` in the same order (they are collectives)."""

    def __init__(self, features, coalesce: bool = True, seed: int = 0, block_rows: int = 4096, group=None,
                 exchange: str = "auto", grad_reduce: str = "mean"):
        if grad_reduce not in GRAD_REDUCES:
            raise ValueError(f"grad_reduce must be one of {GRAD_REDUCES}, got {grad_reduce!r}")
        super().__init__(features, coalesce=coalesce, seed=seed, block_rows=block_rows)
        self.x = Exchanger(group, exchange)
        self.grad_reduce = grad_reduce

    def _lookup_unique(self, tname: str, uids: torch.Tensor, train: bool, counts: torch.Tensor | None = None) -> torch.Tensor:
        table, world = self.tables[tname], self.x.world
        owner = uids % world
        pos = [torch.nonzero(owner == r).flatten() for r in range(world)]
        if counts is None:
            recv = self.x([uids[p] for p in pos])                     # ids others need from me
        else:                                                         # with their occurrences (admission)
            pairs = self.x([torch.stack([uids[p], counts[p]], dim=1) for p in pos])
            recv, recv_counts = [q[:, 0] for q in pairs], torch.cat([q[:, 1] for q in pairs])
        sizes = [len(t) for t in recv]
        own, inv = torch.unique(torch.cat(recv), return_inverse=True)
        own_counts = None if counts is None else torch.zeros(len(own), dtype=torch.int64).index_add_(0, inv, recv_counts)
        rows = table.rows_for(own, train, own_counts)
        vals = table.read(rows)[inv]
        got = self.x(list(torch.split(vals, sizes)))                  # rows of my ids, from their owners
        leaf = torch.empty(len(uids), table.dim)
        for r in range(world):
            leaf[pos[r]] = got[r]
        if train:
            leaf.requires_grad_(True)
            self._pending.append((tname, (rows, inv, sizes, pos), leaf))
        return leaf

    def apply_gradients(self) -> None:
        """Send each looked-up row's gradient to its owner; owners sum per row (over every rank and every
        lookup of the step) and update once (a collective)."""
        pending, self._pending = self._pending, []
        parts = []
        for tname, (rows, inv, sizes, pos), leaf in pending:
            table = self.tables[tname]
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            recv = self.x([grad[p] for p in pos])
            g = torch.zeros(len(rows), table.dim).index_add(0, inv, torch.cat(recv))
            parts.append((tname, rows, g / self.x.world if self.grad_reduce == "mean" else g))
        for tname, got in _by_table(parts).items():
            self.tables[tname].apply_gradients(*merge_row_grads(got))


class ShardedCTRModel(CTRModel):
    """CTRModel over a ShardedEmbeddingCollection with data-parallel dense parameters: call
    ``train_step(local_batch, local_labels)`` on every rank (``grad_reduce="mean"``, the default: the
    gradients are averaged over ranks), or with ``grad_reduce="sum"``
    ``train_step(local_batch, local_labels, loss_scale=1 / global_batch)``."""

    def __init__(self, fields, cfg, group=None, exchange: str = "auto", grad_reduce: str = "mean", feature_kw=None):
        super().__init__(fields, cfg, collection_cls=ShardedEmbeddingCollection, feature_kw=feature_kw, group=group,
                         exchange=exchange, grad_reduce=grad_reduce)
        self.group, self.grad_reduce = group, grad_reduce

    def _reduce_dense_grads(self) -> None:
        world = dist.get_world_size(self.group)
        for p in self.net.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group)
                if self.grad_reduce == "mean":
                    p.grad /= world
