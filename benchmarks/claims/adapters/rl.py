"""``run_seed`` of the RollPacker and RollArc claims, over ``benchmarks/rl_real.py`` (RollPacker, arXiv
2509.21009 §6) and ``benchmarks/rl_real_arc.py`` (RollArc, arXiv 2512.22560 §4). Both need the
warm-started scratchpad policy of the ``rl_policy`` asset (``policy``; default ``$CRUCIBLE_POLICY``,
else the default lake's ``rl_policy/policy``).

RollPacker (``rollpacker_seed``): the rl_real ``rollpacker`` section's per-seed loop for the arms of
the seed's order: the epoch ``scratchpad.problems(seed, steps x P0)`` (``train`` split), held-out
``heldout_problems(spec)`` (stream seed + 1000, ``heldout`` split), Ray actors (engine and trainer one
CPU each) started once per seed before any arm and reset to the warm-start policy before every arm.
Before any arm, one untimed warm-up rollout on the engine actor (``rl_real.warm_up``, reported as
``warmup_s``): the process's first rollout costs several seconds more than later ones, and without it
that cost fell on whichever arm came first. Per arm: ``end_to_end_s`` (sum of the steps' wall times:
rollout, rewards, training, weight sync; held-out evaluation excluded for every arm; Ray start-up
excluded for every arm and reported as ``ray_init_s``), ``accuracy_after`` (held-out pass rate at T = 1
after the last step, fraction), ``accuracy_before``, ``bubble_ratio_mean``, ``reward_mean`` (mean
training reward over the steps: 0 everywhere would mean nothing to learn from), ``trained_len_mean``
(mean tokens of the trained responses: short rounds keep the first R0 to finish, so RollPacker trains
shorter responses), ``every_prompt_trained_once`` (1/0), ``policy_sha256`` (the warm start's files, so
every log line names the policy it started from). The paper's rules are on (``RunSpec`` defaults,
recorded per arm): a verifier timeout scores 0 (``timed_out_reward`` zero; ``reward_timeout_zero``
counts them) and no round is cut by the wall clock (``wall_clock_cut`` 0: a rollout reaching
``timeout_s`` fails the seed instead).

RollArc (``rollarc_seed``): after an untimed one-step warm-up run of every arm (``warmup``), ``ops.rl.rollarc.driver.run`` on ``rl_real_arc.spec_for(seed)`` with the
methods in the seed's order, every method in one process with the same engine servers, trainer thread,
environment threads and reward process (placement ``local``: the same resources). Per arm:
``total_s`` = the method's ``setup_s`` (loading its policy and servers) + ``wall_s`` (its optimizer
steps; evaluation excluded): setup is counted for every arm alike. The environment latency is real
work, never a sleep: each checked turn runs a sandboxed Python subprocess doing ``check_work`` loop
iterations per line (``env_check_work`` in the output says how much). ``reward_mean`` is reported
beside the time so a run whose every reward is 0 (nothing learned) is visible.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _policy(policy: str) -> str:
    if not policy:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import rl_real

        policy = rl_real.POLICY
    if not (Path(policy) / "config.json").exists():
        raise FileNotFoundError(f"no warm-started policy at {policy} (config.json missing): materialize the "
                                "rl_policy asset or set CRUCIBLE_POLICY")
    return policy


def policy_sha256(policy: str) -> str:
    """sha256 of the policy folder's weight and config files (logged with every arm, so a log line
    names the warm start it started from)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(Path(policy).iterdir()):
        if f.suffix in (".safetensors", ".json", ".bin") and f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


RAY_START_ATTEMPTS = 3
"""Tries of the local Ray start per seed: Ray gives its raylet a fixed 30 s to register, which a loaded
2-core machine can miss (seen twice in development under a load average of ~35)."""


def _start_ray(ray) -> None:
    """``ops.launch.init_ray(None, 2, 1)``, tried up to ``RAY_START_ATTEMPTS`` times (``ray.shutdown``
    between tries); the last failure is raised. Start-up is excluded from every arm's time."""
    from ops.launch import init_ray

    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            init_ray(None, 2, 1)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception on a start-up timeout
            ray.shutdown()
            if attempt == RAY_START_ATTEMPTS or "timed out during startup" not in str(e):
                raise
            print(f"ray start attempt {attempt} failed ({e}); retrying", flush=True)


