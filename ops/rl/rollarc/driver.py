"""The RollArc run: the monolithic synchronous baseline and RollArc on the same environments, tasks,
initial policy and number of optimizer steps. Launched by the ``rollarc_run`` asset through Dagster
Pipes; streams one message per step and writes ``result.json``.

    python -m ops.rl.rollarc.driver --spec spec.json --out DIR

The baseline runs first, colocated in this process (``LocalRoles``); then Ray starts (local
``ray.init`` with the four pool resources, or ``ray_address``) with the disaggregated roles
(``RayRoles``) and the elastic reward pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

METHODS = ("monolithic", "rollarc")


@dataclass
class RunSpec:
    """Everything a run needs (JSON-serialisable). ``arc``: ``core.ArcConfig`` fields; ``roles``:
    ``ray_roles.RoleSpec`` fields; ``envs``: environments mixed round-robin over groups."""

    problems_path: str
    tokenizer_dir: str
    model_dir: Optional[str] = None
    methods: list = field(default_factory=lambda: list(METHODS))
    envs: list = field(default_factory=lambda: ["frozenlake", "tool_math"])
    arc: dict = field(default_factory=dict)
    roles: dict = field(default_factory=dict)
    frozenlake_size: int = 4
    seed: int = 0
    ray_address: Optional[str] = None
    num_cpus: int = 2

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def arc_config(self):
        from .core import ArcConfig

        return ArcConfig(**self.arc)

    def role_spec(self):
        from .ray_roles import RoleSpec

        return RoleSpec(tokenizer_dir=self.tokenizer_dir, model_dir=self.model_dir, seed=self.seed, **self.roles)

    def validate(self) -> "RunSpec":
        """Raises ValueError naming the field."""
        from .envs import ENV_NAMES

        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"rollarc.methods must be a non-empty subset of {list(METHODS)}, got {self.methods}")
        bad = [e for e in self.envs if e not in ENV_NAMES]
        if bad or not self.envs:
            raise ValueError(f"rollarc.envs must be a non-empty subset of {list(ENV_NAMES)}, got {self.envs}")
        self.arc_config()
        rs = self.role_spec()
        if rs.route_policy not in ("affinity", "uniform"):
            raise ValueError(f"rollarc.route_policy must be 'affinity' or 'uniform', got {rs.route_policy!r}")
        if rs.env_latency not in ("none", "low", "medium", "heavy"):
            raise ValueError(f"rollarc.env_latency must be none|low|medium|heavy, got {rs.env_latency!r}")
        if sum(rs.engines.values()) < 1 or any(p not in ("gpu_compute", "gpu_bandwidth") for p in rs.engines):
            raise ValueError(f"rollarc.engines must map gpu_compute/gpu_bandwidth to counts (>= 1 in all), got {rs.engines}")
        return self


def load_tasks(spec: RunSpec) -> list:
    """One task per group of the run (enough for the baseline's steps x G and RollArc's look-ahead),
    environments round-robin: FrozenLake maps by seed, ToolMath problems with numeric answers from
    the curated problems table (seeded order)."""
    import polars as pl

    from .types import Task

    cfg = spec.arc_config()
    n = (cfg.steps + 2 * (cfg.async_ratio + 2)) * cfg.groups_per_step * 4
    math_rows: list = []
    if "tool_math" in spec.envs:
        p = Path(spec.problems_path)
        if not p.exists():
            raise FileNotFoundError(f"problems table {p} does not exist: materialize decontaminated_problems first")
        df = pl.read_parquet(p)
        need = {"problem_id", "problem", "answer"}
        if not need <= set(df.columns):
            raise ValueError(f"problems table {p} lacks columns {sorted(need - set(df.columns))}")
        df = df.filter(pl.col("answer").is_not_null() & (pl.col("answer").str.strip_chars() != "")
                       & (pl.col("problem").str.len_chars() < 600))
        if "answer_type" in df.columns:
            df = df.filter(pl.col("answer_type") == "numeric")
        math_rows = df.sort("problem_id").to_dicts()
        random.Random(spec.seed).shuffle(math_rows)
        if not math_rows:
            raise ValueError(f"problems table {p} has no numeric problem for tool_math")
    out = []
    for i in range(n):
        env = spec.envs[i % len(spec.envs)]
        if env == "frozenlake":
            out.append(Task(uid=f"lake{spec.seed}-{i}", env=env, spec={"map_seed": spec.seed * 10_007 + i, "size": spec.frozenlake_size}))
        else:
            r = math_rows[i % len(math_rows)]
            out.append(Task(uid=str(r["problem_id"]), env=env,
                            spec={"problem": r["problem"], "answer": r["answer"], "solution": r.get("solution"),
                                  "answer_type": r.get("answer_type") or "numeric"}))
    return out


def _progress(pipes, method: str, steps: int, t0: float):
    def on_step(row: dict) -> None:
        done = row["step"] + 1
        el = time.monotonic() - t0
        eta = el / done * (steps - done)
        msg = {k: row[k] for k in ("step", "max_staleness", "wait_s", "train_s", "reward_mean", "failed_rewards",
                                   "trajectories", "loss") if k in row}
        pipes.report_custom_message({"method": method, **msg})
        pipes.log.info(f"{method}: step {done}/{steps}, {done / el:.3f} steps/s, ETA {eta:.0f} s; staleness "
                       f"{row['staleness']}, wait {row['wait_s']:.1f}s, train {row['train_s']:.1f}s, "
                       f"reward {row['reward_mean']}, statuses {row['statuses']}")
    return on_step


def run_method(method: str, spec: RunSpec, tasks: list, tok, pipes) -> dict:
    """One method from the initial policy. Returns ``RunResult.to_dict()`` plus ``utilisation``,
    ``setup_s`` (actors / Serve start, outside ``wall_s``)."""
    from .core import run_monolithic, run_rollarc
    from .ray_roles import LocalRoles, RayRoles

    cfg, rs = spec.arc_config(), spec.role_spec()
    t0 = time.monotonic()
    roles = LocalRoles(rs, tok) if method == "monolithic" else RayRoles(rs, tok).start()
    setup_s = time.monotonic() - t0
    pipes.log.info(f"{method}: roles ready in {setup_s:.1f}s")
    try:
        fn = run_monolithic if method == "monolithic" else run_rollarc
        res = asyncio.run(fn(roles, cfg, iter(tasks), on_step=_progress(pipes, method, cfg.steps, time.monotonic())))
        out = res.to_dict()
        out["utilisation"] = roles.utilisation(res.wall_s)
    finally:
        roles.close()
    out["setup_s"] = setup_s
    return out


def init_ray(spec: RunSpec) -> None:
    import ray

    from .ray_roles import pool_resources

    root = str(Path(__file__).resolve().parents[3])
    rs = spec.role_spec()
    env = {"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "OMP_NUM_THREADS": str(rs.threads), "TOKENIZERS_PARALLELISM": "false"}}
    if spec.ray_address:
        ray.init(address=spec.ray_address, runtime_env=env, log_to_driver=False)
    else:
        ray.init(num_cpus=spec.num_cpus, resources=pool_resources(rs.engines, rs.env_workers, rs.reward_max_replicas),
                 include_dashboard=False, runtime_env=env, log_to_driver=False, configure_logging=False)


def run(spec: RunSpec, pipes) -> dict:
    """Every method of ``spec`` on the same tasks. Returns the result dict (see ``main``)."""
    from ops.rl.policy import load_tokenizer

    t0 = time.monotonic()
    tok = load_tokenizer(spec.tokenizer_dir)
    tasks = load_tasks(spec)
    results, ray_init_s = {}, None
    for method in spec.methods:
        if method == "rollarc":
            import ray

            from ray import serve

            ti = time.monotonic()
            init_ray(spec)
            ray_init_s = time.monotonic() - ti
            try:
                results[method] = run_method(method, spec, tasks, tok, pipes)
            finally:
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
        else:
            results[method] = run_method(method, spec, tasks, tok, pipes)
    out = {"spec": asdict(spec), "methods": results, "ray_init_s": ray_init_s, "wall_s": time.monotonic() - t0,
           "ray_address": spec.ray_address or "local"}
    if "monolithic" in results and "rollarc" in results:
        a, b = results["rollarc"], results["monolithic"]
        out["speedup_e2e"] = b["wall_s"] / a["wall_s"] if a["wall_s"] > 0 else None
        out["speedup_trajectories_per_s"] = (a["trajectories_per_s"] / b["trajectories_per_s"]
                                             if b["trajectories_per_s"] > 0 else None)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    spec = RunSpec(**json.loads(Path(args.spec).read_text())).validate()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from ops.launch import rank0_pipes

    with rank0_pipes() as pipes:
        result = run(spec, pipes)
        tmp = out / ".result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1, default=str))
        os.replace(tmp, out / "result.json")
        pipes.log.info(f"rollarc run done in {result['wall_s']:.1f}s; speedup {result.get('speedup_e2e')}")
    return 0


def run_benchmark(problems_path: str, tokenizer_dir: str, model_dir: Optional[str], kinds=("low", "medium", "heavy"),
                  arc: Optional[dict] = None, roles: Optional[dict] = None, seed: int = 0) -> dict:
    """The real-engine benchmark: for each env latency kind, the baseline and RollArc on the same
    tasks and steps (one Ray start per kind). Returns {"settings", kind: {summary rows per method,
    per-pool utilisation, speedups}} (no per-trajectory rows)."""
    from ops.launch import _LocalPipes

    from .report import summary_rows, utilisation_rows

    arc = {"steps": 4, "groups_per_step": 2, "group_size": 3, "redundancy": 1, "async_ratio": 1, "max_turns": 3,
           **(arc or {})}
    roles = {"env_latency_mean_s": 0.5, **(roles or {})}
    out: dict = {"settings": {"arc": arc, "roles": roles, "policy": model_dir or "tiny random Llama", "seed": seed}}
    for kind in kinds:
        spec = RunSpec(problems_path=problems_path, tokenizer_dir=tokenizer_dir, model_dir=model_dir, seed=seed,
                       arc=dict(arc), roles={**roles, "env_latency": kind}).validate()
        r = run(spec, _LocalPipes(0))
        out[kind] = {"summary": summary_rows(r), "utilisation": utilisation_rows(r), "speedup_e2e": r.get("speedup_e2e"),
                     "speedup_trajectories_per_s": r.get("speedup_trajectories_per_s"), "ray_init_s": r["ray_init_s"]}
    return out


if __name__ == "__main__":
    sys.exit(main())
