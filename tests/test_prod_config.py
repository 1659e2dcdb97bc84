"""The production config as a pydantic model (pipelines/profiles.py: ProdConfig, extra="forbid"):
a typo'd key is an error naming it and the file, types are strict, and deploy/prod.example.yaml
really lists every key with its default."""

from pathlib import Path

import pytest

from pipelines.profiles import ProdConfig, ProfileError, load_prod_config
from tests.conftest import ROOT

EXAMPLE = ROOT / "deploy" / "prod.example.yaml"


def _bad(tmp_path: Path, text: str) -> str:
    f = tmp_path / "prod.yaml"
    f.write_text(text)
    with pytest.raises(ProfileError) as e:
        load_prod_config(str(f))
    msg = str(e.value)
    assert msg.startswith(f"{f}: "), msg  # the file comes first
    return msg


def test_a_typod_key_is_an_error_naming_it_the_file_and_the_nearest_key(tmp_path):
    msg = _bad(tmp_path, "teacher:\n  base_url: http://t:8000/v1\n  concurrancy: 8\n")
    assert "unknown key teacher.concurrancy (did you mean 'concurrency'?)" in msg
    assert "known: base_url, model, api_key_env, concurrency" in msg
    msg = _bad(tmp_path, "k8s:\n  gpus_per_stepp: 4\n")
    assert "unknown key k8s.gpus_per_stepp (did you mean 'gpus_per_step'?)" in msg
    msg = _bad(tmp_path, "executer: multiprocess\n")
    assert "unknown section 'executer' (did you mean 'executor'?)" in msg


def test_every_bad_key_is_reported_at_once_and_types_are_not_coerced(tmp_path):
    msg = _bad(tmp_path, "lake: {roott: s3://x}\ncompute: {num_processes: '8', launcher: slurm}\n"
                         "k8s: {node_selector: {gpu: true}, max_concurrent_steps: 0}\n")
    for needle in ("unknown key lake.roott (did you mean 'root'?)",
                   "compute.num_processes must be int, got str '8'",        # strict: "8" is not 8
                   "compute.launcher = 'slurm'; one of 'accelerate' or 'torchrun'",
                   "k8s.node_selector.gpu must be str, got bool True",      # k8s wants "true", not true
                   "k8s.max_concurrent_steps"):
        assert needle in msg, (needle, msg)
    assert "must be a mapping" in _bad(tmp_path, "lake: s3://bucket\n")
    assert "compute.num_processes must be int, got bool True" in _bad(tmp_path, "compute: {num_processes: true}\n")


def test_relative_paths_resolve_against_the_file_and_defaults_come_from_the_model(tmp_path):
    (tmp_path / "acc").mkdir()
    (tmp_path / "acc" / "gpu.yaml").write_text("distributed_type: MULTI_GPU\n")
    f = tmp_path / "prod.yaml"
    f.write_text("compute: {accelerate_config_file: acc/gpu.yaml}\nsources_file: sources.yaml\nexecutor: in_process\n")
    cfg = load_prod_config(str(f))
    assert cfg.compute.accelerate_config_file == str(tmp_path / "acc" / "gpu.yaml")
    assert cfg.sources_file == str(tmp_path / "sources.yaml")
    assert cfg.executor == "in_process" and cfg.source == str(f)
    assert cfg.compute.num_processes == 8 and cfg.teacher.concurrency == 64  # untouched keys keep their defaults
    with pytest.raises(Exception, match="frozen"):
        cfg.executor = "k8s"  # type: ignore[misc]
    assert load_prod_config("").source == "<defaults>"


def test_the_example_lists_every_key_with_its_default():
    import yaml

    doc = yaml.safe_load(EXAMPLE.read_text())
    defaults = ProdConfig().model_dump()
    for section, body in defaults.items():
        if section == "sources_file":  # commented out in the example (default: $CRUCIBLE_SOURCES)
            continue
        assert section in doc, section
        if isinstance(body, dict):
            assert set(doc[section]) == set(body), section
    example = load_prod_config(str(EXAMPLE)).model_dump()
    assert example == defaults  # (the accelerate path resolves to the same file)


def test_the_example_copied_alone_loads_its_accelerate_config_from_the_package(tmp_path):
    """Issue 40 item 1: copying prod.example.yaml without accelerate/ beside it works (the shipped
    config is the fallback), and ``python -m pipelines.profiles example`` prints the shipped example."""
    import subprocess
    import sys

    from pipelines.profiles import BUNDLED

    out = subprocess.run([sys.executable, "-m", "pipelines.profiles", "example"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == EXAMPLE.read_text()
    copy = tmp_path / "prod.yaml"
    copy.write_text(out.stdout)
    cfg = load_prod_config(str(copy))
    assert not (tmp_path / "accelerate").exists()
    assert cfg.compute.accelerate_config_file == str(BUNDLED / "accelerate" / "gpu_8.yaml")
    assert Path(cfg.compute.accelerate_config_file).is_file() and BUNDLED.parent.name == "pipelines"
    # a path that is neither beside the YAML nor shipped names the key, the file and both places searched
    copy.write_text("compute: {accelerate_config_file: accelerate/gpu_4.yaml}\n")
    msg = _bad(tmp_path, copy.read_text())
    assert f"compute.accelerate_config_file {tmp_path / 'accelerate' / 'gpu_4.yaml'} does not exist" in msg
    assert str(BUNDLED) in msg


def test_a_missing_prod_extra_names_the_package_install_not_a_checkout(monkeypatch):
    """Issue 40 item 1: the message says pip install "crucible[prod]", not pip install -e '.[prod]'."""
    import builtins

    from pipelines.profiles import prod_executor

    real_import = builtins.__import__

    def no_k8s(name, *args, **kwargs):
        if name == "dagster_k8s" or name.startswith("dagster_k8s."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_k8s)
    with pytest.raises(ProfileError) as e:
        prod_executor(load_prod_config(str(EXAMPLE)))
    assert 'pip install "crucible[prod]"' in str(e.value) and "-e" not in str(e.value)

