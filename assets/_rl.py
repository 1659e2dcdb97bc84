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


@mirrors(None, own=OWN)
class PolicyChoice(dg.Config):
    """The asset-only fields every RL run config has (``OWN``): which policy, the held-out evaluation
    and the launch's limit. RollArc's config extends it with its nested spec (the optimizer and
    sampling settings under ``roles``); RollPacker's with ``PolicyRunConfig``'s flat ones."""

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


@mirrors(PolicySpec, own=OWN)
class PolicyRunConfig(fields_of(PolicySpec,
        exclude=("tokenizer_dir", "model_dir", "threads", "tiny_hidden", "reward_timeout_s",
                 "reward_retries", "engine_gpus", "trainer_gpus"), base=PolicyChoice)):
    """``PolicyChoice`` and the optimizer and sampling settings of ``ops.rl.runs.PolicySpec``, flat
    (RollPacker's driver spec is flat; its subclass's ``@mirrors`` checks them against that spec)."""


def rl_policy_dir(lake: LakeResource, config: "PolicyRunConfig", asset: str) -> Path:
    """The scratchpad policy's folder (``config.model_dir`` or the ``rl_policy`` asset's). Raises
    FileNotFoundError naming the asset to materialize when it holds no model."""
    d = Path(config.model_dir) if config.model_dir else lake.base / "rl_policy" / "policy"
    if not (d / "model.safetensors").exists() or not (d / "tokenizer.json").exists():
        raise FileNotFoundError(f"{asset}: no scratchpad policy at {d} (model.safetensors + tokenizer.json): "
                                "materialize rl_policy first (or set policy 'smollm2')")
    return d


def problems_table(lake: LakeResource) -> Path:
    """The ``decontaminated_problems`` table an RL run trains on, as a local Parquet file (an
    object-store root: a copy of the committed version under ``work_dir``; ``LakeResource.table_path``).
    Raises FileNotFoundError when it has not been materialized."""
    problems = lake.table_path("decontaminated_problems")
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


SMOKE_STEPS = 20
"""A run with fewer optimizer steps per method than this is a smoke run: its time ratios show that the
wiring works and are labelled ``_smoke``; they are not a measurement of the method (that is the
registered claim's job: docs/claims.md)."""
CLAIMS_JSON = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "claims.json"
"""The confirmatory claims' verdicts (``python -m benchmarks.claims``; docs/claims.md)."""


def claim_verdicts(prefix: str, path: Path = CLAIMS_JSON) -> dict:
    """The registered claims whose id starts with ``prefix`` (e.g. ``rollpacker``), as
    ``{id: {verdict, estimate, ci95, unit, seeds, label, status}}`` from claims.json; ``{"status":
    "claim not yet run"}`` when the file is absent (an installed package, a fresh checkout) or holds no
    such claim. Raises nothing: an unreadable file is reported as its error text."""
    import json

    try:
        claims = json.loads(path.read_text()).get("claims", {}) if path.exists() else {}
    except (OSError, ValueError) as e:
        return {"status": f"claims.json unreadable: {e}"}
    out = {}
    for cid, c in sorted(claims.items()):
        if not cid.startswith(prefix):
            continue
        ran = (c.get("seeds") or {}).get("run", 0)
        out[cid] = {"verdict": c.get("verdict") if ran else "claim not yet run", "status": c.get("status"),
                    "estimate": c.get("estimate"), "ci95": c.get("ci95"), "unit": (c.get("metric") or {}).get("unit"),
                    "seeds": c.get("seeds"), "label": c.get("label"), "statement": c.get("statement")}
    return out or {"status": "claim not yet run", "claims_json": str(path)}


