"""RollArc's trajectory-level asynchronous scheduler, and the monolithic synchronous baseline
(RollArc, arXiv 2512.22560 §4: trajectory-level asynchrony, redundant rollouts, the staleness bound,
versioned weight sync).

The scheduler is written against *roles*, awaitables that may run anywhere (``Roles``): on Ray
actors placed by resource pool (``ops.rl.rollarc.ray_roles``), or in-process scripted ones (tests).
It owns only the algorithm:

* **Trajectory-level asynchrony.** Every trajectory is its own asyncio task: LLM call -> env step
  -> ... -> reward, each await bounded by a timeout. A slow or failing environment ends only its
  own trajectory (status ``timeout`` / ``env_error``).
* **Redundant rollouts.** A group launches ``group_size + redundancy`` trajectories; it completes
  with the first ``group_size`` to finish and cancels the rest (their count is ``dropped``).
* **Bounded staleness.** A finished group enters the ``GroupBuffer`` stamped with the trainer step
  that created it. The trainer takes the oldest groups first; a group whose oldest segment version
  v has ``step - v > async_ratio`` is discarded and counted. The producer never creates a group
  more than ``async_ratio`` steps ahead (at most ``(step + 1 + async_ratio) * groups_per_step``
  groups exist by step ``step``), so ``async_ratio = 0`` is exactly synchronous: the groups of step s
  are created after version s is published and trained at step s.
* **Versioned weight sync.** After each optimizer step the trainer's weights are pushed to every
  engine; ``publish`` returns only once all engines hold the new version (a partial sync never
  publishes; ``ops.rl.weights``). Every segment records the version of the engine that served it.

The baseline (``run_monolithic``, in ``ops.rl.rollarc.monolithic``) is the synchronous agentic step
on the same roles: every trajectory of the batch advances turn by turn in lock step (one batched LLM
call per turn), the batch waits for its slowest environment, rewards are computed after the whole
batch, then one optimizer step — nothing overlaps. The trainer's GRPO samples of a step's groups
(``grpo_samples``) are built in ``ops.rl.rollarc.samples``.

Resume (both schedulers): ``start_step=k`` with ``result`` (the ``RunResult`` of steps 0..k-1, e.g.
``RunResult.from_dict`` of a checkpoint) continues a run whose roles already hold policy version k;
``tasks`` must continue after the ``result.tasks_consumed`` tasks the earlier steps took.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Awaitable, Callable, Iterator, Optional, Protocol

from .types import Group, Segment, StepResult, Task, Trajectory


class RollArcError(RuntimeError):
    """The run cannot continue (no fresh group within ``group_wait_timeout_s``, too many failed
    rewards, a weight sync that did not complete)."""


@dataclass(frozen=True)
class ArcConfig:
    """Scheduler settings. The defaults are the embedded default's sizes (2 CPU cores: the
    ``rollarc_run`` asset adds < 3 minutes to the main job); the ``full`` preset is production-sized
    (pipelines/presets.py, docs/rollarc.md). ``__post_init__`` raises ValueError naming the field
    (``rollarc.<field>``) when one is out of range.
    """

    steps: int = 3
    """Optimizer steps (the same for RollArc and the baseline), 1..1,000,000."""
    groups_per_step: int = 1
    """G: groups (tasks) per optimizer step, 1..8192."""
    group_size: int = 2
    """R: trajectories per group that are trained (GRPO's group), 1..1024."""
    redundancy: int = 1
    """Extra trajectories launched per group (RollArc only), 0..group_size: the first R to finish with a
    reward win, the rest are cancelled (counted as dropped)."""
    async_ratio: int = 1
    """Staleness bound in policy versions (optimizer steps), >= 0: a group whose oldest segment is more
    than this many versions behind the trainer's step is discarded, and the producer creates groups at
    most this many steps ahead; 0 = synchronous."""
    max_turns: int = 2
    """LLM calls per episode, 1..1024; reaching it ends the episode ``truncated``."""
    turn_timeout_s: float = 30.0
    """Limit of one env step and of one LLM call (s, > 0); past it the trajectory ends ``timeout``."""
    episode_timeout_s: float = 120.0
    """Limit of one whole episode, reward included (s, > 0)."""
    reward_timeout_s: float = 30.0
    """Limit of one reward request (s, > 0); past it the trajectory has no reward (``timeout``)."""
    group_wait_timeout_s: float = 300.0
    """How long the trainer waits for its next fresh group before the run fails (s, > 0)."""
    train_timeout_s: float = 300.0
    """Limit of one optimizer step, of the weight sync that follows it and of ``on_step``'s checkpoint
    (s, > 0)."""
    max_failed_fraction: float = 1.0
    """A step fails when more than this fraction of its trained trajectories have no reward (failed
    scoring, env errors and timeouts have none), in [0, 1]."""

    def __post_init__(self):
        checks = (("steps", self.steps >= 1), ("groups_per_step", self.groups_per_step >= 1),
                  ("group_size", self.group_size >= 1), ("redundancy", self.redundancy >= 0),
                  ("async_ratio", self.async_ratio >= 0), ("max_turns", self.max_turns >= 1),
                  ("turn_timeout_s", self.turn_timeout_s > 0), ("episode_timeout_s", self.episode_timeout_s > 0),
                  ("reward_timeout_s", self.reward_timeout_s > 0), ("group_wait_timeout_s", self.group_wait_timeout_s > 0),
                  ("train_timeout_s", self.train_timeout_s > 0),
                  ("max_failed_fraction", 0 <= self.max_failed_fraction <= 1),
                  # sanity caps: a typo (group_size 100000) must fail at once, not after a long launch
                  ("group_size", self.group_size <= 1024), ("redundancy", self.redundancy <= self.group_size),
                  ("groups_per_step", self.groups_per_step <= 8192), ("max_turns", self.max_turns <= 1024),
                  ("steps", self.steps <= 1_000_000))
        for name, ok in checks:
            if not ok:
                raise ValueError(f"arc.{name} is out of range: {getattr(self, name)}")


class Roles(Protocol):
    """Where the work runs. Every method is awaited under a timeout by the scheduler.

    ``llm(messages, key, turn)`` -> Segment: one LLM call on the conversation so far (chat messages;
    ``key`` = trajectory key, ``turn`` from 0); ``llm_batch(requests)`` -> [Segment]: the baseline's
    lock-step call (one batch for every active trajectory); ``env_reset(key, task)`` -> first
    observation; ``env_step(key, action_text)`` -> StepResult; ``env_close(key)``;
    ``reward(trajectory)`` -> (score or None, status); ``train(groups, step)`` -> metrics dict (one
    optimizer step); ``publish(version)`` -> None once every engine holds ``version``.
    """

    async def llm(self, messages: list, key: str, turn: int) -> Segment: ...

    async def llm_batch(self, requests: list) -> list: ...

    async def env_reset(self, key: str, task: Task) -> str: ...

    async def env_step(self, key: str, action: str) -> StepResult: ...

    async def env_close(self, key: str) -> None: ...

    async def reward(self, traj: Trajectory) -> tuple: ...

    async def train(self, groups: list, step: int) -> dict: ...

    async def publish(self, version: int) -> None: ...


SYSTEM = ("You are an agent. Each turn, read the observation and reply with exactly one action in the "
          "format the observation asks for.")


class GroupBuffer:
    """Finished groups waiting for the trainer, oldest first, with the staleness filter.

    ``take(n, step)`` returns the ``n`` oldest groups whose staleness ``step - oldest_version`` is
    <= ``async_ratio``, discarding (and counting) older ones; it waits (bounded) until ``n`` are there.
    """

    def __init__(self, async_ratio: int):
        self.async_ratio = async_ratio
        self._groups: list[Group] = []
        self.discarded: list[dict] = []

    # Waits poll (10 ms) instead of awaiting a Condition/Event under wait_for: cancelling such a
    # wait at shutdown can hang on Python 3.11's wait_for.

    async def put(self, group: Group) -> None:
        self._groups.append(group)

    def __len__(self) -> int:
        return len(self._groups)

    def _filter(self, step: int) -> None:
        keep = []
        for g in self._groups:
            if step - g.oldest_version > self.async_ratio:
                self.discarded.append({"group_id": g.group_id, "created_step": g.created_step,
                                       "oldest_version": g.oldest_version, "discarded_at_step": step})
            else:
                keep.append(g)
        self._groups = keep

    async def take(self, n: int, step: int, timeout_s: float, errors: Optional[list] = None,
                   starved: Optional[Callable[[], bool]] = None) -> list[Group]:
        """The ``n`` oldest fresh groups. Raises RollArcError after ``timeout_s`` without them, or the
        first of ``errors`` (failures of the producing tasks) as soon as there is one."""
        deadline = time.monotonic() + timeout_s
        while True:
            if errors:
                raise errors[0]
            if starved is not None and starved() and len(self._groups) < n:
                raise RollArcError(f"rollarc: the tasks ran out at step {step}: {len(self._groups)} of {n} groups left")
            self._filter(step)
            if len(self._groups) >= n:
                self._groups.sort(key=lambda g: (g.created_step, g.finished_at))
                out, self._groups = self._groups[:n], self._groups[n:]
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise RollArcError(f"rollarc: step {step} got {len(self._groups)} of {n} fresh groups within "
                                   f"{timeout_s:.0f} s (group_wait_timeout_s)")
            await asyncio.sleep(min(0.01, left))


@dataclass
class RunResult:
    """What a run measured (JSON-serialisable via ``to_dict``).

    During a run ``steps``, the counters, ``staleness_hist``, ``discarded_groups``, ``wall_s`` and
    ``tasks_consumed`` are current whenever ``on_step`` is called (a checkpoint can snapshot them);
    ``statuses`` is set at the end.
    """

    method: str
    """``monolithic``, ``rollarc`` or another name given to ``run_rollarc`` (``async0``, ``rollarc_a<k>``)."""
    config: dict
    """The ``ArcConfig`` of the run, as a dict."""
    steps: list = field(default_factory=list)
    """One dict per optimizer step (train metrics, wait seconds, staleness of its groups, reward mean,
    statuses)."""
    wall_s: float = 0.0
    """Seconds from the first rollout to the last publish (summed over the launches of a resumed run)."""
    trained_trajectories: int = 0
    """Trajectories kept for training."""
    generated_trajectories: int = 0
    """Trajectories launched (redundant and discarded ones included)."""
    staleness_hist: dict = field(default_factory=dict)
    """{staleness (policy versions): trained groups}."""
    discarded_groups: int = 0
    """Groups discarded as staler than ``async_ratio``."""
    dropped_trajectories: int = 0
    """Launched trajectories not kept (redundant ones cancelled once their group had ``group_size``)."""
    statuses: dict = field(default_factory=dict)
    """Episode status counts of the trained trajectories (set at the end)."""
    trajectories: list = field(default_factory=list)
    """One summary row per trained trajectory (``traj_summary``: no token ids)."""
    tasks_consumed: int = 0
    """Tasks taken from the task iterator (one per group created, trained or not); a resumed run
    continues after them."""

    @property
    def trajectories_per_s(self) -> float:
        return self.trained_trajectories / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["trajectories_per_s"] = self.trajectories_per_s
        d["staleness_hist"] = {str(k): v for k, v in sorted(self.staleness_hist.items())}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        """The RunResult ``to_dict`` wrote (other keys ignored). Raises TypeError when ``method`` or
        ``config`` is missing."""
        names = {f.name for f in fields(cls)}
        r = cls(**{k: v for k, v in d.items() if k in names})
        r.staleness_hist = {int(k): v for k, v in r.staleness_hist.items()}
        return r


def _continued(result: Optional[RunResult], method: str, cfg: ArcConfig, start_step: int) -> RunResult:
    """The RunResult a run (re)starting at ``start_step`` appends to. Raises ValueError when
    ``start_step`` is outside [0, steps) or does not match ``result``'s method and step count."""
    if not 0 <= start_step < cfg.steps:
        raise ValueError(f"rollarc: start_step must be in [0, steps={cfg.steps}), got {start_step}")
    if result is None:
        if start_step:
            raise ValueError(f"rollarc: start_step {start_step} needs the RunResult of the earlier steps")
        return RunResult(method=method, config=asdict(cfg))
    if result.method != method or len(result.steps) != start_step:
        raise ValueError(f"rollarc: cannot continue a {result.method} result with {len(result.steps)} steps as "
                         f"{method} from step {start_step}")
    return result


async def _after_step(on_step: Optional[Callable[[dict], Optional[Awaitable]]], row: dict, timeout_s: float) -> None:
    """Call ``on_step(row)``; await what it returns (e.g. a checkpoint). Raises RollArcError when that
    takes more than ``timeout_s``."""
    if on_step is None:
        return
    r = on_step(row)
    if inspect.isawaitable(r):
        try:
            await _bounded(r, timeout_s)
        except asyncio.TimeoutError:
            raise RollArcError(f"rollarc: step {row['step']}'s on_step (checkpoint) took more than {timeout_s:.0f} s "
                               f"(train_timeout_s)") from None


def traj_summary(t: Trajectory) -> dict:
    """One row per trajectory for the run's table (no token ids)."""
    return {"group_id": t.group_id, "index": t.index, "task": t.task.uid, "env": t.task.env,
            "created_step": t.created_step, "status": t.status, "turns": t.turns, "reward": t.reward,
            "reward_status": t.reward_status, "versions": [s.policy_version for s in t.segments],
            "pools": [s.pool for s in t.segments], "response_tokens": t.response_tokens,
            "llm_s": round(t.llm_s, 4), "env_s": round(t.env_s, 4), "reward_s": round(t.reward_s, 4),
            "wall_s": round(t.wall_s, 4), "error": t.error}


async def _bounded(aw: Awaitable, timeout_s: float):
    return await asyncio.wait_for(aw, timeout_s)


async def _train_and_publish(roles: Roles, groups: list, step: int, cfg: ArcConfig) -> dict:
    """One optimizer step and the versioned publish of ``step + 1``. Raises RollArcError naming the
    call that overran ``train_timeout_s``."""
    try:
        metrics = await _bounded(roles.train(groups, step), cfg.train_timeout_s)
    except asyncio.TimeoutError:
        raise RollArcError(f"rollarc: the optimizer step {step} took longer than train_timeout_s "
                           f"({cfg.train_timeout_s:.0f} s)") from None
    try:
        await _bounded(roles.publish(step + 1), cfg.train_timeout_s)
    except asyncio.TimeoutError:
        raise RollArcError(f"rollarc: publishing policy version {step + 1} took longer than train_timeout_s "
                           f"({cfg.train_timeout_s:.0f} s); the engines keep version {step}") from None
    return metrics


async def run_trajectory(roles: Roles, cfg: ArcConfig, task: Task, group_id: str, index: int,
                         created_step: int) -> Trajectory:
    """One episode, then its reward. Never raises for env/LLM trouble: the status says what ended it
    (``timeout`` for any wall-clock limit, ``env_error`` for an environment exception); cancellation
    (a redundant trajectory that lost) propagates after the env session is closed."""
    key = f"{group_id}/{index}"
    traj = Trajectory(group_id=group_id, index=index, task=task, created_step=created_step)
    t0 = time.monotonic()
    deadline = t0 + cfg.episode_timeout_s

    def left(limit: float) -> float:
        return max(0.001, min(limit, deadline - time.monotonic()))

    try:
        try:
            te = time.monotonic()
            obs = await _bounded(roles.env_reset(key, task), left(cfg.turn_timeout_s))
            traj.env_s += time.monotonic() - te
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": obs}]
            traj.status = "truncated"
            for turn in range(cfg.max_turns):
                tl = time.monotonic()
                seg = await _bounded(roles.llm(list(messages), key, turn), left(cfg.turn_timeout_s))
                traj.llm_s += time.monotonic() - tl
                traj.segments.append(seg)
                traj.turns = turn + 1
                te = time.monotonic()
                res = await _bounded(roles.env_step(key, seg.text), left(cfg.turn_timeout_s))
                traj.env_s += time.monotonic() - te
                traj.submission = res.info
                if res.done:
                    traj.status = "ok"
                    break
                messages += [{"role": "assistant", "content": seg.text}, {"role": "user", "content": res.observation}]
        except asyncio.TimeoutError:
            traj.status, traj.error = "timeout", f"wall-clock limit hit at turn {traj.turns}"
        except asyncio.CancelledError:
            raise
        except Exception as e:                                    # the env (or its worker) failed
            traj.status, traj.error = "env_error", f"{type(e).__name__}: {e}"[:500]
        if traj.status in ("ok", "truncated"):
            tr = time.monotonic()
            try:
                traj.reward, traj.reward_status = await _bounded(roles.reward(traj), left(cfg.reward_timeout_s))
            except asyncio.TimeoutError:
                traj.reward, traj.reward_status = None, "timeout"
            except asyncio.CancelledError:
                raise
            except Exception as e:                                # failed, never 0.0
                traj.reward, traj.reward_status, traj.error = None, "failed", f"reward: {type(e).__name__}: {e}"[:500]
            traj.reward_s = time.monotonic() - tr
        else:
            traj.reward, traj.reward_status = None, traj.status
    finally:
        traj.wall_s = time.monotonic() - t0
        try:
            await asyncio.wait_for(asyncio.shield(roles.env_close(key)), 5.0)
        except BaseException:                                     # closing is best effort
            pass
    return traj


async def run_group(roles: Roles, cfg: ArcConfig, task: Task, group_id: str, created_step: int,
                    redundancy: int) -> Group:
    """``group_size + redundancy`` trajectories; the group completes with the first ``group_size`` that
    finished with a reward (a fast env_error / timeout does not take a healthy one's place; failed
    ones fill the group only when too few succeed)."""
    tasks = [asyncio.ensure_future(run_trajectory(roles, cfg, task, group_id, i, created_step))
             for i in range(cfg.group_size + redundancy)]
    good: list[Trajectory] = []
    bad: list[Trajectory] = []
    try:
        for fut in asyncio.as_completed(tasks):
            t = await fut
            (good if t.reward is not None else bad).append(t)
            if len(good) == cfg.group_size or len(good) + len(bad) == len(tasks):
                break
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    kept = (good + bad)[: cfg.group_size]
    kept.sort(key=lambda t: t.index)
    return Group(group_id=group_id, task=task, created_step=created_step, trajectories=kept,
                 dropped=len(tasks) - len(kept), finished_at=time.monotonic())


def _step_row(step: int, groups: list[Group], metrics: dict, wait_s: float, train_s: float) -> dict:
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs if t.reward is not None and math.isfinite(t.reward)]
    stale = [step - g.oldest_version for g in groups]
    row = {"step": step, "groups": [g.group_id for g in groups], "staleness": stale,
            "max_staleness": max(stale, default=0), "wait_s": wait_s, "train_s": train_s,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "failed_rewards": sum(t.reward is None for t in trajs), "trajectories": len(trajs),
            "statuses": dict(Counter(t.status for t in trajs))}
    return {**metrics, **row}


