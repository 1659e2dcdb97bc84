"""One learning-rate schedule for every trainer of ``ops``: AdamW with a peak rate, linear warm-up,
then cosine decay to a floor (issue 41: SFT, the RL warm start and the D-CPT probes declared the
same four fields each).

The shape is the linear-warm-up + cosine-decay schedule of Loshchilov & Hutter (2017, "SGDR",
§3, eq. 5, without restarts) with the linear warm-up of Goyal et al. (2017, "Accurate, Large
Minibatch SGD", §2.2), as used by GPT-2/3-style pre-training and SFT recipes. ``min_lr_ratio`` 1.0
makes it linear warm-up then constant (the D-CPT probes' schedule: the base ends at the rate the CPT
continues with).

Step ``t`` counts optimizer steps from 0; the rate is in the optimizer's units (1/step: the factor
applied to Adam's normalised update).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .spec import JsonSpec, require


def warmup_cosine(warmup_steps: int, steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """LR multiplier at step ``s`` (0-based): ``(s + 1) / warmup_steps`` during the linear warm-up,
    then cosine decay from 1 to ``min_lr_ratio`` at ``steps`` (held there after). ``min_lr_ratio``
    1.0: constant after the warm-up."""
    def f(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        t = (s - warmup_steps) / max(1, steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return f


@dataclass
class LrSchedule(JsonSpec):
    """AdamW's learning-rate schedule: linear warm-up to ``lr`` over ``warmup_steps`` optimizer steps,
    then cosine decay to ``lr * min_lr_ratio`` at the run's last step (module docstring for the
    source). A nested part of a stage's spec (``SftPlan.schedule``, ``WarmStartSpec.schedule``,
    ``ProbePlan.base_schedule`` / ``cpt_schedule``); its
    Launchpad path is ``<part>.<field>`` (``schedule.warmup_steps``). ``validate`` raises ValueError
    naming the field by its path. Every field is required (no class defaults): a spec's part names its
    own defaults (``default_factory``), so a partial JSON part fails naming the missing field instead
    of silently taking another stage's values."""

    lr: float
    """Peak AdamW learning rate (> 0; 1/step), reached at the end of the warm-up."""
    warmup_steps: int
    """Optimizer steps of linear warm-up (>= 0; 0: start at ``lr``)."""
    min_lr_ratio: float
    """The cosine ends at lr * min_lr_ratio at the last step (in [0, 1]; 1.0: constant after the warm-up)."""
    weight_decay: float
    """AdamW's decoupled weight decay (>= 0; multiplied by the current rate, as torch.optim.AdamW does)."""

    def validate(self, where: str = "schedule") -> "LrSchedule":
        """Check every field; ``where`` is this part's path in the spec (``sft.schedule``).
        Returns the schedule. Raises ValueError ``<where>.<field> must be ..., got ...``."""
        require(where, self, [
            ("lr", self.lr > 0, "> 0"),
            ("warmup_steps", isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "an integer >= 0"),
            ("min_lr_ratio", 0.0 <= self.min_lr_ratio <= 1.0, "in [0, 1]"),
            ("weight_decay", self.weight_decay >= 0, ">= 0")])
        return self

    def multiplier(self, steps: int) -> Callable[[int], float]:
        """The multiplier of ``lr`` at step s for a run of ``steps`` optimizer steps (``warmup_cosine``),
        for ``torch.optim.lr_scheduler.LambdaLR``."""
        return warmup_cosine(self.warmup_steps, steps, self.min_lr_ratio)

    def lr_at(self, step: int, steps: int) -> float:
        """The learning rate at optimizer step ``step`` (0-based) of a run of ``steps`` steps."""
        return self.lr * self.multiplier(steps)(step)

    def optimizer(self, model, init_state=None, lr: float | None = None):
        """``torch.optim.AdamW`` over ``model`` at this schedule's rate (or ``lr``: a size-scaled rate)
        and weight decay (``ops.lm.train.adamw``; ``init_state`` an optimizer.pt to continue from)."""
        from .train import adamw

        return adamw(model, self.lr if lr is None else lr, self.weight_decay, init_state=init_state)

    def scheduler(self, optimizer, steps: int):
        """``LambdaLR`` stepping ``optimizer`` along this schedule for a run of ``steps`` steps."""
        from .train import lambda_lr

        return lambda_lr(optimizer, self.multiplier(steps))
