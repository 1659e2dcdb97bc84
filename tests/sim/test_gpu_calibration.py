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


def test_calibration_needs_only_torch_and_transformers():
    """A GPU machine's image has torch and transformers but neither polars nor dagster (the first device
    run lost its measurements to ``ops.lake`` importing polars in the results writer): the script, its
    CLI helpers and the atomic JSON writer import neither."""
    code = ("import sys, benchmarks.gpu_calibration, benchmarks._cli, ops.lake\n"
            "from ops.lake import write_json_atomic\n"
            "print(sorted(m for m in ('polars', 'dagster', 'ray') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_committed_h200_calibration_is_physically_plausible_for_an_h200_and_applies_to_its_profile():
    """What makes the committed calibration (a lent H200, 2026-12-04) a measurement of that device
    rather than a model's output or another card's (issue 42 item 5): the free memory the device
    reported (in the skip reasons, bytes / 1e9) fits an H200 (more than an 80 GiB H100 has, at
    most its 150.1e9 bytes of HBM); every decode step moves the model's weights no faster than the
    H200's peak HBM bandwidth (4.8 TB/s: a step is never shorter than weight_bytes / 4.8e12);
    step times grow with the context at every batch and with the model at every point; the
    measured/roofline ratios scatter (a roofline-generated table would sit on 1.0) within
    0.8-6; the point count is the run note's. Then: it loads, covers the three model classes, is
    used for the h200 profile only, and at a measured point the calibrated decode step is the
    measurement."""
    import re

    from sim.roofline import CALIBRATION_PATH, H200, MODELS

    d = json.loads(CALIBRATION_PATH.read_text())
    assert d["device"]["name"] == "NVIDIA H200" and d["device"]["profile"] == "h200"
    free = [float(m.group(1)) * 1e9 for sk in d["skipped"] if (m := re.search(r"of free ([0-9.]+) GB", sk["why"]))]
    assert free and all(80 * 2**30 < f <= 150.2e9 for f in free), free
    points = sum(len(m["decode"]) + len(m["prefill"]) for m in d["models"].values())
    assert f"{points} points" in d["run_note"] and d["wall_s"] <= d["budget_s"]
    by_model = {}
    for name, m in d["models"].items():
        dec = {(p["batch"], p["context"]): p["seconds"] for p in m["decode"]}
        by_model[name] = dec
        for p in m["decode"]:
            assert p["seconds"] >= m["config"]["weight_bytes"] / H200.hbm_bytes_s, (name, p)
        for b in {k[0] for k in dec}:
            ctx = sorted(c for bb, c in dec if bb == b)
            assert all(dec[(b, x)] < dec[(b, y)] for x, y in zip(ctx, ctx[1:])), (name, b)
        ratios = [p["seconds"] / p["roofline_s"] for p in m["decode"] + m["prefill"]]
        assert 0.8 <= min(ratios) and max(ratios) <= 6.0 and max(ratios) - min(ratios) > 0.5, (name, ratios)
    small, mid, big = by_model["qwen2.5-0.5b"], by_model["qwen2.5-1.5b"], by_model["qwen2.5-7b"]
    assert all(small[k] < mid[k] < big[k] for k in big.keys() & mid.keys() & small.keys())
    cal = Calibration.load(CALIBRATION_PATH)
    assert set(cal.tables) == {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"}
    p = d["models"]["qwen2.5-7b"]["decode"][0]
    r = Roofline(H200, MODELS["qwen2.5-7b"], calibration=cal)
    assert r.calibrated and not Roofline(H800, MODELS["qwen2.5-7b"], calibration=cal).calibrated
    assert r.decode_step_s(p["batch"], p["context"]) == pytest.approx(p["seconds"], rel=1e-6)
