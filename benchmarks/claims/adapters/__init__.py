"""``run_seed`` adapters of the claim designs over the benchmark scripts (docs/claims.md)."""
