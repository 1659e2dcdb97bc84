"""The child process of one confirmatory seed: ``python -m benchmarks.claims.child '<spec JSON>'``.

The spec holds ``command`` (``module:function``), ``params``, ``seed``, ``arm_order``, ``workdir`` and
``out``; the child calls ``run_seed(seed=, arm_order=, workdir=Path, **params)`` and writes its result
(arm -> {metric: value}) to ``out`` as JSON. A fresh process per seed: no arm inherits another seed's
imports, caches or allocator state.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Callable


def resolve(command: str) -> Callable:
    """The callable named by ``module:function``. Raises ValueError when the module or the function
    cannot be found (the message names the command)."""
    mod_name, _, fn_name = command.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"command {command!r}: cannot import module {mod_name!r}: {e}") from e
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"command {command!r}: module {mod_name!r} has no callable {fn_name!r}")
    return fn


def as_json(result: object) -> object:
    """The result as plain JSON types (numpy scalars become floats)."""
    return json.loads(json.dumps(result, default=float))


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    fn = resolve(spec["command"])
    result = fn(seed=spec["seed"], arm_order=spec["arm_order"], workdir=Path(spec["workdir"]), **spec["params"])
    Path(spec["out"]).write_text(json.dumps(as_json(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
