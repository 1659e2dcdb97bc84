"""SFT worker: loss-masked, packed supervised fine-tuning of a causal LM, then greedy evaluation.

Logics-STEM (arXiv 2601.01562) §3: stage-1 SFT on the broad set, and stage-2 SFT on targeted data
plus replay. Launched by the ``sft_checkpoint`` / ``stage2_checkpoint`` assets through Dagster
Pipes with ``accelerate launch`` (data parallel over the ranks; gloo on CPU, NCCL on GPU — same
script); only rank 0 opens the Pipes channel and streams the training loss every
``log_every`` steps as custom messages.

Usage: ``accelerate launch ... ops/posttrain/sft.py <plan.json>`` (fields: ``SftPlan``). One launch
trains its ``runs`` one after another (stage 2 trains the targeted run and the random control in one
process group). Per run, under ``out_dir``: ``model.safetensors`` + ``config.json`` +
``optimizer.pt`` (the final state), ``metrics.json`` (loss curve, counts, world size) and
``predictions.parquet`` (one row per evaluation item: ``item_id``, ``prediction`` text,
``response_loss`` in nats/token of the gold response); ``predictions_init.parquet`` for the
initial model when ``eval_init``. A killed run resumes from its last ``checkpoint.pt`` (model,
optimizer, scheduler, step; the data order is a function of the step) and reaches the bit-identical
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
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class SimulatedCrash(RuntimeError):
    """Raised after a checkpoint when ``CRUCIBLE_SFT_CRASH_AFTER_STEP`` asks for it (fault tests)."""


@dataclass
class SftPlan:
    """Everything one launch needs. Lengths in tokens; ``global_batch`` in sequences per step."""

    data_dir: str                      # tokenizer.json (+ general_train.npy when domain_ratio < 1): cpt_tokenizer
    eval_path: str                     # parquet: item_id, problem, response (gold, for the response loss)
    runs: list[dict] = field(default_factory=list)
    # run: {"key", "init_dir" (config.json + model.safetensors), "init_optimizer" (optional optimizer.pt),
    #       "train_path" (parquet: problem, response), "out_dir", "eval_init" (bool),
    #       "seed" (optional: this run's data-order seed, default ``seed``)}
    global_batch: int = 16
    steps: int = 300
    lr: float = 2e-3
    min_lr_ratio: float = 0.1          # cosine decay to lr * min_lr_ratio
    warmup_steps: int = 20
    weight_decay: float = 0.01
    domain_ratio: float = 1.0          # share of SFT sequences per step; the rest general replay
    checkpoint_every: int = 100
    log_every: int = 10
    max_new_tokens: int = 16
    eval_batch: int = 64
    seed: int = 0
    eot_token: str = "<|endoftext|>"   # ends every response; padding id (production: the model's EOS token)

    HYPER = ("global_batch", "steps", "lr", "min_lr_ratio", "warmup_steps", "weight_decay", "domain_ratio",
             "max_new_tokens", "seed", "eot_token")

    def fingerprint(self, run: dict) -> str:
        """Hash of what determines a run's result: its data, initial weights, evaluation items and
        the hyper-parameters (checkpoint cadence and logging excluded)."""
        def h(p):
            if not p or not Path(p).exists():
                return None
            return hashlib.sha256(Path(p).read_bytes()).hexdigest()

        init = Path(run["init_dir"])
        parts = [h(run["train_path"]), h(init / "model.safetensors"), h(init / "config.json"), h(run.get("init_optimizer")),
                 h(self.eval_path), h(Path(self.data_dir) / "tokenizer.json"), bool(run.get("eval_init")), run.get("seed"),
                 {k: getattr(self, k) for k in self.HYPER}]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def lr_lambda(plan: SftPlan):
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` at ``steps``."""
    def f(s: int) -> float:
        if s < plan.warmup_steps:
            return (s + 1) / plan.warmup_steps
        t = (s - plan.warmup_steps) / max(1, plan.steps - plan.warmup_steps)
        return plan.min_lr_ratio + (1 - plan.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return f


def _atomic_json(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def sequence_loss(logits, ids, mask):
    """Mean over sequences of the per-sequence mean cross-entropy on loss tokens (nats).

    logits (B, T, V), ids (B, T) int64, mask (B, T) float: mask[t] = 1 when token t carries loss
    (predicted from position t - 1). Sequences without a loss token count zero.
    """
    import torch.nn.functional as F

    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none")
    ce = ce.view(ids.size(0), -1)
    m = mask[:, 1:]
    per_seq = (ce * m).sum(1) / m.sum(1).clamp(min=1.0)
    return per_seq.mean()


def greedy_decode(model, prompts: list[list[int]], eot_id: int, max_new_tokens: int, n_positions: int):
    """Greedy continuation of left-padded prompts (no sampling, so the result is deterministic).

    Prompts longer than ``n_positions - max_new_tokens`` keep their last tokens. Returns one list
    of generated ids per prompt, ending before the first end-of-text token.
    """
    import torch

    keep = n_positions - max_new_tokens
    prompts = [p[-keep:] for p in prompts]
    B, L = len(prompts), max(len(p) for p in prompts)
    x = torch.full((B, L), eot_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        x[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
        attn[i, L - len(p):] = 1
    done = torch.zeros(B, dtype=torch.bool)
    out = [[] for _ in range(B)]
    for _ in range(max_new_tokens):
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        nxt = model(input_ids=x, attention_mask=attn, position_ids=pos).logits[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eot_id), nxt)
        for i in range(B):
            if not done[i] and nxt[i].item() != eot_id:
                out[i].append(int(nxt[i]))
        done |= nxt == eot_id
        if bool(done.all()):
            break
        x = torch.cat([x, nxt[:, None]], 1)
        attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], 1)
    return out


def response_losses(model, prompts: list[list[int]], golds: list[list[int]], eot_id: int, n_positions: int) -> list[float]:
    """Teacher-forced mean cross-entropy (nats/token) of each gold response given its prompt."""
    import torch
    import torch.nn.functional as F

    seqs, masks = [], []
    for p, g in zip(prompts, golds):
        s = (p + g)[-n_positions:]
        m = ([0] * len(p) + [1] * len(g))[-n_positions:]
        seqs.append(s)
        masks.append(m)
    T = max(len(s) for s in seqs)
    x = torch.full((len(seqs), T), eot_id, dtype=torch.long)
    mk = torch.zeros((len(seqs), T))
    for i, (s, m) in enumerate(zip(seqs, masks)):
        x[i, :len(s)] = torch.tensor(s)
        mk[i, :len(m)] = torch.tensor(m, dtype=torch.float)
    logits = model(input_ids=x).logits[:, :-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none").view(len(seqs), -1)
    m = mk[:, 1:]
    return ((ce * m).sum(1) / m.sum(1).clamp(min=1)).tolist()


def main(plan_path: str) -> int:  # noqa: C901 - one linear training program
    import polars as pl
    import torch
    from safetensors.torch import load_model, save_model
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from ops.launch import data_parallel, rank0_pipes
    from ops.mixture.probe import BlockStream, domain_counts
    from ops.posttrain.data import PROMPT, PackedStream, encode_example

    hf_logging.set_verbosity_error()
    plan = SftPlan(**json.loads(Path(plan_path).read_text()))
    if not 0.0 <= plan.domain_ratio <= 1.0:
        raise ValueError(f"domain_ratio {plan.domain_ratio} outside [0, 1]")
    acc, world, rank, local = data_parallel(plan.global_batch)
    tok_path = Path(plan.data_dir) / "tokenizer.json"
    if not tok_path.exists():
        raise FileNotFoundError(f"no tokenizer at {tok_path}: materialize cpt_tokenizer first")
    tok = Tokenizer.from_file(str(tok_path))
    eot = tok.token_to_id(plan.eot_token)
    if eot is None:
        raise ValueError(f"{tok_path}: the tokenizer has no token {plan.eot_token!r} (SftPlan.eot_token)")
    if plan.domain_ratio < 1.0 and not (Path(plan.data_dir) / "general_train.npy").exists():
        raise FileNotFoundError(f"domain_ratio {plan.domain_ratio} < 1 needs the general replay stream "
                                f"{Path(plan.data_dir) / 'general_train.npy'} (cpt_tokenizer)")
    ev = pl.read_parquet(plan.eval_path)
    for col in ("item_id", "problem", "response"):
        if col not in ev.columns:
            raise ValueError(f"{plan.eval_path}: evaluation table lacks column {col!r}")
    ev_prompts = [e.ids for e in tok.encode_batch([PROMPT.format(problem=p) for p in ev["problem"].to_list()])]
    ev_golds = [e.ids + [eot] for e in tok.encode_batch([" " + r for r in ev["response"].to_list()])]
    ev_ids = ev["item_id"].to_list()
    crash_after = int(os.environ.get("CRUCIBLE_SFT_CRASH_AFTER_STEP", "0") or 0)

    def build(init_dir: Path):
        cfg = AutoConfig.from_pretrained(str(init_dir))
        model = AutoModelForCausalLM.from_config(cfg)
        load_model(model, str(init_dir / "model.safetensors"))
        return model

    @torch.no_grad()
    def evaluate(model) -> pl.DataFrame:
        """Greedy predictions and gold-response losses for this rank's share, gathered on rank 0."""
        m = acc.unwrap_model(model)
        m.eval()
        n_pos = m.config.n_positions
        mine = list(range(rank, len(ev_ids), world))
        mine.sort(key=lambda i: (len(ev_prompts[i]), i))  # similar lengths per batch: less padding
        rows = []
        for b in range(0, len(mine), plan.eval_batch):
            idx = mine[b:b + plan.eval_batch]
            gen = greedy_decode(m, [ev_prompts[i] for i in idx], eot, plan.max_new_tokens, n_pos)
            losses = response_losses(m, [ev_prompts[i] for i in idx], [ev_golds[i] for i in idx], eot, n_pos)
            for i, g, lo in zip(idx, gen, losses):
                rows.append((i, tok.decode(g).strip(), float(lo)))
        if world > 1:
            parts = [None] * world
            torch.distributed.all_gather_object(parts, rows)
            rows = [r for p in parts for r in p]
        rows.sort()
        m.train()
        return pl.DataFrame({"item_id": [ev_ids[i] for i, _, _ in rows], "prediction": [p for _, p, _ in rows],
                             "response_loss": [lo for _, _, lo in rows]})

    def write_parquet(df, path: Path):
        tmp = path.with_name(path.name + ".tmp")
        df.write_parquet(tmp)
        os.replace(tmp, path)

    with rank0_pipes() as pipes:
        pipes.log.info(f"sft: world_size={world} distributed_type={acc.distributed_type} local_batch={local} "
                       f"runs={[r['key'] for r in plan.runs]} eval_items={len(ev_ids)}")
        for run in plan.runs:
            t0 = time.monotonic()
            out = Path(run["out_dir"])
            out.mkdir(parents=True, exist_ok=True)
            if rank == 0:
                _atomic_json({"world_size": world, "distributed_type": str(acc.distributed_type)}, out / "launch.json")
            fp = plan.fingerprint(run)
            metrics_path, ckpt_path = out / "metrics.json", out / "checkpoint.pt"
            if (metrics_path.exists() and json.loads(metrics_path.read_text()).get("fingerprint") == fp
                    and (out / "predictions.parquet").exists()):
                pipes.log.info(f"sft {run['key']}: reused (fingerprint {fp})")
                pipes.report_custom_message({"run": run["key"], "reused": True})
                continue
            train = pl.read_parquet(run["train_path"])
            for col in ("problem", "response"):
                if col not in train.columns:
                    raise ValueError(f"{run['train_path']}: training table lacks column {col!r}")
            init = Path(run["init_dir"])
            if not (init / "model.safetensors").exists():
                raise FileNotFoundError(f"run {run['key']}: no initial model at {init / 'model.safetensors'}")
            model = build(init)
            seq_len = model.config.n_positions
            examples = [encode_example(tok, p, r, eot) for p, r in zip(train["problem"].to_list(), train["response"].to_list())]
            run_seed = int(run.get("seed", plan.seed))
            sft_stream = PackedStream(examples, seq_len, eot, run_seed, name=run["train_path"])
            gen_stream = None
            if plan.domain_ratio < 1.0:
                general = np.load(Path(plan.data_dir) / "general_train.npy", mmap_mode="r")
                gen_stream = BlockStream(general, seq_len, run_seed + 7, "general_train")
            if run.get("eval_init"):
                init_pred = evaluate(model)
                if rank == 0:
                    write_parquet(init_pred, out / "predictions_init.parquet")
            opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, weight_decay=plan.weight_decay)
            if run.get("init_optimizer") and Path(run["init_optimizer"]).exists():
                opt.load_state_dict(torch.load(run["init_optimizer"], map_location="cpu", weights_only=False))
                for g in opt.param_groups:
                    g["lr"] = g["initial_lr"] = plan.lr
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(plan))
            start, curve = 0, []
            if ckpt_path.exists():
                state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
                if state.get("fingerprint") == fp:
                    model.load_state_dict(state["model"])
                    opt.load_state_dict(state["optimizer"])
                    sched.load_state_dict(state["scheduler"])
                    start, curve = state["step"], state["curve"]
                    pipes.log.info(f"sft {run['key']}: resumed at step {start}")
            for s in range(start):  # fast-forward the deterministic data streams
                n_sft = domain_counts(s, plan.global_batch, plan.domain_ratio)
                sft_stream.taken += n_sft
                if gen_stream is not None:
                    gen_stream.taken += plan.global_batch - n_sft
            model, opt = acc.prepare(model, opt)
            model.train()
            window = []
            for step in range(start, plan.steps):
                n_sft = domain_counts(step, plan.global_batch, plan.domain_ratio)
                ids, mask = sft_stream.take(n_sft)
                if n_sft < plan.global_batch:
                    g = np.asarray(gen_stream.take(plan.global_batch - n_sft), dtype=np.int64)
                    ids = np.concatenate([ids, g])
                    mask = np.concatenate([mask, np.ones(g.shape, np.float32)])
                sl = slice(rank * local, (rank + 1) * local)
                x, mk = torch.from_numpy(ids[sl]), torch.from_numpy(mask[sl])
                loss = sequence_loss(model(input_ids=x).logits, x, mk)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"sft {run['key']}: non-finite training loss {loss.item()} at step {step}")
                acc.backward(loss)
                acc.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                window.append(float(loss.detach()))
                done = step + 1
                if done % plan.log_every == 0 or done == plan.steps:
                    point = {"step": done, "loss": float(np.mean(window)), "lr": sched.get_last_lr()[0]}
                    window = []
                    curve.append(point)
                    if rank == 0:
                        pipes.report_custom_message({"run": run["key"], **point})
                if done % plan.checkpoint_every == 0 and done < plan.steps:
                    if rank == 0:
                        tmp = ckpt_path.with_name("checkpoint.pt.tmp")
                        torch.save({"fingerprint": fp, "model": acc.unwrap_model(model).state_dict(),
                                    "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": done,
                                    "curve": curve}, tmp)
                        os.replace(tmp, ckpt_path)
                    acc.wait_for_everyone()
                    if crash_after and done >= crash_after:
                        raise SimulatedCrash(f"sft {run['key']}: simulated crash after the checkpoint at step {done}")
            pred = evaluate(model)
            if rank == 0:
                m = acc.unwrap_model(model)
                tmp = out / "model.safetensors.tmp"
                save_model(m, str(tmp))
                os.replace(tmp, out / "model.safetensors")
                m.config.to_json_file(str(out / "config.json"))
                torch.save(opt.state_dict(), out / "optimizer.pt.tmp")
                os.replace(out / "optimizer.pt.tmp", out / "optimizer.pt")
                write_parquet(pred, out / "predictions.parquet")
                info = {"fingerprint": fp, "key": run["key"], "steps": plan.steps, "global_batch": plan.global_batch,
                        "seq_len": seq_len, "tokens": plan.steps * plan.global_batch * seq_len,
                        "domain_ratio": plan.domain_ratio, "seed": run_seed, "train_rows": train.height, "pack": sft_stream.counts,
                        "curve": curve, "final_loss": curve[-1]["loss"] if curve else None, "world_size": world,
                        "distributed_type": str(acc.distributed_type),
                        "n_params": sum(p.numel() for p in m.parameters()),
                        "wall_s": round(time.monotonic() - t0, 2)}
                _atomic_json(info, metrics_path)
                ckpt_path.unlink(missing_ok=True)
                pipes.log.info(f"sft {run['key']}: {plan.steps} steps, final loss {info['final_loss']:.4f}, "
                               f"{info['wall_s']} s")
            acc.wait_for_everyone()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: sft.py <plan.json>")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main(sys.argv[1]))
