"""The RollPacker run: baseline and tail batching, a few GRPO steps each on the same prompts and the
same initial policy, on Ray (local ``ray.init(num_cpus=...)`` by default, ``--address`` in
production). Launched by the ``rollpacker_run`` asset through Dagster Pipes (the launch protocol,
``assets.launch`` / ``ops.launch.worker_main``); it streams one message per step and returns the
result, which ``worker_main`` writes as ``result.json`` (docs/rollpacker.md).

    python -m ops.rl.rollpacker.driver --spec spec.json --out DIR [--fingerprint FP]

spec.json (``RunSpec.to_json``): methods, P0, R0, eta, steps, max_new_tokens, timeouts, the policy
(``ops.rl.runs.PolicySpec``: a model directory, or the tiny random policy with ``tokenizer_dir``;
learning rate, temperature, seed), the problems file, reward settings, Ray address and CPUs.

Resume (``RunState``): after every completed GRPO step the driver saves, under ``DIR/state/``, the
finished step rows, the tail-batching planner's position (fresh prompts, long-prompt queue, step)
and, through the actors, the trainer's state (policy weights, optimizer state, policy version,
RNG) and the engine's sampling RNG; ``state.json`` is the commit point (written atomically after
the tensor files). Launched again with the same ``--out`` and spec, the driver skips the methods
that finished, and for the method in progress loads the trainer state, publishes its weights to
the engine (versioned sync) and continues with the next step; it logs the Dagster retry number.
Work of a step that had not finished is lost. A state of a different spec (``fingerprint``) is
ignored. A finished launch removes its state (``result.json`` is the record). Progress lines
(steps done / total, rate, ETA) go to the run view after every step.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ops.launch import DriverState
from ops.lm.spec import JsonSpec
from ops.rl.grpo import GRPOConfig
from ops.rl.rollpacker.loop import TIMED_OUT_REWARD
from ops.rl.runs import PolicySpec, read_problems, resume_state

CRASH_ENV = "CRUCIBLE_ROLLPACKER_CRASH_AFTER_STEPS"
"""Fault injection (tests): ``N`` makes the driver SIGKILL its process group (itself and a local Ray
instance; the launch, as a node preemption would) right after saving the run's N-th step. Counted
over the whole run, so the relaunch, which resumes past step N, is not killed again
(``ops.rl.runs.crash_if_asked``)."""

TASKS = {
    "curated": "problems_path (decontaminated_problems) as chat prompts of the policy's tokenizer",
    "scratchpad": "ops.rl.scratchpad.problems(task_seed, steps x P0): remainder by repeated subtraction",
}
"""``RunSpec.task``: where the epoch's prompts come from (docs/rollpacker.md)."""

METHODS = {
    # name: (tail batching, reward scheduler, stream trainer)
    "baseline": (False, False, False),
    "rollpacker": (True, True, True),
    "tail_batching": (True, False, False),
    "tail_batching+reward": (True, True, False),
}


