"""The MinHash kernels keep the process on one OpenMP runtime (``ops.curation.minhash.THREADING_LAYER``): after a
parallel kernel has run, importing torch must not bind torch to the system libgomp."""

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os
from ops.curation import minhash
batch = minhash.shingle_batch(["what is 2 + 3?", "let x be 4. solve for y.", "what is 2 + 3 ?"] * 50)
minhash.signatures(batch, 64)                      # launches Numba's threads
import numba, torch
torch.ones(512, 512) @ torch.ones(512, 512)        # torch's OpenMP pool
gomp = sorted({l.split()[-1] for l in open(f"/proc/{os.getpid()}/maps") if "libgomp" in l})
print(json.dumps({"layer": numba.threading_layer(), "gomp": gomp}))
"""


def _probe(env_extra: dict) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"} | env_extra
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kernels_run_on_workqueue_and_torch_keeps_its_own_libgomp():
    got = _probe({})
    assert got["layer"] == "workqueue"
    system = [p for p in got["gomp"] if "site-packages" not in p]
    assert system == [], f"system libgomp loaded beside torch's: {got['gomp']}"
    assert any("/torch/lib/" in p for p in got["gomp"])


@pytest.mark.skipif(ctypes.util.find_library("gomp") is None, reason="no system libgomp for Numba's OpenMP layer")
def test_an_explicit_threading_layer_is_kept():
    got = _probe({"NUMBA_THREADING_LAYER": "omp"})
    assert got["layer"] == "omp"
    # the case the default avoids: Numba's OpenMP layer loaded the system libgomp first
    assert any("site-packages" not in p for p in got["gomp"]), got["gomp"]
