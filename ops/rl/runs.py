"""What the two RL training drivers share (RollPacker, docs/rollpacker.md; RollArc, docs/rollarc.md):
the policy settings their engine and trainer actors get, the problems table they read, the start of
a resumable launch and the fault injection of the resume tests. Torch-free and ray-free: the assets
import the drivers' specs at load time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PROBLEM_COLUMNS = ("problem_id", "problem", "answer")
"""The columns an RL run needs from ``decontaminated_problems``."""


@dataclass(kw_only=True)
class PolicySpec:
    """The policy and its optimizer as both drivers give them to the engine and trainer actors
    (``ops.rl.ray_actors``; JSON-serialisable, part of a driver's spec)."""

    tokenizer_dir: str
    """Hugging Face directory of the tokenizer (and chat template)."""
    model_dir: Optional[str] = None
    """The policy's weights (Hugging Face directory); None = the tiny random 2-layer Llama (wiring checks)."""
    lr: float = 1e-6
    """AdamW learning rate of the trainer."""
    temperature: float = 1.0
    """Sampling temperature of the engines; the trainer scores the sampled tokens under the same
    distribution (temperature, top_k, top_p: ``ops.lm.sampling.SamplingConfig``)."""
    top_k: int = 0
    """Keep only the k most likely tokens when sampling (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    seed: int = 0
    """Seed of the tiny policy's initial weights, of sampling and of the data order."""
    threads: int = 1
    """Torch threads of each engine actor (and of RollPacker's trainer)."""
    tiny_hidden: int = 64
    """Hidden width of the tiny random policy (used only when model_dir is None)."""
    reward_timeout_s: float = 30.0
    """Limit of one reward request (s)."""
    reward_retries: int = 2
    """Retries of a failed reward request."""
    engine_gpus: float = 0.0
    """GPUs each engine actor requests from Ray (``num_gpus``; fractions share a device), >= 0. 0 (the CPU
    default) runs on CPU; > 0 puts the model on the CUDA device Ray assigns, and an actor without one fails
    naming the field."""
    trainer_gpus: float = 0.0
    """GPUs each trainer actor requests from Ray (``num_gpus``; fractions share a device), >= 0. 0 (the CPU
    default) runs on CPU; > 0 puts the model on the CUDA device Ray assigns, and an actor without one fails
    naming the field."""

    def check_sampling(self, prefix: str) -> None:
        """Raises ValueError naming ``<prefix>.temperature`` / ``.top_k`` / ``.top_p`` when the sampling
        distribution is invalid (the checks of ``ops.lm.sampling.SamplingConfig``), or
        ``<prefix>.engine_gpus`` / ``.trainer_gpus`` when negative, so a bad value fails at the asset
        boundary instead of inside an actor."""
        from ops.lm.sampling import SamplingConfig

        try:
            SamplingConfig(self.temperature, self.top_k, self.top_p)
        except ValueError as e:
            raise ValueError(f"{prefix}.{str(e).removeprefix('sampling.')}") from None
        for name in ("engine_gpus", "trainer_gpus"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{prefix}.{name} must be a number >= 0 (GPUs per actor), got {v!r}")

    def policy(self) -> dict:
        """The spec dict of the engine and trainer actors (``ops.rl.ray_actors._EngineImpl`` /
        ``_TrainerImpl``)."""
        return {"tokenizer_dir": self.tokenizer_dir, "model_dir": self.model_dir, "seed": self.seed,
                "threads": self.threads, "tiny_hidden": self.tiny_hidden, "temperature": self.temperature,
                "top_k": self.top_k, "top_p": self.top_p, "lr": self.lr, "engine_gpus": self.engine_gpus,
                "trainer_gpus": self.trainer_gpus}


def read_problems(path: str | Path):
    """The problems table of a run (``decontaminated_problems``) as a Polars frame: a Parquet file
    (``LakeResource.table_path``'s snapshot) or a Delta table folder (``<lake>/decontaminated_problems/
    data.delta``, its current version). Raises FileNotFoundError when it does not exist, ValueError
    naming the file and the missing columns when it lacks ``problem_id``, ``problem`` or ``answer``."""
    import polars as pl

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"problems table {p} does not exist: materialize decontaminated_problems first")
    df = pl.read_delta(str(p)) if (p / "_delta_log").is_dir() else pl.read_parquet(p)
    missing = set(PROBLEM_COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"problems table {p} lacks columns {sorted(missing)}")
    return df


def resume_state(state, log):
    """Load a driver's saved state (``ops.launch.DriverState``) for this launch; a state of another
    spec is ignored with a warning. Returns ``state``."""
    if not state.load() and state.skipped:
        log.warning(f"{state.skipped}: starting from the first step")
    return state


def crash_if_asked(env_var: str, count: int, loaded: int, log: Callable[[str], None]) -> None:
    """Fault injection of the resume tests: SIGKILL this process group (the driver and a local Ray
    instance: the launch, as a node preemption would) when ``env_var`` holds N with ``loaded`` < N
    <= ``count`` (``count``: steps saved now; ``loaded``: steps the state held when this launch
    started), so the first save that reaches N kills, and a relaunch that resumed past N is not
    killed again. Raises ValueError naming the variable when it is not an integer."""
    from ops.launch import crash_after

    n = crash_after(env_var, "steps")
    if n is not None and loaded < n <= count:
        log(f"fault injection ({env_var}={n}): SIGKILL to the driver's process group after {count} saved steps")
        os.killpg(os.getpgrp(), signal.SIGKILL)