@dataclass
class RunSpec(PolicySpec, JsonSpec):
    """Everything a run needs (JSON-serialisable): the policy (``PolicySpec``: tokenizer_dir,
    model_dir, lr, temperature, seed, threads per actor, reward timeout and retries), the problems
    file, the methods and their sizes. The ``rollpacker_run`` asset's Launchpad config mirrors it.
    ``validate`` is the one check, run by the asset and by the launched driver (``load_spec``); JSON
    in and out through ``ops.lm.spec.JsonSpec``, as every stage's spec."""

    problems_path: str = ""
    """The curated problems table (``decontaminated_problems``); required with task ``curated``."""
    methods: list[str] = field(default_factory=lambda: ["baseline", "rollpacker"])
    """Subset of baseline | tail_batching | tail_batching+reward | rollpacker (tail batching + reward
    scheduler + stream trainer)."""
    prompts_per_step: int = 2
    """P0: prompts per step."""
    responses_per_prompt: int = 4
    """R0: responses per prompt (the GRPO group)."""
    eta: float = 1.25
    """Short-round over-provisioning (paper: 1.25)."""
    steps: int = 2
    """GRPO steps per method (with eta 1.25 and P0 2: a short round, then a long round)."""
    max_new_tokens: int = 48
    """Response budget per rollout response and per held-out response (tokens, >= 1)."""
    timeout_s: float = 120.0
    """Wall-clock limit of one rollout."""
    max_prompt_tokens: int = 200
    """Context kept per curated chat prompt (tokens; the problem is left-truncated to fit)."""
    max_failed_fraction: float = 0.25
    """A step fails when more than this fraction of its rewards could not be computed."""
    reward_workers: int = 1
    """Verifier processes of the reward actor (``ops.rl.reward.RewardScorer``, >= 1)."""
    ray_address: Optional[str] = None
    """Ray cluster to connect to (``auto`` inside a Ray Job); None = a local instance with num_cpus CPUs."""
    num_cpus: int = 2
    """CPUs of the local Ray instance (ignored with compute.ray_address)."""
    task: str = "curated"
    """Where the epoch's prompts come from (``TASKS``): ``curated`` | ``scratchpad``."""
    task_seed: int = 0
    """Scratchpad only: seed of the epoch's problem stream (scratchpad ``train`` split; held-out problems:
    ``problems(task_seed + 1000, eval_size, split="heldout")``, disjoint from it by prompt text)."""
    eval_size: int = 0
    """Scratchpad only: held-out problems scored by the trainer's policy (>= 0; 0 = no evaluation)."""
    eval_every: int = 0
    """Scratchpad only: GRPO steps between held-out evaluations (>= 0; 0 = before and after only)."""
    eval_temperature: float = 1.0
    """Scratchpad only: temperature of the held-out evaluation (0 = greedy)."""
    grpo_agg: str = GRPOConfig.agg
    """GRPO loss aggregation (``ops.rl.grpo``; veRL's names): seq-mean-token-mean (GRPO: mean over responses of
    each response's token mean), seq-mean-token-sum, or token-mean (DAPO)."""
    grpo_scale: str = GRPOConfig.scale
    """GRPO advantage scaling: std (divide by the group's reward std; GRPO) or none (centre only; Dr. GRPO)."""
    grpo_clip_eps: float = GRPOConfig.clip_eps
    """PPO clip range eps of the GRPO loss, in (0, 1)."""
    grpo_kl_coef: float = GRPOConfig.kl_coef
    """beta of the k3 KL penalty to the initial policy (>= 0; 0 = off; > 0 keeps a frozen copy in the trainer)."""
    timed_out_reward: str = "zero"
    """What a verifier timeout scores (``loop.TIMED_OUT_REWARD``): ``zero`` (the paper, §4.2-4.3: reward 0) or
    ``mask`` (the shared RL core's rule: no score, masked out of its group)."""
    wall_clock_cut: bool = False
    """False (the paper: long rounds run to full length): a rollout reaching ``timeout_s`` fails the step
    instead of training responses cut by the clock; True: ``timeout`` responses are trained as finished."""

    GRPO = {"agg": "grpo_agg", "scale": "grpo_scale", "clip_eps": "grpo_clip_eps", "kl_coef": "grpo_kl_coef"}
    """``GRPOConfig`` field -> RunSpec field of the trainer's ``grpo`` section (RollArc's spec nests a
    ``GRPOConfig`` under ``roles.grpo``; this flat spec keeps four ``grpo_*`` fields)."""

    def grpo_section(self) -> dict:
        """The trainer spec's ``grpo`` section: the GRPO settings that differ from ``GRPOConfig``'s
        defaults (``_TrainerImpl`` builds its ``GRPOConfig`` from it, as RollArc's trainer does)."""
        return {k: getattr(self, f) for k, f in self.GRPO.items() if getattr(self, f) != getattr(GRPOConfig, k)}

    def grpo_config(self) -> GRPOConfig:
        """The run's ``GRPOConfig`` (advantages in the driver, loss in the trainer). Raises ValueError
        naming the field (``rollpacker.grpo_<field>``)."""
        try:
            return GRPOConfig(**self.grpo_section())
        except ValueError as e:
            field_name = str(e).split()[0].removeprefix("grpo.")
            raise ValueError(f"rollpacker.grpo_{field_name}: {str(e).removeprefix('grpo.' + field_name + ' ')}") from None

    def policy(self) -> dict:
        """``PolicySpec.policy`` plus the trainer's ``grpo`` section (``grpo_section``)."""
        return {**super().policy(), "grpo": self.grpo_section()}

    def validate(self) -> "RunSpec":
        """Returns the spec; raises ValueError naming the field (``tail_batching.eta``,
        ``rollpacker.methods``, ``rollpacker.steps``, ...)."""
        from .scheduler import TailBatching

        TailBatching(self.prompts_per_step, self.responses_per_prompt, self.eta)
        if self.task not in TASKS:
            raise ValueError(f"rollpacker.task must be one of {list(TASKS)}, got {self.task!r}")
        if self.task == "curated" and not self.problems_path:
            raise ValueError("rollpacker.problems_path is required with task 'curated'")
        if self.eval_size and self.task != "scratchpad":
            raise ValueError(f"rollpacker.eval_size needs task 'scratchpad' (held-out problems), got task {self.task!r}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"rollpacker.methods must be a non-empty subset of {sorted(METHODS)} without repeats, "
                             f"got {self.methods}")
        for name, ok in (("steps", self.steps >= 1), ("max_new_tokens", self.max_new_tokens >= 1),
                         ("timeout_s", self.timeout_s > 0), ("lr", self.lr > 0),
                         ("max_failed_fraction", 0 <= self.max_failed_fraction <= 1), ("num_cpus", self.num_cpus >= 1),
                         ("eval_size", self.eval_size >= 0), ("eval_every", self.eval_every >= 0),
                         ("eval_temperature", self.eval_temperature >= 0)):
            if not ok:
                raise ValueError(f"rollpacker.{name} is out of range: {getattr(self, name)}")
        if self.timed_out_reward not in TIMED_OUT_REWARD:
            raise ValueError(f"rollpacker.timed_out_reward must be one of {list(TIMED_OUT_REWARD)}, "
                             f"got {self.timed_out_reward!r}")
        if not isinstance(self.wall_clock_cut, bool):
            raise ValueError(f"rollpacker.wall_clock_cut must be true or false, got {self.wall_clock_cut!r}")
        self.grpo_config()
        self.check_sampling("rollpacker")
        return self


