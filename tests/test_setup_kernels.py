"""`crucible setup` compiles the MinHash kernels into Numba's on-disk cache (issue 41 item 6: a fresh
clone's first demo paid ~27 s of compiles in near_deduped_problems), and `setup --check` compiles nothing."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ops.curation import minhash
from ops.curation.dedup import near_dedup
from ops.curation.shard import band_keys

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "Let f(x) = 3x^2 + 2x - 7. Compute f(2) and f(-1), then their product.",
    "Let f(x) = 3x^2 + 2x - 7. Compute f(2) and f(-1), then their sum.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
    "Ein Zug fährt 120 km in 1,5 Stunden. Wie groß ist seine Durchschnittsgeschwindigkeit?",
    "∑_{k=1}^{n} k = ?",
    "7*8",
]


def test_compile_kernels_compiles_every_kernel_with_the_signatures_the_curation_steps_use():
    compiled = minhash.compile_kernels()
    assert set(compiled) == set(minhash.KERNELS) and all(n >= 1 for n in compiled.values())
    nat = minhash._native()
    before = {name: list(getattr(nat, name).signatures) for name in minhash.KERNELS}
    # the real callers (near dedup at both thresholds, the sharded band keys) on other texts: no new
    # signature may be compiled, else setup warmed the wrong types and the demo still compiles
    near_dedup(TEXTS, np.arange(len(TEXTS)), threshold=0.5)
    near_dedup(TEXTS + TEXTS[:2], np.arange(len(TEXTS) + 2), threshold=1.0)
    band_keys(TEXTS)
    after = {name: list(getattr(nat, name).signatures) for name in minhash.KERNELS}
    assert after == before


def _run(code: str, env: dict, timeout: float) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_setup_check_compiles_nothing(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "PYTHONPATH": str(ROOT)}
    out = _run("import sys; from pipelines.cli import main\n"
               "rc = main(['setup', '--check'])\n"
               "print('numba' in sys.modules, 'ops.curation.minhash_native' in sys.modules)", env, 120)
    assert out.strip().splitlines()[-1] == "False False"


@pytest.mark.slow
def test_a_later_process_loads_the_kernels_from_the_cache_instead_of_compiling(tmp_path):
    """Two fresh interpreters on an empty NUMBA_CACHE_DIR: the first compiles (cache misses, index files
    written), the second runs near dedup with zero misses and a hit on every kernel."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    stats = ("from ops.curation import minhash; nat = minhash._native()\n"
             "for k in minhash.KERNELS:\n"
             "    s = getattr(nat, k).stats; print(k, sum(s.cache_hits.values()), sum(s.cache_misses.values()))\n")
    first = _run("from ops.curation import minhash; minhash.compile_kernels()\n" + stats, env, 600)
    assert all(int(line.split()[2]) >= 1 for line in first.splitlines())          # compiled, not loaded
    assert list((tmp_path / "numba").rglob("*.nbi"))
    second = _run("import numpy as np; from ops.curation.dedup import near_dedup\n"
                  f"t = {TEXTS!r}; near_dedup(t, np.arange(len(t)), threshold=0.5)\n"
                  "near_dedup(t + t[:2], np.arange(len(t) + 2), threshold=1.0)\n" + stats, env, 600)
    rows = [line.split() for line in second.splitlines()]
    assert [r[0] for r in rows] == list(minhash.KERNELS)
    assert all(int(hits) >= 1 and int(misses) == 0 for _, hits, misses in rows), second
