"""One synchronous RL step on a real engine: rollout (a tail-batching round or the baseline's),
rewards, group advantages, GRPO gradients, one optimizer step, weight sync (RollPacker,
arXiv 2509.21009 §3-4).

The two overlaps of RollPacker are switches, so the ablation runs on the same code:
* ``reward_overlap`` (the reward scheduler, §4.2): each trained response is sent to the reward
  service as soon as it finishes, while the rest of the batch still generates. Off: all rewards are
  requested after the rollout (veRL).
* ``stream_train`` (the stream trainer, §4.3): each group, once its R0 rewards are in, gets its
  advantages and its gradients on a background thread while the rollout continues; the optimizer
  step waits for the whole batch. Off: one pass after all rewards.

Every wait is bounded: the engine call by ``timeout_s`` (plus ``guarded_generate``'s grace), each
reward request by the client's timeout and retries, the rest by ``drain_timeout_s``.

Two rules follow the paper where Crucible's shared RL core departs from it (both switches of
``StepConfig``; the defaults are the paper's):

* ``timed_out_reward``: a response whose verifier runs past its (adaptive) timeout gets reward 0, as
  the paper's reward scheduler does (§4.2-4.3), rather than the shared core's ``failed`` (no score,
  masked out of its group). It is counted apart (``reward_timeout_zero``) and never counts as failed.
  A reward *service* fault (unreachable actor, request timeout after the client's retries) stays
  ``failed``: that is not the response's doing.
* ``wall_clock_cut``: no round is cut by the wall clock (long rounds run their responses to full
  length, paper §4.1). ``timeout_s`` is then only the guard that bounds the engine call: a rollout
  that reaches it fails the step (``TimeoutError``) instead of training responses cut by the clock.
  ``wall_clock_cut=True`` restores the old rule (``timeout`` responses count as finished and train).

Keeping the first R0 of ceil(eta R0) responses (short rounds) trains shorter responses than the
policy's distribution: a prompt's slowest samples are the ones aborted. The authors' design shares
this selection; docs/rollpacker.md gives its size.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Callable

from ops.rl.engine import guarded_generate
from ops.rl.grpo import GRPOConfig, group_advantages
from ops.rl.reward import RewardItem, RewardResult, check_failed_fraction, reward_counts
from ops.rl.rollpacker.scheduler import Group, RoundPlan, RoundResult, run_round
from ops.rl.rollpacker.stream import StreamTrainer, StreamWorker, TrainSample
from ops.rl.types import Completion, Prompt


@dataclass
class StepConfig:
    """Per-step settings shared by both methods."""

    max_new_tokens: int = 64
    """Response budget per generate call (tokens)."""
    timeout_s: float = 120.0
    """Wall-clock limit of one rollout (s; case ``rollout-never-ends``)."""
    stop: tuple = ()
    """Stop strings of the engine."""
    reward_overlap: bool = True
    """RollPacker's reward scheduler: score each response as soon as it finishes, during the rollout (False:
    after the rollout)."""
    stream_train: bool = True
    """RollPacker's stream trainer: compute each accepted group's gradients as soon as it is scored (False: one
    batch after every reward)."""
    max_failed_fraction: float = 0.25
    """The step fails (RewardServiceError) when more than this fraction of its rewards failed."""
    drain_timeout_s: float = 300.0
    """Limit on waiting for rewards and queued gradients after the rollout (s)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """The GRPO loss configuration (its ``scale``, ``std_floor`` and ``eps`` set the advantages here; the
    trainer holds its own copy for the loss)."""
    timed_out_reward: str = "zero"
    """What a verifier timeout scores (``TIMED_OUT_REWARD``): ``zero`` (paper §4.2-4.3: reward 0, status
    ``timeout``) or ``mask`` (the shared core's rule: ``failed``, excluded from its group)."""
    wall_clock_cut: bool = False
    """False (paper): a rollout reaching ``timeout_s`` fails the step (TimeoutError); no response is trained
    cut by the clock. True: responses ending ``timeout`` count as finished and are trained."""

    def __post_init__(self):
        if self.timed_out_reward not in TIMED_OUT_REWARD:
            raise ValueError(f"rollpacker.timed_out_reward must be one of {list(TIMED_OUT_REWARD)}, "
                             f"got {self.timed_out_reward!r}")


