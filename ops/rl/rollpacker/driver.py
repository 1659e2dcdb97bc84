"""The RollPacker run: baseline and tail batching, a few GRPO steps each on the same prompts and the
same initial policy, on Ray (local ``ray.init(num_cpus=...)`` by default, ``--address`` in
production). Launched by the ``rollpacker_run`` asset through Dagster Pipes; rank 0 streams one
message per step and writes ``result.json``.

    python -m ops.rl.rollpacker.driver --spec spec.json --out DIR

spec.json (``RunSpec.to_json``): methods, P0, R0, eta, steps, max_new_tokens, timeouts, the policy
(a model directory, or the tiny random policy with ``tokenizer_dir``), the problems file, learning
rate, reward settings, Ray address and CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

METHODS = {
    # name: (tail batching, reward scheduler, stream trainer)
    "baseline": (False, False, False),
    "rollpacker": (True, True, True),
    "tail_batching": (True, False, False),
    "tail_batching+reward": (True, True, False),
}


@dataclass
class RunSpec:
    """Everything a run needs (JSON-serialisable). See the ``rollpacker_run`` asset's config."""

    problems_path: str
    tokenizer_dir: str
    model_dir: Optional[str] = None
    methods: list = field(default_factory=lambda: ["baseline", "rollpacker"])
    prompts_per_step: int = 2
    responses_per_prompt: int = 4
    eta: float = 1.25
    steps: int = 2
    max_new_tokens: int = 48
    timeout_s: float = 120.0
    max_prompt_tokens: int = 200
    lr: float = 1e-6
    temperature: float = 1.0
    seed: int = 0
    max_failed_fraction: float = 0.25
    reward_workers: int = 1
    reward_timeout_s: float = 30.0
    reward_retries: int = 2
    ray_address: Optional[str] = None
    num_cpus: int = 2
    threads_per_actor: int = 1
    tiny_hidden: int = 64

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def validate(self) -> "RunSpec":
        from .scheduler import TailBatching

        TailBatching(self.prompts_per_step, self.responses_per_prompt, self.eta)
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"rollpacker.methods must be a non-empty subset of {sorted(METHODS)}, got {self.methods}")
        for name, ok in (("steps", self.steps >= 1), ("max_new_tokens", self.max_new_tokens >= 1),
                         ("timeout_s", self.timeout_s > 0), ("lr", self.lr > 0),
                         ("max_failed_fraction", 0 <= self.max_failed_fraction <= 1), ("num_cpus", self.num_cpus >= 1)):
            if not ok:
                raise ValueError(f"rollpacker.{name} is out of range: {getattr(self, name)}")
        return self


def load_prompts(spec: RunSpec, tokenizer) -> list:
    """The epoch: ``steps`` x P0 problems with an answer, in a seeded order, as chat prompts."""
    import polars as pl

    from ops.rl.policy import chat_prompt

    p = Path(spec.problems_path)
    if not p.exists():
        raise FileNotFoundError(f"problems table {p} does not exist: materialize the curated problems first")
    df = pl.read_parquet(p)
    need = {"problem_id", "problem", "answer"}
    if not need <= set(df.columns):
        raise ValueError(f"problems table {p} lacks columns {sorted(need - set(df.columns))}")
    cols = [c for c in ("problem_id", "problem", "answer", "solution", "answer_type") if c in df.columns]
    df = df.select(cols).filter(pl.col("answer").is_not_null() & (pl.col("answer").str.strip_chars() != ""))
    if "answer_type" in df.columns:
        df = df.filter(pl.col("answer_type") != "multiple_choice")
    rows = df.sort("problem_id").to_dicts()
    random.Random(spec.seed).shuffle(rows)
    n = spec.steps * spec.prompts_per_step
    if len(rows) < n:
        raise ValueError(f"problems table {p} has {len(rows)} usable problems; the run needs steps x P0 = {n}")
    return [chat_prompt(tokenizer, r["problem_id"], r["problem"], r["answer"], r.get("solution"),
                        r.get("answer_type") or "numeric", spec.max_prompt_tokens) for r in rows[:n]]


