"""The `crucible` command line: argument errors are one clear line, not a traceback."""

import os
import subprocess
import sys

from tests.conftest import ROOT


def run(*args, home):
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_lineage_of_an_unknown_or_unmaterialized_asset_is_one_clear_line(tmp_path):
    res = run("lineage", "nope", home=tmp_path)
    assert res.returncode == 2 and "unknown asset 'nope'" in res.stderr and "Traceback" not in res.stderr
    res = run("lineage", "sft_dataset", home=tmp_path)
    assert res.returncode == 2 and "sft_dataset has no materialization" in res.stderr


def test_sources_lists_builtin_then_user_partitions(tmp_path):
    res = run("sources", home=tmp_path)
    assert res.returncode == 0
    assert res.stdout.split()[:4] == ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc"]
