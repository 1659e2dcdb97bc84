"""CheckedSubtraction: the multi-turn form of the scratchpad task (``ops.rl.scratchpad``) with a
sandboxed checker between turns; its environment latency is the checker's real work, never a sleep."""

from __future__ import annotations

import re

from ops.rl.rollarc.sandbox import DEFAULT_MODE, require, run_python
from ops.rl.rollarc.types import StepResult, Task

from .base import TextEnv
from .tool_math import parse_final_answer


_DIGITS = re.compile(r"[0-9]{1,6}")

#: The checker program run in the sandbox: recompute the chain from the previous value, each line
#: ``work`` times over (``{prev}``, ``{a}``, ``{lines}``, ``{work}`` are integers the environment
#: formats in; no policy text reaches the subprocess).
_CHECKER = """
prev, a, lines, work = {prev}, {a}, {lines}, {work}
bad = -1
for i, got in enumerate(lines):
    want = prev - a
    acc = 0
    for _ in range(work):
        acc += (prev - a == want)
    if want < 0 or got != want or acc != work:
        bad = i
        break
    prev = want
print(bad)
"""


class CheckedSubtraction(TextEnv):
    """Remainder by repeated subtraction with a checker between turns (``ops.rl.scratchpad``, multi-turn
    form; docs/rl_policy.md): the first observation is ``tool_prompt`` (``a:N?``); each policy turn
    writes chain lines (``\\n<value>`` each) and ends with ``?``; the checker recomputes them from the
    previous value in a fresh sandboxed Python subprocess (``sandbox.run_python``) and replies
    ``scratchpad.CHECK_OK`` (``ok``) when every line is right. A wrong line, an unparseable one, or a
    turn with neither ``?`` nor ``\\boxed{}`` ends the episode (failed check: no final answer, so the
    reward service scores it 0.0). A turn with ``\\boxed{X}`` ends the episode with answer X (its
    lines are not checked; ``tool_math_reward_item`` builds the RewardItem). The correct trajectory
    (``scratchpad.tool_turns``) has ``q // 8 + 1`` turns for quotient q = N // a (long-tailed).

    task.spec: ``a`` (2..9), ``n`` (>= 0), ``answer`` (str, N mod a), ``answer_type`` ("numeric"),
    optional ``check_work`` (int >= 0, default ``check_work`` of the constructor). ``sandbox``: the
    checker's sandbox mode (``sandbox.SANDBOX_MODES``; ``bwrap`` by default, like ``ToolMath``).

    **What decides env latency** (all real work, never a sleep): per checked turn, one interpreter
    start of the sandbox (bwrap + ``python -I -S`` + the supervisor's fork: median 0.27-0.32 s a call,
    ~0.07 s of it bwrap's namespaces, on the shared 2-core machine at load ~16, 2026-12-06;
    ``benchmarks/sandbox_overhead.py``; the start alone was ~50 ms in 2026-12-02's process-only sandbox) plus the checker's
    CPU: ``lines x check_work`` loop iterations (CPython; measured 2026-12-02 on the shared 2-core
    machine: start ~50 ms, ``check_work`` 100,000 -> ~20 ms of CPU a line, ~0.2 s for an 8-line turn). A trajectory's env time is therefore linear in
    its number of turns, i.e. in q // 8, and long-tailed like q. ``info["check_cpu_s"]`` /
    ``info["check_wall_s"]`` sum the subprocesses' CPU and wall seconds.

    info (every step): ``final_answer`` (str or None), ``checks`` (checked turns), ``check_failed``
    (bool), ``checked_lines``, ``check_cpu_s``, ``check_wall_s``.
    """

    name = "checked_subtraction"

    def __init__(self, check_work: int = 0, cpu_s: float = 5.0, wall_s: float = 10.0, mem_mb: int = 256,
                 sandbox: str = DEFAULT_MODE):
        if not isinstance(check_work, int) or check_work < 0:
            raise ValueError(f"checked_subtraction.check_work must be an int >= 0, got {check_work!r}")
        require(sandbox)
        self.check_work, self.cpu_s, self.wall_s, self.mem_mb, self.sandbox = check_work, cpu_s, wall_s, mem_mb, sandbox
        self._live = False
        self._closed = False

    def reset(self, task: Task) -> str:
        from ops.rl import scratchpad as sp

        if self._closed:
            raise RuntimeError("checked_subtraction: reset after close")
        spec = task.spec if isinstance(task.spec, dict) else {}
        a, n = spec.get("a"), spec.get("n")
        if not (isinstance(a, int) and 2 <= a <= 9 and isinstance(n, int) and n >= 0):
            raise ValueError(f"checked_subtraction task.spec needs 'a' (int 2..9) and 'n' (int >= 0), got {task.spec!r}")
        work = spec.get("check_work", self.check_work)
        if not isinstance(work, int) or work < 0:
            raise ValueError(f"checked_subtraction.check_work must be an int >= 0, got {work!r}")
        self.a, self.value, self.work = a, n, work
        self._final, self._checks, self._failed, self._lines, self._cpu, self._wall = None, 0, False, 0, 0.0, 0.0
        self._live = True
        return sp.tool_prompt(sp.Problem(task.uid, a, n))

    def _info(self) -> dict:
        return {"final_answer": self._final, "checks": self._checks, "check_failed": self._failed,
                "checked_lines": self._lines, "check_cpu_s": self._cpu, "check_wall_s": self._wall}

    def _fail(self, why: str) -> StepResult:
        self._failed, self._live = True, False
        return StepResult(why, True, self._info())

    def step(self, action_text: str) -> StepResult:
        from ops.rl import scratchpad as sp

        if not self._live:
            raise RuntimeError("checked_subtraction: step before reset, after the episode ended, or after close")
        text = action_text if isinstance(action_text, str) else ""
        if "\\boxed{" in text:
            self._final, self._live = parse_final_answer(text), False
            return StepResult(f"Answer recorded: {self._final}", True, self._info())
        if not text.rstrip().endswith("?"):
            return self._fail("check failed: the turn ends with neither '?' nor \\boxed{}")
        raw = [x.strip() for x in text.rstrip()[:-1].split("\n") if x.strip()]
        if not raw or not all(_DIGITS.fullmatch(x) for x in raw):
            return self._fail("check failed: unparseable line")
        lines = [int(x) for x in raw]
        r = run_python(_CHECKER.format(prev=self.value, a=self.a, lines=lines, work=self.work),
                       cpu_s=self.cpu_s, wall_s=self.wall_s, mem_mb=self.mem_mb, sandbox=self.sandbox)
        self._checks += 1
        self._cpu += r.cpu_s
        self._wall += r.wall_s
        if not r.ok:
            raise RuntimeError(f"checked_subtraction: the checker failed: {r.error}")
        bad = int(r.output.strip())
        if bad >= 0:
            self._lines += bad
            return self._fail(f"check failed at line {bad + 1}")
        self._lines += len(lines)
        self.value = lines[-1]
        return StepResult(sp.CHECK_OK, False, self._info())

    def close(self) -> None:
        self._live, self._closed = False, True
