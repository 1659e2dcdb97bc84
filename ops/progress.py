"""Progress lines for long steps: ``label: done/total (pct) · rate unit/s · ETA`` at most every
``every_s`` seconds and once at the end, so the Dagster run view shows how far a step is.

    p = Progress(len(items), "verify", context.log.info, unit="items")
    for ...:
        p.update()
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    """Rate-limited progress logging (no Dagster import: pass any ``log(str)`` callable).

    Args:
        total: units of work (>= 0).
        label: what is being done.
        log: where lines go (``context.log.info``, ``pipes.log.info``, ``print``).
        every_s: minimum seconds between lines (the last unit always logs).
        unit: name of a unit in the line.
    """

    def __init__(self, total: int, label: str, log: Callable[[str], None], every_s: float = 10.0, unit: str = "items",
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.label, self.log, self.every_s, self.unit = max(0, int(total)), label, log, every_s, unit
        self.clock = clock
        self.done = 0
        self.t0 = self._last = clock()

    def line(self) -> str:
        el = max(self.clock() - self.t0, 1e-9)
        rate = self.done / el
        pct = 100.0 * self.done / self.total if self.total else 100.0
        left = self.total - self.done
        eta = f"{left / rate:.0f} s" if rate > 0 and left > 0 else ("0 s" if left <= 0 else "?")
        return f"{self.label}: {self.done}/{self.total} {self.unit} ({pct:.0f}%) · {rate:.2f} {self.unit}/s · ETA {eta}"

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.done >= self.total or now - self._last >= self.every_s:
            self._last = now
            self.log(self.line())
