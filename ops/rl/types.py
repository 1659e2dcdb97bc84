"""What flows between rollout engines, schedulers, the reward service and the trainer (torch-free).

Field terms follow the RL literature: a *group* is the R responses sampled for one prompt (GRPO
normalises rewards within it); the *policy version* counts optimizer steps of the trainer and is
stamped on every response by the engine that generated it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

#: Why a response ended. ``stop``: end-of-sequence or a stop string; ``length``: max_new_tokens;
#: ``timeout``: the wall-clock limit of the call; ``abort``: cancelled by the scheduler (tail
#: batching's short round) — aborted responses are never trained.
FINISH_REASONS = ("stop", "length", "timeout", "abort")


@dataclass(frozen=True)
class Prompt:
    """One problem to roll out."""

    uid: str
    """Stable id (``problem_id``); the simulated engine keys its length trace on it."""
    token_ids: tuple[int, ...] = ()
    """The chat-formatted prompt tokens (engines that need text may use ``text``)."""
    text: str = ""
    """The problem statement (for logs and text engines)."""
    answer: Optional[str] = None
    """The reference answer for the reward (``ops.rl.reward``)."""
    solution: Optional[str] = None
    """The reference solution (the verifier falls back to its last ``\\boxed{}`` when answer does not parse)."""
    answer_type: str = "numeric"
    """``numeric`` | ``expression`` | ``multiple_choice`` | ``text``."""


@dataclass
class Completion:
    """One generated response. ``__post_init__`` raises ValueError for an unknown finish_reason."""

    prompt_uid: str
    """Which prompt (its ``uid``)."""
    index: int
    """Which of the prompt's n samples (0-based)."""
    token_ids: list[int]
    """Generated tokens [T] (EOS included when it ended with EOS; T may be 0)."""
    logprobs: list[float]
    """Log-probability [T] of each token under the sampling distribution of the engine."""
    finish_reason: str
    """One of FINISH_REASONS (``stop`` | ``length`` | ``timeout`` | ``abort``)."""
    policy_version: Optional[int]
    """The weight version the engine held when it generated this response."""
    t_finish_s: float = 0.0
    """Seconds from the start of the engine call to this response's end."""
    text: str = ""
    """Decoded response (filled by engines that have a tokenizer)."""
    num_tokens: Optional[int] = None
    """The response length (tokens) when ``token_ids`` is not materialised (simulated engine)."""

    def __post_init__(self):
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"completion.finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")

    @property
    def length(self) -> int:
        """Response length in tokens."""
        return len(self.token_ids) if self.num_tokens is None else self.num_tokens


@dataclass
class RolloutBatch:
    """The result of one ``Engine.generate`` call."""

    completions: list[Completion]
    """Every requested response (len = prompts x n), finished, truncated, timed out or aborted, in request
    order (prompt-major)."""
    timings: dict[str, float] = field(default_factory=dict)
    """``wall_s`` (seconds of the call; simulated seconds for a simulated engine), ``decode_steps``,
    ``slot_steps_busy`` / ``slot_steps_total`` (generation-slot time used / available) and ``bubble_ratio`` =
    1 - busy / total (idle fraction of the slots)."""


#: Called by an engine with each response as it finishes (in finish order); returning True aborts
#: every response still generating (they come back with finish_reason ``abort``).
OnFinish = Callable[[Completion], bool]

JSON = dict[str, Any]
