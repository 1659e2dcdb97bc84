"""A 2-process sharded run (gloo, CPU) equals the single-process run, with all_to_all and with the
all_gather fallback, and with gradients averaged over ranks (the default, train_step's own mean loss)
or summed (loss scaled by 1 / global batch)."""

import datetime

import polars as pl
import pytest
import torch

from ops.sparse.data import feature_columns, movielens_events, time_split
from ops.sparse.train import CTRModel, TrainConfig, take, tensors
from tests.conftest import join_or_kill

CFG = TrainConfig(dim=4, hidden=(16,), dropout=0.0, batch_size=128, crosses=["gender*age_bucket"])
STEPS = 12


def _data():
    df = time_split(movielens_events()).filter(pl.col("split") == "train").head(CFG.batch_size * STEPS)
    fields = feature_columns(df) + CFG.crosses
    return fields, tensors(df, fields), torch.tensor(df["click"].to_numpy(), dtype=torch.float32)


def _worker(rank, world, init_file, mode, out_dir, reduce="sum"):
    import torch.distributed as dist
    from safetensors.torch import save_file

    from ops.sparse.checkpoint import table_tensors
    from ops.sparse.shard import ShardedCTRModel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        fields, feats, y = _data()
        model = ShardedCTRModel(fields, CFG, exchange=mode, grad_reduce=reduce)
        half = CFG.batch_size // world
        for s in range(STEPS):
            idx = torch.arange(s * CFG.batch_size + rank * half, s * CFG.batch_size + (rank + 1) * half)
            if reduce == "sum":
                model.train_step(take(feats, idx), y[idx], loss_scale=1.0 / CFG.batch_size)
            else:                                   # the default: each rank's mean loss, averaged over ranks
                model.train_step(take(feats, idx), y[idx])
        out = {f"sparse/{k}": v for k, v in table_tensors(model.ec).items()}
        out.update({f"dense/{k}": v.detach().clone() for k, v in model.net.state_dict().items()})
        save_file(out, f"{out_dir}/rank{rank}.safetensors", metadata={"mode": model.ec.x.mode})
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def single():
    fields, feats, y = _data()
    torch.set_num_threads(1)
    model = CTRModel(fields, CFG)
    for s in range(STEPS):
        idx = torch.arange(s * CFG.batch_size, (s + 1) * CFG.batch_size)
        model.train_step(take(feats, idx), y[idx])
    ids, full, _ = model.ec.tables["table0"].live()
    return dict(zip(ids.tolist(), full)), model.net.state_dict()


@pytest.mark.parametrize("mode,reduce", [("all_to_all", "mean"), ("all_gather", "sum")])
def test_two_process_sharded_run_matches_single_process(mode, reduce, single, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    ctx = torch.multiprocessing.start_processes(_worker, args=(2, str(tmp_path / "store"), mode, str(tmp_path), reduce), nprocs=2,
                                                join=False, start_method="spawn")
    join_or_kill(ctx, 120, f"sharded run ({mode})")
    rows, dense = single
    sharded = {}
    for r in range(2):
        path = str(tmp_path / f"rank{r}.safetensors")
        with safe_open(path, "pt") as f:
            assert f.metadata()["mode"] == mode
        d = load_file(path)
        ids = d["sparse/table0/ids"]
        assert ((ids % 2) == r).all()                                  # each rank holds only the IDs it owns
        sharded.update(zip(ids.tolist(), d["sparse/table0/rows"]))
        for k, v in dense.items():
            torch.testing.assert_close(d[f"dense/{k}"], v, rtol=1e-4, atol=1e-6)
    assert sharded.keys() == rows.keys()
    keys = sorted(rows)
    from ops.sparse.table import init_rows
    trained = torch.stack([rows[k][:CFG.dim + 1] for k in keys])
    assert not torch.allclose(trained, init_rows(torch.tensor(keys), CFG.dim + 1, 0, 0.01))   # rows did train
    torch.testing.assert_close(torch.stack([sharded[k] for k in keys]), torch.stack([rows[k] for k in keys]), rtol=1e-4, atol=1e-6)
