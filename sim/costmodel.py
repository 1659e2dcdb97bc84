"""Paper-scale step times: the rollout from the unchanged scheduler on the simulated engine, plus a
timeline model of rewards, training and weight sync (RollPacker, arXiv 2509.21009 §4.2-4.3, §6).

Per step, with ``t_i`` the finish time of trained response i (from ``SimEngine``):
* rewards: ``reward_workers`` CPU workers score responses FIFO, each taking a log-normal time.
  Without the reward scheduler they start when the rollout ends; with it, response i is queued at
  t_i (§4.2).
* training: a group's work is ``train_gpu_s_per_token`` x its tokens, in GPU-seconds. Without the
  stream trainer it starts on all GPUs after the last reward; with it, a group can start once its
  rewards are in, on the GPUs of inference instances that are already idle (their sequences are
  done), and on every GPU after the rollout (§4.3: rollout GPUs freed by the tail train).
* a weight sync of ``sync_s`` ends every step.

[open] The paper does not publish its per-phase costs; the defaults are calibrated so that the
synchronous baseline spends ~70% of a step in rollout (the paper's figure; docs/rollpacker.md, "Paper anchors") with a 7B-class decode model.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

from ops.rl.rollpacker.scheduler import RoundResult


@dataclass(frozen=True)
class ClusterModel:
    """Cluster and cost parameters (seconds; GPU-seconds for training). [open] The defaults are
    calibrated, not published: the synchronous baseline spends ~70% of a step in rollout (module
    docstring)."""

    gpus: int = 128
    """Simulated GPUs; a multiple of gpus_per_instance (``instances`` raises ValueError otherwise)."""
    gpus_per_instance: int = 2
    """GPUs per inference instance (tensor parallel); instances = gpus / gpus_per_instance."""
    max_seqs: int = 256
    """Running sequences per instance (the ``SimEngine``'s continuous-batching slots, >= 1)."""
    step_base_s: float = 0.012
    """Fixed part of a decode step (s, > 0): step_s(a) = step_base_s + step_per_seq_s x a running seqs."""
    step_per_seq_s: float = 0.00025
    """Decode-step time per running sequence (s, >= 0; the ``SimEngine`` step model)."""
    reward_workers: int = 48
    """Concurrent reward evaluations: CPU workers scoring responses FIFO."""
    reward_median_s: float = 1.5
    """Median of the log-normal reward time per response (s)."""
    reward_sigma: float = 0.8
    """Log-normal sigma of the reward time per response."""
    train_gpu_s_per_token: float = 0.0065
    """Training cost per token (forward + backward + log-prob recompute), GPU-seconds per token."""
    sync_s: float = 5.0
    """Weight sync at the end of every step (s)."""

    @property
    def instances(self) -> int:
        if self.gpus % self.gpus_per_instance:
            raise ValueError(f"cluster.gpus ({self.gpus}) must be a multiple of cluster.gpus_per_instance "
                             f"({self.gpus_per_instance})")
        return self.gpus // self.gpus_per_instance


# FIFO reward scheduling and the stream trainer's piecewise-capacity queue: the same model as the
# discrete-event simulator's (one implementation, in sim/des/rollpacker.py).
from .des.rollpacker import _reward_done as _rewards  # noqa: E402
from .des.rollpacker import _train_end as _train  # noqa: E402

def step_timeline(rnd: RoundResult, cm: ClusterModel, reward_overlap: bool, stream_train: bool, rng: random.Random,
                  prompt_tokens: int = 200) -> dict:
    """Phase times of one step from its round (simulated engine). Returns rollout_s, reward_end_s,
    train_end_s, step_s, and the busy fractions."""
    rollout = float(rnd.batch.timings["wall_s"])
    drain = list(rnd.batch.timings.get("instance_drain_s", [rollout]))
    comps = [(gi, c) for gi, g in enumerate(rnd.groups) for c in g.completions]
    costs = [rng.lognormvariate(math.log(cm.reward_median_s), cm.reward_sigma) for _ in comps]
    arrivals = [c.t_finish_s if reward_overlap else rollout for _, c in comps]
    done = _rewards(arrivals, costs, cm.reward_workers)
    ready = [0.0] * len(rnd.groups)
    work = [0.0] * len(rnd.groups)
    for (gi, c), d in zip(comps, done):
        ready[gi] = max(ready[gi], d)
        work[gi] += (c.length + prompt_tokens) * cm.train_gpu_s_per_token
    reward_end = max(done, default=rollout)
    train_end = _train(ready, work, drain, rollout, cm.gpus, cm.gpus_per_instance, stream_train)
    end = max(rollout, reward_end, train_end)
    return {"rollout_s": rollout, "reward_end_s": reward_end, "train_end_s": train_end, "step_s": end + cm.sync_s,
            "reward_tail_s": max(0.0, reward_end - rollout), "train_tail_s": max(0.0, end - max(rollout, reward_end)),
            "train_work_gpu_s": sum(work)}


def epoch_time(rounds: Sequence[RoundResult], cm: ClusterModel, reward_overlap: bool, stream_train: bool,
               seed: int = 0) -> dict:
    """Sum of step times over an epoch's rounds, with the per-phase breakdown."""
    rng = random.Random(seed)
    steps = [step_timeline(r, cm, reward_overlap, stream_train, rng) for r in rounds]
    tot = sum(s["step_s"] for s in steps)
    return {"total_s": tot, "steps": len(steps), "mean_step_s": tot / max(1, len(steps)),
            "rollout_s": sum(s["rollout_s"] for s in steps), "reward_tail_s": sum(s["reward_tail_s"] for s in steps),
            "train_tail_s": sum(s["train_tail_s"] for s in steps),
            "rollout_share": sum(s["rollout_s"] for s in steps) / tot if tot else 0.0, "per_step": steps}
