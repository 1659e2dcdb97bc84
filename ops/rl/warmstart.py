"""The SFT warm start of the scratchpad policy: the small GPT-2 that the RL runs start from.

GRPO learns only from groups whose rewards differ (docs/rollpacker.md, docs/rollarc.md), so the RL
runs need a policy whose pass rate on the RL prompt distribution sits well inside (0, 1). This
worker trains it from scratch on the scratchpad task ``ops.rl.scratchpad`` (remainder by repeated
subtraction; docs/rl_policy.md) by supervised fine-tuning on the correct responses and stops as
soon as a held-out sampled pass rate reaches ``target_pass_rate`` (default 0.4: the warm start is
deliberately stopped early, so RL has something left to learn).

Model: ``ops.lm.model.gpt2`` over the task's character-level tokenizer (``build_tokenizer``: one
token per character, ``<eos>`` = pad = id 0), n_embd 128, 4 layers, 4 heads, 320 positions (0.84 M parameters).
Data: each optimizer step draws ``batch_problems`` problems from ``sample_problem(rng, uid,
max_lines, alpha)`` of the ``train`` split only (``ops.rl.scratchpad``: no held-out or
generalisation prompt is ever trained on) with a flatter length law than the RL distribution (alpha 0.5 vs 1.2) so that
every chain length is seen; ``multi_turn_fraction`` of them in the multi-turn tool form
(``tool_prompt`` + ``tool_turns``: loss on the assistant turns and the final EOS, the checker's
observations masked), the rest single-turn (``a:N=``: loss on the response and EOS). The batch of
step ``s`` is a function of ``(seed, s)`` only, so a resumed run sees the batches an uninterrupted
run would. Loss: mean next-token cross-entropy over the loss tokens of the batch (nats/token).
Optimizer: AdamW along ``schedule`` (``ops.lm.schedule.LrSchedule``: lr 2e-3, weight decay 0, linear
warm-up then cosine decay to ``min_lr_ratio`` of the peak at ``max_steps``), gradient norm clipped to 1 (``ops.lm.train.Trainer``).

Stopping rule: every ``eval_every`` optimizer steps the pass rate of one sampled response per
problem (temperature ``eval_temperature``) on the held-out ``problems(eval_seed, eval_size,
split="heldout")`` (RL distribution, content-disjoint from training; ``heldout_accuracy``, its RNG forked so training is not perturbed); training stops at
the first evaluation at or above ``target_pass_rate``, else at ``max_steps``.

Launched by the ``rl_policy`` asset through the launch protocol (``python -m ops.rl.warmstart
--spec --out --fingerprint``; ``ops.launch.worker_main``). Output folder ``out_dir``: config.json +
model.safetensors (``ops.lm.model.save_model``), the tokenizer files (``tokenizer.save_pretrained``),
and ``metrics.json`` (written last: the commit point, with the fingerprint) holding the loss curve,
the evaluation curve, steps, seconds, parameters, the stop reason and the final held-out accuracy
(greedy and sampled, by line bucket) on ``problems(final_eval_seed, final_eval_size, split="heldout")``
and on the same number of ``generalisation`` problems (quotients never trained on;
``heldout_generalisation``). The folder
loads with ``ops.rl.policy.load_policy`` / ``load_tokenizer``. A finished folder with the same
fingerprint is reused. A killed launch resumes from its last checkpoint (every
``checkpoint_every`` steps, ``<out>/runs/warmstart/state``: model, optimizer, scheduler, step, RNG,
curves) and reaches the same result.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ops.launch import worker_main
from ops.lm.schedule import LrSchedule
from ops.lm.spec import JsonSpec, require

#: Bumped when the recipe's code changes what a spec trains (part of the fingerprint).
RECIPE_VERSION = 2
"""2: training rows from the scratchpad ``train`` split only, evaluations on ``heldout`` /
``generalisation`` (1 drew both from the whole problem space)."""
CRASH_ENV = "CRUCIBLE_WARMSTART_CRASH_AFTER_STEP"


@dataclass
class WarmStartSpec(JsonSpec):
    """The spec of one warm start (the ``rl_policy`` run config mirrors it). Steps are optimizer
    steps; lengths in tokens; pass rates in [0, 1]. ``validate`` raises ValueError naming the field
    (``warmstart.<field>``)."""

    out_dir: str
    """The policy folder written at the end (config.json, model.safetensors, tokenizer, metrics.json)."""
    n_embd: int = 128
    """GPT-2 hidden width (>= 1, a multiple of n_head)."""
    n_layer: int = 4
    """GPT-2 transformer layers (>= 1)."""
    n_head: int = 4
    """GPT-2 attention heads (>= 1)."""
    n_positions: int = 320
    """GPT-2 context length (tokens), >= 16 and >= the longest training row at max_lines (``longest_row``:
    266 tokens at max_lines 60)."""
    schedule: LrSchedule = field(default_factory=lambda: LrSchedule(lr=2e-3, warmup_steps=30, min_lr_ratio=0.1,
                                                                     weight_decay=0.0))
    """AdamW's rate over ``max_steps``: peak ``lr`` 2e-3 after 30 warm-up steps, cosine decay to
    lr * ``min_lr_ratio`` (0.1) at max_steps, no weight decay (``ops.lm.schedule.LrSchedule``)."""
    max_steps: int = 1000
    """Optimizer steps at most (training stops earlier at the target pass rate)."""
    batch_problems: int = 32
    """Problems (sequences) per optimizer step."""
    max_lines: int = 60
    """Longest chain (quotient) of a training problem (lines, >= 1)."""
    alpha: float = 0.5
    """Training length law p(q) ~ q^-alpha (the RL distribution has 1.2)."""
    multi_turn_fraction: float = 0.5
    """Share of training problems in the multi-turn tool form (the rest single-turn), in [0, 1]."""
    eval_every: int = 25
    """Optimizer steps between held-out evaluations (the stopping rule's cadence)."""
    eval_seed: int = 7
    """Seed of the stopping rule's held-out problems (``problems(eval_seed, eval_size, split="heldout")``: RL
    distribution, content-disjoint from the training rows)."""
    eval_size: int = 128
    """Held-out problems scored at each evaluation, one sampled response each (>= 1)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the stopping rule's evaluation (>= 0; 0 = greedy)."""
    target_pass_rate: float = 0.4
    """Stop at the first evaluation whose sampled pass rate reaches this (0.2-0.7 keeps GRPO groups mixed)."""
    final_eval_seed: int = 99
    """Seed of the final held-out problems (``problems(final_eval_seed, final_eval_size, split=...)`` of the
    ``heldout`` and ``generalisation`` splits)."""
    final_eval_size: int = 512
    """Final held-out problems, scored greedy and sampled at the end (>= 1)."""
    max_new_tokens: int = 256
    """Response budget of each held-out response, in every evaluation (tokens, >= 1)."""
    checkpoint_every: int = 100
    """Optimizer steps between resume checkpoints (model, optimizer, scheduler, RNG, curves), >= 1."""
    log_every: int = 10
    """Optimizer steps between logged points of the loss curve (window mean), >= 1."""
    seed: int = 0
    """Seed of the initial weights, of the training batches (one stream per step) and of evaluation sampling."""

    CADENCE = ("out_dir", "checkpoint_every", "log_every")

    def validate(self, processes: Optional[int] = None) -> "WarmStartSpec":
        """Check every field (and, with ``processes``, that the batch splits over the ranks).
        Returns the spec. Raises ValueError naming the field."""
        from ops.lm.train import check_global_batch

        require("warmstart", self, [
            ("out_dir", bool(self.out_dir), "a folder"),
            *((k, getattr(self, k) >= 1, ">= 1") for k in (
                "n_embd", "n_layer", "n_head", "max_steps", "batch_problems", "max_lines", "eval_every", "eval_size",
                "final_eval_size", "max_new_tokens", "checkpoint_every", "log_every")),
            ("n_embd", self.n_embd % max(1, self.n_head) == 0, "a multiple of n_head"),
            ("n_positions", self.n_positions >= 16, ">= 16"),
            ("alpha", self.alpha >= 0, ">= 0"),
            ("multi_turn_fraction", 0.0 <= self.multi_turn_fraction <= 1.0, "in [0, 1]"),
            ("eval_temperature", self.eval_temperature >= 0, ">= 0"),
            ("target_pass_rate", 0.0 < self.target_pass_rate <= 1.0, "in (0, 1]")])
        self.schedule.validate("warmstart.schedule")
        longest = longest_row(self.max_lines)
        require("warmstart", self, [("n_positions", self.n_positions >= longest,
                                     f">= {longest} (the longest training row at max_lines {self.max_lines})")])
        check_global_batch(self.batch_problems, processes)
        return self

    def fingerprint(self) -> str:
        """Hash of what determines the trained policy (every field but the output folder and the
        checkpoint and logging cadence) and of the recipe version. 16 hex digits."""
        d = {k: v for k, v in asdict(self).items() if k not in self.CADENCE}
        d.update(d.pop("schedule"))        # flat, as before the schedule was a part: same hash for the same recipe
        d["recipe_version"] = RECIPE_VERSION
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def longest_row(max_lines: int) -> int:
    """Tokens of the longest training row at ``max_lines`` (prompt + response + EOS, single-turn or
    multi-turn with its observations): every divisor 2..9 at quotient ``max_lines``, remainder a - 1."""
    from ops.rl import scratchpad as sp

    out = 0
    for a in range(2, 10):
        p = sp.Problem("x", a, max_lines * a + a - 1)
        single = len(p.prompt) + len(sp.solution(a, p.n)) + 1
        multi = len(sp.tool_prompt(p)) + sum(len(t) + (len(o) if o is not None else 1) for t, o in sp.tool_turns(a, p.n))
        out = max(out, single, multi)
    return out


class ProblemBatches:
    """The training batches of a warm start (the ``batches`` of ``ops.lm.train.Trainer``): step
    ``s`` draws ``batch_problems`` problems from ``random.Random(f"warmstart:{seed}:{s}")``, so a
    batch depends only on the seed and the step (``position``/``seek`` carry nothing).

    ``take(step)`` -> ids int64 (B, T), mask float32 (B, T), right-padded with ``<eos>`` (id 0) to
    the longest row; ``mask[t] = 1`` when token t carries loss (predicted from t - 1).
    """

    def __init__(self, tok, spec: WarmStartSpec):
        self.tok, self.spec = tok, spec
        self.eos = tok.eos_token_id

    def row(self, rng: random.Random, uid: str) -> tuple[list[int], list[int]]:
        """One training row (ids, loss mask) of a freshly drawn problem of the scratchpad ``train`` split,
        single-turn or multi-turn."""
        from ops.rl import scratchpad as sp

        p = sp.sample_problem(rng, uid, self.spec.max_lines, self.spec.alpha, split="train")
        if rng.random() >= self.spec.multi_turn_fraction:
            prompt, resp = sp.encode(self.tok, p.prompt), sp.encode(self.tok, sp.solution(p.a, p.n)) + [self.eos]
            return prompt + resp, [0] * len(prompt) + [1] * len(resp)
        ids = sp.encode(self.tok, sp.tool_prompt(p))
        mask = [0] * len(ids)
        for text, obs in sp.tool_turns(p.a, p.n):
            turn = sp.encode(self.tok, text) + ([self.eos] if obs is None else [])
            ids, mask = ids + turn, mask + [1] * len(turn)
            if obs is not None:
                o = sp.encode(self.tok, obs)
                ids, mask = ids + o, mask + [0] * len(o)
        return ids, mask

    def take(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        rng = random.Random(f"warmstart:{self.spec.seed}:{step}")
        rows = [self.row(rng, f"warm-{step}-{i}") for i in range(self.spec.batch_problems)]
        width = max(len(r[0]) for r in rows)
        if width > self.spec.n_positions:
            raise ValueError(f"warmstart.n_positions {self.spec.n_positions} < a training row of {width} tokens")
        ids = np.full((len(rows), width), self.eos, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        for i, (x, m) in enumerate(rows):
            ids[i, :len(x)], mask[i, :len(m)] = x, m
        return ids, mask

    def position(self) -> dict:
        return {}

    def seek(self, position: dict) -> None:
        pass


def masked_token_mean_loss(model, ids, mask):
    """Mean next-token cross-entropy (nats/token) over the loss tokens of the whole batch
    (transformers' causal-LM loss with ``labels = ids`` where ``mask`` is 1, else -100)."""
    import torch

    labels = torch.where(mask > 0, ids, torch.full_like(ids, -100))
    return model(input_ids=ids, labels=labels).loss


def _on_cpu(model):
    """``model`` itself on CPU, else a CPU copy: ``scratchpad.heldout_accuracy`` builds its inputs on
    the CPU (the warm-start policy is 0.84 M parameters, so a copy per evaluation is cheap)."""
    import copy

    p = next(model.parameters())
    return model if p.device.type == "cpu" else copy.deepcopy(model).cpu()


def length_stats(lengths: list[int]) -> dict:
    """``{"n", "median", "p90", "max", "max_over_median"}`` of response lengths (tokens)."""
    a = np.asarray(lengths, dtype=float)
    med = float(np.median(a))
    return {"n": int(a.size), "median": med, "p90": float(np.percentile(a, 90)), "max": float(a.max()),
            "max_over_median": round(float(a.max()) / med, 2) if med else None}


def train(spec: WarmStartSpec, out: Path, pipes, dp=None) -> dict:
    """The warm start of ``spec`` (see the module docstring): trains (or reuses a published folder
    of the same fingerprint), writes the policy folder on rank 0 and returns its metrics record."""
    import torch

    from ops.lake import write_json_atomic
    from ops.lm.checkpoint import LMState, published, run_folder
    from ops.lm.model import gpt2, param_counts, quiet_transformers, save_model
    from ops.lm.train import DataParallel, Trainer, crash_if_asked
    from ops.rl import scratchpad as sp

    quiet_transformers()
    log, t0 = pipes.log.info, time.monotonic()
    folder, fp = Path(spec.out_dir), spec.fingerprint()
    if (info := published(folder / "metrics.json", fp, log, "warmstart",
                          needs=(folder / "model.safetensors", folder / "tokenizer.json"))) is not None:
        pipes.report_custom_message({"reused": True})
        return info
    dp = dp or DataParallel.start(spec.batch_problems)
    if dp.rank == 0:
        (folder / "metrics.json").unlink(missing_ok=True)     # a stale record must not pass for this run's
    tok = sp.build_tokenizer()
    model = gpt2(len(tok), spec.n_positions, tok.eos_token_id,
                 {"n_embd": spec.n_embd, "n_layer": spec.n_layer, "n_head": spec.n_head}, seed=spec.seed)
    opt = spec.schedule.optimizer(model)
    sched = spec.schedule.scheduler(opt, spec.max_steps)
    trainer = Trainer(dp, model, opt, sched, ProblemBatches(tok, spec), masked_token_mean_loss,
                      state=LMState(run_folder(out, "warmstart"), fp),
                      history={"loss_curve": [], "window": [], "eval_curve": [], "train_s": 0.0, "eval_s": 0.0},
                      name="warmstart", log=log)
    held = sp.problems(spec.eval_seed, spec.eval_size, split="heldout")
    h = trainer.history
    mark = [time.monotonic()]

    def on_step(done: int, loss: float) -> None:
        now = time.monotonic()
        h["train_s"] += now - mark[0]
        mark[0] = now
        point = trainer.log_loss(loss, spec.log_every, spec.max_steps, curve="loss_curve")
        if point is not None and dp.rank == 0:
            pipes.report_custom_message(point)
        if done % spec.checkpoint_every == 0 and done < spec.max_steps:
            trainer.save()
            crash_if_asked(CRASH_ENV, done, "steps", "warmstart", log, since=trainer.resumed_from or 0)
            mark[0] = time.monotonic()

    def evaluate() -> float:
        t = time.monotonic()
        r = trainer.evaluate(lambda m: sp.heldout_accuracy(_on_cpu(m), tok, held, spec.eval_temperature,
                                                           spec.max_new_tokens, seed=spec.seed))
        h["eval_s"] += time.monotonic() - t
        point = {"step": trainer.step, "train_s": round(h["train_s"], 2), "accuracy": r["accuracy"], "n": r["n"],
                 "mean_len": round(r["mean_len"], 2)}
        h["eval_curve"].append(point)
        log(f"warmstart: step {trainer.step} loss {h['loss_curve'][-1]['loss'] if h['loss_curve'] else float('nan'):.4f} "
            f"held-out pass rate {r['accuracy']:.3f} (T={spec.eval_temperature}, n={r['n']})")
        if dp.rank == 0:
            pipes.report_custom_message({"eval": point})
        mark[0] = time.monotonic()
        return r["accuracy"]

    stop = "max_steps"
    while True:
        s = trainer.step
        if s > 0 and (s % spec.eval_every == 0 or s == spec.max_steps):
            done_at = h["eval_curve"][-1]["step"] if h["eval_curve"] else -1
            acc = h["eval_curve"][-1]["accuracy"] if done_at == s else evaluate()
            if acc >= spec.target_pass_rate:
                stop = "target_pass_rate"
                break
        if s >= spec.max_steps:
            break
        mark[0] = time.monotonic()
        trainer.train(min(spec.max_steps, (s // spec.eval_every + 1) * spec.eval_every), on_step)

    t_final = time.monotonic()
    final = {}
    rl_probs = sp.problems(spec.final_eval_seed, spec.final_eval_size, split="heldout")
    gen_probs = sp.problems(spec.final_eval_seed, spec.final_eval_size, split="generalisation")
    gen = {}
    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        final[name] = trainer.evaluate(lambda m: sp.heldout_accuracy(_on_cpu(m), tok, rl_probs, temp, spec.max_new_tokens,
                                                                     seed=spec.seed))
        gen[name] = trainer.evaluate(lambda m: sp.heldout_accuracy(_on_cpu(m), tok, gen_probs, temp, spec.max_new_tokens,
                                                                   seed=spec.seed))
    n_body, n_all = param_counts(trainer.unwrapped)
    info = {"fingerprint": fp, "recipe_version": RECIPE_VERSION, "spec": asdict(spec), "steps": trainer.step,
            "stop_reason": stop, "params": n_all, "non_embedding_params": n_body, "vocab_size": len(tok),
            "loss_curve": h["loss_curve"], "eval_curve": h["eval_curve"],
            "final_loss": h["loss_curve"][-1]["loss"] if h["loss_curve"] else None,
            "pass_rate": h["eval_curve"][-1]["accuracy"] if h["eval_curve"] else None,
            "heldout": {"seed": spec.final_eval_seed, "n": spec.final_eval_size, "split": "heldout", **final},
            "heldout_generalisation": {"seed": spec.final_eval_seed, "n": spec.final_eval_size, "split": "generalisation",
                                       **gen},
            "rl_response_lengths": length_stats([sp.response_length(p) for p in rl_probs]),
            "train_s": round(h["train_s"], 2), "eval_s": round(h["eval_s"] + time.monotonic() - t_final, 2),
            "wall_s": round(time.monotonic() - t0, 2), "resumes": trainer.state.resumes if trainer.state else [],
            "threads": torch.get_num_threads(), **dp.describe()}
    if dp.rank == 0:
        save_model(trainer.unwrapped, folder)
        tok.save_pretrained(str(folder))
        write_json_atomic(info, folder / "metrics.json", indent=1)
        log(f"warmstart: {trainer.step} steps ({stop}), pass rate {info['pass_rate']}, held-out greedy "
            f"{final['greedy']['accuracy']:.3f} sampled {final['sampled']['accuracy']:.3f}, {info['wall_s']} s")
    trainer.finish()
    return info


def run(spec: WarmStartSpec, out: Path, fingerprint: str, pipes) -> Optional[dict]:
    """The worker's ``run`` (``ops.launch.worker_main``): the warm start's metrics record on rank 0."""
    from ops.lm.train import DataParallel

    dp = DataParallel.start(spec.batch_problems)
    info = train(spec, out, pipes, dp)
    return info if dp.rank == 0 else None


def main(argv: Optional[list[str]] = None) -> int:
    return worker_main(WarmStartSpec.from_json, run, argv, description=__doc__)


if __name__ == "__main__":
    from ops.launch import exit_worker

    exit_worker(main())
