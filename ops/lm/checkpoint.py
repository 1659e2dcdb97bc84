"""Checkpoints of the LM training loop and the finished-run records it reuses.

A launch (``ops.launch.worker_main``) trains its runs one after another in its run folder ``out``;
run ``key`` keeps its checkpoint in ``<out>/runs/<key>/state/`` (``LMState``): ``state.json`` is
the commit point (step, the run's history, the data position, the files it names) written
atomically after the tensor files (model + optimizer + scheduler, and each rank's RNG state). A
state saved for another fingerprint is ignored, saying why. The finished run is published outside
the run folder with its fingerprint (``published`` finds it again). docs/mixture.md, "Probe grid";
docs/posttrain.md, "Stage-1 SFT".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Optional

from ops.launch import DriverState


class LMState(DriverState):
    """The checkpoint of one training run (see the module docstring).

    Attributes (besides ``DriverState``'s): step (optimizer steps done), history (what the run
    records as it goes, JSON), data (``MixedBatches.position()``), model_file (model, optimizer and
    scheduler state), rng_files (one per rank).
    """

    FIELDS = {"step": 0, "history": None, "data": {}, "model_file": "", "rng_files": []}


def run_folder(out: str | Path, key: str) -> Path:
    """``<out>/runs/<key>``, the key made file-name safe (``|`` and other characters become ``_``)."""
    return Path(out) / "runs" / re.sub(r"[^A-Za-z0-9._-]", "_", key)


def rng_state() -> dict:
    """This process's RNG states: Python, numpy's global generator, torch CPU (and CUDA devices)."""
    import random

    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def describe_saved(run_dir: str | Path) -> str:
    """What a launch's run folder holds, for the asset's log: ``"checkpoints: <run> at step N, ..."``,
    or ``""`` when no run saved anything (the asset's ``saved(run_dir)`` of ``assets.launch.launch``)."""
    found = []
    for p in sorted(Path(run_dir).glob("runs/*/state/state.json")):
        try:
            found.append(f"{p.parents[1].name} at step {json.loads(p.read_text())['step']}")
        except (ValueError, KeyError):
            found.append(f"{p.parents[1].name} (unreadable {p.name})")
    return ("checkpoints: " + ", ".join(found)) if found else ""


def published(path: str | Path, fingerprint: str, log: Callable[[str], None], what: str,
              needs: tuple[Path, ...] = ()) -> Optional[dict[str, Any]]:
    """The finished run's record at ``path`` when it carries ``fingerprint`` (and every file in
    ``needs`` exists): the run is then reused, not retrained, and ``log`` says so. None otherwise."""
    path = Path(path)
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    if info.get("fingerprint") != fingerprint or not all(Path(n).exists() for n in needs):
        return None
    log(f"{what}: reused (fingerprint {fingerprint})")
    return info