def fingerprint(spec: RunSpec) -> str:
    """Hash of what determines a run's steps: the spec without its timeouts, Ray address, CPUs and
    threads, and the problems file's path, size and mtime. 16 hex digits."""
    from ops.launch import spec_fingerprint

    d = asdict(spec)
    for k in ("ray_address", "num_cpus", "threads", "timeout_s", "reward_timeout_s", "reward_retries"):
        d.pop(k)
    # the scratchpad epoch is a function of the spec alone (no data file; "" would stat the cwd)
    return spec_fingerprint(d, spec.problems_path if spec.task == "curated" else "<scratchpad: no data file>")


class RunState(DriverState):
    """The finished steps of one run directory, saved after every step (see the module docstring).

    Layout: ``<out>/state/state.json`` (fingerprint, steps saved, finished rows, finished methods,
    the method in progress with its planner position and state files, resumes) and the state files
    ``trainer-<method>-<step>.pt`` / ``engine-<method>-<step>.pt`` of the last saved step.

    Attributes:
        rows: finished step rows, every method, in run order. done: methods finished.
        evals: held-out evaluations so far, per method (``run_method``; {} without ``eval_size``).
        current: the method in progress (``method``, ``step``, ``version``, ``trainer``, ``engine``,
            ``planner``) or None. count: steps saved over the run. skipped: why a state on disk was
            ignored (None: it was not). seconds: time spent saving, over every launch.
    """

    FIELDS = {"rows": [], "done": [], "current": None, "count": 0, "evals": {}}

    @property
    def steps_done(self) -> int:
        """GRPO steps of the run the state holds (every method's finished rows)."""
        return len(self.rows)

    def rows_of(self, method: str) -> list[dict]:
        return [r for r in self.rows if r["method"] == method]

    def save(self, method: str, rows: list[dict], planner, actors, finished: bool) -> int:
        """Record ``method``'s rows after a completed step: with the trainer and engine state and the
        planner position, or, when the method is ``finished``, as done. Returns the steps saved so far."""
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows = [r for r in self.rows if r["method"] != method] + list(rows)
        if finished:
            self.done.append(method)
            self.current = None
        else:
            k = rows[-1]["step"]
            files = {"trainer": f"trainer-{method}-{k}.pt", "engine": f"engine-{method}-{k}.pt"}
            version = actors.save_state(str(self.dir / files["trainer"]), str(self.dir / files["engine"]))
            self.current = {"method": method, "step": k, "version": version, **files,
                            "planner": {"fresh": [q.uid for q in planner.fresh], "long_queue": [q.uid for q in planner.long_queue],
                                        "step": planner.step}}
        self.count += 1
        self.commit(t, {self.current["trainer"], self.current["engine"]} if self.current else set())
        return self.count


