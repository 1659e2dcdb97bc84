"""Failure-driven post-training (Logics-STEM, arXiv 2601.01562 §3): the SFT worker (sft.py), the chat
format and its loss mask (data.py; packing and the training loop are the LM substrate's, ops/lm),
the training/evaluation sets (sets.py), scoring (evaluate.py), failure regions (regions.py),
targeted synthesis (synthesis.py), and the targeted-vs-random comparison (report.py). No Dagster
import; the assets live in assets/posttrain.py."""
