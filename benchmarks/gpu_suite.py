"""The GPU checks of issue 40 item 5, in one script with one total budget (< 8 minutes), for a lent
device machine (one GPU, 16 CPU cores). Each section runs in a child process with its own share of
the budget (killed with its process group when it overruns) and its result lands in one JSON
labelled with the device (GPU name and memory from ``torch.cuda``, CPU cores, host):

- ``vllm_smoke``: the vLLM-backed rollout engine (``ops.rl.engine.VLLMEngine``, the ``vllm`` extra,
  pinned ``vllm==0.30.0`` in constraints.txt) generates a batch from a randomly initialised Llama
  policy written to disk; reports tokens/s. Skipped, with the reason, when vLLM is not importable
  (a device machine reaches no package index: install the extra into its image beforehand).
- ``rollpacker``: RollPacker against its synchronous baseline (``ops.rl.rollpacker.driver``,
  the real Ray engine/trainer/reward actors with ``num_gpus``) on the scratchpad task, with a
  random policy of hidden width ``--rl-hidden`` (default 768: on a GPU its decode step costs about
  the same at batch 1 and 64, the batch-insensitive regime RollPacker's tail batching assumes);
  reports per-method step and rollout seconds.
- ``gba``: GBA's throughput at W = 8 and 16 workers on the machine's cores, measured over ideal
  (``benchmarks/gba_bench.py --sections throughput``).
- ``rollarc`` (only with budget left): RollArc against the monolithic baseline at equal resources
  (``benchmarks/rollarc_bench.py --real``; needs ``--rollarc-problems``, a problems file, and the
  tokenizer the ``rollpacker`` section trains; without them its JSON says it was skipped).

    .venv/bin/python benchmarks/gpu_suite.py --out $OUT/gpu_suite.json               # on the device machine
    .venv/bin/python benchmarks/gpu_suite.py --dry-run                               # the plan, no run

Without a CUDA device the script writes the results file with ``device: null`` and the reason, runs
nothing, and exits 3 (``--allow-cpu`` runs the sections anyway, labelled ``cpu``). Exit 0 when every
section that ran succeeded; 1 otherwise.

Raises (at argument parsing, exit 2): a budget over 480 s or under 60 s, an unknown section, a
worker count below 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("vllm_smoke", "rollpacker", "gba", "rollarc")
"""In run order; ``rollarc`` runs only if budget is left."""
SHARES = {"vllm_smoke": 0.25, "rollpacker": 0.30, "gba": 0.30, "rollarc": 0.15}
"""Each section's share of the total budget (what a section leaves unused goes to the next)."""
MAX_BUDGET_S = 480.0
"""The issue's limit: the whole suite under 8 minutes."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=450.0, help="total wall-clock budget, 60..480 s (default 450)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_suite.json"), help="results JSON")
    ap.add_argument("--rl-hidden", type=int, default=768, help="hidden width of the RL policy (rollpacker, vllm_smoke)")
    ap.add_argument("--rl-steps", type=int, default=3, help="RL steps per method (rollpacker)")
    ap.add_argument("--gba-workers", default="8,16", help="W values of the GBA throughput section")
    ap.add_argument("--rollarc-problems", default="", help="rollarc section: a problems file for "
                    "benchmarks/rollarc_bench.py run_benchmark (empty: the section records that it was skipped)")
    ap.add_argument("--allow-cpu", action="store_true", help="run the sections without a CUDA device (labelled cpu)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (sections, budgets, commands); run nothing")
    ap.add_argument("--no-device-note", default="", help="recorded with the reason when no CUDA device is found "
                    "(e.g. why no device machine was lent)")
    ap.add_argument("--section", default="", help=argparse.SUPPRESS)      # internal: run one section in this process
    ap.add_argument("--section-out", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not 60.0 <= a.budget_s <= MAX_BUDGET_S:
        ap.error(f"--budget-s must be in [60, {MAX_BUDGET_S:.0f}] (the suite's total limit is 8 minutes), got {a.budget_s}")
    chosen = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SECTIONS]
    if bad or not chosen:
        ap.error(f"--sections: unknown {bad or 'empty'}; known: {', '.join(SECTIONS)}")
    a.sections = [s for s in SECTIONS if s in chosen]
    try:
        a.gba_workers = [int(w) for w in a.gba_workers.split(",")]
    except ValueError:
        ap.error(f"--gba-workers must be comma-separated integers, got {a.gba_workers!r}")
    if any(w < 2 for w in a.gba_workers):
        ap.error(f"--gba-workers: every W must be >= 2, got {a.gba_workers}")
    if a.rl_hidden < 16 or a.rl_steps < 1:
        ap.error("--rl-hidden must be >= 16 and --rl-steps >= 1")
    return a


def device_label() -> dict:
    """The machine the suite runs on: GPU name and memory (``torch.cuda``; None without CUDA), CPU
    cores, host name."""
    import platform

    label = {"gpu": None, "gpu_memory_gib": None, "cuda_devices": 0, "cpu_cores": os.cpu_count(),
             "host": platform.node()}
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            label.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                         cuda_devices=torch.cuda.device_count(), torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:
        pass
    return label


def section_command(name: str, a: argparse.Namespace, out: Path) -> list[str]:
    """The child command of section ``name`` writing its JSON to ``out``."""
    py = sys.executable
    if name == "gba":
        return [py, str(ROOT / "benchmarks" / "gba_bench.py"), "--sections", "throughput", "--throughput-workers",
                ",".join(map(str, a.gba_workers)), "--throughput-epochs", "0.25", "--out", str(out)]
    if name == "rollarc":       # the tokenizer: the one the rollpacker section trained (same parts folder)
        return [py, str(ROOT / "benchmarks" / "rollarc_bench.py"), "--real", "--real-problems", a.rollarc_problems,
                "--real-tokenizer", str(out.parent / "rollpacker_work" / "policy"), "--seeds", "0", "--steps", "2",
                "--out", str(out)]
    return [py, str(Path(__file__).resolve()), "--section", name, "--section-out", str(out),
            "--rl-hidden", str(a.rl_hidden), "--rl-steps", str(a.rl_steps), "--allow-cpu"]


def plan(a: argparse.Namespace) -> list[dict]:
    """Sections in order with their budget share (s) and command."""
    work = Path(a.out).parent / "gpu_suite_parts"
    return [{"section": s, "budget_s": round(a.budget_s * SHARES[s], 1),
             "command": section_command(s, a, work / f"{s}.json")} for s in a.sections]


def run_child(cmd: list[str], limit_s: float, log: Path) -> dict:
    """Run ``cmd`` in its own process group with a wall-clock limit; the group is killed after it."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=30)
    tail = log.read_text(errors="replace")[-2000:]
    return {"exit_code": rc, "timed_out": rc is None, "wall_s": round(time.monotonic() - t0, 1), "log_tail": tail}


