"""The monolithic synchronous baseline of RollArc's comparison (RollArc, arXiv 2512.22560 §4:
"monolithic, synchronous"): ``run_monolithic`` runs the synchronous agentic step on the same roles
as ``core.run_rollarc`` — every trajectory of the batch advances turn by turn in lock step (one
batched LLM call per turn), the batch waits for its slowest environment, rewards are computed after
the whole batch, then one optimizer step; nothing overlaps. Resume as in ``core``'s docstring.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Awaitable, Callable, Iterator, Optional

from .core import (SYSTEM, ArcConfig, RollArcError, Roles, RunResult, _after_step, _bounded, _check_failed,
                   _continued, _step_row, _train_and_publish, traj_summary)
from .types import Group, Task, Trajectory


async def _lockstep_rollout(roles: Roles, cfg: ArcConfig, batch: list[tuple[Task, str, int]], step: int) -> list[Trajectory]:
    """The baseline's rollout: every trajectory of the batch advances one turn at a time together."""
    trajs = [Trajectory(group_id=gid, index=i, task=task, created_step=step) for task, gid, i in batch]
    keys = [f"{t.group_id}/{t.index}" for t in trajs]
    msgs: list[list] = [[] for _ in trajs]
    active = []

    async def reset(k):
        try:
            obs = await _bounded(roles.env_reset(keys[k], trajs[k].task), cfg.turn_timeout_s)
            msgs[k] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": obs}]
            trajs[k].status = "truncated"
            return k
        except asyncio.TimeoutError:
            trajs[k].status, trajs[k].error = "timeout", "env reset past turn_timeout_s"
        except Exception as e:
            trajs[k].status, trajs[k].error = "env_error", f"{type(e).__name__}: {e}"[:500]
        return None

    active = [k for k in await asyncio.gather(*(reset(k) for k in range(len(trajs)))) if k is not None]
    t_start = time.monotonic()
    for turn in range(cfg.max_turns):
        if not active:
            break
        tl = time.monotonic()
        try:
            segs = await _bounded(roles.llm_batch([(msgs[k], keys[k], turn) for k in active]),
                                  cfg.turn_timeout_s * max(1, len(active)))
        except asyncio.TimeoutError:
            for k in active:
                trajs[k].status, trajs[k].error = "timeout", f"batched LLM call past its limit at turn {turn}"
            break
        llm_s = time.monotonic() - tl
        for k, seg in zip(active, segs):
            trajs[k].segments.append(seg)
            trajs[k].turns = turn + 1
            trajs[k].llm_s += llm_s

        async def step_one(k, seg):
            te = time.monotonic()
            try:
                r = await _bounded(roles.env_step(keys[k], seg.text), cfg.turn_timeout_s)
                return k, r, None, time.monotonic() - te
            except asyncio.TimeoutError:
                return k, None, "timeout", time.monotonic() - te
            except Exception as e:
                return k, None, f"{type(e).__name__}: {e}"[:500], time.monotonic() - te

        out = await asyncio.gather(*(step_one(k, s) for k, s in zip(active, segs)))   # waits for the slowest
        env_s = max(o[3] for o in out)
        nxt = []
        for k, r, err, _ in out:
            trajs[k].env_s += env_s
            if err == "timeout":
                trajs[k].status, trajs[k].error = "timeout", f"env step past turn_timeout_s at turn {turn}"
            elif err is not None:
                trajs[k].status, trajs[k].error = "env_error", err
            else:
                trajs[k].submission = r.info
                if r.done:
                    trajs[k].status = "ok"
                else:
                    msgs[k] = msgs[k] + [{"role": "assistant", "content": segs[active.index(k)].text},
                                         {"role": "user", "content": r.observation}]
                    nxt.append(k)
        active = nxt
        if time.monotonic() - t_start > cfg.episode_timeout_s:
            for k in active:
                trajs[k].status, trajs[k].error = "timeout", "episode_timeout_s"
            break

    async def score(t: Trajectory):
        if t.status not in ("ok", "truncated"):
            t.reward, t.reward_status = None, t.status
            return
        tr = time.monotonic()
        try:
            t.reward, t.reward_status = await _bounded(roles.reward(t), cfg.reward_timeout_s)
        except asyncio.TimeoutError:
            t.reward, t.reward_status = None, "timeout"
        t.reward_s = time.monotonic() - tr

    await asyncio.gather(*(score(t) for t in trajs))                     # rewards after the whole batch
    await asyncio.gather(*(asyncio.wait_for(roles.env_close(k), 5.0) for k in keys), return_exceptions=True)
    return trajs


async def run_monolithic(roles: Roles, cfg: ArcConfig, tasks: Iterator[Task],
                         on_step: Optional[Callable[[dict], Optional[Awaitable]]] = None, start_step: int = 0,
                         result: Optional[RunResult] = None) -> RunResult:
    """The synchronous baseline: per step, G tasks x R trajectories in lock step, rewards after the
    batch, one optimizer step, publish; no redundancy, staleness always 0. ``on_step``,
    ``start_step`` and ``result`` as in ``run_rollarc`` (nothing is in flight between steps, so a
    resume loses no work). Raises RollArcError (tasks ran out, too many failed rewards, a call past
    ``train_timeout_s``), ValueError (``start_step`` not matching ``result``)."""
    res = _continued(result, "monolithic", cfg, start_step)
    wall0 = res.wall_s
    t0 = time.monotonic()
    for step in range(start_step, cfg.steps):
        tw = time.monotonic()
        batch_tasks = list(itertools.islice(tasks, cfg.groups_per_step))
        if len(batch_tasks) < cfg.groups_per_step:
            raise RollArcError(f"rollarc: the tasks ran out at step {step} (need {cfg.groups_per_step} per step)")
        res.tasks_consumed += len(batch_tasks)
        gids = [f"s{step}-g{step * cfg.groups_per_step + j}-{t.uid}" for j, t in enumerate(batch_tasks)]
        batch = [(t, gid, i) for t, gid in zip(batch_tasks, gids) for i in range(cfg.group_size)]
        trajs = await _lockstep_rollout(roles, cfg, batch, step)
        groups = [Group(group_id=gid, task=t, created_step=step,
                        trajectories=[x for x in trajs if x.group_id == gid], finished_at=time.monotonic())
                  for t, gid in zip(batch_tasks, gids)]
        wait_s = time.monotonic() - tw
        _check_failed(step, groups, cfg)
        tt = time.monotonic()
        metrics = await _train_and_publish(roles, groups, step, cfg)
        train_s = time.monotonic() - tt
        res.generated_trajectories += len(trajs)
        res.trained_trajectories += len(trajs)
        res.trajectories += [traj_summary(t) for t in trajs]
        res.staleness_hist[0] = res.staleness_hist.get(0, 0) + len(groups)
        row = _step_row(step, groups, metrics, wait_s, train_s)
        res.steps.append(row)
        res.wall_s = wall0 + time.monotonic() - t0
        await _after_step(on_step, row, cfg.train_timeout_s)
    res.wall_s = wall0 + time.monotonic() - t0
    res.statuses = dict(Counter(t["status"] for t in res.trajectories))
    return res
