"""GPU roles ask Ray for ``num_gpus`` (issue: production paths; docs/rollpacker.md, "The shared RL
core"): on a real local Ray instance that advertises one GPU, an engine actor with engine_gpus 1
is placed with a CUDA device assigned (CUDA_VISIBLE_DEVICES set by Ray) and, on this CPU-only
machine, fails naming the field instead of silently training on CPU; with 0 it runs on CPU."""

import logging
import os
import time

import pytest

from ops.rl.ray_actors import role_device


def test_zero_gpus_is_cpu_and_gpus_without_cuda_fail_naming_the_field(monkeypatch):
    torch = pytest.importorskip("torch")
    assert role_device({"engine_gpus": 0}, "engine") == torch.device("cpu")
    assert role_device({}, "trainer") == torch.device("cpu")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the CPU-only error path cannot be exercised")
    with pytest.raises(RuntimeError, match=r"trainer_gpus = 0.5 but no CUDA device is visible to this trainer actor"):
        role_device({"trainer_gpus": 0.5}, "trainer")


def test_an_engine_actor_with_engine_gpus_gets_a_gpu_from_ray():
    ray = pytest.importorskip("ray")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: this test checks the placement on a CPU-only machine")
    from ops.rl.ray_actors import _EngineImpl

    ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        @ray.remote(num_cpus=0, num_gpus=1)
        def visible():
            return os.environ.get("CUDA_VISIBLE_DEVICES")

        assert ray.get(visible.remote(), timeout=60) == "0"         # Ray assigns the advertised GPU
        eng = ray.remote(num_cpus=0, num_gpus=1)(_EngineImpl).remote({"tokenizer_dir": "unused", "engine_gpus": 1})
        with pytest.raises(ray.exceptions.RayActorError, match=r"engine_gpus = 1 but no CUDA device .*CUDA_VISIBLE_DEVICES='0'"):
            ray.get(eng.version.remote(), timeout=120)
        deadline = time.monotonic() + 60                                # the dead actor releases its GPU
        while ray.available_resources().get("GPU", 0) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray.available_resources().get("GPU", 0) == 1.0
    finally:
        ray.shutdown()
