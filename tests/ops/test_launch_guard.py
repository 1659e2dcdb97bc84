"""Nothing of a launch outlives its step (issue 42 item 8; case orchestrator-killed-mid-training):
``ops.launch.die_with_parent`` / ``pdeathsig_preexec`` (PR_SET_PDEATHSIG) on the launcher and every
rank, and the watchdog ``ops.launch.watch_launch`` that ``resources.compute.start_guarded`` starts
beside every launch. Real processes: a 2-rank torchrun launch, a local Ray instance."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.launch import alive, die_with_parent, pdeathsig_preexec, process_tree

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 5.0
"""Seconds within which every process of a launch must be gone after its step was SIGKILLed."""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")


def _wait_gone(procs: dict, bound_s: float) -> tuple[dict, float]:
    t0 = time.monotonic()
    while (left := alive(procs)) and time.monotonic() - t0 < bound_s:
        time.sleep(0.1)
    return left, time.monotonic() - t0


def _cmdlines(procs: dict) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except OSError:
            pass
    return out


def test_a_child_with_pdeathsig_dies_with_the_thread_that_started_it():
    """The preexec_fn of ComputeResource.run's Popen: the child (in a session of its own, as every
    launch is) dies when its parent is SIGKILLed; without it, the same child survives (the control)."""
    code = ("import subprocess, sys, time\n"
            "from ops.launch import pdeathsig_preexec\n"
            "guard = sys.argv[1] == '1'\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,\n"
            "                     preexec_fn=pdeathsig_preexec() if guard else None)\n"
            "print(c.pid, flush=True); time.sleep(60)\n")
    for guard, should_survive in (("1", False), ("0", True)):
        p = subprocess.Popen([sys.executable, "-c", code, guard], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        child = int(p.stdout.readline())
        procs = process_tree(child)
        assert list(procs) == [child]
        p.kill()
        p.wait(timeout=10)
        left, _ = _wait_gone(procs, 2.0)
        try:
            assert bool(left) is should_survive, (guard, left)
        finally:
            for pid in left:
                os.kill(pid, signal.SIGKILL)


def test_die_with_parent_kills_a_process_whose_parent_is_already_gone():
    """The race die_with_parent closes: a rank whose launcher died before it asked for the signal
    (it was re-parented) kills itself at once instead of running on as an orphan."""
    code = "from ops.launch import die_with_parent; die_with_parent(parent_pid=-5); print('still here')"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == -signal.SIGKILL and "still here" not in p.stdout
    assert die_with_parent() is True                              # in this (pytest) process: set, parent alive


def _killed_step(tmp_path, spec: dict, ranks: int, ready: list[str], timeout_s: float = 180.0):
    """Start _guard_step (a step process) with a launch of _guard_driver, wait until every file of
    ``ready`` exists in the run folder, snapshot the step's process tree, SIGKILL the step's process
    group (what an OOM kill or a preempted node does) and return (snapshot, command lines, processes left after
    BOUND_S, seconds until the last one went), with the snapshot's command lines."""
    out = tmp_path / "run"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    step = subprocess.Popen([sys.executable, "-m", "tests.ops._guard_step", str(tmp_path / "spec.json"), str(out), str(ranks)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = step.stdout.readline().split()
        assert line[:1] == ["launch"], step.stderr.read()[-3000:]
        launch_pid, watch_pid = int(line[1]), int(line[3])
        deadline = time.monotonic() + timeout_s
        while not all((out / f).exists() for f in ready):
            assert step.poll() is None, step.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"the launch did not start within {timeout_s} s"
            time.sleep(0.2)
        tree = process_tree(step.pid, (launch_pid,))
        tree.pop(watch_pid, None)                                     # the watchdog ends on its own, checked below
        names = _cmdlines(tree)
        os.killpg(step.pid, signal.SIGKILL)
        step.wait(timeout=10)
        left, took = _wait_gone({**tree, **process_tree(watch_pid)}, BOUND_S)
        return tree, names, left, took
    finally:
        if step.poll() is None:
            os.killpg(step.pid, signal.SIGKILL)
            step.wait(timeout=10)


def test_a_killed_step_leaves_no_launcher_and_no_rank(tmp_path):
    """torchrun (the launcher) and both ranks, mid-training: within BOUND_S of the step's SIGKILL
    none is left (before: the launch lived in a process group of its own and ran on as orphans)."""
    tree, names, left, took = _killed_step(tmp_path, {"sleep_s": 300}, 2, ["ready-0", "ready-1"])
    launchers = [n for n in names if "torch.distributed.run" in n]
    ranks = [n for n in names if "-m tests.ops._guard_driver" in n and n not in launchers]
    assert len(launchers) == 1 and len(ranks) == 2, names
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left after {BOUND_S} s: {_cmdlines(left)}"


def test_a_killed_step_leaves_no_local_ray_process(tmp_path):
    """A Ray-backed driver that started a local Ray instance (ops.launch.init_ray, as the RL drivers
    do) and an actor: within BOUND_S of the step's SIGKILL no Ray process is left, the renamed
    agents (ray::DashboardAgent, ray::RuntimeEnvAgent, which outlived their raylet by more than 30 s
    without the watchdog) and the actor's worker included."""
    tree, names, left, took = _killed_step(tmp_path, {"sleep_s": 300, "ray": True}, 0, ["ready-0", "actor-pid"])
    actor = int((tmp_path / "run" / "actor-pid").read_text())
    assert actor in tree and any("raylet" in n for n in names) and any("gcs_server" in n for n in names), names
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left after {BOUND_S} s: {_cmdlines(left)}"
