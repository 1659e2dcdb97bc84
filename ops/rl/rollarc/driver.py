"""The RollArc run: the monolithic synchronous baseline and RollArc on the same environments, tasks,
initial policy and number of optimizer steps. Launched by the ``rollarc_run`` asset through Dagster
Pipes (the launch protocol, ``assets.launch`` / ``ops.launch.worker_main``); it streams one message
per step and returns the result, which ``worker_main`` writes as ``result.json`` (docs/rollarc.md).

    python -m ops.rl.rollarc.driver --spec spec.json --out DIR [--fingerprint FP]

The spec (``RunSpec``, typed and nested: ``arc``, ``roles``; ``fingerprint``, ``load_spec``) lives in
``ops.rl.rollarc.spec`` (re-exported here); the real-engine benchmark over env latencies
(``run_benchmark``) in ``benchmarks/rollarc_bench.py``.

The baseline runs first, colocated in this process (``LocalRoles``); then Ray starts (local
``ray.init`` with the four pool resources, or ``ray_address``) with the disaggregated roles
(``RayRoles``) and the elastic reward pool.

Resume (``RunState``): every ``checkpoint_every`` optimizer steps of a method the driver saves,
under ``DIR/state/``, the trainer's state (``trainer-<method>-<step>.pt``: weights, AdamW state,
policy version, RNG; written by the trainer, ``ops.rl.ray_actors._TrainerImpl``) and, in
``state.json`` (the commit point, written atomically after the trainer file), the method's
``RunResult`` so far: step rows, trajectory summaries, counters and the number of tasks consumed. A
finished method is stored whole. Launched again with the same ``--out`` and spec, the driver skips
the finished methods, and for the method in progress loads the trainer state, publishes it to every
engine (versioned sync: policy version k + 1 after step k) and continues with step k + 1 on the
tasks after the consumed ones (``core.run_rollarc(start_step=...)``), logging the Dagster retry
number. Lost: the steps after the last save, and RollArc's groups in flight at the interruption
(fresh groups are generated from the next tasks). ``wall_s`` adds the launches' training seconds
(setup and lost work excluded); a resumed method's utilisation covers its last launch. A state of
another spec (``fingerprint``) is ignored; a finished launch removes its state (``result.json`` is
the record).

Task ``scratchpad`` (the result contract of the RL drivers): every group is a ``checked_subtraction``
episode (``envs.CheckedSubtraction``) on ``ops.rl.scratchpad.problems(task_seed, ...)``; with
``eval_size`` the trainer's held-out accuracy (``_TrainerImpl.heldout``) is measured before, every
``eval_every`` steps and after each method, never inside its times. The result adds ``task``,
``eval`` ({method: [{step, train_wall_s, accuracy, n, policy_version}, ...]}), ``response_lengths``
({method: response tokens of every trained trajectory, in order}), ``budget`` (the processes and
threads of the methods, ``placement``) and ``speedup_vs_monolithic`` ({method: x}).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from ops.launch import DriverState
from ops.rl.runs import read_problems, resume_state

from .spec import (DEFAULT_METHODS, ENVS, METHODS, PLACEMENTS, TASKS, RunSpec,  # noqa: F401 (re-exported)
                   fingerprint, load_spec)

CRASH_ENV = "CRUCIBLE_ROLLARC_CRASH_AFTER_STEPS"
"""Fault injection (tests): ``N`` makes the driver SIGKILL its process group (itself and a local Ray
instance: the launch, as a node preemption would) right after the first save that holds N or more
steps of the run (finished methods' steps included). Counted over the whole run: a relaunch whose
saved state already holds N steps is not killed again (``ops.rl.runs.crash_if_asked``)."""


class RunState(DriverState):
    """What one run directory has saved (see the module docstring).

    Layout: ``<out>/state/state.json`` (fingerprint, finished methods, the method in progress,
    resumes, seconds spent saving) and ``trainer-<method>-<step>.pt`` of the last saved step.

    Attributes:
        done: {method: its result dict (``RunResult.to_dict`` + utilisation, setup_s)}, finished methods.
        current: the method in progress (``method``, ``step`` saved last, ``version``, ``trainer``
            file name, ``result``: ``RunResult.to_dict`` after that step) or None.
        resumes: one dict per resume (method, after_step, policy_version, steps_done, retry_number).
        skipped: why a state on disk was ignored (None: it was not). seconds: time spent saving, over
            every launch.
    """

    FIELDS = {"done": {}, "current": None}

    @property
    def steps_done(self) -> int:
        """Optimizer steps of the run the state holds (finished methods and the saved part of the
        method in progress)."""
        cur = len(self.current["result"]["steps"]) if self.current else 0
        return sum(len(r["steps"]) for r in self.done.values()) + cur

    def _commit(self, t: float) -> None:
        self.commit(t, {self.current["trainer"]} if self.current else set())

    async def save_step(self, method: str, result: dict, roles, timeout_s: float) -> int:
        """Record ``method`` in progress after the last step of ``result`` (``RunResult.to_dict``,
        snapshot when the step ended): the trainer state through ``roles.save_checkpoint`` (bounded
        by ``timeout_s``), then ``state.json``. Returns ``steps_done``. Raises RuntimeError when the
        trainer's version is not the number of steps trained."""
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        k = result["steps"][-1]["step"]
        name = f"trainer-{method}-{k}.pt"
        version = await asyncio.wait_for(roles.save_checkpoint(str(self.dir / name)), timeout_s)
        if version != k + 1:
            raise RuntimeError(f"{method}: the trainer holds policy version {version} after step {k} (expected {k + 1})")
        self.current = {"method": method, "step": k, "version": version, "trainer": name, "result": result}
        self._commit(t)
        return self.steps_done

    def save_done(self, method: str, result: dict) -> int:
        """Record ``method`` as finished with its whole result dict. Returns ``steps_done``."""
        t = time.monotonic()
        self.done[method] = result
        self.current = None
        self._commit(t)
        return self.steps_done


def crash_if_asked(count: int, loaded: int, log: Callable[[str], None]) -> None:
    """Fault injection: SIGKILL this process group when ``CRASH_ENV`` = N with ``loaded`` < N <=
    ``count`` (steps saved now; ``loaded``: steps the state held when this launch started;
    ``ops.rl.runs.crash_if_asked``). Raises ValueError when the variable is not an integer."""
    from ops.rl.runs import crash_if_asked as crash

    crash(CRASH_ENV, count, loaded, log)


def tool_math_problems(df):
    """The rows of a problems table that ToolMath uses: a non-empty answer, a problem under 600
    characters, numeric answer type (when the column exists). Polars in, Polars out."""
    import polars as pl

    df = df.filter(pl.col("answer").is_not_null() & (pl.col("answer").str.strip_chars() != "")
                   & (pl.col("problem").str.len_chars() < 600))
    if "answer_type" in df.columns:
        df = df.filter(pl.col("answer_type") == "numeric")
    return df


def tool_math_rows(spec: RunSpec) -> list[dict]:
    """The ToolMath problems of a run, in its seeded order (empty when ``tool_math`` is not one of
    its environments). The asset calls it before launching, so that an unusable table fails before
    a launch and a run folder. Raises FileNotFoundError / ValueError naming the file: missing, lacks
    columns, no numeric problem."""
    if spec.task != "curated" or "tool_math" not in spec.envs:
        return []
    df = read_problems(spec.problems_path)
    rows = tool_math_problems(df).sort("problem_id").to_dicts()
    if not rows:
        raise ValueError(f"problems table {spec.problems_path} has no numeric problem for the tool_math environment "
                         f"({df.height} rows); use envs ['frozenlake'] or curate more problems")
    random.Random(spec.seed).shuffle(rows)
    return rows


def load_tasks(spec: RunSpec) -> list:
    """One task per group of the run (enough for the baseline's steps x G and RollArc's look-ahead),
    environments round-robin: FrozenLake maps by seed, ToolMath problems with numeric answers from
    the curated problems table (``tool_math_rows``)."""
    from .types import Task

    cfg = spec.arc_config
    n = (cfg.steps + 2 * (max(cfg.async_ratio, 2) + 2)) * cfg.groups_per_step * 4
    if spec.task == "scratchpad":
        from ops.rl import scratchpad as sp

        return [Task(uid=p.uid, env="checked_subtraction",
                     spec={"a": p.a, "n": p.n, "answer": p.answer, "answer_type": "numeric", "check_work": spec.check_work})
                for p in sp.problems(spec.task_seed, n, spec.max_lines)]
    math_rows = tool_math_rows(spec)
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


def _progress(pipes, method: str, steps: int, t0: float, start_step: int = 0):
    def on_step(row: dict) -> None:
        done = row["step"] + 1
        el = time.monotonic() - t0
        eta = el / (done - start_step) * (steps - done)
        msg = {k: row[k] for k in ("step", "max_staleness", "wait_s", "train_s", "reward_mean", "failed_rewards",
                                   "trajectories", "loss") if k in row}
        pipes.report_custom_message({"method": method, **msg})
        pipes.log.info(f"{method}: step {done}/{steps}, {(done - start_step) / el:.3f} steps/s, ETA {eta:.0f} s; staleness "
                       f"{row['staleness']}, wait {row['wait_s']:.1f}s, train {row['train_s']:.1f}s, "
                       f"reward {row['reward_mean']}, statuses {row['statuses']}")
    return on_step


def run_method(method: str, spec: RunSpec, tasks: list, tok, pipes, state: Optional[RunState] = None,
               on_saved: Optional[Callable[[int], None]] = None, eval_cache: Optional[dict] = None) -> dict:
    """One method, from the initial policy or, when ``state`` holds it in progress, after its last
    saved step: trainer state loaded, ``publish(k + 1)`` to every engine, the saved RunResult
    continued on the tasks after the consumed ones. With ``state``, the trainer state and the
    RunResult are saved every ``spec.checkpoint_every`` steps (not after the last step: the finished
    method is saved whole), then ``on_saved(steps saved over the run)``.

    With ``spec.eval_size``, the trainer's held-out accuracy before the first step (reused from
    ``eval_cache`` when an earlier method of the run measured it: every method starts from the same
    policy and the evaluation is seeded), every ``eval_every`` steps and after the last; evaluation
    seconds are excluded from ``wall_s`` and every ``train_wall_s``.

    Returns ``RunResult.to_dict()`` plus ``utilisation`` (of this launch), ``setup_s`` (actors /
    Serve start, outside ``wall_s``), ``async_ratio``, ``eval`` (entries as in the result contract),
    ``eval_s`` (mid-run evaluation seconds taken out of ``wall_s``). Raises RollArcError (see ``core``), RuntimeError when the
    saved trainer's version does not match the saved steps, FileNotFoundError naming a missing
    trainer file."""
    from .core import RunResult, run_rollarc
    from .monolithic import run_monolithic
    from .local_roles import LocalRoles
    from .ray_roles import RayRoles

    cfg, rs = spec.method_config(method), spec.role_spec
    cur = state.current if state is not None and state.current and state.current["method"] == method else None
    res = RunResult.from_dict(cur["result"]) if cur else RunResult(method=method, config=asdict(cfg))
    start, wall0 = len(res.steps), res.wall_s
    t0 = time.monotonic()
    if needs_ray(spec, method):
        roles = RayRoles(rs, tok).start()
    else:
        roles = LocalRoles(rs, tok, serve=spec.placement == "local")
    setup_s = time.monotonic() - t0
    pipes.log.info(f"{method}: roles ready in {setup_s:.1f}s ({type(roles).__name__}, placement {spec.placement}, "
                   f"async_ratio {cfg.async_ratio})")
    probs = spec.eval_problems()
    evals: list = list(cur["result"].get("eval", [])) if cur else []
    ev = {"s": 0.0}                                     # seconds of evaluation inside the method's clock

    async def evaluate(step: int, wall_so_far: float) -> float:
        te = time.monotonic()
        r = await asyncio.wait_for(roles.heldout(probs, spec.eval_temperature, 256, spec.task_seed), cfg.train_timeout_s)
        evals.append({"step": step, "train_wall_s": max(0.0, wall_so_far), "accuracy": r["accuracy"], "n": r["n"],
                      "policy_version": r["policy_version"], "by_lines": r.get("by_lines"), "mean_len": r.get("mean_len")})
        pipes.log.info(f"{method}: held-out accuracy {r['accuracy']:.3f} (n {r['n']}) after {step} steps, "
                       f"policy version {r['policy_version']} ({time.monotonic() - te:.1f}s, not timed)")
        return time.monotonic() - te

    async def go():
        if probs and not cur:                          # before the method's clock starts
            if eval_cache is not None and "step0" in eval_cache:
                evals.append(dict(eval_cache["step0"]))
            else:
                await evaluate(0, 0.0)
                if eval_cache is not None:
                    eval_cache["step0"] = dict(evals[-1])
        if cur:
            path = str(state.dir / cur["trainer"])
            version = await asyncio.wait_for(roles.load_checkpoint(path), cfg.train_timeout_s)
            if version != start:
                raise RuntimeError(f"{method}: {path} holds policy version {version}, the saved run has {start} steps")
            await asyncio.wait_for(roles.publish(version), cfg.train_timeout_s)
            retry = getattr(pipes, "retry_number", None)
            state.resumes.append({"method": method, "after_step": cur["step"], "policy_version": version,
                                  "steps_done": state.steps_done, "retry_number": retry})
            pipes.log.info(f"{method}: resuming after step {cur['step']} (policy version {version} published to the "
                           f"engines) on Dagster retry {'n/a' if retry is None else retry}")
            pipes.log.info(f"{method}: {state.steps_done} of {len(spec.methods) * cfg.steps} steps of the run done; "
                           f"continuing with task {res.tasks_consumed} of {len(tasks)}"
                           + (" (groups in flight at the interruption are lost)" if method == "rollarc" else ""))
        progress = _progress(pipes, method, cfg.steps, time.monotonic(), start)

        def on_step(row: dict):
            progress(row)
            k = row["step"]
            mid_eval = bool(probs and spec.eval_every and k < cfg.steps - 1 and (k + 1) % spec.eval_every == 0)
            save_now = not (state is None or k >= cfg.steps - 1 or (k + 1) % spec.checkpoint_every)
            if not (mid_eval or save_now):
                return None
            wall_now = res.wall_s - ev["s"]

            async def after():
                if mid_eval:
                    ev["s"] += await evaluate(k + 1, wall_now)
                if save_now:
                    snapshot = res.to_dict()
                    snapshot["eval"] = list(evals)
                    snapshot["wall_s"] -= ev["s"]
                    n = await state.save_step(method, snapshot, roles, cfg.train_timeout_s)
                    if on_saved:
                        on_saved(n)
            return after()

        it = iter(tasks[res.tasks_consumed:])
        if method == "monolithic":
            return await run_monolithic(roles, cfg, it, on_step=on_step, start_step=start, result=res)
        return await run_rollarc(roles, cfg, it, on_step=on_step, start_step=start, result=res, method=method)

    async def go_and_eval():
        await go()
        res.wall_s -= ev["s"]                          # evaluation never counts in a method's time
        if probs:
            await evaluate(cfg.steps, res.wall_s)

    try:
        asyncio.run(go_and_eval())
        out = res.to_dict()
        out["utilisation"] = roles.utilisation(res.wall_s - wall0)
    finally:
        roles.close()
    out["setup_s"] = setup_s
    out["async_ratio"] = None if method == "monolithic" else cfg.async_ratio
    out["eval"] = evals
    out["eval_s"] = ev["s"]
    if state is not None:
        n = state.save_done(method, out)
        if on_saved:
            on_saved(n)
    return out


def needs_ray(spec: RunSpec, method: str) -> bool:
    """Whether ``method``'s roles are Ray actors under ``spec.placement``."""
    return spec.placement == "ray" or (spec.placement == "split" and method != "monolithic")


def init_ray(spec: RunSpec) -> None:
    """Ray for the RollArc roles: the local node advertises the four pools (``pool_resources``)."""
    from ops.launch import init_ray as start_ray

    from .ray_roles import pool_resources

    rs = spec.role_spec
    start_ray(spec.ray_address, spec.num_cpus, rs.threads,
              resources=pool_resources(rs.engines, rs.env_workers, rs.reward_autoscaling.max_replicas))


def run(spec: RunSpec, pipes, state: Optional[RunState] = None,
        on_saved: Optional[Callable[[int], None]] = None) -> dict:
    """Every method of ``spec`` on the same tasks; with ``state`` (loaded), saving as it goes and
    resuming: methods it holds as done are skipped (their saved results kept), the one in progress
    continues (``run_method``). Returns the result dict (see ``main``)."""
    from ops.rl.policy import load_tokenizer

    t0 = time.monotonic()
    tok = load_tokenizer(spec.tokenizer_dir)
    tasks = load_tasks(spec)
    results, ray_init_s, eval_cache = {}, None, {}
    for method in spec.methods:
        if state is not None and method in state.done:
            results[method] = state.done[method]
            pipes.log.info(f"{method}: finished before this launch ({len(results[method]['steps'])} steps), skipped")
            if not any(r.get("method") == method for r in state.resumes):
                state.resumes.append({"method": method, "skipped": True, "steps_done": len(results[method]["steps"]),
                                      "retry_number": getattr(pipes, "retry_number", None)})
            continue
        if needs_ray(spec, method):
            import ray

            from ray import serve

            ti = time.monotonic()
            init_ray(spec)
            ray_init_s = (ray_init_s or 0.0) + time.monotonic() - ti
            try:
                results[method] = run_method(method, spec, tasks, tok, pipes, state, on_saved, eval_cache)
            finally:
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
        else:
            results[method] = run_method(method, spec, tasks, tok, pipes, state, on_saved, eval_cache)
    out = {"spec": asdict(spec), "methods": results, "ray_init_s": ray_init_s, "wall_s": time.monotonic() - t0,
           "ray_address": spec.ray_address or "local", "task": spec.task,
           "eval": {m: r.get("eval", []) for m, r in results.items()},
           "response_lengths": {m: [t["response_tokens"] for t in r["trajectories"]] for m, r in results.items()},
           "weight_syncs": {m: (r.get("utilisation") or {}).get("weight_syncs") for m, r in results.items()
                            if (r.get("utilisation") or {}).get("weight_syncs")},
           "budget": budget(spec)}
    if "monolithic" in results:
        b = results["monolithic"]["wall_s"]
        out["speedup_vs_monolithic"] = {m: (b / r["wall_s"] if r["wall_s"] > 0 else None)
                                        for m, r in results.items() if m != "monolithic"}
    if state is not None:
        out.update(fingerprint=state.fp, retry_number=getattr(pipes, "retry_number", None), resumes=state.resumes,
                   state_save_s=state.seconds)
    if "monolithic" in results and "rollarc" in results:
        a, b = results["rollarc"], results["monolithic"]
        out["speedup_e2e"] = b["wall_s"] / a["wall_s"] if a["wall_s"] > 0 else None
        # with each method's start-up (RollArc: Ray, Serve and the actors; the baseline: loading the policy)
        tot_a, tot_b = a["wall_s"] + a.get("setup_s", 0.0) + (ray_init_s or 0.0), b["wall_s"] + b.get("setup_s", 0.0)
        out["speedup_incl_setup"] = tot_b / tot_a if tot_a > 0 else None
        out["speedup_trajectories_per_s"] = (a["trajectories_per_s"] / b["trajectories_per_s"]
                                             if b["trajectories_per_s"] > 0 else None)
    return out


def budget(spec: RunSpec) -> str:
    """The processes and threads each method of ``spec`` runs on, in words."""
    rs = spec.role_spec
    n_eng = sum(rs.engines.values())
    if spec.placement == "local":
        return (f"every method: one process (this one) with {n_eng} engine servers ({rs.engines}, dynamic batching "
                f"up to {rs.max_batch}, one generation thread each), the trainer on a thread of it, torch intra-op "
                f"threads {rs.threads} (process-wide), environment steps on threads (each check one sandboxed "
                f"subprocess), one reward verifier process")
    if spec.placement == "ray":
        return (f"every method: Ray actors — {n_eng} engines ({rs.engines}, {rs.threads} torch threads each), one "
                f"trainer actor ({rs.trainer_threads} threads) on gpu_compute, {rs.env_workers} env worker(s), reward "
                f"pool {rs.reward_autoscaling.min_replicas}-{rs.reward_autoscaling.max_replicas} replicas; "
                f"Ray CPUs {spec.num_cpus}")
    return (f"split: monolithic colocated in one process (one engine, in-process trainer); the others on Ray "
            f"({n_eng} engines, trainer actor, {rs.env_workers} env worker(s), reward pool) — not an equal budget")


def run_launched(spec: RunSpec, out: Path, fp: str, pipes) -> dict:
    """The launched run (the ``run`` of ``ops.launch.worker_main``): ``run`` resuming from the state
    saved under ``out`` (``RunState``); ``worker_main`` removes that state once ``result.json`` is written.
    Returns the result dict (see ``run``)."""
    state = resume_state(RunState(out, fingerprint(spec)), pipes.log)
    loaded = state.steps_done
    result = run(spec, pipes, state, on_saved=lambda n: crash_if_asked(n, loaded, pipes.log.info))
    e2e = result.get("speedup_e2e")
    pipes.log.info(f"rollarc run done in {result['wall_s']:.1f}s" + ("" if e2e is None else
                   f"; monolithic/rollarc wall-clock ratio over every step, the cold first one included: {e2e:.3f} "
                   "(the asset's run_speedup_* leaves each method's first step out)"))
    return result


def main(argv: Optional[list[str]] = None) -> int:
    from ops.launch import worker_main

    return worker_main(load_spec, run_launched, argv, description=__doc__, scratch=("state",))


if __name__ == "__main__":
    sys.exit(main())
