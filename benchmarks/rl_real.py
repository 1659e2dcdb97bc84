"""Real RL systems benchmark on the scratchpad task (docs/rollpacker.md, docs/rollarc.md): the
warm-started policy trained with GRPO, every method on the same engine code, prompts and seeds.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.rl_real [--section rollpacker|rollarc|all] [--seeds 3] [--quick]
        [--policy <rl_policy folder>] [--actors ray|local] [--out benchmarks/results/rl_real.json]

Section ``rollpacker`` (RollPacker, arXiv 2509.21009): for each seed, the driver's methods
(``ops.rl.rollpacker.driver.METHODS``: baseline, tail_batching, tail_batching+reward, rollpacker)
run one after the other through the driver's own ``run_method`` on the same actors (reset to the
warm-started policy before every method), on the epoch ``scratchpad.problems(seed, steps x P0)``
with held-out ``scratchpad.problems(seed + 1000, eval_size)``. The method order rotates with the
seed so a slow patch of a shared machine does not always hit the same method. Measured per method
and seed: end-to-end time (the sum of the steps' wall times, ``step_s``: rollout, rewards,
training, weight sync; held-out evaluation excluded), rollout and step time, bubble ratio, longest trained
response per round, held-out accuracy against step and against that wall time, and the check that
every prompt of the epoch was trained exactly once. Across seeds: mean and 95% CI (Student t) of
the end-to-end speed-up against the baseline and of the final accuracy.

Actors: Ray by default (``--actors ray``), as the driver launches them: engine and trainer are
separate processes with one CPU each, the reward service a third (0 CPU). On 2 cores this is the
only fair placement for RollPacker's overlaps: with the in-process ``LocalActors`` the stream
trainer's backward and the reward threads share the driver's interpreter (GIL) with generation, so
the overlap slows the rollout instead of hiding the training (measured: rollout 2-3x slower).
Ray start-up (~10-40 s) happens once, before any method, and is reported apart.

``decode_batch_cost``: the HFEngine's time per decode step against batch size at a fixed length
(EOS disabled so every sequence runs the full length), one torch thread, as the engine actor runs.

Section ``rollarc``: ``benchmarks.rl_real_arc.run_section(seeds, quick)`` (imported lazily; when it
is missing the file's existing ``rollarc`` entry is kept). Sections are merged into the existing
JSON, so running one keeps the other. Figures are ``label: real`` (measured on this machine).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, previous_results, write_results  # noqa: E402
from resources.lake import LakeResource  # noqa: E402

POLICY = os.environ.get("CRUCIBLE_POLICY") or str(LakeResource().base / "rl_policy" / "policy")
"""The warm-started policy folder: ``$CRUCIBLE_POLICY``, else the ``rl_policy`` asset's output in the
default lake (materialize it with ``crucible`` / the Dagster UI, job ``rl_policy_job``)."""

#: Sizes of the rollpacker section (full and --quick). One learning rate for every method.
SIZES = {
    "full": {"steps": 12, "prompts_per_step": 8, "responses_per_prompt": 8, "eta": 1.25, "max_new_tokens": 256,
             "lr": 6e-5, "eval_size": 256, "eval_every": 6},
    "quick": {"steps": 5, "prompts_per_step": 8, "responses_per_prompt": 8, "eta": 1.25, "max_new_tokens": 256,
              "lr": 6e-5, "eval_size": 64, "eval_every": 0},
}
"""Tuning (baseline, seed 0, 256 held-out, T=1, shared machine): lr 3e-4 collapses the policy
(0.49 -> 0.19-0.30 in 6 steps), 1e-4 loses ~7 points in 10 steps, 3e-5 gains 2-3 points in 20
steps, 6e-5 gains 6 points at step 10 and 3 at step 20. 12 steps keep the 4 x 3 runs near 12
minutes (~4 s a step on a quiet machine, ~7 s on the shared one)."""
MICRO_BATCH = 16
"""Trainer micro-batch (responses per backward pass); the same for every method."""


def ci95(xs: list[float]) -> dict:
    """Mean and 95% confidence interval of the mean (Student t, n - 1 degrees of freedom)."""
    from scipy import stats

    xs = [float(x) for x in xs]
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return {"mean": m, "ci95": [m, m], "n": len(xs)}
    h = float(stats.t.ppf(0.975, len(xs) - 1)) * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"mean": m, "ci95": [m - h, m + h], "n": len(xs)}


class _Log:
    def info(self, msg):
        print(msg, flush=True)

    warning = info


class _Pipes:
    """What ``run_method`` needs of Dagster Pipes: a log and custom messages (dropped here)."""

    retry_number = 0
    log = _Log()

    def report_custom_message(self, _m):
        pass


def decode_batch_cost(policy: str, batches=(1, 8, 32, 64, 128), length: int = 64, repeats: int = 2) -> dict:
    """Seconds per decode step of ``HFEngine.generate`` against batch size, every sequence running
    ``length`` new tokens (EOS disabled), best of ``repeats``, one torch thread."""
    import torch

    from ops.rl import scratchpad as sp
    from ops.rl.engine import HFEngine
    from ops.rl.policy import load_policy, load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(policy)
    model = load_policy(policy)
    model.eval()
    eng = HFEngine(model, tok)
    eng.eos_id = None                        # no sequence stops early: a fixed batch for `length` steps
    prompt = sp.to_prompt(tok, sp.Problem("cost", 7, 45))
    rows = []
    for b in batches:
        best = None
        for _ in range(repeats):
            batch = eng.generate([prompt], b, length, timeout_s=300)
            per = batch.timings["wall_s"] / max(1.0, batch.timings["decode_steps"])
            best = per if best is None else min(best, per)
        rows.append({"batch": b, "s_per_step": best, "s_per_token": best / b})
    base = rows[0]["s_per_step"]
    for r in rows:
        r["vs_batch_1"] = r["s_per_step"] / base
    big = rows[-1]
    return {"length": length, "threads": 1, "rows": rows,
            "note": f"batch {big['batch']} costs {big['vs_batch_1']:.1f}x batch 1 per decode step "
                    f"({big['batch'] / big['vs_batch_1']:.0f}x the tokens per second): per-step overhead dominates, "
                    "like memory-bound GPU decode, so a round's rollout time is set by its longest response"}


def _spec(seed: int, sizes: dict, policy: str, methods: list):
    from ops.rl.rollpacker.driver import RunSpec

    return RunSpec(task="scratchpad", task_seed=seed, seed=seed, tokenizer_dir=policy, model_dir=policy, methods=methods,
                   timeout_s=300, eval_temperature=1.0, **sizes).validate()


def _make_actors(spec, kind: str):
    from ops.rl.ray_actors import Actors, LocalActors

    pol = spec.policy()
    cls = Actors if kind == "ray" else LocalActors
    return cls(pol, {**pol, "micro_batch": MICRO_BATCH}, spec.reward_workers, spec.reward_timeout_s)


def warm_up(actors, spec, prompts: list) -> float:
    """One untimed rollout on the engine (the epoch's first P0 prompts x R0 responses, ``spec``'s
    budget) before any method, so the process's first-call costs (allocator, kernels, threads; ~6 s
    on the first rollout measured on this machine) fall on no method. Every method then resets the
    actors (policy and sampling seed) as before. Returns its seconds."""
    from ops.rl.engine import guarded_generate

    t = time.monotonic()
    guarded_generate(actors.engine, prompts[:spec.prompts_per_step], spec.responses_per_prompt, spec.max_new_tokens,
                     timeout_s=spec.timeout_s)
    return time.monotonic() - t


def _method_figures(rows: list[dict], ev: list[dict], epoch: list[str]) -> dict:
    trained = [u for r in rows for u in r["trained_prompts"]]
    lens = [n for r in rows for n in r["response_lengths"]]
    short = [r for r in rows if r["round"] != "long"]
    return {
        "end_to_end_s": sum(r["step_s"] for r in rows),
        "step_s_total": sum(r["step_s"] for r in rows), "rollout_s_total": sum(r["rollout_s"] for r in rows),
        "reward_wait_s_total": sum(r["reward_wait_s"] for r in rows),
        "train_tail_s_total": sum(r["train_tail_s"] for r in rows),
        "step_s_mean": statistics.fmean(r["step_s"] for r in rows),
        "rollout_s_mean": statistics.fmean(r["rollout_s"] for r in rows),
        "bubble_ratio_mean": statistics.fmean(r["bubble_ratio"] for r in rows),
        "max_response_len_per_round": [r["max_response_len"] for r in rows],
        "round_kinds": [r["round"] for r in rows],
        "max_response_len_mean": statistics.fmean(r["max_response_len"] for r in rows),
        "max_response_len_mean_short_rounds": statistics.fmean(r["max_response_len"] for r in short) if short else None,
        "long_rounds": sum(r["round"] == "long" for r in rows),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in rows),
        "trained_responses": len(lens), "response_len_median": statistics.median(lens), "response_len_max": max(lens),
        "trained_len_mean": statistics.fmean(lens),
        "reward_timeout_zero": sum(r.get("reward_timeout_zero", 0) for r in rows),
        "trained_length_capped": sum(r.get("trained_length", 0) for r in rows),
        "every_prompt_trained_once": sorted(trained) == sorted(epoch),
        "prompts_trained": len(trained), "epoch_prompts": len(epoch),
        "accuracy_curve": [{k: e[k] for k in ("step", "train_wall_s", "accuracy", "n", "policy_version")} for e in ev],
        "accuracy_before": ev[0]["accuracy"] if ev else None, "accuracy_after": ev[-1]["accuracy"] if ev else None,
        "steps": [{k: r.get(k) for k in ("step", "round", "step_s", "rollout_s", "reward_wait_s", "train_tail_s",
                                         "sync_s", "bubble_ratio", "max_response_len", "median_response_len",
                                         "reward_mean", "zero_signal_groups", "finish_abort", "long_queue")} for r in rows],
    }


def rollpacker_section(seeds: int, quick: bool, policy: str, actors_kind: str, methods=None) -> dict:
    """Every method x seed on the scratchpad task (module docstring). Returns the section dict."""
    from dataclasses import replace

    from ops.launch import init_ray
    from ops.rl.policy import load_tokenizer
    from ops.rl.rollpacker.driver import METHODS, evaluate, heldout_problems, load_prompts, run_method

    methods = list(methods or ["baseline", "tail_batching", "tail_batching+reward", "rollpacker"])
    assert all(m in METHODS for m in methods) and methods[0] == "baseline"
    sizes = SIZES["quick" if quick else "full"]
    tok = load_tokenizer(policy)
    t0 = time.monotonic()
    ray_s = 0.0
    if actors_kind == "ray":
        import ray

        init_ray(None, 2, 1)
        ray_s = time.monotonic() - t0
    per_seed = []
    try:
        for seed in range(seeds):
            spec = _spec(seed, sizes, policy, methods)
            prompts = load_prompts(spec, tok)
            epoch = [p.uid for p in prompts]
            actors = _make_actors(spec, actors_kind)
            order = methods[seed % len(methods):] + methods[:seed % len(methods)]
            out = {"seed": seed, "order": order, "methods": {}}
            try:
                greedy = replace(spec, eval_temperature=0.0)
                held = heldout_problems(spec)
                for m in order:
                    evals: dict = {}
                    t = time.monotonic()
                    rows = run_method(m, spec, prompts, _Pipes(), actors, state=None, evals=evals)
                    out["methods"][m] = _method_figures(rows, evals.get(m, []), epoch)
                    out["methods"][m]["wall_with_eval_s"] = time.monotonic() - t
                    if m == "baseline":                               # greedy pass rate after; before below
                        out["greedy_after"] = evaluate(actors, held, greedy)["accuracy"]
                actors.reset()
                out["greedy_before"] = evaluate(actors, held, greedy)["accuracy"]
            finally:
                actors.kill()
            b = out["methods"]["baseline"]
            for m, f in out["methods"].items():
                f["speedup_vs_baseline"] = b["end_to_end_s"] / f["end_to_end_s"]
            per_seed.append(out)
            print(f"seed {seed}: " + ", ".join(f"{m} {f['end_to_end_s']:.1f}s acc {f['accuracy_before']:.3f}->"
                                              f"{f['accuracy_after']:.3f}" for m, f in out["methods"].items()), flush=True)
    finally:
        if actors_kind == "ray":
            ray.shutdown()

    def across(m, key):
        return ci95([s["methods"][m][key] for s in per_seed])

    rows = {}
    for m in methods:
        rows[m] = {k: across(m, k) for k in ("end_to_end_s", "step_s_mean", "rollout_s_mean", "bubble_ratio_mean",
                                             "max_response_len_mean", "speedup_vs_baseline", "accuracy_after")}
        rows[m]["long_rounds_mean"] = statistics.fmean(s["methods"][m]["long_rounds"] for s in per_seed)
        rows[m]["every_prompt_trained_once"] = all(s["methods"][m]["every_prompt_trained_once"] for s in per_seed)
    base_lens = [f for s in per_seed for f in [s["methods"]["baseline"]]]
    acc_b, acc_r = rows["baseline"]["accuracy_after"], rows.get("rollpacker", rows["baseline"])["accuracy_after"]
    speed = rows.get("rollpacker", rows["baseline"])["speedup_vs_baseline"]
    return {
        "label": "real", "task": "scratchpad", "actors": actors_kind, "sizes": sizes, "micro_batch": MICRO_BATCH,
        "methods": methods, "seeds": seeds, "ray_init_s": ray_s, "section_wall_s": time.monotonic() - t0,
        "speedup": {"mean": speed["mean"], "ci95": speed["ci95"]},
        "accuracy": {"baseline": {"mean": acc_b["mean"], "ci95": acc_b["ci95"]},
                     "rollpacker": {"mean": acc_r["mean"], "ci95": acc_r["ci95"]}},
        "targets": {"speedup_ge_1_5": speed["mean"] >= 1.5,
                    "rollpacker_accuracy_inside_baseline_ci": acc_b["ci95"][0] <= acc_r["mean"] <= acc_b["ci95"][1]},
        "max_over_median_len": statistics.fmean(f["response_len_max"] / f["response_len_median"] for f in base_lens),
        "per_method": rows,
        "per_seed": per_seed,
    }


def policy_summary(section: dict) -> dict:
    """Held-out pass rate of the baseline GRPO runs before and after (sampled T=1 and greedy)."""
    ps = section["per_seed"]
    before = ci95([s["methods"]["baseline"]["accuracy_before"] for s in ps])
    after = ci95([s["methods"]["baseline"]["accuracy_after"] for s in ps])
    gb, ga = ci95([s["greedy_before"] for s in ps]), ci95([s["greedy_after"] for s in ps])
    return {"accuracy_before": before["mean"], "accuracy_before_ci95": before["ci95"],
            "accuracy_after": after["mean"], "accuracy_after_ci95": after["ci95"],
            "gain_points": 100 * (after["mean"] - before["mean"]),
            "greedy_before": gb["mean"], "greedy_before_ci95": gb["ci95"],
            "greedy_after": ga["mean"], "greedy_after_ci95": ga["ci95"],
            "seeds": len(ps), "eval_size": section["sizes"]["eval_size"], "eval_temperature": 1.0,
            "steps": section["sizes"]["steps"], "lr": section["sizes"]["lr"], "method": "baseline (synchronous GRPO)"}


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "rl_real.json", seeds=3, quick="5 steps per method, 64 held-out problems (a smoke run)",
                      full_doc=True)
    ap.add_argument("--section", choices=["rollpacker", "rollarc", "all"], default="all")
    ap.add_argument("--policy", default=POLICY, help="warm-started policy folder (model_dir and tokenizer_dir)")
    ap.add_argument("--actors", choices=["ray", "local"], default="ray")
    ap.add_argument("--methods", default=None, help="comma-separated subset of the driver's METHODS (baseline first)")
    ap.add_argument("--skip-decode-cost", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    out_path = Path(args.out)
    doc = previous_results(out_path)
    doc.update({"label": "real", "command": command_line(__file__, argv, env="OMP_NUM_THREADS=1")})

    def write():
        doc["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                          "load_average_at_end": os.getloadavg(),
                          "note": "2-core machine; figures are real but noisy when other processes share it"}
        doc["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_results(doc, out_path)
        print(f"wrote {out_path}", flush=True)

    if args.section in ("rollpacker", "all"):
        sec = rollpacker_section(args.seeds, args.quick, args.policy, args.actors,
                                 args.methods.split(",") if args.methods else None)
        if not args.skip_decode_cost:
            sec["decode_batch_cost"] = decode_batch_cost(args.policy)
        doc["rollpacker"] = sec
        kept = {k: v for k, v in doc.get("policy", {}).items() if k == "grpo_120_steps"}  # rl_gain.py's entry
        doc["policy"] = {**policy_summary(sec), "dir": args.policy, **kept}
        doc["decode_batch_cost"] = sec.get("decode_batch_cost", doc.get("decode_batch_cost"))
        write()                                               # kept even if the rollarc section fails
    rc = 0
    if args.section in ("rollarc", "all"):
        try:
            from benchmarks import rl_real_arc
        except ImportError as e:
            print(f"rollarc section: benchmarks/rl_real_arc.py not importable ({e}); keeping the existing entry")
        else:
            try:
                doc["rollarc"] = rl_real_arc.run_section(args.seeds, args.quick)
            except Exception as e:  # noqa: BLE001 - the other section's figures are already written
                print(f"rollarc section failed: {type(e).__name__}: {e}; keeping the existing entry", flush=True)
                rc = 1
        write()
    return rc


if __name__ == "__main__":
    sys.exit(main())
