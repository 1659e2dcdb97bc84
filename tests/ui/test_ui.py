"""The Dagster UI, used as a person would: start ``dagster dev`` on 127.0.0.1 (a free port, its own
process group, a fresh instance and lake), open it in headless Chromium (Debian's ``/usr/bin/chromium``
driven by Playwright: no browser download), check that the global asset graph shows every group,
materialize ``general_corpus`` with the asset page's Materialize button, wait for the run to succeed,
and save screenshots (``results/ui/`` or ``$CRUCIBLE_UI_RESULTS``). Everything it started is killed
by PID/process group. Opt-in: ``pytest -m ui tests/ui`` (~1-2 minutes)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.ui

GROUPS = ("sources", "curation", "training", "mixture")
RESULTS = Path(os.environ.get("CRUCIBLE_UI_RESULTS", ROOT / "results" / "ui"))
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 150


def _chromium() -> str:
    """Debian's Chromium; installed with apt-get when missing (root only), else the test is skipped."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
        if path:
            return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], capture_output=True, timeout=600)
        if Path("/usr/bin/chromium").exists():
            return "/usr/bin/chromium"
    msg = "no Chromium: apt-get install chromium (Debian) to run the browser test"
    if os.environ.get("CRUCIBLE_UI_REQUIRED"):       # CI: a missing browser is a failure, never a skip
        pytest.fail(msg)
    pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def dagster_dev(tmp: Path):
    """``dagster dev`` over a fresh instance and lake; yields (base URL, DAGSTER_HOME, log path)."""
    home = tmp / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = _free_port()
    log = tmp / "dagster_dev.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "CRUCIBLE_HOME": str(tmp / "lake"), "PYTHONUNBUFFERED": "1"}
    env.pop("CRUCIBLE_PROFILE", None)
    dagster = str(Path(sys.executable).parent / "dagster")
    with log.open("wb") as out:
        proc = subprocess.Popen([dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_default_signals)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/server_info", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dagster dev did not answer on {base} within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield base, home, log
    finally:
        pids = _descendants(proc.pid)
        for group in {proc.pid, *(os.getpgid(p) for p in pids if _alive(p))}:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.getpgid(pid)
        return True
    except ProcessLookupError:
        return False


def _dismiss_welcome(page) -> None:
    """Close the first-visit "Join the Dagster community" dialog when it shows."""
    skip = page.get_by_role("button", name="Skip", exact=True)
    try:
        skip.wait_for(state="visible", timeout=8_000)
    except Exception:
        return
    skip.click()
    skip.wait_for(state="hidden")


def test_ui_shows_every_group_and_materializes_an_asset(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")
    chromium = _chromium()
    RESULTS.mkdir(parents=True, exist_ok=True)
    with dagster_dev(tmp_path) as (base, home, log), sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)

            # 1. the global asset graph shows every group
            page.goto(f"{base}/asset-groups")
            _dismiss_welcome(page)
            for group in GROUPS:                              # in the sidebar and as a node of the graph
                names = page.get_by_text(group, exact=True)
                names.first.wait_for(state="visible")
                deadline = time.monotonic() + 30
                while names.count() < 2 and time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                assert names.count() >= 2, f"group {group!r} is not a node of the asset graph"
            page.wait_for_timeout(1500)                       # let the graph lay out before the picture
            page.screenshot(path=str(RESULTS / "asset_graph.png"), full_page=True)

            # 2. materialize general_corpus from its asset page
            page.goto(f"{base}/assets/general_corpus")
            try:
                page.locator("button", has_text="Materialize").first.click()
            except Exception:
                page.screenshot(path=str(RESULTS / "asset_page.png"), full_page=True)
                raise
            page.get_by_text("Launched run", exact=False).first.wait_for(state="visible")
            page.screenshot(path=str(RESULTS / "launched.png"))

            # 3. the run succeeds (watched in the Runs page, as a person would)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            page.goto(f"{base}/runs")
            while not page.get_by_text("Success", exact=True).count():
                if page.get_by_text("Failure", exact=True).count():
                    page.screenshot(path=str(RESULTS / "failed_run.png"), full_page=True)
                    pytest.fail(f"the run failed; see {RESULTS / 'failed_run.png'} and {log}")
                if time.monotonic() > deadline:
                    page.screenshot(path=str(RESULTS / "timeout.png"), full_page=True)
                    pytest.fail(f"no successful run within {RUN_TIMEOUT_S} s:\n{log.read_text()[-2000:]}")
                page.wait_for_timeout(3000)
                page.reload()
            page.locator("a[href*='/runs/']").first.click()
            page.get_by_text("general_corpus").first.wait_for(state="visible")
            page.get_by_text("Success", exact=True).first.wait_for(state="visible")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(RESULTS / "finished_run.png"), full_page=True)
        finally:
            browser.close()

        # the UI's run is a real run in the instance: one success that materialized general_corpus
        import dagster as dg

        instance = dg.DagsterInstance.from_config(str(home))
        try:
            runs = instance.get_runs()
            assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
            assert instance.get_latest_materialization_event(dg.AssetKey("general_corpus")) is not None
        finally:
            instance.dispose()
    for name in ("asset_graph.png", "launched.png", "finished_run.png"):
        assert (RESULTS / name).stat().st_size > 10_000, name
