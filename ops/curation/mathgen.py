"""DeepMind's ``mathematics_dataset`` generator (Saxton et al., ICLR 2019), made importable today.

The 2019 package predates sympy 1.12 and numpy 2. Everything needed to run it lives here, and only
here:

* ``sympy.solvers.diophantine.base_solution_linear`` moved into the ``diophantine`` submodule:
  re-export it under the old name;
* ``numpy.object`` was removed: alias it to ``object``;
* ``ndarray.itemset`` was removed in numpy 2: the one module that calls it
  (``mathematics_dataset.sample.polynomials``) is loaded from its source with each
  ``arr.itemset(index, value)`` rewritten to ``arr[index] = value`` (same meaning for the full
  tuple indices it passes);
* determinism: ``util.composition`` draws variable letters with ``random.choice(list(a_set))``
  (order depends on the per-process string hash seed) and orders entities through a set of
  objects hashed by address. Both are rewritten to ordered equivalents (``sorted``,
  ``dict.fromkeys``), so a seed gives the same problems in every process.

Difficulty comes from the package's own train-easy / train-medium / train-hard entropy split.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import random
import re
import sys
from collections.abc import Iterator

_PATCHED = False
_ITEMSET = re.compile(r"^(\s*)([\w.]+)\.itemset\((\w+), (.+)\)\s*$", re.M)
_COMPOSITION_FIXES = (
    ("symbol = random.choice(list(allowed))", "symbol = random.choice(sorted(allowed))"),
    ("entities = set(context.child_entities)", "entities = dict.fromkeys(context.child_entities)"),
    ("entities.add(maybe_entity)", "entities[maybe_entity] = None"),
)
DIFFICULTIES = ("train-easy", "train-medium", "train-hard")


def _install_shims() -> None:
    global _PATCHED
    if _PATCHED:
        return
    import warnings

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if not hasattr(np, "object"):
            np.object = object  # type: ignore[attr-defined]
    importlib.import_module("sympy.solvers.diophantine")
    pkg = sys.modules["sympy.solvers.diophantine"]
    if not hasattr(pkg, "base_solution_linear"):
        sub = importlib.import_module("sympy.solvers.diophantine.diophantine")
        pkg.base_solution_linear = sub.base_solution_linear  # type: ignore[attr-defined]
    def itemset(source: str) -> str:
        patched, count = _ITEMSET.subn(r"\1\2[\3] = \4", source)
        if count != 2:
            raise ImportError(f"mathematics_dataset shim: expected 2 itemset calls, rewrote {count}")
        return patched

    def composition(source: str) -> str:
        for old, new in _COMPOSITION_FIXES:
            if source.count(old) != 1:
                raise ImportError(f"mathematics_dataset shim: {old!r} not found once in util/composition.py")
            source = source.replace(old, new)
        return source

    _load_rewritten("mathematics_dataset.sample.polynomials", itemset)
    _load_rewritten("mathematics_dataset.util.composition", composition)
    _PATCHED = True


def _load_rewritten(name: str, rewrite) -> None:
    """Import module ``name`` from its source after ``rewrite(source)``, before anyone else does."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ImportError("mathematics_dataset is not installed; run `make setup`")
    with open(spec.origin, encoding="utf-8") as f:
        source = rewrite(f.read())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)


def module_names() -> list[str]:
    """Names of all training modules (e.g. ``algebra__linear_1d``), sorted."""
    return sorted(_flat_modules(0))


def _flat_modules(level: int) -> dict:
    _install_shims()
    from mathematics_dataset.modules import modules

    lower, upper = level / 3, (level + 1) / 3

    def entropy_fn(range_):
        length = range_[1] - range_[0]
        return (range_[0] + lower * length, range_[0] + upper * length)

    flat: dict = {}

    def add(tree, prefix=None):
        for key, value in tree.items():
            full = f"{prefix}__{key}" if prefix else key
            if isinstance(value, dict):
                add(value, full)
            else:
                flat[full] = value

    add(modules.train(entropy_fn))
    return flat


def generate(per_module: int, seed: int = 0, modules: list[str] | None = None) -> Iterator[dict]:
    """Yield ``per_module`` problems for every (difficulty, module) pair, deterministically.

    Each (difficulty, module) stream is seeded from ``seed`` and its own name, so the output of one
    module does not depend on which other modules are generated. Questions longer than the package's
    ``MAX_QUESTION_LENGTH`` (or answers over ``MAX_ANSWER_LENGTH``) are skipped, as its own
    ``generate.py`` does.

    Yields:
        dicts with ``module``, ``difficulty`` (train-easy|train-medium|train-hard), ``index``,
        ``question`` and ``answer`` (strings).
    Raises:
        ValueError: per_module < 0, or an unknown module name.
    """
    if per_module < 0:
        raise ValueError(f"mathematics_dataset.per_module must be >= 0, got {per_module}")
    _install_shims()
    import numpy as np
    import sympy.core.random as sympy_random
    from mathematics_dataset import generate_settings

    for level, difficulty in enumerate(DIFFICULTIES):
        flat = _flat_modules(level)
        names = sorted(flat) if modules is None else modules
        unknown = set(names) - set(flat)
        if unknown:
            raise ValueError(f"unknown mathematics_dataset modules: {sorted(unknown)}")
        for name in names:
            digest = hashlib.sha256(f"{seed}/{difficulty}/{name}".encode()).digest()
            stream_seed = int.from_bytes(digest[:4], "little")
            random.seed(stream_seed)
            np.random.seed(stream_seed)
            sympy_random.seed(stream_seed)  # sympy's randprime draws from its own generator
            produced = attempts = 0
            while produced < per_module and attempts < per_module * 20:
                attempts += 1
                problem = flat[name]()
                question, answer = str(problem.question), str(problem.answer)
                if len(question) > generate_settings.MAX_QUESTION_LENGTH:
                    continue
                if len(answer) > generate_settings.MAX_ANSWER_LENGTH:
                    continue
                yield {"module": name, "difficulty": difficulty, "index": produced, "question": question, "answer": answer}
                produced += 1
