"""benchmarks/gpu_calibration.py --tiny: runs on CPU in seconds and writes a calibration JSON that
sim/roofline.py reads and applies."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.roofline import CALIBRATION_SCHEMA, CPU_TINY, H800, TINY, Calibration, Roofline

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_calibration_writes_a_json_the_roofline_applies(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "gpu_calibration.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_calibration.py"), "--tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["schema"] == CALIBRATION_SCHEMA and d["device"]["profile"] == "cpu-tiny"
    assert "--tiny" in d["command"]
    tiny = d["models"]["tiny"]
    assert len(tiny["decode"]) == 6 and len(tiny["prefill"]) == 4          # the --tiny grid, nothing skipped
    assert all(p["seconds"] > 0 and p["roofline_s"] > 0 for p in tiny["decode"] + tiny["prefill"])
    assert tiny["config"]["params"] == TINY.params
    cal = Calibration.load(out)
    r = Roofline(CPU_TINY, TINY, calibration=cal)
    assert r.calibrated and not Roofline(H800, TINY, calibration=cal).calibrated
    for p in tiny["decode"]:
        assert r.decode_step_s(p["batch"], p["context"]) == pytest.approx(p["seconds"], rel=1e-6)
    for p in tiny["prefill"]:
        assert r.prefill_s(p["batch"], p["context"]) == pytest.approx(p["seconds"], rel=1e-6)
