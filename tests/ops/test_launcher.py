"""ops.launcher: the one argv/environment builder of a launch, shared by ComputeResource and the
benchmarks, importable without Dagster."""

import subprocess
import sys
from pathlib import Path

import pytest

from ops.launcher import Launcher

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FIELDS = ("launcher", "num_processes", "cpu", "accelerate_config_file", "mixed_precision", "threads_per_process",
                 "tracking_uri", "tracking_experiment")


def test_compute_resource_takes_its_launch_defaults_from_the_launcher():
    from resources.compute import ComputeResource

    c = ComputeResource()
    assert {f: getattr(c, f) for f in LAUNCH_FIELDS} == {f: getattr(Launcher(), f) for f in LAUNCH_FIELDS}
    assert c.launcher_settings() == Launcher()


@pytest.mark.parametrize("fields", [
    {},                                                   # embedded default: 2 CPU ranks, --multi_gpu
    {"num_processes": 1},                                 # one rank: --cpu
    {"num_processes": 4, "launcher": "torchrun"},
    {"cpu": False, "mixed_precision": "bf16", "num_processes": 8},
    {"accelerate_config_file": "deploy/accelerate/gpu_8.yaml", "cpu": False},
    {"tracking_uri": "http://mlflow:5000", "tracking_experiment": "x", "threads_per_process": 2},
])
def test_compute_resource_builds_the_launchers_command_and_env(fields):
    from resources.compute import ComputeResource

    c, lz = ComputeResource(**fields), Launcher(**fields)
    for kw in ({}, {"module": True}, {"num_processes": 3}):
        assert c.launch_command("ops.gba.launch_sync", ["--spec", "s.json"], port=29501, **kw) == \
            lz.command("ops.gba.launch_sync", ["--spec", "s.json"], port=29501, **kw)
    assert c.launch_env() == lz.env()


def test_embedded_cpu_command_and_env():
    cmd = Launcher(num_processes=4).command("x.py", ["a"], port=29500)
    assert cmd == [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "4",
                   "--num_machines", "1", "--dynamo_backend", "no", "--mixed_precision", "no",
                   "--main_process_ip", "127.0.0.1", "--main_process_port", "29500", "x.py", "a"]
    assert Launcher(num_processes=1).command("x.py", port=29500)[-6:] == [
        "--cpu", "--main_process_ip", "127.0.0.1", "--main_process_port", "29500", "x.py"]
    assert Launcher().env() == {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
                                "ACCELERATE_USE_CPU": "true"}
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        Launcher(num_processes=0).command("x.py")


def test_gba_benchmark_launch_path_imports_no_dagster_and_no_pipes():
    """benchmarks/gba_bench.py builds its launches with ops.launcher, and the GBA drivers it starts
    (sync ranks, the PS and its workers) import neither dagster nor, outside a Pipes launch,
    dagster_pipes: the benchmark runs where only torch and accelerate are installed."""
    code = ("import sys; sys.modules['dagster'] = None; sys.modules['dagster_pipes'] = None\n"   # importing either fails
            "import benchmarks.gba_bench, ops.gba.sync, ops.gba.ps, ops.gba.server, ops.gba.launch_ps, ops.gba.launch_sync\n"
            "from ops.launcher import Launcher\n"
            "print(Launcher(num_processes=2).command('ops/gba/launch_sync.py', port=29500)[3])")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "--multi_gpu"
