"""Curation stages of the Logics-STEM engine (arXiv 2601.01562 §2): sources, annotation, dedup,
decontamination, verification, stratified sampling."""
