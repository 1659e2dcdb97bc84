"""CTR events: MovieLens-100k from the wheel, the time split, feature encoding and bad user files."""

import numpy as np
import polars as pl
import pytest

from ops.sparse.data import (CTRDataError, encode_features, feature_columns, load_user_events, movielens_events, stable_id,
                             time_split)


@pytest.fixture(scope="module")
def events():
    return time_split(movielens_events())


def test_movielens_events_have_the_published_counts_and_label(events):
    assert events.height == 100_000
    assert events["user_id"].n_unique() == 943 and events["item_id"].n_unique() == 1682
    assert events["click"].sum() == 55_375                       # ratings 4 and 5 in ML-100k: 34,174 + 21,201
    assert (events["click"] == (events["rating"] >= 4).cast(pl.Int8)).all()
    assert events.filter(pl.col("item_id") == 1)["genres"][0].to_list() == ["Animation", "Children's", "Comedy"]  # Toy Story
    assert set(events["age_bucket"].unique()) <= {"<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+"}


def test_time_split_trains_on_the_past_and_tests_on_the_future(events):
    train, test = events.filter(pl.col("split") == "train"), events.filter(pl.col("split") == "test")
    assert train["timestamp"].max() < test["timestamp"].min()
    assert abs(test.height / events.height - 0.2) < 0.001
    with pytest.raises(ValueError, match="test_fraction"):
        time_split(events, 1.5)


def test_encode_features_ids_lengths_and_crosses(events):
    df = events.head(50)
    enc = encode_features(df, feature_columns(df), ["gender*age_bucket"])
    ids, lens = enc["user_id"]
    assert np.array_equal(ids[:, 0], df["user_id"].to_numpy()) and (lens == 1).all()
    gids, glens = enc["genres"]
    assert np.array_equal(glens, df["genres"].list.len().to_numpy())
    assert gids[0, 0] == stable_id(df["genres"][0][0])
    cross = enc["gender*age_bucket"][0][:, 0]
    assert cross[0] == stable_id(f"{df['gender'][0]}|{df['age_bucket'][0]}")
    with pytest.raises(CTRDataError, match="multi-hot"):
        encode_features(df, [], ["genres*gender"])
    with pytest.raises(CTRDataError, match="missing feature column 'nope'"):
        encode_features(df, ["nope"])


def test_user_events_file_is_validated_with_clear_errors(tmp_path):
    good = pl.DataFrame({"user_id": [1, 2], "item_id": [5, 6], "timestamp": [10, 20], "click": [1, 0], "city": ["a", "b"]})
    p = tmp_path / "ok.parquet"
    good.write_parquet(p)
    assert load_user_events(p)["click"].dtype == pl.Int8
    cases = [
        (good.drop("timestamp"), "missing required column(s) ['timestamp']"),
        (good.with_columns(item_id=pl.Series([5, -6])), "record 1 has item_id=-6"),
        (good.with_columns(user_id=pl.Series([1.0, 2.5])), "column 'user_id' must be integer"),
        (good.with_columns(click=pl.Series([1, 3])), "record 1 has click=3"),
    ]
    for df, msg in cases:
        df.write_parquet(p)
        with pytest.raises(CTRDataError) as e:
            load_user_events(p)
        assert msg in str(e.value) and str(p) in str(e.value)


def test_missing_wheel_says_run_crucible_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_WHEELS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run `crucible setup`"):
        movielens_events()
