"""Confirmatory claims: designs registered before they run, an append-only log, verdicts from the
registered rule, and tables rendered from ``benchmarks/results/claims.json`` (docs/claims.md).

``python -m benchmarks.claims {list,validate,register,run,summarize,render}``; the pieces:
``design`` (the design file), ``stats`` (intervals and verdict rules), ``runner`` (registry, runs,
log, summary), ``render`` (markdown tables), ``adapters`` (``run_seed`` callables over the benchmarks).
"""
