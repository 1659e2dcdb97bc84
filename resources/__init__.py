"""Dagster resources: where data lives (lake), which user sources exist. Swapped per profile."""
