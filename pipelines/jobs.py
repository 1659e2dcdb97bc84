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

# GBA vs sync all-reduce, async PS, SSP and Hop-BW under one straggler trace (one partition per mode).
gba_job = dg.define_asset_job(
    "gba_job",
    selection=dg.AssetSelection.assets("gba_run"),
    description="Train the CTR model in one training mode (partition): sync | async | gba | ssp | hopbw.",
)

# The mixture group (D-CPT Law). Partitioned assets get their own jobs; the main job runs each over
# its whole partition range in one run (the assets' BackfillPolicy.single_run: one launch).
mixture_data_job = dg.define_asset_job(
    "mixture_data_job",
    selection=dg.AssetSelection.assets("general_corpus", "domain_corpus", "cpt_tokenizer"),
    description="The CPT corpora (general reviews, curated STEM problems) and the BPE tokenizer + token streams.",
)
cpt_base_job = dg.define_asset_job(
    "cpt_base_job",
    selection=dg.AssetSelection.assets("cpt_base_models"),
    description="Pre-train the base model of each probe size (launch a partition range to do all in one run).",
)
cpt_probe_job = dg.define_asset_job(
    "cpt_probe_job",
    selection=dg.AssetSelection.assets("cpt_probe_runs"),
    description="Continual pre-training probes, size x domain ratio (a partition range runs in one launch).",
)
mixture_job = dg.define_asset_job(
    "mixture_job",
    selection=dg.AssetSelection.assets("dcpt_law_fit", "mixture_plan"),
    description="Fit the D-CPT Law on every finished probe run and answer the three mixture questions.",
)
