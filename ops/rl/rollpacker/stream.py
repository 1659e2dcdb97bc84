"""The stream trainer (RollPacker, arXiv 2509.21009 §4.3): gradients on finished samples while
other responses are still generating; one deferred, renormalised optimizer step.

The GRPO loss of a step is N / D with N = sum of per-response terms and D their count (or the token
count, for ``token-mean``) over the whole P0 x R0 batch (``ops.rl.grpo.grpo_loss_terms``). Groups
arrive one by one as their R0 responses finish and are scored; for each, ``add`` back-propagates
its numerator, so parameter gradients accumulate sum_g dN_g/dtheta, and records D_g. ``step``
divides the accumulated gradients by sum_g D_g, clips, and applies the optimizer once: the update
equals the all-at-once update (to floating-point summation order). The old policy is the current
weights: the step is deferred, so they do not change while groups arrive (on-policy, ratio = 1).
Log-probabilities are those of the engine's sampling distribution (temperature, top-k, top-p:
``ops.lm.sampling``), from the SamplingConfig the engine samples with (``HFEngine.sampling``, or
``SamplingConfig.from_spec`` of the actor spec the engine was built from), so a sampled token scores
the same on both sides (case ``logprob-temperature-consistent``).

A token whose log-ratio to the behaviour policy (or to the reference, with a KL term) is beyond
``GRPOConfig.log_ratio_bound`` is masked out of the loss and counted (``grpo_loss_terms``): one stale
or mismatched log-prob no longer turns the step's gradient into NaN, and ``step``'s metrics report
the count as ``masked_tokens`` (case ``grpo-stale-ratio-overflow``).

``add`` may run on a background thread (``StreamWorker``) while the engine generates.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from ops.rl.grpo import GRPOConfig, grpo_loss_terms, token_logprobs
from ops.lm.sampling import SamplingConfig


@dataclass
class TrainSample:
    """One response to train on: token ids, its advantage, valid flag (>= 1 token and finite reward)."""

    prompt_ids: Sequence[int]
    """Token ids of the prompt (context only, never trained)."""
    response_ids: Sequence[int]
    """Token ids of the response [T]."""
    advantage: float
    """The response's GRPO advantage (group-normalised), given to each of its tokens."""
    valid: bool
    """Whether it is trained: >= 1 token and a finite reward (invalid ones are masked out of the loss)."""
    old_logprobs: Optional[Sequence[float]] = None
    """Log-probabilities [T] of the response tokens under the policy that sampled them (the engine's
    record). None = on-policy (the current weights are the old policy: ratio 1, as in RollPacker's deferred
    step); set for asynchronous training (RollArc), where the sampling policy may be ``async_ratio`` versions
    behind and the PPO ratio pi / pi_old corrects for it."""
    row_tokens: Optional[int] = None
    """Token count of the loss row this sample belongs to (the denominator of the row's token mean); None =
    the sample is its own row. RollArc sets it to the trajectory's response tokens over all its LLM turns, so
    a multi-turn trajectory is one row whatever its number of turns (``ops.rl.grpo``)."""
    row_share: float = 1.0
    """The sample's share of its row in the row count (the shares of one row's samples sum to 1; RollArc: the
    turn's tokens / the trajectory's)."""


