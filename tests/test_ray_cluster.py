"""The RL assets on a real multi-node Ray cluster, as a cluster is used (docs/operations.md, "Ray
clusters"): a head and two worker nodes started as separate ``ray start`` processes with different
resources, the drivers submitted as Ray Jobs (the repository as the job's ``runtime_env``
working_dir, Pipes messages through a file in the run folder), and every role on a node that
advertises the resources it asks for.

Nodes (one CPU each, so roles must spread):
- head: ``reward`` (RollArc's Serve reward replicas), the job's driver;
- worker A: ``gpu_compute`` (RollArc's prefill engines and trainer);
- worker B: ``gpu_bandwidth`` and ``cpu_env`` (decode engines, environment workers).

The cluster uses its own temp dir, so it never becomes the machine's default cluster. Every
``ray start`` runs in a session (process group) of its own, and the node's processes stay in it
(gcs_server, raylet, the dashboard and the renamed agents ``ray::DashboardAgent`` /
``ray::RuntimeEnvAgent``, which a command-line match missed: six processes, ~0.9 GB, outlived every
run); workers and job drivers are their descendants. At the end the fixture SIGTERMs, then
SIGKILLs, those groups and every descendant, and fails when anything it started is still running
after that (``ray stop`` is not used: it stops every Ray on the machine, other sessions' too).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import lake_with_problems, materialize_logged

RAY = Path(sys.executable).parent / "ray"
MODEL_DIR = Path(__file__).resolve().parents[1] / ".models" / "SmolLM2-135M-Instruct"
NODES = {"head": {"reward": 4}, "worker_a": {"gpu_compute": 4}, "worker_b": {"gpu_bandwidth": 4, "cpu_env": 4}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_processes(groups: list[int]) -> dict:
    """pid -> start time of every live process in ``groups`` or below one of them."""
    from ops.launch import process_tree

    procs: dict = {}
    for g in groups:
        procs.update(process_tree(g, tuple(groups)))
    return procs


def _stop(groups: list[int], seen: dict) -> dict:
    """SIGTERM, then SIGKILL, the cluster's process groups and every process found in or below them
    (now or in ``seen``, snapshots taken while the nodes ran); returns what is still running after
    that (pid -> start time; empty when the cluster is gone)."""
    from ops.launch import alive, kill_processes

    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        procs = {**alive(seen), **_cluster_processes(groups)}
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        kill_processes(procs, sig)
        deadline = time.monotonic() + wait_s
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.3)
        seen = {**procs}
    return {**alive(seen), **_cluster_processes(groups)}


@pytest.fixture(scope="module")
def cluster():
    import json

    if not RAY.exists():
        pytest.skip("the ray CLI is not installed")
    tag = f"/tmp/crc-{uuid.uuid4().hex[:8]}"          # short: Ray's unix socket paths must stay < 108 bytes
    gcs, dash = _free_port(), _free_port()
    # the nodes run this environment's python (a job's entrypoint `python` is the node's, as on a real cluster)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{RAY.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # every node's dashboard agent (which runs submitted jobs) needs its own HTTP port on one host
    common = lambda: ["--num-cpus=1", "--disable-usage-stats", f"--dashboard-agent-listen-port={_free_port()}"]
    starts = [[str(RAY), "start", "--head", f"--port={gcs}", f"--dashboard-port={dash}", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--temp-dir={tag}", f"--resources={json.dumps(NODES['head'])}", *common()]]
    for name in ("worker_a", "worker_b"):
        # its own temp dir: nodes on one host must not unpack job packages into the same session folder
        starts.append([str(RAY), "start", f"--address=127.0.0.1:{gcs}", f"--resources={json.dumps(NODES[name])}",
                       f"--temp-dir={tag}-{name[-1]}", *common()])
    groups: list[int] = []                           # one process group per `ray start` (its CLI's pid)
    seen: dict = {}
    left: dict = {}
    try:
        for cmd in starts:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            groups.append(proc.pid)
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{out[-2000:]}\n{err[-2000:]}"
        _wait_for_nodes_and_jobs_api(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", env)
        seen.update(_cluster_processes(groups))
        yield {"gcs": f"127.0.0.1:{gcs}", "jobs": f"http://127.0.0.1:{dash}", "tag": tag, "env": env,
               "snapshot": lambda: seen.update(_cluster_processes(groups))}
    finally:
        seen.update(_cluster_processes(groups))
        left = _stop(groups, seen)
        for d in Path("/tmp").glob(Path(tag).name + "*"):
            shutil.rmtree(d, ignore_errors=True)
    assert not left, f"processes of the test's Ray cluster still running after SIGKILL: {sorted(left)}"


def _wait_for_nodes_and_jobs_api(gcs: str, jobs: str, env: dict, timeout_s: float = 180.0) -> None:
    """Until the three nodes are alive and the Jobs API answers (bounded)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_nodes

    os.environ["RAY_AUTH_MODE"] = env["RAY_AUTH_MODE"]
    deadline, err = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            alive = [n for n in list_nodes(address=gcs) if n.state == "ALIVE"]
            JobSubmissionClient(jobs).list_jobs()
            if len(alive) == 3:
                return
        except Exception as e:  # noqa: BLE001 - not up yet
            err = e
        time.sleep(1.0)
    pytest.fail(f"the 3-node Ray cluster was not up within {timeout_s}s: {err!r}")


