"""benchmarks/gpu_suite.py (issue 40 item 5) where no device is lent: import and argument handling
only (the sections themselves run on a lent GPU machine)."""

import json
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import gpu_suite  # noqa: E402


def test_defaults_fit_the_eight_minute_budget_and_cover_every_section():
    a = gpu_suite.parse_args([])
    assert a.budget_s == 450.0 and a.budget_s < 8 * 60
    assert a.sections == ["vllm_smoke", "rollpacker", "gba", "rollarc"] and a.gba_workers == [8, 16]
    assert sum(gpu_suite.SHARES.values()) == pytest.approx(1.0)
    steps = gpu_suite.plan(a)
    assert sum(s["budget_s"] for s in steps) <= a.budget_s
    gba = next(s for s in steps if s["section"] == "gba")["command"]
    assert gba[gba.index("--throughput-workers") + 1] == "8,16" and gba[gba.index("--sections") + 1] == "throughput"
    rp = next(s for s in steps if s["section"] == "rollpacker")["command"]
    assert rp[rp.index("--rl-hidden") + 1] == "768"


@pytest.mark.parametrize("argv, needle", [
    (["--budget-s", "500"], "--budget-s must be in [60, 480]"),
    (["--budget-s", "30"], "--budget-s must be in [60, 480]"),
    (["--sections", "gba,tpu"], "unknown ['tpu']"),
    (["--gba-workers", "1,8"], "every W must be >= 2"),
    (["--gba-workers", "eight"], "comma-separated integers"),
])
def test_bad_arguments_exit_2_naming_the_argument(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_suite.parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_sections_keep_their_order_and_dry_run_runs_nothing(tmp_path, capsys):
    assert gpu_suite.parse_args(["--sections", "gba,rollpacker"]).sections == ["rollpacker", "gba"]
    out = tmp_path / "r.json"
    assert gpu_suite.main(["--dry-run", "--out", str(out), "--sections", "gba"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["section"] for s in plan["sections"]] == ["gba"] and plan["sections"][0]["budget_s"] == 135.0
    assert not out.exists()


def test_without_a_cuda_device_it_writes_the_reason_and_exits_3(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the suite would run")
    out = tmp_path / "r.json"
    assert gpu_suite.main(["--out", str(out), "--no-device-note", "not lent"]) == 3
    got = json.loads(out.read_text())
    assert got["device"] is None and got["sections"] == {} and got["note"] == "not lent"
    assert got["reason"].startswith("no CUDA device")
