"""What the two RL training assets share (``rollpacker_run``, docs/rollpacker.md; ``rollarc_run``,
docs/rollarc.md): the asset-only fields of their run configs (the policy, the launch's time limit),
the problems table they train on, and the launch and metadata of a Ray driver."""

from pathlib import Path
from typing import Optional

import dagster as dg

from resources.lake import LakeResource
from resources.teacher import default_model_dir

from ._config import mirrors

OWN = frozenset({"policy", "model_dir", "run_timeout_s"})
"""The fields of ``PolicyRunConfig``: the asset's own, not the driver spec's (``@mirrors(own=...)``)."""


@mirrors(None, own=OWN)
class PolicyRunConfig(dg.Config):
    """The fields every RL run config has beside its driver's: which policy, and the launch's limit."""

    policy: str = "smollm2"
    """``smollm2`` (the model directory) or ``tiny`` (a random 2-layer Llama: wiring checks only)."""
    model_dir: str = ""
    """Hugging Face directory of the policy; empty = $CRUCIBLE_MODELS/SmolLM2-135M-Instruct."""
    run_timeout_s: float = 900.0
    """Wall-clock limit of the launch (s); its whole process group is killed after it."""

    def policy_dirs(self, asset: str) -> tuple[str, Optional[str]]:
        """(tokenizer directory, model directory or None for the tiny random policy). Raises
        ValueError naming ``<asset>.policy`` when it is neither ``smollm2`` nor ``tiny``."""
        if self.policy not in ("smollm2", "tiny"):
            raise ValueError(f"{asset}.policy must be 'smollm2' or 'tiny', got {self.policy!r}")
        model_dir = self.model_dir or default_model_dir()
        return model_dir, model_dir if self.policy == "smollm2" else None

    def driver_fields(self) -> dict:
        """The values of the fields the driver's config dataclass holds (every field but ``OWN``)."""
        return self.model_dump(exclude=set(OWN))


def problems_table(lake: LakeResource) -> Path:
    """The ``decontaminated_problems`` table an RL run trains on. Raises FileNotFoundError when it
    has not been materialized."""
    problems = lake.path("decontaminated_problems")
    if not problems.exists():
        raise FileNotFoundError(f"decontaminated_problems has no table at {problems}: materialize it first")
    return problems


def saved_steps(state_cls, fp: str):
    """``saved(run_dir)`` of an RL launch (``assets.launch.launch``): the steps that the driver's
    ``RunState`` (``state_cls``, with ``steps_done``) of spec fingerprint ``fp`` holds in the run
    folder, described ("" when none)."""
    def saved(run_dir: Path) -> str:
        state = state_cls(run_dir, fp)
        n = state.steps_done if state.load() else 0
        return f"{n} saved step(s)" if n else ""
    return saved


ASSET = {"deps": ["decontaminated_problems"], "group_name": "training", "code_version": "1",
         "kinds": {"ray", "pytorch", "parquet"}, "pool": "gpu"}
"""The ``dg.asset`` arguments of an RL run: it trains on the curated problems, on the GPU pool."""

def launch_driver(context: dg.AssetExecutionContext, compute, lake: LakeResource, asset: str, module: str, spec,
                  fp: str, state_cls, timeout_s: float):
    """``assets.launch.launch`` of an RL driver ``module`` (``python -m``, one process that starts
    Ray) with its validated ``spec`` (``to_json``) of fingerprint ``fp``: the run folder under
    ``<lake>/<asset>/``, the saved steps of ``state_cls`` logged, Ray's log deduplication off (every
    actor's line reaches the run view). A context manager yielding ``Launched``."""
    from .launch import launch

    return launch(context, compute, base=lake.base, asset=asset, module=module, spec=spec.to_json(), fingerprint=fp,
                  timeout_s=timeout_s, saved=saved_steps(state_cls, fp), env={"RAY_DEDUP_LOGS": "0"})


def run_metadata(res: dict, model_dir: Optional[str], resumed: str) -> dict[str, dg.MetadataValue]:
    """The metadata entries both RL assets report from a driver's result: the policy, Ray address,
    wall seconds, hyper-parameters (the spec), where a retried launch resumed (``resumed``, "" =
    nowhere) and the seconds spent saving state."""
    return {"policy": dg.MetadataValue.text(model_dir or "tiny random Llama"),
            "ray_address": dg.MetadataValue.text(res["ray_address"]),
            "wall_s": dg.MetadataValue.float(round(res["wall_s"], 2)),
            "hyper_parameters": dg.MetadataValue.json(res["spec"]),
            "resumed_from": dg.MetadataValue.text(resumed or "none"),
            "state_save_s": dg.MetadataValue.float(round(res.get("state_save_s", 0.0), 3))}