TIMED_OUT_REWARD = {
    "zero": "a verifier timeout scores 0.0 (status 'timeout'), as in the paper (arXiv 2509.21009 §4.2-4.3)",
    "mask": "a verifier timeout is 'failed' (no score; masked out of its group, counted in the failed fraction)",
}
"""``StepConfig.timed_out_reward`` / ``RunSpec.timed_out_reward``: how a verifier timeout is scored."""

VERIFIER_TIMEOUT = "verifier timed out"
"""Start of the error of a result whose verifier ran past its per-item limit (``ops.rl.reward.RewardScorer``;
a test pins the two together)."""


def timed_out_as_zero(r: RewardResult) -> RewardResult:
    """``r`` unchanged unless its verifier timed out; then the paper's rule: score 0.0, status
    ``timeout`` (the error kept). Service faults (anything else ``failed``) are left ``failed``."""
    if r.status == "failed" and (r.error or "").startswith(VERIFIER_TIMEOUT):
        return RewardResult(r.key, 0.0, "timeout", r.attempts, r.error)
    return r


class _GuardedEngine:
    """Routes ``run_round``'s engine call through ``guarded_generate``."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, n, max_new_tokens, stop=None, timeout_s=60.0, on_finish=None):
        return guarded_generate(self.engine, prompts, n, max_new_tokens, stop, timeout_s, on_finish)


class RLStep:
    """Runs steps of one method against one engine, reward client and trainer.

    Args:
        engine: an Engine (the HF engine in process, or a Ray engine proxy).
        trainer: StreamTrainer over the trained policy.
        score: callable(list[RewardItem]) -> list[RewardResult] (``RewardClient.score``).
        publish: callable(trainer, version) that syncs the trainer's weights to the engine(s) and
            returns once the version is published.
        cfg: StepConfig.
        reward_threads: concurrent reward requests.
    """

    def __init__(self, engine, trainer: StreamTrainer, score: Callable[[list[RewardItem]], list[RewardResult]],
                 publish: Callable[[StreamTrainer, int], None], cfg: StepConfig = StepConfig(), reward_threads: int = 4):
        self.engine, self.trainer, self.score, self.publish, self.cfg = engine, trainer, score, publish, cfg
        self.pool = ThreadPoolExecutor(max_workers=reward_threads, thread_name_prefix="reward")
        self.assembler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="groups")
        self.worker = StreamWorker(trainer) if cfg.stream_train else None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.assembler.shutdown(wait=False, cancel_futures=True)
        if self.worker is not None:
            self.worker.close()

    def _submit(self, prompt: Prompt, c: Completion):
        item = RewardItem(f"{c.prompt_uid}/{c.index}", c.text, prompt.answer, prompt.solution, prompt.answer_type)
        zero = self.cfg.timed_out_reward == "zero"
        return self.pool.submit(lambda: timed_out_as_zero(self.score([item])[0]) if zero else self.score([item])[0])

    @staticmethod
    def _samples(g: Group, results: list[RewardResult], cfg: GRPOConfig) -> tuple[list[TrainSample], bool]:
        adv, valid, zero = group_advantages([r.value for r in results], [c.length for c in g.completions], cfg)
        return [TrainSample(g.prompt.token_ids, c.token_ids, a, v) for c, a, v in zip(g.completions, adv, valid)], zero

    def run(self, plan: RoundPlan) -> tuple[RoundResult, dict]:
        """One step: roll out ``plan``, score, train, publish the next version. Returns the round and
        the step metrics (round metrics + timings + rewards + loss).

        Raises:
            RewardServiceError: the failed fraction of rewards exceeds ``max_failed_fraction``.
            TimeoutError: rewards or gradients did not finish within ``drain_timeout_s``; or, without
                ``wall_clock_cut``, a trained response was cut by the rollout's ``timeout_s``.
        """
        cfg = self.cfg
        t0 = time.monotonic()
        futs: dict[tuple[str, int], object] = {}
        group_jobs = []
        zero_groups: list[bool] = []
        by_uid = {p.uid: p for p in plan.prompts}

        def finish_group(g: Group):
            keys = [(c.prompt_uid, c.index) for c in g.completions]
            futures_wait([futs[k] for k in keys], timeout=cfg.drain_timeout_s)
            res = [futs[k].result(timeout=0) for k in keys]
            samples, zero = self._samples(g, res, cfg.grpo)
            zero_groups.append(zero)
            self.worker.put(samples)
            return res

        def on_response(c: Completion):
            if cfg.reward_overlap:
                futs[(c.prompt_uid, c.index)] = self._submit(by_uid[c.prompt_uid], c)

        def on_group(g: Group):
            if cfg.stream_train and cfg.reward_overlap:
                group_jobs.append(self.assembler.submit(finish_group, g))

        rnd = run_round(_GuardedEngine(self.engine), plan, cfg.max_new_tokens, cfg.timeout_s, cfg.stop,
                        on_response=on_response, on_group=on_group)
        t_rollout = time.monotonic()
        cut = sum(c.finish_reason == "timeout" for g in rnd.groups for c in g.completions)
        if cut and not cfg.wall_clock_cut:
            futures_wait(group_jobs, timeout=cfg.drain_timeout_s)      # streamed groups: let them land, then drop them
            if self.worker is not None:
                self.worker.drain(cfg.drain_timeout_s)
            self.trainer._reset()
            raise TimeoutError(f"step {plan.step} ({plan.kind} round): {cut} trained responses were cut by the rollout's "
                               f"wall clock (timeout_s {cfg.timeout_s:.0f}s); with wall_clock_cut off (the paper's rule) "
                               "responses run to full length and the step fails instead")
        if not cfg.reward_overlap:
            for g in rnd.groups:
                for c in g.completions:
                    futs[(c.prompt_uid, c.index)] = self._submit(g.prompt, c)
        if cfg.stream_train and not cfg.reward_overlap:
            group_jobs = [self.assembler.submit(finish_group, g) for g in rnd.groups]
        keys = [(c.prompt_uid, c.index) for g in rnd.groups for c in g.completions]
        done, pending = futures_wait([futs[k] for k in keys], timeout=cfg.drain_timeout_s)
        if pending:
            raise TimeoutError(f"step {plan.step}: {len(pending)} rewards still pending after {cfg.drain_timeout_s:.0f}s")
        results = [futs[k].result() for k in keys]
        t_reward = time.monotonic()
        try:
            failed_frac = check_failed_fraction(results, cfg.max_failed_fraction)
        except Exception:
            self.trainer._reset()
            raise
        if cfg.stream_train:
            futures_wait(group_jobs, timeout=cfg.drain_timeout_s)
            for j in group_jobs:
                j.result(timeout=0)
            self.worker.drain(cfg.drain_timeout_s)
        else:
            samples = []
            R = plan.accept_responses
            for k, g in enumerate(rnd.groups):
                s, zero = self._samples(g, results[k * R:(k + 1) * R], cfg.grpo)
                samples += s
                zero_groups.append(zero)
            self.trainer.add(samples)
        tm = self.trainer.step()
        t_train = time.monotonic()
        self.publish(self.trainer, tm["version"])
        t_end = time.monotonic()
        counts = reward_counts(results)
        vals = [r.score for r in results if r.score is not None]
        m = dict(rnd.metrics)
        m.update({
            "step_s": t_end - t0, "rollout_wall_s": t_rollout - t0, "reward_wait_s": t_reward - t_rollout,
            "train_tail_s": t_train - t_reward, "sync_s": t_end - t_train,
            "reward_mean": sum(vals) / len(vals) if vals else float("nan"),
            "verified": counts["verified"], "wrong": counts["wrong"], "unparseable": counts["unparseable"],
            "reward_failed": counts["failed"] + counts["bad_gold"], "reward_failed_fraction": failed_frac,
            "reward_timeout_zero": counts.get("timeout", 0),
            "zero_signal_groups": sum(zero_groups) / max(1, len(zero_groups)),
            **{k: tm[k] for k in ("loss", "grad_norm", "tokens", "valid_responses", "clip_fraction", "kl", "masked_tokens",
                                "train_compute_s")},
            "policy_version_after": tm["version"],
        })
        return rnd, m
