"""The Dagster UI, used as a person would: start ``dagster dev`` on 127.0.0.1 (a free port, its own
process group, a fresh instance and lake), open it in headless Chromium (Debian's ``/usr/bin/chromium``
driven by Playwright: no browser download), check that the global asset graph shows every group,
materialize ``ctr_events`` with the asset page's Materialize button, wait for the run to succeed,
open the materialization's figure (a PNG in its metadata) and save screenshots (``results/ui/`` or ``$CRUCIBLE_UI_RESULTS``). Everything it started is killed
by PID/process group. Opt-in: ``pytest -m ui tests/ui`` (~1-2 minutes)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ops.launcher import free_port
from tests.conftest import ROOT, wait_until_serving

pytestmark = pytest.mark.ui

GROUPS = ("sources", "curation", "training", "mixture")
RESULTS = Path(os.environ.get("CRUCIBLE_UI_RESULTS", ROOT / "results" / "ui"))
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 300


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
    port = free_port()
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
        wait_until_serving(proc, f"{base}/server_info", START_TIMEOUT_S, log, "dagster dev")
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


def _wait_for_run(home: Path, timeout_s: float) -> str:
    """The status of the instance's one run once it is finished (SUCCESS, FAILURE, CANCELED), or
    ``"not finished within <timeout_s> s (<status>)"``."""
    import dagster as dg

    finished = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
    deadline = time.monotonic() + timeout_s
    last = "no run"
    while time.monotonic() < deadline:
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            runs = instance.get_runs()
        finally:
            instance.dispose()
        if runs:
            last = runs[0].status.value
            if runs[0].status in finished:
                return last
        time.sleep(2)
    return f"not finished within {timeout_s} s ({last})"


def _diagnose(home: Path, log: Path) -> str:
    """Why a UI run did not succeed: every run's status and its last events from the instance, the
    dagster dev log without the daemons' tick lines, and the busiest processes on the machine."""
    import dagster as dg

    out = []
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        for run in instance.get_runs():
            out.append(f"run {run.run_id} {run.status.value}")
            for event in instance.all_logs(run.run_id)[-15:]:
                out.append(f"  {event.dagster_event_type or ''} {(event.message or '')[:300]}")
    finally:
        instance.dispose()
    ticks = ("AssetDaemon", "SchedulerDaemon", "SensorDaemon", "BackfillDaemon", "Prefetching", "Tick produced")
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if not any(t in ln for t in ticks)]
    out.append("dagster dev log (daemon ticks left out):")
    out.extend(lines[-60:])
    ps = subprocess.run(["ps", "-eo", "pid,pcpu,rss,etime,args", "--sort=-pcpu"], capture_output=True, text=True, timeout=30)
    out.append("busiest processes:")
    out.extend(ln[:200] for ln in ps.stdout.splitlines()[:12])
    return "\n".join(out)


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

            # 2. materialize ctr_events (a source asset with a figure in its metadata) from its asset page
            page.goto(f"{base}/assets/ctr_events")
            try:
                page.locator("button", has_text="Materialize").first.click()
            except Exception:
                page.screenshot(path=str(RESULTS / "asset_page.png"), full_page=True)
                raise
            page.get_by_text("Launched run", exact=False).first.wait_for(state="visible")
            page.screenshot(path=str(RESULTS / "launched.png"))

            # 3. the run succeeds: the instance is polled for its status (a reload loop on a loaded
            # machine can cancel the Runs page's query before it renders), then the Runs page shows it
            status = _wait_for_run(home, RUN_TIMEOUT_S)
            if status != "SUCCESS":
                page.goto(f"{base}/runs")
                page.wait_for_timeout(3000)
                page.screenshot(path=str(RESULTS / "failed_run.png"), full_page=True)
                pytest.fail(f"the UI's run ended {status} (see {RESULTS / 'failed_run.png'}):\n{_diagnose(home, log)}")
            page.goto(f"{base}/runs")
            try:
                page.get_by_text("Success", exact=True).first.wait_for(state="visible", timeout=120_000)
            except Exception:
                page.screenshot(path=str(RESULTS / "runs_page.png"), full_page=True)
                raise
            page.locator("a[href*='/runs/']").first.click()
            page.get_by_text("ctr_events").first.wait_for(state="visible")
            page.get_by_text("Success", exact=True).first.wait_for(state="visible")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(RESULTS / "finished_run.png"), full_page=True)

            # 4. the materialization's figure: a PNG written to the lake (assets._meta.image), its path in
            # the metadata; the asset page lists the entry with that path
            page.goto(f"{base}/assets/ctr_events")
            row = page.locator("tr", has=page.get_by_text("figure", exact=True))
            row.first.wait_for(state="visible")
            shown = row.first.inner_text()
            assert "_figures/" in shown and ".png" in shown, f"the figure row shows {shown!r}, not the figure's lake path"
            page.wait_for_timeout(500)
            page.screenshot(path=str(RESULTS / "metadata_plot.png"), full_page=True)
        finally:
            browser.close()

        # the UI's run is a real run in the instance: one success that materialized ctr_events
        import dagster as dg

        instance = dg.DagsterInstance.from_config(str(home))
        try:
            runs = instance.get_runs()
            assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
            event = instance.get_latest_materialization_event(dg.AssetKey("ctr_events"))
            assert event is not None
            figure = event.asset_materialization.metadata["figure"].value   # the PNG the UI row names
            assert Path(figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(figure).stat().st_size > 2_000
        finally:
            instance.dispose()
    for name in ("asset_graph.png", "launched.png", "finished_run.png", "metadata_plot.png"):
        assert (RESULTS / name).stat().st_size > 10_000, name