def _check_failed(step: int, groups: list[Group], cfg: ArcConfig) -> None:
    trajs = [t for g in groups for t in g.trajectories]
    failed = sum(t.reward is None for t in trajs)
    if trajs and failed / len(trajs) > cfg.max_failed_fraction:
        raise RollArcError(f"rollarc: step {step}: {failed} of {len(trajs)} trajectories have no reward "
                           f"(> max_failed_fraction {cfg.max_failed_fraction})")


async def run_rollarc(roles: Roles, cfg: ArcConfig, tasks: Iterator[Task],
                      on_step: Optional[Callable[[dict], Optional[Awaitable]]] = None, start_step: int = 0,
                      result: Optional[RunResult] = None, method: str = "rollarc") -> RunResult:
    """The asynchronous run: a producer creating groups within the staleness budget, every
    trajectory advancing independently, and the trainer taking the oldest fresh groups.

    Args:
        roles: see ``Roles``. tasks: an endless (or long enough) iterator of tasks; the producer
            takes one per group. on_step: called with each step's row (progress, Pipes messages)
            once the step's version is published; when it returns an awaitable (a checkpoint), the
            trainer awaits it (within ``train_timeout_s``) before its next step while rollouts go on.
        start_step: the first optimizer step to train (resume; 0 = from the start). The roles must
            hold policy version ``start_step`` (trainer state loaded, published to every engine);
            the producer's staleness budget counts from it, so the first groups are created at
            ``start_step`` and trained within ``async_ratio`` steps of it.
        result: the RunResult of steps ``0..start_step-1`` (its ``steps`` has ``start_step`` rows),
            continued in place: counters add up over the launches, ``wall_s`` adds this launch's
            seconds, group ids continue after ``tasks_consumed``. None: a new one.
        method: the RunResult's method name (the driver's ``async0`` / ``rollarc_a<k>`` rows).
    Resuming loses the groups that were in flight or waiting in the buffer when the earlier launch
    stopped (their tasks count as consumed; the producer creates fresh groups from the next tasks).
    Returns: RunResult. Raises: RollArcError (no fresh group in time, too many failed rewards, a
        train/publish call or ``on_step``'s awaitable past ``train_timeout_s``); ValueError
        (``start_step`` outside [0, steps) or not matching ``result``).
    """
    res = _continued(result, method, cfg, start_step)
    buf = GroupBuffer(cfg.async_ratio)
    state = {"step": start_step, "created": 0}
    stop = {"now": False}
    running: set = set()
    hist: Counter = Counter(res.staleness_hist)
    discarded0, wall0 = res.discarded_groups, res.wall_s
    t0 = time.monotonic()

    errors: list = []

    async def group_task(task: Task, gid: str, created_step: int):
        try:
            g = await run_group(roles, cfg, task, gid, created_step, cfg.redundancy)
        except asyncio.CancelledError:
            raise
        except Exception as e:                  # a bug, not an env failure: stop the run, say where
            errors.append(RollArcError(f"rollarc: group {gid} failed: {type(e).__name__}: {e}"))
            raise
        res.generated_trajectories += len(g.trajectories) + g.dropped
        res.dropped_trajectories += g.dropped
        await buf.put(g)

    async def producer():
        while not stop["now"]:
            # discarded groups free their slot: otherwise a discard would starve the trainer; the
            # budget counts from start_step (groups of this launch)
            if (state["created"] - len(buf.discarded)
                    >= (state["step"] - start_step + 1 + cfg.async_ratio) * cfg.groups_per_step):
                await asyncio.sleep(0.01)
                continue
            created_step = state["step"]
            state["created"] += 1
            try:
                task = next(tasks)
            except StopIteration:
                state["exhausted"] = True
                return
            res.tasks_consumed += 1
            n = res.tasks_consumed                  # the group's index over the whole run
            t = asyncio.ensure_future(group_task(task, f"s{created_step}-g{n - 1}-{task.uid}", created_step))
            running.add(t)
            t.add_done_callback(running.discard)

    prod = asyncio.ensure_future(producer())
    try:
        for step in range(start_step, cfg.steps):
            tw = time.monotonic()
            if prod.done() and prod.exception() is not None:
                raise prod.exception()
            groups = await buf.take(cfg.groups_per_step, step, cfg.group_wait_timeout_s, errors,
                                    starved=lambda: state.get("exhausted", False) and not running)
            wait_s = time.monotonic() - tw
            _check_failed(step, groups, cfg)
            tt = time.monotonic()
            metrics = await _train_and_publish(roles, groups, step, cfg)
            train_s = time.monotonic() - tt
            for g in groups:
                hist[step - g.oldest_version] += 1
                res.trained_trajectories += len(g.trajectories)
                res.trajectories += [traj_summary(t) for t in g.trajectories]
            row = _step_row(step, groups, metrics, wait_s, train_s)
            res.steps.append(row)
            res.staleness_hist = dict(hist)
            res.discarded_groups = discarded0 + len(buf.discarded)
            res.wall_s = wall0 + time.monotonic() - t0
            state["step"] = step + 1                # version step + 1 is published: the producer may go on
            await _after_step(on_step, row, cfg.train_timeout_s)
    finally:
        stop["now"] = True
        await asyncio.gather(prod, return_exceptions=True)
        for t in list(running):
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    res.wall_s = wall0 + time.monotonic() - t0
    res.staleness_hist = dict(hist)
    res.discarded_groups = discarded0 + len(buf.discarded)
    res.statuses = dict(Counter(t["status"] for t in res.trajectories))
    return res
