"""ToolMath: a curated STEM problem with a sandboxed Python calculator tool (``ToolMath``;
``ops.rl.rollarc.sandbox.run_python``), ``parse_final_answer`` (a reply's final answer) and
``tool_math_reward_item`` (the final answer as the reward service's ``RewardItem``)."""

from __future__ import annotations

import re
from typing import Optional

from ops.rl.rollarc.sandbox import DEFAULT_MODE, require, run_python
from ops.rl.rollarc.types import StepResult, Task

from .base import TextEnv


_CALC = re.compile(r"<calc>(.*?)</calc>", re.S | re.I)
_ANSWER_LINE = re.compile(r"(?im)^[ \t>*_#-]*(?:final[ \t]+)?answer[*_ \t]*[:：][ \t*_]*(.+?)[ \t]*$")


def parse_final_answer(text: str) -> Optional[str]:
    """The final answer of a reply: the last ``\\boxed{...}`` (balanced braces), else the last line
    ``Answer: X`` (also ``Final answer:``, ``**Answer:**``), stripped of ``$``, ``**`` and a final
    period; None when there is none (or it is empty)."""
    from ops.curation.verify import last_boxed

    text = text or ""
    ans = last_boxed(text)
    if ans is None:
        found = _ANSWER_LINE.findall(text)
        ans = found[-1] if found else None
    if ans is None:
        return None
    ans = ans.strip().strip("*_ ").strip()
    if ans.endswith(".") and not ans[:-1].rstrip().endswith("."):
        ans = ans[:-1].rstrip()
    if len(ans) >= 2 and ans[0] == ans[-1] == "$":
        ans = ans[1:-1].strip()
    return ans or None


class ToolMath(TextEnv):
    """A curated STEM problem with a sandboxed Python calculator tool.

    task.spec: ``problem`` (str), ``answer`` and ``answer_type`` (used by the verifier, not here;
    see ``tool_math_reward_item``). The policy writes ``<calc>EXPR</calc>`` (observation
    ``Result: ...`` / ``Error: ...``) or ``Answer: X`` / ``\\boxed{X}`` (done).

    Args:
        cpu_s, wall_s, mem_mb: limits of each calculator call (``sandbox.run_python``).
        sandbox: ``bwrap`` (kernel-enforced, the default) or ``rlimits`` (the weaker mode, only when
            asked for): ``sandbox.SANDBOX_MODES``.
        max_calls_per_turn: ``<calc>`` blocks run per reply (later ones are skipped, and said so).
        max_result_chars: cap on each result shown to the policy.

    info (every step): ``final_answer`` (str or None), ``calc_calls``, ``calc_errors``,
    ``invalid_actions`` (replies with neither a call nor an answer), ``calc_cpu_s``.

    Raises (constructor): ValueError for a bad limit or sandbox mode; ``sandbox.SandboxUnavailable``
    for ``bwrap`` without bubblewrap installed (the environment refuses to run model-generated code).
    """

    name = "tool_math"

    def __init__(self, cpu_s: float = 1.0, wall_s: float = 2.0, mem_mb: int = 256,
                 max_calls_per_turn: int = 3, max_result_chars: int = 500, sandbox: str = DEFAULT_MODE):
        if not (cpu_s > 0 and wall_s > 0 and mem_mb >= 64):
            raise ValueError(f"tool_math needs cpu_s > 0, wall_s > 0, mem_mb >= 64; got {cpu_s}, {wall_s}, {mem_mb}")
        if max_calls_per_turn < 1 or max_result_chars < 1:
            raise ValueError(f"tool_math needs max_calls_per_turn >= 1 and max_result_chars >= 1, got "
                             f"{max_calls_per_turn}, {max_result_chars}")
        require(sandbox)
        self.cpu_s, self.wall_s, self.mem_mb, self.sandbox = cpu_s, wall_s, mem_mb, sandbox
        self.max_calls_per_turn, self.max_result_chars = max_calls_per_turn, max_result_chars
        self._live = False
        self._closed = False

    def reset(self, task: Task) -> str:
        if self._closed:
            raise RuntimeError("tool_math: reset after close")
        problem = task.spec.get("problem") if isinstance(task.spec, dict) else None
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"tool_math task.spec needs a non-empty 'problem' (str), got {task.spec!r}")
        self._final, self._calls, self._errors, self._invalid, self._cpu = None, 0, 0, 0, 0.0
        self._live = True
        return ("Solve the problem below. You may use a Python calculator: write <calc>EXPR</calc> "
                "(an expression or a few statements; math functions such as sqrt, comb, pi are built "
                "in) and the next message shows \"Result: ...\" or \"Error: ...\". Up to "
                f"{self.max_calls_per_turn} calls per reply. When you are done, write the final answer "
                "on its own line as \"Answer: X\" (or \\boxed{X}); that ends the episode.\n\n"
                f"Problem: {problem.strip()}")

    def _info(self) -> dict:
        return {"final_answer": self._final, "calc_calls": self._calls, "calc_errors": self._errors,
                "invalid_actions": self._invalid, "calc_cpu_s": self._cpu}

    def step(self, action_text: str) -> StepResult:
        if not self._live:
            raise RuntimeError("tool_math: step before reset, after the episode ended, or after close")
        text = action_text if isinstance(action_text, str) else ""
        answer = parse_final_answer(text)
        if answer is not None:
            self._final, self._live = answer, False
            return StepResult(f"Answer recorded: {answer}", True, self._info())
        exprs = _CALC.findall(text)
        if not exprs:
            self._invalid += 1
            why = "an unclosed <calc> (close it with </calc>)" if "<calc>" in text.lower() else \
                "neither a <calc>EXPR</calc> call nor a final answer"
            return StepResult(f"Your reply had {why}. This turn was wasted. Call the calculator with "
                              "<calc>EXPR</calc> or finish with \"Answer: X\".", False, self._info())
        lines = []
        for i, expr in enumerate(exprs[: self.max_calls_per_turn]):
            r = run_python(expr.strip(), cpu_s=self.cpu_s, wall_s=self.wall_s, mem_mb=self.mem_mb,
                           max_output_chars=self.max_result_chars, sandbox=self.sandbox)
            self._calls += 1
            self._cpu += r.cpu_s
            if r.ok:
                body = "Result: " + (r.output.strip() or "(no output)")
            else:
                self._errors += 1
                body = "Error: " + r.error
            lines.append(body if len(exprs) == 1 else f"[{i + 1}] {body}")
        if len(exprs) > self.max_calls_per_turn:
            lines.append(f"(only the first {self.max_calls_per_turn} <calc> calls of a reply are run)")
        return StepResult("\n".join(lines), False, self._info())

    def close(self) -> None:
        self._live, self._closed = False, True


def tool_math_reward_item(key: str, spec: dict, final_answer: Optional[str]):
    """The reward service's ``RewardItem`` (``ops.rl.reward``) for a ToolMath episode: the final
    answer as a ``\\boxed{}`` response (no answer -> empty response -> ``unparseable``, 0.0)."""
    from ops.rl.reward import RewardItem

    response = f"\\boxed{{{final_answer}}}" if final_answer else ""
    return RewardItem(key=key, response=response, answer=spec.get("answer"), solution=spec.get("solution"),
                      answer_type=spec.get("answer_type", "numeric"))