# ------------------------------------------------------------------------------- in-process sections


def _tokenizer_dir(work: Path) -> Path:
    """The scratchpad task's tokenizer (and a tiny policy), trained offline by a 1-step warm start."""
    from ops.rl.warmstart import WarmStartSpec, train
    from tests.conftest import RecordingPipes

    pol = work / "policy"
    if not (pol / "tokenizer.json").exists():
        spec = WarmStartSpec(out_dir=str(pol), max_steps=1, batch_problems=4, eval_every=1, eval_size=2,
                             final_eval_size=2, n_embd=64, n_layer=2, checkpoint_every=1).validate()
        train(spec, work / "ws", RecordingPipes(0))
    return pol


def _policy_dir(work: Path, hidden: int) -> Path:
    """A randomly initialised 12-layer Llama policy of width ``hidden`` with the scratchpad tokenizer
    (HF format, loadable by vLLM)."""
    pol = _tokenizer_dir(work)
    big = work / f"llama_{hidden}"
    if not (big / "config.json").exists():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(str(pol))
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                          num_hidden_layers=12, num_attention_heads=max(1, hidden // 64), max_position_embeddings=1024,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(big)
        tok.save_pretrained(big)
    return big


def section_vllm_smoke(a: argparse.Namespace, work: Path) -> dict:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not importable: pip install \"crucible[vllm]\" -c constraints.txt into the "
                           "image beforehand (a device machine reaches no package index)"}
    from ops.rl.engine import VLLMEngine
    from ops.rl.types import Prompt

    model = _policy_dir(work, a.rl_hidden)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    prompts = [Prompt(uid=f"p{i}", token_ids=tuple(tok(f"{i} + {i} =")["input_ids"]), text=f"{i} + {i} =")
               for i in range(32)]
    engine = VLLMEngine(str(model), gpu_memory_utilization=0.3, enforce_eager=True)
    t0 = time.monotonic()
    out = engine.generate(prompts, n=4, max_new_tokens=64)
    dt = time.monotonic() - t0
    tokens = sum(len(getattr(r, "token_ids", ()) or ()) for r in out)
    return {"responses": len(out), "tokens": tokens, "seconds": round(dt, 3), "tokens_per_s": round(tokens / dt, 1)}


