"""Crucible operations: plain Python (Polars, numpy, scikit-learn, datasketch); no Dagster import."""
