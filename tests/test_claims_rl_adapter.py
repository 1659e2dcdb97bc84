"""The RL claims adapter's Ray start (benchmarks/claims/adapters/rl.py): a start-up timeout, which Ray
raises when its raylet misses a fixed 30 s registration window on a loaded machine, is retried up to
RAY_START_ATTEMPTS times with a shutdown between tries; any other error is raised at once."""

import pytest

import ops.launch
from benchmarks.claims.adapters import rl

TIMEOUT = Exception("The current node timed out during startup. This could happen because ...")


class _Ray:
    def __init__(self):
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1


def _failing(errors):
    calls = []

    def init_ray(address, num_cpus, threads):
        calls.append((address, num_cpus, threads))
        if errors:
            raise errors.pop(0)

    return init_ray, calls


def test_a_startup_timeout_is_retried_then_succeeds(monkeypatch):
    init_ray, calls = _failing([TIMEOUT, TIMEOUT])
    monkeypatch.setattr(ops.launch, "init_ray", init_ray)
    ray = _Ray()
    rl._start_ray(ray)
    assert calls == [(None, 2, 1)] * 3 and ray.shutdowns == 2


def test_the_last_startup_timeout_and_any_other_error_are_raised(monkeypatch):
    init_ray, calls = _failing([TIMEOUT] * rl.RAY_START_ATTEMPTS)
    monkeypatch.setattr(ops.launch, "init_ray", init_ray)
    with pytest.raises(Exception, match="timed out during startup"):
        rl._start_ray(_Ray())
    assert len(calls) == rl.RAY_START_ATTEMPTS
    init_ray, calls = _failing([RuntimeError("port in use")])
    monkeypatch.setattr(ops.launch, "init_ray", init_ray)
    with pytest.raises(RuntimeError, match="port in use"):
        rl._start_ray(_Ray())
    assert len(calls) == 1
