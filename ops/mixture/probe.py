"""CPT probe worker: pre-train a GPT-2-style model on the general corpus, then continually pre-train
it on a general/domain mixture, recording validation losses at exponentially spaced token counts.

These runs are the data of the D-CPT Law (arXiv 2406.01375 §3: losses over model size N, tokens D and
mixture ratio r; §4.1 favours exponentially spaced checkpoints). Launched by the
``cpt_base_models`` / ``cpt_probe_runs`` assets through Dagster Pipes with ``accelerate launch``
(data parallel over ``world_size`` ranks; gloo on CPU, NCCL on GPU — same script). Rank 0 streams
every checkpoint's losses as a Pipes custom message.

Usage: ``accelerate launch ... ops/mixture/probe.py <plan.json>``; the plan is written by the asset
(see ``ProbePlan`` below for its fields). Everything a run produces goes under its own folder and is
written atomically; a killed run resumes from its last checkpoint (model, optimizer, step) on the
next launch with the same plan, and a finished run with the same fingerprint is reused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

# GPT-2 shapes of the probe sizes: non-embedding parameters ~ 12 * n_layer * n_embd^2.
SIZES: dict[str, dict[str, int]] = {
    # Depth grows with width. At probe scale (~100 optimizer steps of base training) the loss
    # differences between sizes are ~0.1 nats and single-seed noise is ~0.05-0.1 nats, so the
    # default grid spans ~70x in N to keep the N axis of the law above the noise (measured:
    # width-48 models were no better than width-32 ones at this budget).
    "xs": {"n_embd": 16, "n_layer": 2, "n_head": 2},   # ~6.6k non-embedding parameters
    "s": {"n_embd": 32, "n_layer": 2, "n_head": 2},    # ~25k
    "m": {"n_embd": 64, "n_layer": 3, "n_head": 4},    # ~150k
    "l": {"n_embd": 96, "n_layer": 4, "n_head": 4},    # ~448k
    "xl": {"n_embd": 128, "n_layer": 6, "n_head": 4},  # ~1.2M
    "xxl": {"n_embd": 192, "n_layer": 8, "n_head": 6},  # ~3.5M
}


@dataclass
class ProbePlan:
    """Everything one launch needs. Token counts are in tokens (not sequences)."""

    phase: str                      # "base" | "cpt"
    data_dir: str                   # token streams + manifest.json (ops.mixture.tokens)
    base_dir: str                   # <base_dir>/<size>/: base model + base losses
    out_dir: str                    # <out_dir>/<run>/: CPT checkpoints + metrics.json
    runs: list[dict] = field(default_factory=list)  # [{"size": "xs", "ratio": 0.25, "key": "..."}]
    sizes: dict = field(default_factory=lambda: dict(SIZES))
    seq_len: int = 128
    global_batch: int = 16          # sequences per optimizer step, summed over ranks
    base_tokens: int = 200_000
    base_lr: float = 3e-3
    cpt_tokens: int = 131_072
    first_checkpoint: int = 4_096   # checkpoints at first_checkpoint * 2^k up to cpt_tokens
    cpt_lr: float = 3e-3
    cpt_warmup_steps: int = 0
    warmup_steps: int = 10
    weight_decay: float = 0.01
    val_seqs_general: int = 48
    val_seqs_per_subdomain: int = 24
    seed: int = 0

    BASE_FIELDS = ("seq_len", "global_batch", "base_tokens", "base_lr", "warmup_steps", "weight_decay",
                   "val_seqs_general", "val_seqs_per_subdomain", "seed")
    CPT_FIELDS = ("cpt_tokens", "first_checkpoint", "cpt_lr", "cpt_warmup_steps")

    def fingerprint(self, size: str, ratio: float | None = None) -> str:
        """Hash of what determines a result: the data manifest, the size's shape, the base
        hyper-parameters, and for a CPT run (``ratio`` given) the CPT hyper-parameters and ratio."""
        manifest = (Path(self.data_dir) / "manifest.json").read_text()
        fields = self.BASE_FIELDS + (self.CPT_FIELDS if ratio is not None else ())
        d = {k: getattr(self, k) for k in fields}
        return hashlib.sha256(json.dumps([manifest, self.sizes.get(size), d, ratio], sort_keys=True).encode()).hexdigest()[:16]

    def base_settings(self) -> dict:
        """The fields a CPT launch must share with the base models it starts from."""
        return {k: getattr(self, k) for k in self.BASE_FIELDS}


def run_dir_name(size: str, ratio: float) -> str:
    return f"{size}_r{ratio:.3f}"


def checkpoint_tokens(plan: ProbePlan) -> list[int]:
    """Exponentially spaced CPT token counts (multiples of the global batch), ending at cpt_tokens."""
    per_step = plan.global_batch * plan.seq_len
    out, t = [], plan.first_checkpoint
    while t < plan.cpt_tokens:
        out.append(t)
        t *= 2
    out.append(plan.cpt_tokens)
    steps = sorted({max(1, math.ceil(x / per_step)) for x in out})
    return [s * per_step for s in steps]


def domain_counts(step: int, global_batch: int, ratio: float) -> int:
    """Domain sequences in optimizer step ``step``: a deterministic schedule whose running total is
    round(steps * global_batch * ratio), so the realised mixture ratio is exact up to one sequence."""
    return int(math.floor((step + 1) * global_batch * ratio + 0.5) - math.floor(step * global_batch * ratio + 0.5))


class BlockStream:
    """A token stream read as non-overlapping blocks of ``seq_len`` tokens in a seeded order that is
    reshuffled each epoch. ``take(n)`` is deterministic given how many blocks were taken before."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, name: str):
        self.n_blocks = tokens.size // seq_len
        if self.n_blocks == 0:
            raise ValueError(f"token stream {name!r} has {tokens.size} tokens, fewer than one block of {seq_len}")
        self.blocks = tokens[: self.n_blocks * seq_len].reshape(self.n_blocks, seq_len)
        self.seed, self.taken, self._epoch, self._perm = seed, 0, -1, None

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks)
            self._epoch = epoch
        return self._perm

    def take(self, n: int) -> np.ndarray:
        out = []
        for i in range(self.taken, self.taken + n):
            out.append(self.blocks[self._order(i // self.n_blocks)[i % self.n_blocks]])
        self.taken += n
        return np.stack(out) if out else np.zeros((0, self.blocks.shape[1]), dtype=self.blocks.dtype)


def _val_blocks(tokens: np.ndarray, seq_len: int, n: int) -> np.ndarray:
    """The first ``n`` whole blocks of a validation stream (fewer when it is short)."""
    k = min(n, tokens.size // seq_len)
    return tokens[: k * seq_len].reshape(k, seq_len)


def _atomic_json(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def main(plan_path: str) -> int:  # noqa: C901 - one linear training program
    import torch
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from ops.launch import data_parallel, rank0_pipes

    hf_logging.set_verbosity_error()
    plan = ProbePlan(**json.loads(Path(plan_path).read_text()))
    acc, world, rank, local_batch = data_parallel(plan.global_batch)
    manifest = json.loads((Path(plan.data_dir) / "manifest.json").read_text())
    load = lambda name: np.load(Path(plan.data_dir) / f"{name}.npy", mmap_mode="r")  # noqa: E731
    subdomains = manifest["subdomains"]
    val = {"general": _val_blocks(load("general_val"), plan.seq_len, plan.val_seqs_general)}
    for s in subdomains:
        blocks = _val_blocks(load(f"domain_{s}_val"), plan.seq_len, plan.val_seqs_per_subdomain)
        if len(blocks):
            val[f"domain/{s}"] = blocks

    def build(size: str):
        if size not in plan.sizes:
            raise ValueError(f"unknown probe size {size!r}; known: {sorted(plan.sizes)}")
        cfg = GPT2Config(vocab_size=manifest["vocab_size"], n_positions=plan.seq_len, bos_token_id=manifest["eot_id"],
                         eos_token_id=manifest["eot_id"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         **plan.sizes[size])
        torch.manual_seed(plan.seed)
        model = GPT2LMHeadModel(cfg)
        emb = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
        total = sum(p.numel() for p in model.parameters())
        return model, total - emb, total

    @torch.no_grad()
    def evaluate(model) -> dict[str, float]:
        """Mean next-token loss (nats/token) per validation stream, summed over ranks."""
        m = acc.unwrap_model(model)
        m.eval()
        out = {}
        for name, blocks in val.items():
            mine = blocks[rank::world]
            s = torch.zeros(2, dtype=torch.float64)
            for i in range(0, len(mine), 16):
                x = torch.from_numpy(np.asarray(mine[i:i + 16], dtype=np.int64))
                logits = m(input_ids=x).logits[:, :-1]
                s[0] += F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum").double()
                s[1] += x[:, 1:].numel()
            if world > 1:
                torch.distributed.all_reduce(s)
            out[name] = float(s[0] / s[1])
        # domain loss = token-weighted over sub-domains (the whole domain validation set)
        dom = [(val[k].shape[0], out[k]) for k in val if k.startswith("domain/")]
        out["domain"] = sum(n * v for n, v in dom) / max(sum(n for n, _ in dom), 1)
        m.train()
        return out

    def train_steps(model, opt, sched, streams, ratio, start, stop, on_step=None):
        """Optimizer steps [start, stop); each rank takes its slice of the global batch."""
        g_stream, d_stream = streams
        model.train()
        for step in range(start, stop):
            n_dom = domain_counts(step, plan.global_batch, ratio)
            batch = np.concatenate([d_stream.take(n_dom), g_stream.take(plan.global_batch - n_dom)])
            x = torch.from_numpy(np.asarray(batch[rank * local_batch:(rank + 1) * local_batch], dtype=np.int64))
            loss = model(input_ids=x, labels=x).loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss {loss.item()} at step {step}")
            acc.backward(loss)
            acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if on_step:
                on_step(step + 1)

    def make_streams(ratio_seed: int):
        g = BlockStream(load("general_train"), plan.seq_len, plan.seed * 1000 + ratio_seed, "general_train")
        d = BlockStream(load("domain_train"), plan.seq_len, plan.seed * 1000 + ratio_seed + 1, "domain_train")
        return g, d

    def schedule(opt, warmup):
        """Linear warm-up, then constant: the base ends at the learning rate the CPT continues
        with, so no re-warming transient (the CPT "stability gap") sits in the early checkpoints,
        and every checkpoint is a valid D (no decay tied to a run length)."""
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)

    per_step = plan.global_batch * plan.seq_len
    with rank0_pipes() as pipes:
        pipes.log.info(f"probe {plan.phase}: world_size={world} distributed_type={acc.distributed_type} "
                       f"local_batch={local_batch} runs={[r['key'] for r in plan.runs]}")
        if rank == 0:
            folder = Path(plan.out_dir if plan.phase == "cpt" else plan.base_dir)
            folder.mkdir(parents=True, exist_ok=True)
            _atomic_json({"world_size": world, "distributed_type": str(acc.distributed_type)}, folder / "launch.json")
        from ops.progress import Progress

        progress = Progress(len(plan.runs), f"probe {plan.phase}", pipes.log.info if rank == 0 else (lambda _l: None),
                            every_s=0.0, unit="runs")
        for run in plan.runs:
            if run is not plan.runs[0]:
                progress.update()
            t0 = time.monotonic()
            size = run["size"]
            base = Path(plan.base_dir) / size
            if plan.phase == "base":
                fp = plan.fingerprint(size)
                done = base / "base.json"
                if done.exists() and json.loads(done.read_text()).get("fingerprint") == fp:
                    pipes.log.info(f"base {size}: reused (fingerprint {fp})")
                    pipes.report_custom_message({"run": run["key"], "reused": True})
                    continue
                model, n_params, n_total = build(size)
                opt = torch.optim.AdamW(model.parameters(), lr=plan.base_lr, weight_decay=plan.weight_decay)
                steps = max(1, math.ceil(plan.base_tokens / per_step))
                sched = schedule(opt, plan.warmup_steps)
                model, opt = acc.prepare(model, opt)
                train_steps(model, opt, sched, make_streams(0), 0.0, 0, steps)
                losses = evaluate(model)
                if rank == 0:
                    base.mkdir(parents=True, exist_ok=True)
                    from safetensors.torch import save_model

                    tmp = base / "model.safetensors.tmp"
                    save_model(acc.unwrap_model(model), str(tmp))
                    os.replace(tmp, base / "model.safetensors")
                    # The optimizer state too: CPT continues training (Adam moments included)
                    # instead of restarting from zero moments, which is a transient of its own.
                    torch.save(opt.state_dict(), base / "optimizer.pt.tmp")
                    os.replace(base / "optimizer.pt.tmp", base / "optimizer.pt")
                    acc.unwrap_model(model).config.to_json_file(str(base / "config.json"))
                    info = {"fingerprint": fp, "size": size, "settings": plan.base_settings(), "n_params": n_params, "n_params_total": n_total,
                            "tokens": steps * per_step, "steps": steps, "losses": losses,
                            "wall_s": round(time.monotonic() - t0, 2), "world_size": world}
                    _atomic_json(info, done)
                    pipes.report_custom_message({"run": run["key"], **info})
                    pipes.log.info(f"base {size}: N={n_params} loss_general={losses['general']:.4f} "
                                   f"loss_domain={losses['domain']:.4f} in {info['wall_s']} s")
                acc.wait_for_everyone()
                continue

            # --- continual pre-training on the mixture ------------------------------------
            ratio = float(run["ratio"])
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"run {run['key']}: domain ratio {ratio} outside [0, 1]")
            base_info = json.loads((base / "base.json").read_text()) if (base / "base.json").exists() else None
            if base_info is None or base_info.get("fingerprint") != plan.fingerprint(size):
                raise FileNotFoundError(f"run {run['key']}: no base model for size {size!r} under {base} matching these "
                                        "base settings; materialize cpt_base_models (size partition) first")
            rdir = Path(plan.out_dir) / run_dir_name(size, ratio)
            rdir.mkdir(parents=True, exist_ok=True)
            fp = plan.fingerprint(size, ratio)
            metrics_path, ckpt_path = rdir / "metrics.json", rdir / "checkpoint.pt"
            if metrics_path.exists() and json.loads(metrics_path.read_text()).get("fingerprint") == fp:
                pipes.log.info(f"cpt {run['key']}: reused (fingerprint {fp})")
                pipes.report_custom_message({"run": run["key"], "reused": True})
                continue
            model, n_params, n_total = build(size)
            from safetensors.torch import load_model

            load_model(model, str(base / "model.safetensors"))
            opt = torch.optim.AdamW(model.parameters(), lr=plan.cpt_lr, weight_decay=plan.weight_decay)
            if (base / "optimizer.pt").exists():
                opt.load_state_dict(torch.load(base / "optimizer.pt", map_location="cpu", weights_only=False))
                for g in opt.param_groups:
                    g["lr"] = g["initial_lr"] = plan.cpt_lr
            marks = checkpoint_tokens(plan)
            sched = schedule(opt, plan.cpt_warmup_steps)
            points = [{"step": 0, "tokens": 0, **{f"loss_{k}": v for k, v in base_info["losses"].items()}}]
            start = 0
            if ckpt_path.exists():
                state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
                if state.get("fingerprint") == fp:
                    model.load_state_dict(state["model"])
                    opt.load_state_dict(state["optimizer"])
                    sched.load_state_dict(state["scheduler"])
                    start, points = state["step"], state["points"]
                    pipes.log.info(f"cpt {run['key']}: resumed at step {start} ({start * per_step} tokens)")
            model, opt = acc.prepare(model, opt)
            streams = make_streams(1 + int(round(ratio * 1000)))
            # fast-forward the deterministic streams to the resume point
            for s in range(start):
                n_dom = domain_counts(s, plan.global_batch, ratio)
                streams[1].taken += n_dom
                streams[0].taken += plan.global_batch - n_dom
            step = start
            for mark in marks:
                stop = mark // per_step
                if stop <= step:
                    continue
                train_steps(model, opt, sched, streams, ratio, step, stop)
                step = stop
                losses = evaluate(model)
                pt = {"step": step, "tokens": step * per_step, **{f"loss_{k}": v for k, v in losses.items()}}
                points.append(pt)
                if rank == 0:
                    pipes.report_custom_message({"run": run["key"], **pt})
                    pipes.log.info(f"cpt {run['key']} D={pt['tokens']}: loss_general={losses['general']:.4f} "
                                   f"loss_domain={losses['domain']:.4f}")
                    tmp = ckpt_path.with_name("checkpoint.pt.tmp")
                    torch.save({"fingerprint": fp, "model": acc.unwrap_model(model).state_dict(),
                                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step,
                                "points": points}, tmp)
                    os.replace(tmp, ckpt_path)
                acc.wait_for_everyone()
                if _crash_after := os.environ.get("CRUCIBLE_PROBE_CRASH_AFTER_CHECKPOINTS"):  # fault injection (tests)
                    if len(points) - 1 >= int(_crash_after) and step < marks[-1] // per_step:
                        pipes.log.info(f"cpt {run['key']}: simulated crash after checkpoint {len(points) - 1}")
                        os._exit(3)
            if rank == 0:
                _atomic_json({"fingerprint": fp, "key": run["key"], "size": size, "ratio": ratio,
                              "n_params": n_params, "n_params_total": n_total, "world_size": world,
                              "subdomain_share": manifest["subdomain_share"], "points": points,
                              "wall_s": round(time.monotonic() - t0, 2)}, metrics_path)
                ckpt_path.unlink(missing_ok=True)  # the run is finished; its result is the metrics
            acc.wait_for_everyone()
        if plan.runs:
            progress.update()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: probe.py <plan.json>")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main(sys.argv[1]))