class StreamTrainer:
    """Accumulates GRPO gradients over partial batches; one optimizer step per training step.

    Args:
        model: the trained policy (train mode is set by ``add``).
        optimizer: a torch optimizer over ``model``'s parameters.
        cfg: GRPOConfig.
        micro_batch: responses per forward/backward pass.
        max_grad_norm: gradient clipping after renormalisation (None: no clipping).
        sampling: the engines' SamplingConfig (the old policy is the distribution they sample from;
            the default is T = 1 without top-k/top-p).
        ref_model: reference policy for the KL term (needed when cfg.kl_coef > 0; scored with the
            same sampling distribution).
    Attributes:
        version: policy version = optimizer steps applied.
    Raises:
        ValueError: micro_batch < 1, kl_coef > 0 without ref_model; TypeError: sampling is not a
            SamplingConfig.
    """

    def __init__(self, model, optimizer, cfg: GRPOConfig = GRPOConfig(), micro_batch: int = 8,
                 max_grad_norm: Optional[float] = 1.0, sampling: SamplingConfig = SamplingConfig(), pad_id: int = 0,
                 ref_model=None, version: int = 0):
        if micro_batch < 1:
            raise ValueError(f"trainer.micro_batch must be >= 1, got {micro_batch}")
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("grpo.kl_coef > 0 needs a ref_model")
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(f"trainer.sampling must be an ops.lm.sampling.SamplingConfig, got {sampling!r}")
        self.model, self.opt, self.cfg = model, optimizer, cfg
        self.micro_batch, self.max_grad_norm, self.sampling, self.pad_id = micro_batch, max_grad_norm, sampling, pad_id
        self.ref_model = ref_model
        self.version = version
        self._reset()

    def _reset(self) -> None:
        self.den = 0.0
        self.num_value = 0.0
        self.samples = 0
        self.stats = {"clip_fraction": 0.0, "kl": 0.0, "tokens": 0, "valid_responses": 0, "masked_tokens": 0}
        self.compute_s = 0.0
        self.opt.zero_grad(set_to_none=True)

    def add(self, samples: Sequence[TrainSample]) -> None:
        """Back-propagate the loss numerator of ``samples`` (gradients accumulate, no step)."""
        import torch

        t0 = time.perf_counter()
        self.model.train()
        for i in range(0, len(samples), self.micro_batch):
            mb = samples[i: i + self.micro_batch]
            logp, mask = self._logprobs(self.model, mb)
            ref = None
            if self.cfg.kl_coef > 0:
                with torch.no_grad():
                    ref, _ = self._logprobs(self.ref_model, mb)
            old = logp.detach()
            if any(s.old_logprobs is not None for s in mb):
                old = old.clone()
                for b, s in enumerate(mb):
                    if s.old_logprobs is not None and len(s.old_logprobs):
                        if len(s.old_logprobs) != len(s.response_ids):
                            raise ValueError(f"TrainSample.old_logprobs has {len(s.old_logprobs)} entries for "
                                             f"{len(s.response_ids)} response tokens")
                        old[b, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs, dtype=old.dtype, device=old.device)
            rows = any(s.row_tokens is not None for s in mb)
            row_tokens = [len(s.response_ids) if s.row_tokens is None else s.row_tokens for s in mb] if rows else None
            row_share = [s.row_share for s in mb] if rows else None
            num, den, st = grpo_loss_terms(logp, old, mask, [s.advantage for s in mb], [s.valid for s in mb],
                                           self.cfg, ref, row_tokens, row_share)
            if num.requires_grad:
                num.backward()
            self.den += den
            self.num_value += float(num.detach())
            self.samples += len(mb)
            for k in ("tokens", "valid_responses", "masked_tokens"):
                self.stats[k] += st[k]
            self.stats["clip_fraction"] += st["clip_fraction"] * st["tokens"]
            self.stats["kl"] += st["kl"] * st["tokens"]
        self.compute_s += time.perf_counter() - t0

    def _logprobs(self, model, mb: Sequence[TrainSample]):
        return token_logprobs(model, [s.prompt_ids for s in mb], [s.response_ids for s in mb], self.sampling,
                              self.pad_id)

    def logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Per-token log-probabilities [T_i] of each sample's response under the current weights and
        the sampling distribution — what ``add`` uses as pi (no gradient, no accumulation)."""
        import torch

        out = []
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for i in range(0, len(samples), self.micro_batch):
                mb = samples[i: i + self.micro_batch]
                lp, _ = self._logprobs(self.model, mb)
                out += [lp[b, : len(s.response_ids)].tolist() for b, s in enumerate(mb)]
        self.model.train(was_training)
        return out

    def gradients(self) -> dict:
        """The renormalised gradients the step would apply (name -> tensor), without applying them."""
        scale = 1.0 / max(1.0, self.den)
        return {n: (p.grad * scale).clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def step(self) -> dict:
        """Renormalise, clip, apply the optimizer once, bump the version. Returns step metrics:
        loss, grad_norm, samples, tokens, valid_responses, clip_fraction, kl, masked_tokens (tokens
        with a log-ratio beyond ``cfg.log_ratio_bound``, masked out of the loss), train_compute_s, version.

        Raises:
            FloatingPointError: a gradient is not finite (nothing is applied).
        """
        import torch

        scale = 1.0 / max(1.0, self.den)
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.mul_(scale)
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm if self.max_grad_norm else float("inf")))
        if not math.isfinite(norm):
            self._reset()
            raise FloatingPointError(f"policy gradient norm is {norm}; optimizer step skipped at version {self.version}")
        self.opt.step()
        self.version += 1
        tok = max(1, self.stats["tokens"])
        out = {"loss": self.num_value * scale, "grad_norm": norm, "samples": self.samples, "tokens": self.stats["tokens"],
               "valid_responses": self.stats["valid_responses"], "clip_fraction": self.stats["clip_fraction"] / tok,
               "kl": self.stats["kl"] / tok, "masked_tokens": self.stats["masked_tokens"], "train_compute_s": self.compute_s, "version": self.version}
        self.model.eval()
        self._reset()
        return out


class StreamWorker:
    """Runs ``trainer.add`` on a background thread, fed group by group while rollout continues.

    ``put(samples)`` queues a group; ``drain(timeout_s)`` waits until every queued group is added
    (raises TimeoutError past the limit, or the error the thread hit).
    """

    def __init__(self, trainer: StreamTrainer):
        self.trainer = trainer
        self.q: queue.Queue = queue.Queue()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._loop, name="stream-trainer", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    self.trainer.add(item)
            except BaseException as e:  # noqa: BLE001 - surfaced by drain()
                self.error = e
            finally:
                self.q.task_done()

    def put(self, samples: Sequence[TrainSample]) -> None:
        self.q.put(list(samples))

    def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.q.unfinished_tasks:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream trainer did not finish its queued groups within {timeout_s:.0f}s")
            time.sleep(0.005)
        if self.error is not None:
            e, self.error = self.error, None
            raise e

    def close(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=10)
