"""SFT worker: loss-masked, packed supervised fine-tuning of a causal LM, then greedy evaluation.

Logics-STEM (arXiv 2601.01562) §3: stage-1 SFT on the broad set, and stage-2 SFT on targeted data
plus replay (docs/posttrain.md, "Stage-1 SFT" and "Stage 2 and the comparison"). Launched by the
``sft_checkpoint`` / ``stage2_checkpoint`` assets through the launch protocol (``python -m
ops.posttrain.sft --spec --out --fingerprint`` under ``accelerate launch -m``: data parallel over
the ranks, gloo on CPU, NCCL on GPU); the spec is an ``SftPlan``. Only rank 0 opens the Pipes
channel and streams the training loss every ``log_every`` steps as custom messages. The training
loop, checkpoints, data streams and generation are the LM substrate's (``ops.lm``).

One launch trains its ``runs`` one after another (stage 2 trains the targeted runs and the random
controls in one process group). Per run, under its ``out_dir``: ``model.safetensors`` +
``config.json`` + ``optimizer.pt`` (the final state), ``metrics.json`` (loss curve, counts, world
size) and ``predictions.parquet`` (one row per evaluation item: ``item_id``, ``prediction`` text,
``response_loss`` in nats/token of the gold response; greedy answers from
``ops.posttrain.decode.greedy_cached``); ``predictions_init.parquet`` for the
initial model when ``eval_init``. A killed run resumes from its last checkpoint in the launch's run
folder (model, optimizer, scheduler, step, RNG, data position) and reaches the bit-identical
result; a finished run with the same fingerprint is reused.

Batches: each optimizer step takes ``global_batch`` sequences, of which
``round(step share of domain_ratio)`` are packed SFT rows and the rest general-corpus blocks
(general replay; ``domain_ratio`` = the D-CPT ``mixture_plan`` trade-off ratio when there is one,
1.0 = no general data). Every sequence weighs equally in the loss; within a sequence the loss is the
mean cross-entropy over its loss tokens (the response tokens of SFT rows, all tokens of general
blocks).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ops.launch import spec_fingerprint, worker_main
from ops.lm.schedule import LrSchedule
from ops.lm.spec import JsonSpec, require

RUN_KEYS = ("key", "init_dir", "train_path", "out_dir")


@dataclass
class SftPlan(JsonSpec):
    """The spec of one SFT launch, with the stage-1 defaults (the ``sft_checkpoint`` run config
    mirrors them). Lengths in tokens; ``global_batch`` in sequences per step over all ranks.
    ``validate`` raises ValueError naming the field."""

    data_dir: str
    """The ``cpt_tokenizer`` folder: tokenizer.json (+ general_train.npy when domain_ratio < 1)."""
    eval_path: str
    """Evaluation parquet: item_id, problem, response (the gold response, for the response loss)."""
    runs: list[dict] = field(default_factory=list)
    """Runs trained one after another: {"key", "init_dir" (config.json + model.safetensors), "init_optimizer"
    (optional optimizer.pt), "train_path" (parquet: problem, response), "out_dir", "eval_init" (bool),
    "seed" (optional: this run's data-order seed, default ``seed``), "eval_path" (optional: this run's
    evaluation items, default ``eval_path``)}; keys distinct."""
    global_batch: int = 16
    """Sequences per optimizer step, summed over ranks (>= 1, a multiple of the number of ranks)."""
    steps: int = 300
    """Optimizer steps per run (>= 1)."""
    schedule: LrSchedule = field(default_factory=lambda: LrSchedule(lr=4e-3, warmup_steps=20, min_lr_ratio=0.1,
                                                                     weight_decay=0.01))
    """AdamW's rate over each run's ``steps``: peak ``lr`` 4e-3 after 20 warm-up steps, cosine decay to
    lr * ``min_lr_ratio`` (0.1) at the last step, weight decay 0.01 (``ops.lm.schedule.LrSchedule``)."""
    domain_ratio: float = 1.0
    """Share of SFT sequences per step (in [0, 1]), the rest general replay; the D-CPT ``mixture_plan``
    trade-off ratio when there is one, 1.0 = no general data."""
    checkpoint_every: int = 50
    """Steps between resumable checkpoints (>= 1)."""
    log_every: int = 10
    """Steps between logged training-loss points (window means), streamed as Pipes messages (>= 1)."""
    max_new_tokens: int = 16
    """Greedy-decoding budget per evaluation item (tokens, >= 1)."""
    eval_batch: int = 64
    """Evaluation items per generation batch on each rank (>= 1)."""
    seed: int = 0
    """Default data-order seed of the runs (a run's own ``seed`` overrides it)."""
    eot_token: str = "<|endoftext|>"
    """The token that ends every response and pads (non-empty, in the tokenizer; production: a Hugging Face
    model's EOS token)."""

    HYPER = ("global_batch", "steps", "domain_ratio", "max_new_tokens", "seed", "eot_token")
    """Hashed by ``fingerprint`` with the schedule's four fields (flat, as before the schedule was a part)."""

    def validate(self, processes: Optional[int] = None) -> "SftPlan":
        """Check every field (and, with ``processes``, that the global batch splits over the ranks).
        Returns the plan. Raises ValueError naming the field or the run."""
        from ops.lm.train import check_global_batch

        require("sft", self, [
            *((k, getattr(self, k) >= 1, ">= 1") for k in ("steps", "checkpoint_every", "log_every", "max_new_tokens",
                                                           "eval_batch")),
            ("domain_ratio", 0.0 <= self.domain_ratio <= 1.0, "in [0, 1]"),
            ("eot_token", bool(self.eot_token), "a token")])
        self.schedule.validate("sft.schedule")
        check_global_batch(self.global_batch, processes)
        keys = [r.get("key") for r in self.runs]
        for r in self.runs:
            missing = [k for k in RUN_KEYS if not r.get(k)]
            if missing:
                raise ValueError(f"sft run {r.get('key')!r} lacks {missing}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"sft runs have repeated keys: {keys}")
        return self

    def fingerprint(self, run: dict) -> str:
        """Hash of what determines a run's result: its data, initial weights, evaluation items and
        the hyper-parameters (checkpoint cadence and logging excluded)."""
        def h(p):
            if not p or not Path(p).exists():
                return None
            return hashlib.sha256(Path(p).read_bytes()).hexdigest()

        init = Path(run["init_dir"])
        parts = [h(run["train_path"]), h(init / "model.safetensors"), h(init / "config.json"), h(run.get("init_optimizer")),
                 h(run.get("eval_path") or self.eval_path), h(Path(self.data_dir) / "tokenizer.json"), bool(run.get("eval_init")),
                 run.get("seed"),
                 {**{k: getattr(self, k) for k in self.HYPER}, **asdict(self.schedule)}]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    def launch_fingerprint(self) -> str:
        """The launch's fingerprint: ``ops.launch.spec_fingerprint`` of the plan and of every run's
        content fingerprint (a rewritten but identical training table is the same launch)."""
        return spec_fingerprint({**asdict(self), "run_fingerprints": [self.fingerprint(r) for r in self.runs]},
                                str(Path(self.data_dir) / "tokenizer.json"))


@dataclass
class Stage2Plan(SftPlan):
    """An ``SftPlan`` with the stage-2 defaults (the ``stage2_checkpoint`` run config mirrors them):
    the peak learning rate sits about where stage 1's cosine ended, so stage 2 continues without a
    re-warming shock; 60 steps (about 3 epochs of the 600 new items plus replay) so that three seeds
    per arm fit the main job's budget (docs/posttrain.md, "Defaults")."""

    steps: int = 60
    """Optimizer steps per run (>= 1): about 3 epochs of the 600 new items plus replay."""
    schedule: LrSchedule = field(default_factory=lambda: LrSchedule(lr=6e-4, warmup_steps=5, min_lr_ratio=0.1,
                                                                     weight_decay=0.01))
    """Peak stage-2 rate 6e-4: about where stage 1's cosine ended (4e-4), so stage 2 continues without a
    re-warming shock (measured: 1.5e-3 and 3e-3 lowered overall accuracy below stage 1's); 5 warm-up
    steps; cosine to 0.1 x and weight decay 0.01 as stage 1."""


class _Sft:
    """What every run of one launch shares: the plan, the ranks, the tokenizer and the evaluation
    sets (the plan's, and any run's own ``eval_path``, each tokenised once)."""

    def __init__(self, plan: SftPlan, dp, pipes):
        import polars as pl
        from tokenizers import Tokenizer

        self.plan, self.dp, self.pipes, self.log = plan, dp, pipes, pipes.log.info
        tok_path = Path(plan.data_dir) / "tokenizer.json"
        if not tok_path.exists():
            raise FileNotFoundError(f"no tokenizer at {tok_path}: materialize cpt_tokenizer first")
        self.tok = Tokenizer.from_file(str(tok_path))
        self.eot = self.tok.token_to_id(plan.eot_token)
        if self.eot is None:
            raise ValueError(f"{tok_path}: the tokenizer has no token {plan.eot_token!r} (SftPlan.eot_token)")
        self.general = Path(plan.data_dir) / "general_train.npy"
        if plan.domain_ratio < 1.0 and not self.general.exists():
            raise FileNotFoundError(f"domain_ratio {plan.domain_ratio} < 1 needs the general replay stream "
                                    f"{self.general} (cpt_tokenizer)")
        self._pl, self._evals = pl, {}

    def eval_set(self, path: str) -> tuple[list, list, list]:
        """(prompt ids, gold response ids + EOT, item ids) of the evaluation table at ``path``."""
        from ops.posttrain.data import PROMPT

        if path not in self._evals:
            ev = _read_table(path, ("item_id", "problem", "response"), "evaluation")
            prompts = [e.ids for e in self.tok.encode_batch([PROMPT.format(problem=p) for p in ev["problem"].to_list()])]
            golds = [e.ids + [self.eot] for e in self.tok.encode_batch([" " + r for r in ev["response"].to_list()])]
            self._evals[path] = (prompts, golds, ev["item_id"].to_list())
        return self._evals[path]

    def evaluate(self, model, path: Optional[str] = None):
        """Greedy predictions and gold-response losses for this rank's share of the evaluation items
        at ``path`` (default the plan's), gathered on every rank: a frame (item_id, prediction,
        response_loss) in evaluation-set order."""
        from ops.lm.evaluate import response_losses

        from .decode import greedy_cached

        all_prompts, all_golds, item_ids = self.eval_set(path or self.plan.eval_path)
        n_pos, dp, b = model.config.n_positions, self.dp, self.plan.eval_batch
        mine = sorted(range(dp.rank, len(item_ids), dp.world), key=lambda i: (len(all_prompts[i]), i))  # less padding
        rows = []
        for s in range(0, len(mine), b):
            idx = mine[s:s + b]
            prompts, golds = [all_prompts[i] for i in idx], [all_golds[i] for i in idx]
            gen = greedy_cached(model, prompts, self.eot, self.plan.max_new_tokens, n_pos)
            losses = response_losses(model, prompts, golds, self.eot, n_pos)
            rows += [(i, self.tok.decode(g).strip(), float(lo)) for i, g, lo in zip(idx, gen, losses)]
        rows = sorted(dp.gather(rows))
        return self._pl.DataFrame({"item_id": [item_ids[i] for i, _, _ in rows], "prediction": [p for _, p, _ in rows],
                                   "response_loss": [lo for _, _, lo in rows]})

    def batches(self, run: dict, seq_len: int, seed: int):
        """Packed SFT rows (first in each batch) and general-corpus blocks at ``domain_ratio``, and
        the packed stream (its counts go into metrics.json)."""
        from ops.lm.data import BlockStream, MixedBatches, PackedStream
        from ops.posttrain.data import encode_example

        train = _read_table(run["train_path"], ("problem", "response"), "training")
        examples = [encode_example(self.tok, p, r, self.eot) for p, r in zip(train["problem"].to_list(), train["response"].to_list())]
        sft = PackedStream(examples, seq_len, self.eot, seed, name=run["train_path"])
        general = None
        if self.plan.domain_ratio < 1.0:
            general = BlockStream(np.load(self.general, mmap_mode="r"), seq_len, seed + 7, "general_train")
        return MixedBatches(sft, general, self.plan.global_batch, self.plan.domain_ratio, name=f"sft {run['key']}"), sft, train.height

    def train(self, run: dict, out: Path) -> dict:
        """Train one run (or reuse its published result) and publish model, predictions and metrics."""
        from ops.lake import write_json_atomic, write_parquet_atomic
        from ops.lm.checkpoint import LMState, published, run_folder
        from ops.lm.model import load_model, save_model
        from ops.lm.train import Trainer, crash_if_asked, evaluating, sequence_mean_loss

        plan, dp, key, t0 = self.plan, self.dp, run["key"], time.monotonic()
        folder = Path(run["out_dir"])
        dp.record(folder)
        fp = plan.fingerprint(run)
        if (info := published(folder / "metrics.json", fp, self.log, f"sft {key}", needs=(folder / "predictions.parquet",))) is not None:
            self.pipes.report_custom_message({"run": key, "reused": True})
            return info
        init = Path(run["init_dir"])
        if not (init / "model.safetensors").exists():
            raise FileNotFoundError(f"run {key}: no initial model at {init / 'model.safetensors'}")
        model = load_model(init)
        seq_len, run_seed = model.config.n_positions, int(run.get("seed", plan.seed))
        batches, packed, train_rows = self.batches(run, seq_len, run_seed)
        eval_path = run.get("eval_path") or plan.eval_path
        if run.get("eval_init"):
            with evaluating(model):
                init_pred = self.evaluate(model, eval_path)
            if dp.rank == 0:
                write_parquet_atomic(init_pred, folder / "predictions_init.parquet")
        opt = plan.schedule.optimizer(model, init_state=run.get("init_optimizer"))
        sched = plan.schedule.scheduler(opt, plan.steps)
        trainer = Trainer(dp, model, opt, sched, batches, sequence_mean_loss, state=LMState(run_folder(out, key), fp),
                          history={"curve": [], "window": []}, name=f"sft {key}", log=self.log)

        def on_step(done: int, loss: float) -> None:
            point = trainer.log_loss(loss, plan.log_every, plan.steps)
            if point is not None and dp.rank == 0:
                self.pipes.report_custom_message({"run": key, **point})
            if done % plan.checkpoint_every == 0 and done < plan.steps:
                trainer.save()
                crash_if_asked("CRUCIBLE_SFT_CRASH_AFTER_STEP", done, "steps", f"sft {key}", self.log,
                               since=trainer.resumed_from or 0)

        trainer.train(plan.steps, on_step)
        pred = trainer.evaluate(lambda m: self.evaluate(m, eval_path))
        curve = trainer.history["curve"]
        info = {"fingerprint": fp, "key": key, "steps": plan.steps, "global_batch": plan.global_batch,
                "seq_len": seq_len, "tokens": plan.steps * plan.global_batch * seq_len,
                "domain_ratio": plan.domain_ratio, "seed": run_seed, "train_rows": train_rows, "pack": packed.counts,
                "curve": curve, "final_loss": curve[-1]["loss"] if curve else None, **dp.describe(),
                "n_params": sum(p.numel() for p in trainer.unwrapped.parameters()),
                "wall_s": round(time.monotonic() - t0, 2)}
        if dp.rank == 0:
            save_model(trainer.unwrapped, folder, trainer.optimizer)
            write_parquet_atomic(pred, folder / "predictions.parquet")
            write_json_atomic(info, folder / "metrics.json", indent=1)
            self.log(f"sft {key}: {plan.steps} steps, final loss {info['final_loss']:.4f}, {info['wall_s']} s")
        trainer.finish()
        return info


def _read_table(path: str, columns: tuple[str, ...], what: str):
    """A Parquet table with ``columns``; ValueError naming the file and the missing column."""
    import polars as pl

    df = pl.read_parquet(path)
    for col in columns:
        if col not in df.columns:
            raise ValueError(f"{path}: {what} table lacks column {col!r}")
    return df


def deterministic_torch() -> None:
    """Deterministic kernels for the whole launch (``torch.use_deterministic_algorithms``; on CUDA
    the cuBLAS workspace setting it needs, set before the first cuBLAS call; warn-only, so an op
    without a deterministic kernel warns instead of failing). With the seeded data order and the
    fixed threads per rank (``ComputeResource.threads_per_process``) a run repeats bit for bit, so
    the comparison's verdict cannot move between two runs of the same inputs."""
    import os

    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def run(plan: SftPlan, out: Path, fingerprint: str, pipes) -> Optional[dict]:
    """Train (or reuse) every run of the plan in order; the result (rank 0) is ``{"world_size",
    "distributed_type", "runs": {key: metrics.json record}}``."""
    from ops.lm.model import quiet_transformers
    from ops.lm.train import DataParallel

    quiet_transformers()
    deterministic_torch()
    dp = DataParallel.start(plan.global_batch)
    sft = _Sft(plan, dp, pipes)
    pipes.log.info(f"sft: world_size={dp.world} distributed_type={dp.acc.distributed_type} local_batch={dp.local_batch} "
                   f"runs={[r['key'] for r in plan.runs]} eval_paths={sorted({r.get('eval_path') or plan.eval_path for r in plan.runs})}")
    results = {r["key"]: sft.train(r, out) for r in plan.runs}
    return {**dp.describe(), "runs": results} if dp.rank == 0 else None


def main(argv: Optional[list[str]] = None) -> int:
    return worker_main(SftPlan.from_json, run, argv, description=__doc__)


if __name__ == "__main__":
    from ops.launch import exit_worker

    exit_worker(main())
