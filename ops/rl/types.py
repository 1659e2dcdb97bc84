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
    """One problem to roll out.

    Attributes:
        uid: stable id (``problem_id``); the simulated engine keys its length trace on it.
        token_ids: the chat-formatted prompt tokens (engines that need text may use ``text``).
        text: the problem statement (for logs and text engines).
        answer, solution: the reference for the reward (see ``ops.rl.reward``).
        answer_type: ``numeric`` | ``expression`` | ``multiple_choice`` | ``text``.
    """

    uid: str
    token_ids: tuple[int, ...] = ()
    text: str = ""
    answer: Optional[str] = None
    solution: Optional[str] = None
    answer_type: str = "numeric"


@dataclass
class Completion:
    """One generated response.

    Attributes:
        prompt_uid, index: which prompt and which of its n samples.
        token_ids: generated tokens [T] (EOS included when it ended with EOS; T may be 0).
        logprobs: log-probability [T] of each token under the sampling distribution of the engine.
        finish_reason: one of FINISH_REASONS.
        policy_version: the weight version the engine held when it generated this response.
        t_finish_s: seconds from the start of the engine call to this response's end.
        text: decoded response (filled by engines that have a tokenizer).
        num_tokens: the response length when ``token_ids`` is not materialised (simulated engine).
    """

    prompt_uid: str
    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: Optional[int]
    t_finish_s: float = 0.0
    text: str = ""
    num_tokens: Optional[int] = None

    def __post_init__(self):
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"completion.finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")

    @property
    def length(self) -> int:
        """Response length in tokens."""
        return len(self.token_ids) if self.num_tokens is None else self.num_tokens


@dataclass
class RolloutBatch:
    """The result of one ``Engine.generate`` call.

    Attributes:
        completions: every requested response (len = prompts x n), finished, truncated, timed out
            or aborted, in request order (prompt-major).
        timings: ``wall_s`` (seconds of the call; simulated seconds for a simulated engine),
            ``decode_steps``, ``slot_steps_busy`` / ``slot_steps_total`` (generation-slot time used
            / available) and ``bubble_ratio`` = 1 - busy / total (idle fraction of the slots).
    """

    completions: list[Completion]
    timings: dict[str, float] = field(default_factory=dict)


#: Called by an engine with each response as it finishes (in finish order); returning True aborts
#: every response still generating (they come back with finish_reason ``abort``).
OnFinish = Callable[[Completion], bool]

JSON = dict[str, Any]
