"""Jobs: what runs together."""

import dagster as dg

# One run per source partition (the UI's "materialize all" launches a backfill of these).
sources_job = dg.define_asset_job(
    "sources_job",
    selection=dg.AssetSelection.assets("raw_problems"),
    description="Materialize one raw_problems partition (one source).",
)

# Everything downstream of the raw sources, plus the benchmark references, with their checks.
curation_job = dg.define_asset_job(
    "curation_job",
    selection=dg.AssetSelection.groups("curation") | dg.AssetSelection.assets("benchmark_problems"),
    description="Annotate, dedup, decontaminate, distill and sample the SFT dataset from all raw sources.",
)

# The recommendation substrate: MovieLens-100k CTR events and the single-process DeepFM model.
training_job = dg.define_asset_job(
    "training_job",
    selection=dg.AssetSelection.assets("ctr_events", "ctr_model"),
    description="Build the CTR events (MovieLens-100k, time split) and train the DeepFM CTR model on the sparse engine.",
)
