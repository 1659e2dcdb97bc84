"""Data-mixture selection for continual pre-training: the D-CPT Law (arXiv 2406.01375).

Submodules are imported directly (``from ops.mixture.law import fit_law``); this package
imports nothing so that importing one submodule never pulls in another's dependencies.
"""