def restore_planner(planner, saved: dict, prompts: list) -> None:
    """Put a fresh ``RoundPlanner`` at a saved position (prompt uids of the fresh and long-prompt
    queues, step). Raises ValueError naming a uid that is not in this epoch."""
    from collections import deque

    by_uid = {q.uid: q for q in prompts}
    missing = [u for u in saved["fresh"] + saved["long_queue"] if u not in by_uid]
    if missing:
        raise ValueError(f"saved planner position names prompts {missing[:3]} that are not in this run's epoch")
    planner.fresh = deque(by_uid[u] for u in saved["fresh"])
    planner.long_queue = deque(by_uid[u] for u in saved["long_queue"])
    planner.step = saved["step"]


def load_prompts(spec: RunSpec, tokenizer) -> list:
    """The epoch: ``steps`` x P0 problems with an answer, in a seeded order, as chat prompts
    (task ``curated``), or the first ``steps`` x P0 problems of the scratchpad stream
    ``ops.rl.scratchpad.problems(task_seed, ..., split="train")`` as ``a:N=`` prompts (task ``scratchpad``; the
    tokenizer must be the task's character tokenizer, which the warm-started policy folder holds)."""
    if spec.task == "scratchpad":
        from ops.rl import scratchpad as sp

        return [sp.to_prompt(tokenizer, p)
                for p in sp.problems(spec.task_seed, spec.steps * spec.prompts_per_step, split="train")]
    import polars as pl

    from ops.rl.policy import chat_prompt

    p = Path(spec.problems_path)
    df = read_problems(p)
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


def heldout_problems(spec: RunSpec) -> list:
    """The held-out problems of a scratchpad run: ``eval_size`` problems of the scratchpad ``heldout``
    split (stream ``task_seed + 1000``): disjoint from the epoch (``train`` split) by prompt text, not
    only by uid; [] when evaluation is off."""
    from ops.rl import scratchpad as sp

    if spec.task != "scratchpad" or not spec.eval_size:
        return []
    return sp.problems(spec.task_seed + 1000, spec.eval_size, split="heldout")


def evaluate(actors, problems: list, spec: RunSpec) -> dict:
    """Held-out pass rate of the trainer's current policy (``ops.rl.ray_actors._TrainerImpl.heldout``:
    one response per problem at ``eval_temperature``, greedy at 0; sampling seeded with ``spec.seed``,
    so every evaluation of a run draws from the same stream), between steps. Works on ``Actors`` (a
    call on the trainer actor's handle, bounded by its RPC timeout) and on ``LocalActors`` (the trainer
    role in process). Returns ``{"accuracy", "n", "by_lines", "mean_len", "policy_version"}``."""
    tuples = [(p.uid, p.a, p.n) for p in problems]
    args = (tuples, spec.eval_temperature, spec.max_new_tokens, spec.seed)
    if hasattr(actors, "handles"):                            # Ray: the trainer actor is handles[1]
        import ray

        return ray.get(actors.handles[1].heldout.remote(*args), timeout=actors.rpc_timeout_s)
    return actors._tr.heldout(*args)


def make_actors(spec: RunSpec):
    """The engine, trainer and reward actors of a run (``ops.rl.ray_actors.Actors``); the trainer's
    spec carries the run's ``grpo`` section."""
    from ops.rl.ray_actors import Actors

    return Actors(spec.policy(), spec.policy(), spec.reward_workers, spec.reward_timeout_s)


def step_config(spec: RunSpec, method: str):
    """The ``loop.StepConfig`` of ``method``'s steps: its overlaps (``METHODS``), the run's sizes and
    timeouts, its GRPO settings (``RunSpec.grpo_config``: advantages here, the same section in the
    trainer's spec for the loss) and the paper's rules (``timed_out_reward``, ``wall_clock_cut``)."""
    from .loop import StepConfig

    _, overlap, stream = METHODS[method]
    return StepConfig(max_new_tokens=spec.max_new_tokens, timeout_s=spec.timeout_s, reward_overlap=overlap,
                      stream_train=stream, max_failed_fraction=spec.max_failed_fraction, grpo=spec.grpo_config(),
                      timed_out_reward=spec.timed_out_reward, wall_clock_cut=spec.wall_clock_cut)