def _placement(cluster) -> tuple[dict, list[dict]]:
    """(node id -> resources, actors with class name, node id and required resources) from the
    cluster's state API, dead actors included."""
    from ray.util.state import list_actors, list_nodes

    nodes = {n.node_id: n.resources_total for n in list_nodes(address=cluster["gcs"], detail=True)}
    actors = [{"class_name": a.class_name, "node_id": a.node_id, "required": a.required_resources or {}}
              for a in list_actors(address=cluster["gcs"], detail=True, limit=1000)]
    return nodes, actors


def _assert_roles_on_their_nodes(cluster, classes: set) -> dict:
    nodes, actors = _placement(cluster)
    assert len(nodes) == 3
    seen = {}
    for a in actors:
        if a["class_name"] not in classes:
            continue
        assert a["node_id"] in nodes, a
        have = nodes[a["node_id"]]
        for k, v in a["required"].items():
            assert have.get(k, 0) >= v, f"{a['class_name']} needs {k}={v} but landed on a node with {have}"
        seen.setdefault(a["class_name"], set()).add(a["node_id"])
    return seen


@pytest.fixture
def cluster_env(cluster, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    return cluster


def _run_as_ray_job(cluster, tmp_path, asset, name: str, config: dict):
    """Materialize the RL ``asset`` (op ``name``) with run config ``config`` on a lake of curated
    problems, its driver submitted as a Ray Job to ``cluster``; then snapshot the cluster's processes.
    Returns (result, metadata, log, lake). Skips when the SmolLM2 directory is missing."""
    from resources.compute import ComputeResource

    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    lake = lake_with_problems(tmp_path)
    compute = ComputeResource(ray_jobs_address=cluster["jobs"], ray_job_poll_s=0.5)
    res, meta, log, _ = materialize_logged([asset], {"lake": lake, "compute": compute},
                                           {"ops": {name: {"config": {"policy": "tiny", "model_dir": str(MODEL_DIR),
                                                                      **config}}}})
    cluster["snapshot"]()
    return res, meta, log, lake


def test_rollarc_run_as_a_ray_job_puts_each_role_on_the_node_its_pool_names(cluster_env, tmp_path):
    from assets import rollarc

    cluster = cluster_env
    config = {"methods": ["rollarc"], "checkpoint_every": 1, "run_timeout_s": 500.0,
              "arc": {"steps": 2, "groups_per_step": 2, "group_size": 2, "redundancy": 1, "async_ratio": 1, "max_turns": 2},
              "roles": {"max_new_tokens": 8, "env_latency": "low", "env_latency_mean_s": 0.05,
                        "engines": {"gpu_compute": 1, "gpu_bandwidth": 1}, "reward_autoscaling": {"max_replicas": 1}}}
    res, meta, log, lake = _run_as_ray_job(cluster, tmp_path, rollarc.rollarc_run, "rollarc_run", config)
    assert res.success
    assert "Ray job crucible-" in log and cluster["jobs"] in log          # submitted through the Jobs API
    assert "rollarc: step 2/2" in log                                      # Pipes messages came back from the job
    assert meta["ray_address"] == "auto"
    table = lake.read("rollarc_run")
    assert table["method"].to_list() == ["rollarc", "rollarc"]
    seen = _assert_roles_on_their_nodes(cluster, {"EngineServer", "EnvWorker", "_TrainerImpl"})
    nodes, _ = _placement(cluster)
    by_res = {k: {n for n, r in nodes.items() if k in r} for k in ("gpu_compute", "gpu_bandwidth", "cpu_env")}
    assert seen["_TrainerImpl"] <= by_res["gpu_compute"] and seen["EnvWorker"] <= by_res["cpu_env"]
    assert seen["EngineServer"] == by_res["gpu_compute"] | by_res["gpu_bandwidth"]   # one engine per pool, two nodes
    assert not list((tmp_path / "rollarc_run").glob(".run-*"))              # the run folder went after success


def test_rollpacker_run_as_a_ray_job_spreads_its_actors_over_the_nodes(cluster_env, tmp_path):
    from assets import rollpacker

    cluster = cluster_env
    config = {"methods": ["baseline"], "steps": 2, "prompts_per_step": 2, "responses_per_prompt": 2,
              "max_new_tokens": 8, "run_timeout_s": 400.0}
    res, meta, log, lake = _run_as_ray_job(cluster, tmp_path, rollpacker.rollpacker_run, "rollpacker_run", config)
    assert res.success and "Ray job crucible-" in log
    table = lake.read("rollpacker_run")
    assert table["method"].to_list() == ["baseline", "baseline"] and table["policy_version"].to_list() == [0, 1]
    # engine and trainer ask for one CPU each and every node has one: they land on two different nodes,
    # and the reward actor (0 CPUs) answers the driver through Ray calls across nodes
    seen = _assert_roles_on_their_nodes(cluster, {"_EngineImpl", "_TrainerImpl", "_RewardImpl"})
    assert {"_EngineImpl", "_TrainerImpl", "_RewardImpl"} <= set(seen)
    _, actors = _placement(cluster)
    last = {a["class_name"]: a["node_id"] for a in actors if a["class_name"] in ("_EngineImpl", "_TrainerImpl")}
    assert last["_EngineImpl"] != last["_TrainerImpl"]
