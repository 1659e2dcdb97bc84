"""Launchpad paths of run-config classes (pipelines/config_paths.py) and the dotted-path setter they
share with ``assets._config.to_spec`` (``set_path``), on the real GBA run config (nested: cluster,
train, policy.decay)."""

import gc

import pytest

from assets._config import MIRRORS, set_path
from assets.gba import GBARunConfig
from ops.gba.config import JOB
from pipelines.config_paths import field_at, nested_config, sized_config, unknown_paths


def test_set_path_and_nested_config_build_the_nested_run_config():
    data = {"cluster": {"workers": 2}}
    set_path(data, "cluster.run_timeout_s", 60.0)
    set_path(data, "policy.decay.threshold", 3)
    set_path(data, "mode", "gba")
    assert data == {"cluster": {"workers": 2, "run_timeout_s": 60.0}, "policy": {"decay": {"threshold": 3}},
                    "mode": "gba"}
    assert nested_config({"train.epochs": 5.0, "cluster.workers": 4, "seed": 1}) == {
        "train": {"epochs": 5.0}, "cluster": {"workers": 4}, "seed": 1}


def test_field_at_and_unknown_paths_walk_the_nested_config_classes():
    assert field_at(GBARunConfig, "cluster.run_timeout_s").default == JOB.cluster.run_timeout_s
    with pytest.raises(KeyError, match="cluster.nope is not a field of GBARunConfig"):
        field_at(GBARunConfig, "cluster.nope.deeper")
    assert unknown_paths(GBARunConfig, ["train.epochs", "trian.epochs", "cluster.x"]) == ["cluster.x", "trian.epochs"]


def test_sized_config_replaces_defaults_at_dotted_paths_only():
    sized = sized_config(GBARunConfig, {"cluster.run_timeout_s": 42.0, "train.epochs": 0.5})
    assert sized.__name__ == "GBARunConfig" and issubclass(sized, GBARunConfig)
    c = sized()
    assert c.cluster.run_timeout_s == 42.0 and c.train.epochs == 0.5
    assert c.cluster.rpc_timeout_s == JOB.cluster.rpc_timeout_s      # the part's other defaults stay
    assert GBARunConfig().cluster.run_timeout_s == JOB.cluster.run_timeout_s   # the original is untouched
    with pytest.raises(KeyError, match="nope is not a field"):
        sized_config(GBARunConfig, {"nope": 1})
    # the sized subclasses share their bases' names: drop them, or the suite-wide walk of Config
    # subclasses (test_config_sources) finds them in place of the registered classes
    del sized, c
    gc.collect()
    assert all(k.__module__ != "assets.gba" or k in MIRRORS for k in GBARunConfig.__subclasses__())