def run_method(method: str, spec: RunSpec, prompts: list, pipes, actors, state: Optional[RunState] = None,
               progress=None, on_saved: Optional[Callable[[int], None]] = None,
               evals: Optional[dict] = None) -> list[dict]:
    """``spec.steps`` steps of one method, from the initial policy (actors reset first).

    With ``state``, every completed step is saved (``RunState.save``; then ``on_saved(steps saved)``),
    and a method the state holds in progress continues after its last saved step: planner position
    restored, trainer state loaded and published to the engine. ``progress.update()`` after each
    step. Returns the method's rows (restored ones included).

    Held-out evaluation (``spec.eval_size`` > 0, task scratchpad): before the first step, every
    ``eval_every`` steps and after the last, appended to ``state.evals[method]`` (or to ``evals``
    when given) as ``{"step", "train_wall_s", "accuracy", "n", "policy_version", "by_lines"}``;
    ``train_wall_s`` sums the rows' ``step_s`` (rollout, rewards, training, weight sync), so
    evaluation and state saving never count in any time. Each row
    carries ``response_lengths`` (tokens of every trained response, in acceptance order) and ``sync``
    (the engine's weight-sync record after the step: ``Actors.sync_stats``)."""
    from ops.rl.reward import RewardClient

    from .loop import RLStep
    from .scheduler import RoundPlanner, TailBatching

    tb = METHODS[method][0]
    actors.reset()
    planner = RoundPlanner(prompts, TailBatching(spec.prompts_per_step, spec.responses_per_prompt, spec.eta, enabled=tb))
    rows = []
    cur = state.current if state is not None else None
    if cur is not None and cur["method"] == method:
        restore_planner(planner, cur["planner"], prompts)
        version = actors.restore(str(state.dir / cur["trainer"]), str(state.dir / cur["engine"]))
        rows = state.rows_of(method)
        resumed = {"method": method, "after_step": cur["step"], "policy_version": version, "steps_done": len(state.rows),
                   "retry_number": getattr(pipes, "retry_number", None)}
        state.resumes.append(resumed)
        pipes.log.info(f"{method}: resuming after step {cur['step']} (policy version {version} published to the engine; "
                       f"{len(state.rows)} of {len(spec.methods) * spec.steps} steps of the run done) on Dagster retry "
                       f"{getattr(pipes, 'retry_number', 'n/a')}")
    held = heldout_problems(spec)
    if evals is None:
        evals = state.evals if state is not None else {}
    if cur is None or cur["method"] != method:
        evals[method] = []
    ev = evals.setdefault(method, [])

    def run_eval():
        if not held:
            return
        t = time.monotonic()
        r = evaluate(actors, held, spec)
        ev.append({"step": len(rows), "train_wall_s": sum(x["step_s"] for x in rows), "accuracy": r["accuracy"],
                   "n": r["n"], "policy_version": r["policy_version"], "by_lines": r["by_lines"], "mean_len": r["mean_len"]})
        pipes.log.info(f"{method} held-out after {len(rows)} steps: accuracy {r['accuracy']:.3f} on {r['n']} problems "
                       f"(T={spec.eval_temperature}, {time.monotonic() - t:.1f}s, not counted)")

    client = RewardClient(actors.reward, timeout_s=spec.reward_timeout_s, max_retries=spec.reward_retries,
                          backoff_s=0.2)
    client.health()                                           # before any training
    if not rows and not ev:
        run_eval()                                            # step 0: the initial policy
    step = RLStep(actors.engine, actors.trainer, client.score, actors.publish, step_config(spec, method),
                  reward_threads=4)
    try:
        while len(rows) < spec.steps and (plan := planner.next_round()) is not None:
            rnd, m = step.run(plan)
            planner.requeue(rnd.aborted)
            m = {"method": method, **{k: v for k, v in m.items() if k != "policy_versions"},
                 "policy_version": (m["policy_versions"] or [None])[0],
                 "trained_prompts": [g.prompt.uid for g in rnd.groups], "long_queue": len(planner.long_queue),
                 "response_lengths": [c.length for g in rnd.groups for c in g.completions],
                 "sync": actors.sync_stats()}
            rows.append(m)
            pipes.report_custom_message({k: v for k, v in m.items() if k not in ("trained_prompts", "response_lengths")})
            pipes.log.info(f"{method} step {m['step']} ({m['round']}): rollout {m['rollout_s']:.1f}s, step {m['step_s']:.1f}s, "
                           f"max len {m['max_response_len']}, bubble {m['bubble_ratio']:.2f}, reward {m['reward_mean']:.3f}")
            last = len(rows) >= spec.steps or planner.done()
            if held and (last or (spec.eval_every and len(rows) % spec.eval_every == 0)):
                run_eval()                                    # before the save: a resume keeps it
            if state is not None:
                n = state.save(method, rows, planner, actors, finished=last)
                if on_saved:
                    on_saved(n)
            if progress is not None:
                progress.update()
    finally:
        step.close()
    return rows


