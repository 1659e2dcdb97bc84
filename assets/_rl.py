"""What the two RL training assets share (``rollpacker_run``, docs/rollpacker.md; ``rollarc_run``,
docs/rollarc.md): the asset-only fields of their run configs (the policy, the held-out evaluation
of the scratchpad policy, the launch's time limit), the problems table they train on, and the launch
and metadata of a Ray driver.

Policies (``policy``): ``scratchpad`` (default) is the warm-started GPT-2 of the ``rl_policy`` asset
on the scratchpad task (docs/rl_policy.md; the driver's ``task="scratchpad"``, with a held-out
pass-rate curve per method); ``smollm2`` is SmolLM2-135M-Instruct on the curated problems
(``task="curated"``); ``tiny`` a random 2-layer Llama on the curated problems (wiring checks only)."""

from pathlib import Path
from typing import Optional

import dagster as dg

from ops.rl.runs import PolicySpec
from resources.lake import LakeResource
from resources.teacher import default_model_dir

from ._config import fields_of, mirrors

OWN = frozenset({"policy", "model_dir", "eval_size", "eval_every", "run_timeout_s"})
"""The fields of ``PolicyRunConfig`` that are the asset's own, not the driver spec's (``@mirrors(own=...)``)."""


POLICIES = ("scratchpad", "smollm2", "tiny")


