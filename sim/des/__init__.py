"""A discrete-event simulator of synchronous and asynchronous RL post-training on a virtual clock:
RollPacker's tail batching (arXiv 2509.21009) and RollArc's trajectory-level asynchrony (arXiv
2512.22560) against their baselines, every method on the same GPU count. See docs/rollpacker.md
and docs/rollarc.md, section "Simulator".

Mechanics (no sleeping, no threads; a run is deterministic given its seed and takes seconds):

* ``EventLoop``: a heapq of (time, sequence number, callback); ties run in scheduling order.
* ``Instance``: one inference engine (``tp`` GPUs) with continuous batching, vLLM-style: up to
  ``max_seqs`` running sequences, FCFS admission while the KV cache has room, chunked prefill
  (admitted prompts are prefilled in the same pass as one decode step of the running sequences),
  recompute preemption of the newest sequence when the KV cache is full. Iteration times come
  from ``sim.roofline.Roofline`` (decode bandwidth-bound at small batch: weights + the batch's KV
  read every step; prefill compute-bound). Between events (a finish, an admission, a preemption,
  an abort, a weight-sync stall) the batch is fixed, so a run of decode steps is costed in closed
  form (``DecodeRun``): the cost is O(events), not O(tokens).
* RollPacker (``simulate_rollpacker``): the production round planner and acceptance rule
  (``ops.rl.rollpacker.scheduler``: ``RoundPlanner``, ``run_round``) drive ``DESEngine``; on top,
  per step, rewards on a pool of CPU workers (adaptive timeout with the reward scheduler),
  training from the roofline (6·N·tokens FLOPs + the log-prob pass), the stream trainer on GPUs
  of drained instances, and a weight sync. Methods: ``baseline`` (veRL-style synchronous),
  ``tail_batching``, ``tail_batching+reward``, ``rollpacker`` (+ stream trainer).
* RollArc (``simulate_rollarc``): the scheduling rules of ``ops.rl.rollarc.core`` re-expressed as
  events: ``monolithic`` (lock-step turns, waits for the slowest env step, rewards after the batch),
  ``async0`` (trajectory-level asynchrony, async_ratio 0, colocated: rollout and training
  time-share every GPU), ``rollarc_a1`` / ``rollarc_a2`` (async_ratio 1 / 2, redundant rollouts, a
  trainer pool disaggregated from the rollout pool). Every method owns the same GPUs
  (``Allocation``); the disaggregated split is chosen by a pilot on a separate seed.

Resource accounting: every method reports ``gpu_seconds_budget`` = GPUs x makespan and the busy
GPU-seconds of each pool (never above the budget); the equal-resources check is that every method of
a comparison has the same GPU count.

Modules: ``engine`` (the virtual clock, the event queue, engine instances, allocation and
``ServedModel``), ``rollpacker`` and ``rollarc`` (one per simulated system). Every public name is
importable from ``sim.des``.
"""

from __future__ import annotations

from .engine import Allocation, EventLoop, Instance, Request, ServedModel, make_instances
from .rollpacker import (RP_METHODS, DESEngine, RollPackerConfig, reward_draws, rollpacker_rollouts, rollpacker_step,
                         rollpacker_timelines, simulate_rollpacker)
from .rollarc import (PILOT_SEED, RA_METHODS, RollArcConfig, choose_trainer_gpus, ra_method, rollarc_allocation,
                      run_rollarc_method, simulate_rollarc, trainer_split_candidates)

__all__ = ["Allocation", "DESEngine", "EventLoop", "Instance", "PILOT_SEED", "RA_METHODS", "RP_METHODS", "Request",
           "RollArcConfig", "RollPackerConfig", "ServedModel", "choose_trainer_gpus", "make_instances", "ra_method",
           "reward_draws", "rollarc_allocation", "rollpacker_rollouts", "rollpacker_step", "rollpacker_timelines",
           "run_rollarc_method", "simulate_rollarc", "simulate_rollpacker", "trainer_split_candidates"]