def make_actors(spec: RunSpec):
    """The engine, trainer and reward actors of a run (``ops.rl.ray_actors.Actors``)."""
    from ops.rl.ray_actors import Actors

    pol = {"tokenizer_dir": spec.tokenizer_dir, "model_dir": spec.model_dir, "seed": spec.seed,
           "threads": spec.threads_per_actor, "tiny_hidden": spec.tiny_hidden}
    return Actors({**pol, "temperature": spec.temperature}, {**pol, "lr": spec.lr}, spec.reward_workers,
                  spec.reward_timeout_s)


def run_method(method: str, spec: RunSpec, prompts: list, pipes, actors) -> list[dict]:
    """``spec.steps`` steps of one method, from the initial policy (actors reset first)."""
    from ops.rl.reward import RewardClient

    from .loop import RLStep, StepConfig
    from .scheduler import RoundPlanner, TailBatching

    tb, overlap, stream = METHODS[method]
    actors.reset()
    client = RewardClient(actors.reward_url, timeout_s=spec.reward_timeout_s, max_retries=spec.reward_retries,
                          backoff_s=0.2)
    client.health()                                           # before any training
    step = RLStep(actors.engine, actors.trainer, client.score, actors.publish,
                  StepConfig(max_new_tokens=spec.max_new_tokens, timeout_s=spec.timeout_s, reward_overlap=overlap,
                             stream_train=stream, max_failed_fraction=spec.max_failed_fraction), reward_threads=4)
    planner = RoundPlanner(prompts, TailBatching(spec.prompts_per_step, spec.responses_per_prompt, spec.eta, enabled=tb))
    rows = []
    try:
        while len(rows) < spec.steps and (plan := planner.next_round()) is not None:
            rnd, m = step.run(plan)
            planner.requeue(rnd.aborted)
            m = {"method": method, **{k: v for k, v in m.items() if k != "policy_versions"},
                 "policy_version": (m["policy_versions"] or [None])[0],
                 "trained_prompts": [g.prompt.uid for g in rnd.groups], "long_queue": len(planner.long_queue)}
            rows.append(m)
            pipes.report_custom_message({k: v for k, v in m.items() if k != "trained_prompts"})
            pipes.log.info(f"{method} step {m['step']} ({m['round']}): rollout {m['rollout_s']:.1f}s, step {m['step_s']:.1f}s, "
                           f"max len {m['max_response_len']}, bubble {m['bubble_ratio']:.2f}, reward {m['reward_mean']:.3f}")
    finally:
        step.close()
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    spec = RunSpec(**json.loads(Path(args.spec).read_text())).validate()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from ops.launch import rank0_pipes
    from ops.rl.policy import load_tokenizer

    with rank0_pipes() as pipes:
        import ray

        t0 = time.monotonic()
        tok = load_tokenizer(spec.tokenizer_dir)
        prompts = load_prompts(spec, tok)
        root = str(Path(__file__).resolve().parents[3])
        env = {"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                            "OMP_NUM_THREADS": str(spec.threads_per_actor), "TOKENIZERS_PARALLELISM": "false"}}
        if spec.ray_address:
            ray.init(address=spec.ray_address, runtime_env=env, log_to_driver=False)
        else:
            ray.init(num_cpus=spec.num_cpus, include_dashboard=False, runtime_env=env, log_to_driver=False,
                     configure_logging=False)
        rows = []
        try:
            actors = make_actors(spec)
            init_s = time.monotonic() - t0
            pipes.log.info(f"ray and actors ready in {init_s:.1f}s")
            for method in spec.methods:
                rows += run_method(method, spec, prompts, pipes, actors)
            actors.kill()
        finally:
            ray.shutdown()
        result = {"spec": asdict(spec), "steps": rows, "ray_init_s": init_s, "wall_s": time.monotonic() - t0,
                  "ray_address": spec.ray_address or "local", "prompts": [p.uid for p in prompts]}
        tmp = out / ".result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1, default=str))
        os.replace(tmp, out / "result.json")
        pipes.log.info(f"rollpacker run done in {result['wall_s']:.1f}s: {len(rows)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
