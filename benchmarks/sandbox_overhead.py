"""Per-call cost of the RollArc tool sandbox (``ops.rl.rollarc.sandbox.run_python``) by mode.

Runs ``n`` rounds, each one call of a trivial expression (``6 * 7``) in each mode (interleaved, so
that machine load hits every variant alike), and prints the median and p90 wall seconds per call, and the bare bubblewrap start (``bwrap ... /bin/true``-equivalent:
the interpreter's ``-c pass`` under the same namespaces and binds) against the bare interpreter
start, so that the namespace cost is separated from the supervisor's second interpreter.

    .venv/bin/python benchmarks/sandbox_overhead.py [n]

Real measurements on whatever machine runs it (no simulation); the numbers in docs/rollarc.md
("Sandbox") name their machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def _quantiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def main(n: int = 40) -> dict:
    from ops.rl.rollarc.sandbox import SANDBOX_MODES, _interpreter, bwrap_argv, run_python

    exe, _ = _interpreter()
    bare = {"python -I -S -c pass": [exe, "-I", "-S", "-c", "pass"],
            "bwrap + python -I -S -c pass": bwrap_argv([exe, "-I", "-S", "-c", "pass"])}
    walls: dict = {**{f"run_python[{m}]": [] for m in SANDBOX_MODES}, **{k: [] for k in bare}}
    for mode in SANDBOX_MODES:
        run_python("1", sandbox=mode)                    # warm the page cache
    for _ in range(n):                                   # interleaved: machine load hits every variant alike
        for mode in SANDBOX_MODES:
            r = run_python("6 * 7", sandbox=mode)
            assert r.ok and r.output == "42", r
            walls[f"run_python[{mode}]"].append(r.wall_s)
        for name, argv in bare.items():
            t = time.monotonic()
            subprocess.run(argv, check=True, env={}, timeout=30)
            walls[name].append(time.monotonic() - t)
    out = {k: _quantiles(v) for k, v in walls.items()}
    for k, (p50, p90) in out.items():
        print(f"{k:34s} median {p50 * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   (n={n})")
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
