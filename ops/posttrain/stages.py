"""The post-training stages' own settings and the work between reading the lake and launching
(Logics-STEM, arXiv 2601.01562 §3; docs/posttrain.md): where the student and its tokenizer come
from, the mixture ratio, the stage-1 and stage-2 run lists, which committed runs can be reused, the
predictions a worker wrote, the per-slice accuracy table and the per-seed stage-2 scores.

No Dagster: the ``sft_checkpoint`` and ``stage2_checkpoint`` run configs mirror :class:`Stage1Inputs`
and :class:`Stage2Inputs` (assets/posttrain.py); errors are ValueError / FileNotFoundError naming
the field, the file or the run. ``lake`` arguments are any object with ``LakeResource``'s ``base``
(a local folder), ``remote``, ``read``, ``read_dataset`` and ``path``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ops.lm.spec import require

ARMS = ("targeted", "random")
"""The stage-2 arms: the targeted items and the random control of the same size."""


@dataclass
class Stage1Inputs:
    """What ``sft_checkpoint`` reads and builds before its ``SftPlan``: the student, the sets
    (ops.posttrain.sets.stage1_sets), the mixture ratio and the launch's limit. ``validate`` raises
    ValueError naming the field (``sft_checkpoint.<field>``)."""

    base_size: str = "m"
    """cpt_base_models size the student starts from (ops.mixture.probe.SIZES). Measured on 2 cores:
    size m (150k non-embedding parameters) reaches 21% programmatic accuracy after 300 steps in
    ~85 s; size l reaches 9-10% in 200-300 steps at 2x the time per step."""
    base_dir: str = ""
    """A model folder (config.json + model.safetensors) to start from instead; empty = the CPT base."""
    tokenizer_dir: str = ""
    """Folder with the student's tokenizer.json (and general_train.npy for general replay); empty =
    cpt_tokenizer. Set it with base_dir for a Hugging Face model."""
    modules: list[str] = field(default_factory=list)
    """mathematics_dataset modules of the programmatic slice; empty = ops.posttrain.data.TASK_MODULES."""
    train_per_module: int = 300
    """Generated training problems per (module, level)."""
    eval_per_module: int = 60
    """Generated evaluation problems per (module, level), evaluation-side templates only
    (ops.posttrain.data.template_side); half dev (regions), half test (report)."""
    train_seed: int = 101
    """Generator seed of the programmatic training problems (must differ from eval_seed)."""
    eval_seed: int = 202
    """Generator seed of the programmatic evaluation problems (a different draw from training's)."""
    heldout_fraction: float = 0.05
    """Share of sft_dataset rows held out of training and evaluated (slice curated_heldout)."""
    benchmark_items: int = 16
    """MATH-500 and GSM8K test items attempted per benchmark (slice benchmark:<name>)."""
    arithmetic_items: int = 64
    """OLMES basic-skills arithmetic items attempted, exact answer (slice benchmark:basic_arithmetic;
    ops.posttrain.sets.basic_arithmetic_items): the real benchmark nearest to the student's reach."""
    domain_ratio: float = -1.0
    """Share of SFT sequences per step, the rest general-corpus replay; < 0 = mixture_plan's
    trade-off r_d when mixture_plan exists, else 1.0 (no general data)."""
    timeout_s: float = 1200.0
    """Wall-clock limit of the launch."""

    def validate(self) -> "Stage1Inputs":
        """Returns self. Raises ValueError naming every bad field."""
        require("sft_checkpoint", self, [
            ("domain_ratio", self.domain_ratio <= 1, "<= 1 (< 0: read mixture_plan)"),
            ("heldout_fraction", 0.0 <= self.heldout_fraction < 1.0, "in [0, 1)"),
            *((k, getattr(self, k) >= 0, ">= 0") for k in ("train_per_module", "eval_per_module", "benchmark_items",
                                                           "arithmetic_items")),
            ("timeout_s", self.timeout_s > 0, "> 0")])
        return self

    def student_dir(self, base: Path) -> Path:
        """The folder the student starts from: ``base_dir``, else ``<lake>/cpt_base_models/<base_size>``.
        Raises FileNotFoundError naming it when config.json or model.safetensors is missing."""
        d = Path(self.base_dir) if self.base_dir else Path(base) / "cpt_base_models" / self.base_size
        if not (d / "model.safetensors").exists() or not (d / "config.json").exists():
            raise FileNotFoundError(f"sft_checkpoint: no student model at {d} (config.json + model.safetensors); "
                                    f"materialize cpt_base_models partition {self.base_size!r} or set base_dir")
        return d

    def tokenizer_folder(self, base: Path) -> Path:
        """``tokenizer_dir``, else ``<lake>/cpt_tokenizer``. Raises FileNotFoundError without tokenizer.json."""
        d = Path(self.tokenizer_dir) if self.tokenizer_dir else Path(base) / "cpt_tokenizer"
        if not (d / "tokenizer.json").exists():
            raise FileNotFoundError(f"sft_checkpoint: no tokenizer at {d / 'tokenizer.json'}; materialize cpt_tokenizer "
                                    "first (or set tokenizer_dir)")
        return d

    def mixture_ratio(self, base: Path) -> tuple[float, str]:
        """(domain ratio, where it came from): the configured ratio when >= 0, else the trade-off
        ``r_d`` of ``<lake>/mixture_plan/plan.json``, else 1.0 (source ``default (no mixture_plan)``).
        Raises ValueError naming the field when the configured ratio is above 1."""
        if self.domain_ratio >= 0:
            self.validate()
            return self.domain_ratio, "config"
        plan = Path(base) / "mixture_plan" / "plan.json"
        if plan.exists():
            return float(json.loads(plan.read_text())["tradeoff"]["r_d"]), f"mixture_plan trade-off r_d ({plan})"
        return 1.0, "default (no mixture_plan)"


@dataclass
class Stage2Inputs:
    """What ``stage2_checkpoint`` adds to its ``Stage2Plan``. ``validate`` raises ValueError naming
    the field (``stage2_checkpoint.<field>``)."""

    replay_fraction: float = 0.3
    """Share of stage-2 rows replayed from the stage-1 training set (the same rows in both arms)."""
    seeds: int = 3
    """Training runs per arm (>= 1; 3 by default), each with its own data order (seed, seed + 1,
    ...), all in one launch; the comparison's intervals resample these seeds as well as the items
    (ops.posttrain.report.hierarchical_bootstrap), so training-order noise is not read as an effect."""
    timeout_s: float = 1200.0
    """Wall-clock limit of the launch (every run of both arms)."""

    def validate(self) -> "Stage2Inputs":
        """Returns self. Raises ValueError naming every bad field."""
        require("stage2_checkpoint", self, [("seeds", self.seeds >= 1, ">= 1"),
                                            ("replay_fraction", 0.0 <= self.replay_fraction < 1.0, "in [0, 1)"),
                                            ("timeout_s", self.timeout_s > 0, "> 0")])
        return self


def read_optional(lake, asset: str, pattern: str | None = None) -> pl.DataFrame | None:
    """An upstream table, or None when it was never materialized: the committed table (a Delta
    table, local or object store), or with ``pattern`` the dataset folder (object store: committed;
    local root: ``<lake>/<asset>/<pattern>`` concatenated). Raises ops.lake.LegacyTableError (a
    FileNotFoundError naming the file and the fix) for a table of the pre-Delta local layout."""
    from ops.lake import LegacyTableError

    if pattern and not lake.remote:
        files = sorted((lake.base / asset).glob(pattern))
        return pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed") if files else None
    try:
        return lake.read_dataset(asset) if pattern else lake.read(asset)
    except LegacyTableError:
        raise
    except FileNotFoundError:
        return None


def reusable_runs(plan, committed: dict[str, Path]) -> list[tuple[Path, str, bool]]:
    """(committed folder, the run's ``out_dir``, reusable) per run of ``plan`` (an ``SftPlan``):
    reusable when the folder's ``metrics.json`` carries the run's fingerprint and its model and
    predictions exist, so the worker can skip retraining it. ``committed``: run key -> lake folder."""
    def committed_fingerprint(path: Path) -> str | None:  # the record's fingerprint; None when missing or unreadable
        try:
            return json.loads(path.read_text()).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            return None

    out = []
    for r in plan.runs:
        src = committed[r["key"]]
        needs = [src / "model.safetensors", src / "predictions.parquet"] + ([src / "predictions_init.parquet"] if r.get("eval_init") else [])
        ok = committed_fingerprint(src / "metrics.json") == plan.fingerprint(r) and all(p.exists() for p in needs)
        out.append((src, r["out_dir"], ok))
    return out


def read_predictions(path: Path, run_key: str) -> pl.DataFrame:
    """A run's staged predictions (columns item_id, prediction, ...). Raises ValueError naming the
    run and the file when it is unreadable or lacks ``item_id`` / ``prediction``."""
    try:
        df = pl.read_parquet(path)
    except (OSError, pl.exceptions.ComputeError) as e:
        raise ValueError(f"{run_key}: unreadable predictions {path}: {e}") from e
    missing = [c for c in ("item_id", "prediction") if c not in df.columns]
    if missing:
        raise ValueError(f"{run_key}: predictions {path} lack column(s) {missing}")
    return df


def stage2_runs(stage1_model: Path, train_paths: dict[str, str], eval_path: str, stage: Path, seeds: list[int]) -> list[dict]:
    """The stage-2 run list of a ``Stage2Plan``: one run ``stage2_<arm>_s<k>`` per arm and seed, from
    the stage-1 model and optimizer state, writing under ``stage/<arm>/s<k>``. ``train_paths``: arm ->
    training parquet."""
    return [{"key": f"stage2_{arm}_s{k}", "init_dir": str(stage1_model), "init_optimizer": str(stage1_model / "optimizer.pt"),
             "seed": sd, "train_path": train_paths[arm], "out_dir": str(stage / arm / f"s{k}"), "eval_path": eval_path}
            for arm in ARMS for k, sd in enumerate(seeds)]


@dataclass
class Stage2Scores:
    """Stage-2 results gathered from the worker's metrics and the scored predictions."""

    scored: dict[str, pl.DataFrame]
    """``stage2_<arm>`` -> per-item correctness averaged over seeds (ops.posttrain.evaluate.average_seeds)."""
    long: pl.DataFrame
    """One row per arm, seed and item (item_id, slice, split, module, difficulty, correct, checkpoint, seed)."""
    curves: dict[str, list]
    """``<arm> seed <seed>`` -> the training-loss curve."""
    walls: dict[str, float]
    """``<arm>_s<k>`` -> training wall-clock seconds."""
    per_seed: list[dict]
    """arm, seed, steps, final_loss, accuracy_programmatic_test per run."""


def stage2_scores(run_metrics: dict[str, dict], all_scored: dict[tuple[str, int], pl.DataFrame], seeds: list[int]) -> Stage2Scores:
    """Gather every stage-2 run: ``run_metrics`` (run key -> the worker's metrics), ``all_scored``
    ((arm, k) -> scored test items). Raises ValueError naming the run when it trained with another
    seed than planned."""
    from ops.posttrain.evaluate import average_seeds

    scored, curves, walls, per_seed, long = {}, {}, {}, [], []
    prog = (pl.col("slice") == "programmatic") & (pl.col("split") == "test")
    for arm in ARMS:
        frames = []
        for k, sd in enumerate(seeds):
            m = run_metrics[f"stage2_{arm}_s{k}"]
            if int(m["seed"]) != sd:
                raise ValueError(f"stage2_checkpoint: run stage2_{arm}_s{k} trained with seed {m['seed']}, planned {sd}")
            sc = all_scored[(arm, k)]
            frames.append(sc)
            long.append(sc.select("item_id", "slice", "split", "module", "difficulty", "correct")
                        .with_columns(checkpoint=pl.lit(f"stage2_{arm}"), seed=pl.lit(sd)))
            curves[f"{arm} seed {sd}"], walls[f"{arm}_s{k}"] = m["curve"], m["wall_s"]
            per_seed.append({"arm": arm, "seed": sd, "steps": m["steps"], "final_loss": round(float(m["final_loss"]), 4),
                             "accuracy_programmatic_test": round(float(sc.filter(prog)["correct"].mean()), 4)})
        scored[f"stage2_{arm}"] = average_seeds(frames)
    return Stage2Scores(scored, pl.concat(long), curves, walls, per_seed)


def slice_table(scored: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Accuracy per checkpoint and slice (programmatic test and dev, every other slice, every
    module) with bootstrap 95% intervals rounded to 3 places; slices with no items dropped.
    ``scored``: checkpoint -> scored items (slice, split, module, correct)."""
    from ops.posttrain.evaluate import accuracy_table

    slices = {"programmatic (test)": (pl.col("slice") == "programmatic") & (pl.col("split") == "test"),
              "programmatic (dev)": (pl.col("slice") == "programmatic") & (pl.col("split") == "dev")}
    any_df = next(iter(scored.values()))
    for s in sorted(set(any_df["slice"].to_list()) - {"programmatic"}):
        slices[s] = pl.col("slice") == s
    for m in sorted(set(any_df["module"].drop_nulls().to_list())):
        slices[f"module:{m}"] = pl.col("module") == m
    table = accuracy_table(scored, slices).filter(pl.col("n") > 0)  # stage 2 scores the test split only
    return table.with_columns(pl.col("accuracy", "ci_low", "ci_high").round(3))