def rollpacker_seed(seed: int, arm_order: list[str], workdir: Path, policy: str = "", sizes: str = "full",
                    actors: str = "ray") -> dict:
    """RollPacker methods (``ops.rl.rollpacker.driver.METHODS``) for one seed, in ``arm_order``.
    ``sizes``: a key of ``rl_real.SIZES``. Raises FileNotFoundError without a policy, ValueError for an
    unknown method or sizes key."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import rl_real

    from ops.rl.policy import load_tokenizer
    from ops.rl.rollpacker.driver import METHODS, heldout_problems, load_prompts, run_method

    bad = [m for m in arm_order if m not in METHODS]
    if bad or sizes not in rl_real.SIZES:
        raise ValueError(f"rollpacker run_seed: unknown methods {bad} (known {list(METHODS)}) or sizes {sizes!r} "
                         f"(known {list(rl_real.SIZES)})")
    policy = _policy(policy)
    tok = load_tokenizer(policy)
    spec = rl_real._spec(seed, rl_real.SIZES[sizes], policy, list(arm_order))
    prompts = load_prompts(spec, tok)
    epoch = [p.uid for p in prompts]
    t0 = time.monotonic()
    if actors == "ray":
        import ray

        _start_ray(ray)
    ray_s = time.monotonic() - t0
    out = {}
    try:
        acts = rl_real._make_actors(spec, actors)
        try:
            heldout_problems(spec)                             # fails early when the split cannot be built
            warm_s = rl_real.warm_up(acts, spec, prompts)      # untimed, before every arm
            for m in arm_order:
                evals: dict = {}
                rows = run_method(m, spec, prompts, rl_real._Pipes(), acts, state=None, evals=evals)
                f = rl_real._method_figures(rows, evals.get(m, []), epoch)
                out[m] = {"end_to_end_s": f["end_to_end_s"], "accuracy_after": f["accuracy_after"],
                          "accuracy_before": f["accuracy_before"], "bubble_ratio_mean": f["bubble_ratio_mean"],
                          "max_response_len_mean": f["max_response_len_mean"], "long_rounds": f["long_rounds"],
                          "every_prompt_trained_once": int(f["every_prompt_trained_once"]), "ray_init_s": ray_s,
                          "warmup_s": warm_s, "reward_mean": f["reward_mean"], "trained_len_mean": f["trained_len_mean"],
                          "reward_timeout_zero": f["reward_timeout_zero"], "timed_out_reward": spec.timed_out_reward,
                          "wall_clock_cut": int(spec.wall_clock_cut),
                          "steps": spec.steps, "eval_size": spec.eval_size, "policy_sha256": policy_sha256(policy)}
        finally:
            acts.kill()
    finally:
        if actors == "ray":
            ray.shutdown()
    return out


WARMUP_SEED_OFFSET = 500_000
"""The warm-up run's task stream is ``seed + WARMUP_SEED_OFFSET``: never a confirmatory or development seed."""


def rollarc_seed(seed: int, arm_order: list[str], workdir: Path, policy: str = "", quick: bool = False,
                 steps: int | None = None, warmup: bool = True) -> dict:
    """RollArc methods (``rl_real_arc.METHODS``: monolithic, async0, rollarc_a1, rollarc_a2) for one
    seed, in ``arm_order``, placement ``local``. ``warmup``: first an untimed run of every arm for one
    step of the quick workload, no evaluation, on task stream ``seed + WARMUP_SEED_OFFSET`` (measured
    without it: the first arm's setup took ~10 s against ~5 s for the next ones, the process's import
    and first-call costs, which are no method's setup); ``warmup_s`` reports it. Every arm's own setup
    (its policy and servers) is still counted in its ``total_s``. Raises FileNotFoundError without a
    policy, ValueError for an unknown method."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import rl_real_arc as ra

    from dataclasses import replace

    from ops.rl.rollarc.driver import run

    bad = [m for m in arm_order if m not in ra.METHODS]
    if bad:
        raise ValueError(f"rollarc run_seed: unknown methods {bad}; known {list(ra.METHODS)}")
    policy = _policy(policy)
    warm_s = 0.0
    if warmup:
        t = time.monotonic()
        w = ra.spec_for(seed + WARMUP_SEED_OFFSET, policy, True, methods=tuple(arm_order), placement="local", steps=1)
        run(replace(w, eval_size=0).validate(), ra._QuietPipes())
        warm_s = time.monotonic() - t
    spec = ra.spec_for(seed, policy, quick, methods=tuple(arm_order), placement="local", steps=steps)
    res = run(spec, ra._QuietPipes())
    out = {}
    for m in arm_order:
        r = res["methods"][m]
        rewards = [s["reward_mean"] for s in r["steps"] if s.get("reward_mean") is not None]
        out[m] = {"total_s": r.get("setup_s", 0.0) + r["wall_s"], "wall_s": r["wall_s"], "setup_s": r.get("setup_s", 0.0),
                  "reward_mean": statistics.fmean(rewards) if rewards else None,
                  "accuracy_after": r["eval"][-1]["accuracy"] if r.get("eval") else None,
                  "trajectories_per_s": r["trajectories_per_s"], "trained_trajectories": r["trained_trajectories"],
                  "env_check_work": spec.check_work, "warmup_s": warm_s, "policy_sha256": policy_sha256(policy)}
    return out