def section_rollpacker(a: argparse.Namespace, work: Path) -> dict:
    import ray
    import torch

    from ops.rl.policy import load_tokenizer
    from ops.rl.ray_actors import Actors
    from ops.rl.rollpacker.driver import RunSpec, RunState, fingerprint, load_prompts, result_fields, run_methods
    from tests.conftest import RecordingPipes

    pol = _tokenizer_dir(work)                         # the policy itself is random, of width rl_hidden
    gpus = 1.0 if torch.cuda.is_available() else 0.0
    out = {"hidden": a.rl_hidden, "gpus_per_actor": gpus, "methods": {}}
    ray.init(num_cpus=4, num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    try:
        for method in ("baseline", "rollpacker"):
            spec = RunSpec(task="scratchpad", tokenizer_dir=str(pol), model_dir=None, tiny_hidden=a.rl_hidden,
                           methods=[method], steps=a.rl_steps, prompts_per_step=8, responses_per_prompt=8,
                           max_new_tokens=96, timeout_s=120, lr=1e-5, engine_gpus=gpus, trainer_gpus=gpus).validate()
            actors = Actors(spec.policy(), spec.policy(), reward_item_timeout_s=20)
            try:
                state = RunState(work / f"state_{method}", fingerprint(spec))
                t0 = time.monotonic()
                rows = run_methods(spec, load_prompts(spec, load_tokenizer(str(pol))), RecordingPipes(0), actors, state)
                res = result_fields(spec, rows, state.evals)
            finally:
                actors.kill()
            out["methods"][method] = {
                "wall_s": round(time.monotonic() - t0, 2),
                "step_s": [round(r["step_s"], 3) for r in rows], "rollout_s": [round(r["rollout_s"], 3) for r in rows],
                "policy_version": res["weight_syncs"][method]["policy_version"]}
    finally:
        ray.shutdown()
    b, r = (sum(out["methods"][m]["step_s"]) for m in ("baseline", "rollpacker"))
    out["rollpacker_over_baseline_step_time"] = round(r / b, 3) if b else None
    return out


def run_section(a: argparse.Namespace) -> int:
    """``--section NAME``: one in-process section, its JSON to ``--section-out``."""
    out = Path(a.section_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f"{a.section}_work"
    work.mkdir(exist_ok=True)
    fn = {"vllm_smoke": section_vllm_smoke, "rollpacker": section_rollpacker}[a.section]
    out.write_text(json.dumps(fn(a, work), indent=1))
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.section:
        if a.section not in ("vllm_smoke", "rollpacker"):
            raise SystemExit(f"--section: {a.section!r} is not an in-process section")
        return run_section(a)
    steps = plan(a)
    if a.dry_run:
        print(json.dumps({"budget_s": a.budget_s, "sections": steps}, indent=1))
        return 0
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device = device_label()
    result = {"command": " ".join([".venv/bin/python", "benchmarks/gpu_suite.py", *(argv if argv is not None else sys.argv[1:])]),
              "device": device if (device["gpu"] or a.allow_cpu) else None, "budget_s": a.budget_s, "sections": {}}
    if not device["gpu"] and not a.allow_cpu:
        result["reason"] = "no CUDA device on this machine: nothing ran (a lent GPU machine runs this script)"
        if a.no_device_note:
            result["note"] = a.no_device_note
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(result["reason"], file=sys.stderr)
        return 3
    t_end = time.monotonic() + a.budget_s
    carry = 0.0
    for st in steps:
        left = t_end - time.monotonic()
        limit = min(left, st["budget_s"] + carry)
        if limit < 20:
            result["sections"][st["section"]] = {"skipped": f"budget left {left:.0f} s"}
            continue
        part = Path(st["command"][st["command"].index("--out" if "--out" in st["command"] else "--section-out") + 1])
        part.parent.mkdir(parents=True, exist_ok=True)
        run = run_child(st["command"], limit, part.with_suffix(".log"))
        carry = max(0.0, limit - run["wall_s"])
        run["result"] = json.loads(part.read_text()) if part.exists() and run["exit_code"] == 0 else None
        result["sections"][st["section"]] = run
        out.write_text(json.dumps(result, indent=1) + "\n")        # written after every section
    out.write_text(json.dumps(result, indent=1) + "\n")
    ok = all(s.get("exit_code") == 0 for s in result["sections"].values() if "exit_code" in s)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