def run_figures(step_s: dict[str, list[float]], baseline: str, seed: int, claim_prefix: str,
                claims_path: Path = CLAIMS_JSON) -> dict[str, dg.MetadataValue]:
    """The run's own time figures, labelled with what they measured, beside the registered claim
    (issue 38, item 4). ``step_s``: {method: seconds of each optimizer step, in order} (evaluation
    excluded). Every method's first step is excluded (it carries the cold start: engine and trainer
    start-up, first compilation; it was e.g. 1.015 s of a 1.22 s baseline run), so warm-up is treated
    identically for every arm. Keys carry the step count and ``_smoke`` below ``SMOKE_STEPS``:

    * ``run_scope``: steps per method, seed, runs (1), what is excluded;
    * ``run_train_s_<n>_steps[_smoke]``: {method: seconds of steps 2..n};
    * ``run_speedup_<n>_steps[_smoke]``: {method: baseline's seconds / method's} over steps 2..n
      ("n/a" text when a method has fewer than 2 steps);
    * ``claim_verdict``: ``claim_verdicts(claim_prefix)`` (the confirmatory figure, or "claim not yet run").
    """
    n = max((len(v) for v in step_s.values()), default=0)
    tag = f"{n}_steps" + ("_smoke" if n < SMOKE_STEPS else "")
    warm = {m: sum(v[1:]) for m, v in step_s.items() if len(v) >= 2}
    out = {"run_scope": dg.MetadataValue.text(
        f"this run only: {n} optimizer step(s) per method, seed {seed}, 1 run; times exclude every method's first "
        f"(cold) step{'; a smoke run: ratios show the wiring, not the method' if n < SMOKE_STEPS else ''}. "
        f"The confirmatory figure is claim_verdict (docs/claims.md)."),
        "claim_verdict": dg.MetadataValue.json(claim_verdicts(claim_prefix, claims_path))}
    if warm:
        out[f"run_train_s_{tag}"] = dg.MetadataValue.json({m: round(s, 3) for m, s in warm.items()})
    if baseline in warm and len(warm) == len(step_s):
        out[f"run_speedup_{tag}"] = dg.MetadataValue.json(
            {m: round(warm[baseline] / s, 3) if s > 0 else None for m, s in warm.items()})
    else:
        out[f"run_speedup_{tag}"] = dg.MetadataValue.text("n/a: a method has fewer than 2 steps (the first is excluded)")
    return out


def training_signal(context, asset: str, zero_signal_fractions) -> dict[str, dg.MetadataValue]:
    """``training_signal`` metadata of an RL run, and a warning in the run's log when it had none:
    ``zero_signal_fractions`` are the steps' shares of zero-signal groups (every reward of the group
    equal, so GRPO's advantages are 0; ``ops.rl.grpo``), None where a step did not report one. No
    signal = at least one share and every share 1.0: the optimizer steps changed nothing and the run
    measured the systems path, not learning."""
    zero = [z for z in zero_signal_fractions if z is not None]
    if not zero:                                # no step reported it: nothing to say
        return {}
    if all(z == 1.0 for z in zero):
        context.log.warning(f"{asset}: every group had equal rewards (zero-signal groups, advantage 0): the optimizer "
                            "steps changed nothing. The policy solved none (or all) of each group's samples here; "
                            "the run measures the systems path, not learning.")
        return {"training_signal": dg.MetadataValue.text("none: every group zero-signal (equal rewards)")}
    return {"training_signal": dg.MetadataValue.text("yes: some groups had reward variance")}


def learning_metadata(res: dict, baseline: str) -> dict[str, dg.MetadataValue]:
    """The result contract's metadata (docs/rl_policy.md, "How the RL runs use it"): per method the
    held-out accuracy curve (``res["eval"]``: step, training seconds without evaluation, accuracy,
    n, policy version; the held-out problems are the scratchpad ``heldout`` split, disjoint from the
    training prompts by text), the accuracy before / after with its steps and seed
    (``run_accuracy_before_after``), the response-length distribution of the trained responses
    (``res["response_lengths"]``: n, median, p90, max, max/median in tokens) and the weight-sync
    record per method (``res["weight_syncs"]``: the policy version the engines end on, stale commits
    refused, failed syncs; ``ops.rl.weights.sync_stats``). Time ratios are ``run_figures``'. Entries
    the result does not hold (a curated-task run has no ``eval``) are left out. ``baseline`` is unused
    here (kept for the callers' symmetry)."""
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
        seed = (res.get("spec") or {}).get("seed")
        out["run_accuracy_before_after"] = dg.MetadataValue.json(
            {m: {"before": c[0]["accuracy"], "after": c[-1]["accuracy"], "steps": c[-1]["step"], "n": c[-1]["n"],
                 "seed": seed, "split": "scratchpad heldout (content-disjoint from training)"}
             for m, c in ev.items() if c})
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
