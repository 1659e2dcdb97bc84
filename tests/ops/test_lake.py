"""Atomic writes: a failed write never half-overwrites the previous table."""

import polars as pl
import pytest

from ops import lake


def test_failed_write_keeps_previous_version(tmp_path):
    p = tmp_path / "t" / "data.parquet"
    v1 = lake.write_parquet_atomic(pl.DataFrame({"a": [1, 2]}), p)

    class Boom(pl.DataFrame):
        def write_parquet(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError):
        lake.write_parquet_atomic(Boom({"a": [3]}), p)
    assert pl.read_parquet(p)["a"].to_list() == [1, 2]
    assert lake.file_sha256(p)[:16] == v1
    assert [f.name for f in p.parent.iterdir()] == ["data.parquet"]  # no temp file left behind


def test_same_rows_same_version(tmp_path):
    df = pl.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert lake.write_parquet_atomic(df, tmp_path / "1.parquet") == lake.write_parquet_atomic(df, tmp_path / "2.parquet")
    assert lake.write_parquet_atomic(df, tmp_path / "3.parquet") != lake.write_parquet_atomic(df.reverse(), tmp_path / "4.parquet")


def test_hf_dataset_layout_loads_with_datasets(tmp_path):
    import datasets

    df = pl.DataFrame({"problem": ["p1", "p2"], "response": ["r1", "r2"]})
    lake.write_hf_dataset(df, tmp_path / "ds", "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*.parquet\n---\n# card\n")
    ds = datasets.load_dataset("parquet", data_dir=str(tmp_path / "ds"))["train"]
    assert ds["problem"] == ["p1", "p2"]
    lake.write_hf_dataset(df.head(1), tmp_path / "ds", "# v2\n")  # replace in place
    assert datasets.load_dataset("parquet", data_dir=str(tmp_path / "ds"))["train"].num_rows == 1


def test_a_locked_catalog_never_fails_a_write(tmp_path):
    import subprocess
    import sys
    import time

    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path), catalog_lock_timeout_s=0.5)
    lake.write(pl.DataFrame({"a": [1]}), "first")  # creates the catalog
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(tmp_path / 'catalog.duckdb')!r}); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        t = time.monotonic()
        path, _ = lake.write(pl.DataFrame({"b": [2]}), "second")  # needs a new view: catalog is locked
        assert time.monotonic() - t < 10
        assert pl.read_parquet(path)["b"].to_list() == [2]
    finally:
        holder.kill()
        holder.wait()
    assert lake.refresh_view("second") is True  # created once the lock is gone
    import duckdb

    with duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True) as con:
        assert con.execute('select b from "second"').fetchone() == (2,)