@mirrors(PolicySpec, own=OWN)
class PolicyRunConfig(fields_of(PolicySpec,
        exclude=("tokenizer_dir", "model_dir", "threads", "tiny_hidden", "reward_timeout_s",
                 "reward_retries", "engine_gpus", "trainer_gpus"))):
    """The fields every RL run config has: which policy, the held-out evaluation and the launch's
    limit (``OWN``), and the optimizer and sampling settings both drivers take from
    ``ops.rl.runs.PolicySpec`` (each subclass's ``@mirrors`` checks them against its driver's spec)."""

    policy: str = "scratchpad"
    """``scratchpad`` (the ``rl_policy`` warm start on the scratchpad task, docs/rl_policy.md),
    ``smollm2`` (the model directory, on the curated problems) or ``tiny`` (a random 2-layer Llama on
    the curated problems: wiring checks only)."""
    model_dir: str = ""
    """Hugging Face directory of the policy; empty = the ``rl_policy`` folder (scratchpad) or
    ``<models>/SmolLM2-135M-Instruct`` (smollm2, tiny: its tokenizer; models = $CRUCIBLE_MODELS, else
    ``<repo>/.models`` in a checkout, else ``<venv>/share/crucible/models``)."""
    eval_size: int = 64
    """Scratchpad only: held-out problems scored (one sampled response each) before, during and after
    each method (the driver's ``eval_size``; 0 = no evaluation). Ignored for smollm2 / tiny."""
    eval_every: int = 0
    """Scratchpad only: optimizer steps between held-out evaluations (0 = before and after only)."""
    run_timeout_s: float = 900.0
    """Wall-clock limit of the launch (s); its whole process group is killed (a Ray Job stopped) after it."""

    @property
    def task(self) -> str:
        """The driver's task: ``scratchpad`` for the scratchpad policy, else ``curated``."""
        return "scratchpad" if self.policy == "scratchpad" else "curated"

    def policy_dirs(self, asset: str, rl_policy: str | Path = "") -> tuple[str, Optional[str]]:
        """(tokenizer directory, model directory or None for the tiny random policy). ``rl_policy``:
        the ``rl_policy`` asset's folder (the scratchpad policy's default). Raises ValueError naming
        ``<asset>.policy`` when it is not ``scratchpad``, ``smollm2`` or ``tiny``."""
        if self.policy not in POLICIES:
            raise ValueError(f"{asset}.policy must be one of {list(POLICIES)}, got {self.policy!r}")
        if self.policy == "scratchpad":
            d = self.model_dir or str(rl_policy)
            return d, d
        model_dir = self.model_dir or default_model_dir()
        return model_dir, model_dir if self.policy == "smollm2" else None

    def task_fields(self, asset: str) -> dict:
        """The driver spec's task fields (the result contract of docs/rl_policy.md): for the
        scratchpad task ``task``, no problems file and the held-out evaluation (``eval_size``,
        ``eval_every``); nothing for the curated task (the driver's default). Raises
        ValueError naming ``<asset>.eval_size`` / ``<asset>.eval_every`` when negative."""
        for name in ("eval_size", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{asset}.{name} must be >= 0, got {getattr(self, name)}")
        if self.task != "scratchpad":
            return {}                                    # the driver's default task, "curated"
        return {"task": "scratchpad", "problems_path": "", "eval_size": self.eval_size, "eval_every": self.eval_every}

    def driver_fields(self) -> dict:
        """The values of the fields the driver's config dataclass holds (every field but ``OWN``)."""
        return self.model_dump(exclude=set(OWN))


def rl_policy_dir(lake: LakeResource, config: "PolicyRunConfig", asset: str) -> Path:
    """The scratchpad policy's folder (``config.model_dir`` or the ``rl_policy`` asset's). Raises
    FileNotFoundError naming the asset to materialize when it holds no model."""
    d = Path(config.model_dir) if config.model_dir else lake.base / "rl_policy" / "policy"
    if not (d / "model.safetensors").exists() or not (d / "tokenizer.json").exists():
        raise FileNotFoundError(f"{asset}: no scratchpad policy at {d} (model.safetensors + tokenizer.json): "
                                "materialize rl_policy first (or set policy 'smollm2')")
    return d


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


ASSET = {"deps": ["decontaminated_problems", "rl_policy"], "group_name": "training", "code_version": "2",
         "kinds": {"ray", "pytorch", "parquet"}, "pool": "gpu"}
"""The ``dg.asset`` arguments of an RL run: it trains the scratchpad policy (``rl_policy``) or a
curated-problems policy (``decontaminated_problems``), on the GPU pool."""

def launch_driver(context: dg.AssetExecutionContext, compute, lake: LakeResource, asset: str, module: str, spec,
                  fp: str, state_cls, timeout_s: float):
    """``assets.launch.launch`` of an RL driver ``module`` (``python -m``, one process that starts
    Ray) with its validated ``spec`` (``to_json``) of fingerprint ``fp``: the run folder under
    ``<lake>/<asset>/``, the saved steps of ``state_cls`` logged, Ray's log deduplication off (every
    actor's line reaches the run view). A context manager yielding ``Launched``."""
    from .launch import launch

    return launch(context, compute, base=lake.base, asset=asset, module=module, spec=spec.to_json(), fingerprint=fp,
                  timeout_s=timeout_s, saved=saved_steps(state_cls, fp), env={"RAY_DEDUP_LOGS": "0"}, ray_job=True)


def ray_address(compute) -> Optional[str]:
    """The ``ray_address`` of an RL driver's spec: ``auto`` (the cluster the Ray Job runs on) when
    the compute resource submits Ray Jobs (``ray_jobs_address``), else ``compute.ray_address``
    (None = a local Ray instance started by the driver)."""
    return "auto" if compute.ray_jobs_address else compute.ray_address


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


def learning_metadata(res: dict, baseline: str) -> dict[str, dg.MetadataValue]:
    """The result contract's metadata (docs/rl_policy.md, "How the RL runs use it"): per method the
    held-out accuracy curve (``res["eval"]``: step, training seconds without evaluation, accuracy,
    n, policy version), the response-length distribution of the trained responses
    (``res["response_lengths"]``: n, median, p90, max, max/median in tokens), the training seconds
    (the last evaluation's ``train_wall_s``) and the speedup against ``baseline`` (its seconds over
    the method's), and the weight-sync record per method (``res["weight_syncs"]``: the policy
    version the engines end on, stale commits refused, failed syncs; ``ops.rl.weights.sync_stats``).
    Entries the result does not hold (a curated-task run has no ``eval``) are left out."""
    import polars as pl

    from ops.rl.warmstart import length_stats

    from ._meta import md_table

    out: dict[str, dg.MetadataValue] = {"task": dg.MetadataValue.text(res.get("task", "curated"))}
    ev = res.get("eval") or {}
    if ev:
        rows = [{"method": m, "step": e["step"], "train_wall_s": round(float(e["train_wall_s"]), 2),
                 "accuracy": round(float(e["accuracy"]), 4), "n": e["n"], "policy_version": e.get("policy_version")}
                for m, curve in ev.items() for e in curve]
        out["accuracy_curve"] = md_table(pl.DataFrame(rows), 200)
        secs = {m: float(c[-1]["train_wall_s"]) for m, c in ev.items() if c}
        out["accuracy_before_after"] = dg.MetadataValue.json(
            {m: {"before": c[0]["accuracy"], "after": c[-1]["accuracy"], "steps": c[-1]["step"]} for m, c in ev.items() if c})
        out["method_train_s"] = dg.MetadataValue.json({m: round(s, 2) for m, s in secs.items()})
        if baseline in secs:
            out["method_speedup_vs_baseline"] = dg.MetadataValue.json(
                {m: round(secs[baseline] / s, 3) if s > 0 else None for m, s in secs.items()})
    syncs = res.get("weight_syncs") or {}
    if syncs:                      # {method: policy version(s) held, stale commits refused, failed syncs}
        out["weight_syncs"] = dg.MetadataValue.json(syncs)
        out["stale_syncs_refused"] = dg.MetadataValue.int(sum(int(s.get("stale_syncs_refused", 0)) for s in syncs.values()))
    lengths = {m: v for m, v in (res.get("response_lengths") or {}).items() if v}
    if lengths:
        out["response_lengths"] = md_table(pl.DataFrame([{"method": m, **length_stats(v)} for m, v in lengths.items()]))
    return out


def role_gpus(compute) -> dict:
    """``engine_gpus`` / ``trainer_gpus`` of the RL actors from the compute resource
    (``rl_engine_gpus`` / ``rl_trainer_gpus``: production swaps the resource, not the run config)."""
    return {"engine_gpus": float(compute.rl_engine_gpus), "trainer_gpus": float(compute.rl_trainer_gpus)}