def run_methods(spec: RunSpec, prompts: list, pipes, actors, state: RunState,
                on_saved: Optional[Callable[[int], None]] = None) -> list[dict]:
    """Every method of ``spec`` in order, resuming from ``state`` (loaded): methods it holds as done
    are skipped (their saved rows kept), the one in progress continues. Logs a progress line after
    each step. Returns every row, in run order."""
    from ops.progress import Progress

    total = len(spec.methods) * spec.steps
    progress = Progress(total - len(state.rows), "rollpacker run: GRPO steps" + (
        f" (resumed with {len(state.rows)} of {total} done)" if state.rows else ""), pipes.log.info, every_s=0.0, unit="steps")
    rows = []
    for method in spec.methods:
        if method in state.done:
            pipes.log.info(f"{method}: finished before this launch ({len(state.rows_of(method))} steps), skipped")
            rows += state.rows_of(method)
            continue
        rows += run_method(method, spec, prompts, pipes, actors, state=state, progress=progress, on_saved=on_saved)
    return rows


def result_fields(spec: RunSpec, rows: list[dict], evals: dict) -> dict:
    """The result's ``task``, ``eval`` ({method: evaluation entries}, {} without ``eval_size``) and
    ``response_lengths`` ({method: tokens of every trained response, in training order}) and
    ``weight_syncs`` ({method: the engine's ``ops.rl.weights.sync_stats`` after its last step:
    policy_version, stale_syncs_refused, failed_syncs})."""
    last = {r["method"]: r["sync"] for r in rows if r.get("sync")}
    return {"task": spec.task, "eval": {m: list(evals.get(m, [])) for m in spec.methods if evals.get(m)},
            "response_lengths": {m: [n for r in rows if r["method"] == m for n in r.get("response_lengths", [])]
                                 for m in spec.methods},
            "weight_syncs": {m: last[m] for m in spec.methods if m in last}}


def load_spec(text: str) -> RunSpec:
    """The validated RunSpec of a spec file's text (``RunSpec.to_json``). Raises ValueError naming
    the field (an unknown one too)."""
    return RunSpec.from_json(text)


def run(spec: RunSpec, out: Path, fp: str, pipes) -> dict:
    """The launched run (the ``run`` of ``ops.launch.worker_main``): Ray and the actors up, every
    method resumed from the state saved under ``out`` (``RunState``; ``worker_main`` removes it once
    ``result.json`` is written). Returns the result: spec, step rows, Ray start and wall seconds,
    Ray address, prompt uids, resumes, seconds spent saving, and ``result_fields`` (task, eval,
    response_lengths)."""
    import ray

    from ops.launch import init_ray
    from ops.rl.policy import load_tokenizer
    from ops.rl.runs import crash_if_asked

    t0 = time.monotonic()
    tok = load_tokenizer(spec.tokenizer_dir)
    prompts = load_prompts(spec, tok)
    state = resume_state(RunState(out, fingerprint(spec)), pipes.log)
    loaded = state.count
    init_ray(spec.ray_address, spec.num_cpus, spec.threads)
    rows = []
    try:
        actors = make_actors(spec)
        init_s = time.monotonic() - t0
        pipes.log.info(f"ray and actors ready in {init_s:.1f}s")
        rows = run_methods(spec, prompts, pipes, actors, state,
                           on_saved=lambda n: crash_if_asked(CRASH_ENV, n, loaded, pipes.log.info))
        actors.kill()
    finally:
        ray.shutdown()
    result = {"spec": asdict(spec), "steps": rows, "ray_init_s": init_s, "wall_s": time.monotonic() - t0,
              "ray_address": spec.ray_address or "local", "prompts": [p.uid for p in prompts],
              "resumes": state.resumes, "state_save_s": state.seconds, **result_fields(spec, rows, state.evals)}
    pipes.log.info(f"rollpacker run done in {result['wall_s']:.1f}s: {len(rows)} steps")
    return result


def main(argv: Optional[list[str]] = None) -> int:
    from ops.launch import worker_main

    return worker_main(load_spec, run, argv, description=__doc__, scratch=("state",))


if __name__ == "__main__":
    sys.exit(main())
