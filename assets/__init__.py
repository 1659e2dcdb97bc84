"""Dagster assets and asset checks, one module per lifecycle stage."""
