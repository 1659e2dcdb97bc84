"""Named configurations of the ``mixture`` group (docs/mixture.md, "The regime").

The D-CPT Law (Que et al., arXiv 2406.01375, §1 and §3) continues *well-trained* base models: further
general training no longer lowers their general loss, so domain data raises it and the law chooses how
much of that rise to accept. ``ops.mixture.validation.regime_status`` calls the closed loop "in the
regime" only when every base of the target size meets the plateau criterion of ``ops.mixture.plateau``
(the last 20% of base pre-training improved the general validation loss by < 0.5%) and the general
loss rises at the highest r_d by more than twice the probes' seed noise of the rise.

The pipeline's defaults (the whole review corpus, sizes ``xs``-``l``, 200,000 base tokens) are far
from that plateau: ``benchmarks/dcpt_plateau.py`` extrapolates ~1e8 tokens, hours per base on 2 cores.
``PLATEAU_SMALL`` shrinks the general corpus's role instead (issue 39 item 1 allows it): the general
corpus is the first 600 training review titles (``general_corpus`` ``variant: titles``,
``max_train_docs: 600``; ~21k tokens at a 512-token vocabulary, the titles' full held-out validation
split unchanged), which the probes repeat for ~30 epochs in 614,400 base tokens. Size ``s`` (the
closed loop's target) then has passed the bottom of its held-out general loss (~0.4-0.5M tokens) and
starts to memorise the titles: through the assets its two bases' last 20% changed the general loss by
-2.8% and -3.5% (plateaued); at 409,600 tokens they still improved 0.77% and 0.54%. With 300 titles
and 491,520 tokens the bases were over-trained (their held-out loss rose 9-11% in the last 20%) and
domain data then *lowered* the general loss, which the regime check reports as not reached; with 1,500
titles ``s`` still improved 0.9% per last 20% at ~1M tokens.
What that costs and what it measured (exploratory, development seeds, 2-core machine shared with a
benchmark queue): ``benchmarks/results/dcpt_regime_small.json``.

Each entry maps an op (asset) name to the run-config fields it sets; every other field keeps the
asset's default. The probe grid's sizes are fixed when the code location loads, so the configuration
also names them (``sizes``: set ``CRUCIBLE_CPT_SIZES`` to ``",".join(sizes)`` before loading). The
base models are the assets ``cpt_base_models`` (one partition per size, one folder per init) keyed
by their fingerprint (token manifest, shape, base settings, init): a run with an unchanged
configuration reuses them and keeps their data version; a changed one trains new ones.
"""

from __future__ import annotations

from typing import Any

PLATEAU_SMALL_SIZES: tuple[str, ...] = ("xs", "s")
"""The probe sizes of ``PLATEAU_SMALL`` (``CRUCIBLE_CPT_SIZES=xs,s``); the target of the closed loop is
the largest, ``s``. ``xs`` reaches its bottom later than ``s`` and may still improve at the budget: the
regime check judges the target size's bases only, and each base records its own criterion."""

PLATEAU_SMALL: dict[str, dict[str, Any]] = {
    "general_corpus": {"variant": "titles", "max_train_docs": 600},
    "cpt_tokenizer": {"vocab_size": 512, "seed": 0},
    "cpt_base_models": {"base_tokens": 614_400, "seq_len": 32, "global_batch": 16, "val_seqs_general": 256,
                        "val_seqs_per_subdomain": 32, "inits": [0, 1]},
    "cpt_probe_runs": {"cpt_tokens": 32_768, "first_checkpoint": 1_024, "seeds": [0, 1], "repeat_ratios": [0.5, 1.0]},
    "dcpt_law_fit": {"forms": ["L3"]},
}
"""Op -> run-config fields of the shrunk regime (module docstring). The base settings not named keep the
defaults (``base_schedule``: lr 3e-3, warm-up 10 steps, weight decay 0.01; seed 0); the plan and the closed loop
keep theirs (T = 3%, tolerance max(1 point, 2 x seed noise))."""


def run_config(name: str = "plateau_small") -> dict[str, dict[str, Any]]:
    """The Dagster run config ``{"ops": {op: {"config": fields}}}`` of a named configuration (a deep copy).
    Raises KeyError naming the known configurations for an unknown ``name``."""
    import copy

    known = {"plateau_small": PLATEAU_SMALL}
    if name not in known:
        raise KeyError(f"unknown mixture configuration {name!r}; known: {sorted(known)}")
    return {"ops": {op: {"config": copy.deepcopy(fields)} for op, fields in known[name].items()}}
