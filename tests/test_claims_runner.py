"""benchmarks.claims' runner (issue 38, item 1): registration pins a committed design, a changed design
and a logged seed are refused, the log is append-only, the verdict is recomputed from every logged run,
each seed runs in a fresh process with a timeout. Every test works in its own temporary git repository."""

import json
import subprocess
import textwrap

import pytest

from benchmarks.claims.design import DesignError, load_design
from benchmarks.claims.runner import ClaimError, Layout, read_log, register, run

TOY = '''
import time
def run_seed(seed, arm_order, workdir, base_s=3.0, speedup=2.0, sleep_s=0.0, fail_seed=None, grandchild=False):
    """Deterministic toy arms: the baseline takes base_s + (seed % 7) / 10 s, the treatment that / speedup.
    grandchild: first start a sleeping process in a session of its own (its pid in workdir/grandchild.pid)."""
    if seed == fail_seed:
        raise RuntimeError("planted failure")
    if grandchild:
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        (workdir / "grandchild.pid").write_text(str(p.pid))
    time.sleep(sleep_s)
    (workdir / "order.txt").write_text(",".join(arm_order))
    b = base_s + (seed % 7) / 10
    return {"fast": {"wall_s": b / speedup, "peak_mb": 10}, "slow": {"wall_s": b, "peak_mb": 12}}
'''

DESIGN = """\
id: toy-speed
paper: "A toy paper, section 1"
statement: "fast is at least 1.5x faster than slow"
label: simulated
arms: [fast, slow]
metric: {name: wall_s, unit: s, direction: lower}
kind: speed_ratio
unit: "one seed: both arms run from the same seed"
seeds: [1000, 1001, 1002, 1003]
test: "ratio of means, delta-method 95% interval (t, n-1 df)"
decision_rule: {margin: 1.5, rule: "shown if ci95 lower > 1.5; not shown if ci95 upper < 1.5; inconclusive otherwise"}
order: "arms alternate per seed"
warmup: "none: both arms cold"
command: "toyclaim:run_seed"
params: {speedup: 2.0}
budget_minutes: 1
"""


def git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "benchmarks" / "claims" / "designs").mkdir(parents=True)
    (root / "toyclaim.py").write_text(TOY)
    (root / "benchmarks" / "claims" / "designs" / "toy-speed.yaml").write_text(DESIGN)
    git(root, "init", "-q")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "toy design")
    monkeypatch.syspath_prepend(str(root))
    return Layout(root)


def commit(root, msg="edit"):
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", msg)


def head(root):
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()


def test_register_records_sha_and_commit(repo):
    entry = register("toy-speed", repo)
    assert entry["registered_commit"] == head(repo.root)
    assert entry["design_sha256"] == load_design(repo.designs / "toy-speed.yaml").sha256
    assert json.loads(repo.registry.read_text())["toy-speed"] == entry
    with pytest.raises(ClaimError, match="already registered"):
        register("toy-speed", repo)


def test_register_refuses_an_uncommitted_design(repo):
    p = repo.designs / "toy-speed.yaml"
    p.write_text(DESIGN.replace("margin: 1.5", "margin: 1.2"))
    with pytest.raises(ClaimError, match="uncommitted"):
        register("toy-speed", repo)
    (repo.designs / "toy-new.yaml").write_text(DESIGN.replace("id: toy-speed", "id: toy-new"))
    with pytest.raises(ClaimError, match="not committed"):
        register("toy-new", repo)


def test_run_refuses_a_design_changed_after_registration(repo):
    register("toy-speed", repo)
    (repo.designs / "toy-speed.yaml").write_text(DESIGN.replace("margin: 1.5", "margin: 1.2"))
    commit(repo.root)  # committed or not: the sha differs from the registered one
    with pytest.raises(ClaimError, match="changed after registration"):
        run("toy-speed", layout=repo, in_process=True)
    assert not repo.log("toy-speed").exists()
    register("toy-speed", repo, supersede=True)  # a new registration keeps the old one on record
    assert len(json.loads(repo.registry.read_text())["toy-speed"]["superseded"]) == 1


def test_run_refuses_unregistered_claims_and_seeds(repo):
    with pytest.raises(ClaimError, match="not registered"):
        run("toy-speed", layout=repo, in_process=True)
    register("toy-speed", repo)
    with pytest.raises(ClaimError, match=r"\[7\] are not registered"):
        run("toy-speed", [7], layout=repo, in_process=True)


def test_runs_append_alternate_order_and_give_the_verdict(repo):
    register("toy-speed", repo)
    recs = run("toy-speed", [1000, 1001], layout=repo, in_process=True)
    assert [r["arm_order"] for r in recs] == [["fast", "slow"], ["slow", "fast"]]
    summary = json.loads(repo.summary.read_text())["claims"]["toy-speed"]
    assert summary["verdict"] == "incomplete" and summary["seeds"] == {"run": 2, "planned": 4, "failed": 0,
                                                                       "list": [1000, 1001]}
    first = repo.log("toy-speed").read_text()
    with pytest.raises(ClaimError, match=r"\[1001\] are already in the log"):
        run("toy-speed", [1001], layout=repo, in_process=True)
    run("toy-speed", layout=repo, in_process=True)  # the rest: 1002, 1003
    after = repo.log("toy-speed").read_text()
    assert after.startswith(first)  # append-only
    log = read_log(repo.log("toy-speed"))
    assert [r["seed"] for r in log] == [1000, 1001, 1002, 1003]
    assert [r["arm_order"][0] for r in log] == ["fast", "slow", "fast", "slow"]
    for r in log:
        assert r["status"] == "ok" and r["design_sha256"] == load_design(repo.designs / "toy-speed.yaml").sha256
        assert r["commit"] == head(repo.root) and r["machine"]["cores"] >= 1
        assert r["started_at"] <= r["finished_at"]
    s = json.loads(repo.summary.read_text())["claims"]["toy-speed"]
    # every seed: slow / fast = 2 exactly, so the ratio of means is 2 with a zero-width interval
    assert s["estimate"] == pytest.approx(2.0) and s["ci95"] == pytest.approx([2.0, 2.0])
    assert s["verdict"] == "shown" and s["status"] == "complete"
    assert s["arm_means"]["slow"]["peak_mb"] == 12
    assert s["registered_commit"] == head(repo.root)


def test_verdict_not_shown_when_the_speedup_is_below_the_margin(repo):
    (repo.designs / "toy-speed.yaml").write_text(DESIGN.replace("{speedup: 2.0}", "{speedup: 1.2}"))
    commit(repo.root)
    register("toy-speed", repo)
    run("toy-speed", layout=repo, in_process=True)
    s = json.loads(repo.summary.read_text())["claims"]["toy-speed"]
    assert s["estimate"] == pytest.approx(1.2) and s["verdict"] == "not shown"


def test_a_failed_seed_is_logged_and_can_be_retried_without_erasing_it(repo):
    (repo.designs / "toy-speed.yaml").write_text(DESIGN.replace("{speedup: 2.0}", "{speedup: 2.0, fail_seed: 1001}"))
    commit(repo.root)
    register("toy-speed", repo)
    with pytest.raises(ClaimError, match=r"seeds \[1001\] failed"):
        run("toy-speed", layout=repo, in_process=True)
    log = read_log(repo.log("toy-speed"))
    assert [(r["seed"], r["status"]) for r in log] == [(1000, "ok"), (1001, "failed"), (1002, "ok"), (1003, "ok")]
    assert "planted failure" in log[1]["error"]
    s = json.loads(repo.summary.read_text())["claims"]["toy-speed"]
    assert s["seeds"]["run"] == 3 and s["seeds"]["failed"] == 1 and s["verdict"] == "incomplete"


def test_each_seed_runs_in_a_child_process_killed_after_its_budget(repo):
    (repo.designs / "toy-speed.yaml").write_text(DESIGN.replace("budget_minutes: 1", "budget_minutes: 0.02")
                                                 .replace("{speedup: 2.0}", "{speedup: 2.0, sleep_s: 0.0}"))
    commit(repo.root)
    register("toy-speed", repo)
    recs = run("toy-speed", [1000], layout=repo)  # a real child process
    assert recs[0]["status"] == "ok" and recs[0]["metrics"]["slow"]["wall_s"] == pytest.approx(3.6)
    (repo.designs / "toy-speed.yaml").write_text(DESIGN.replace("budget_minutes: 1", "budget_minutes: 0.02")
                                                 .replace("{speedup: 2.0}", "{speedup: 2.0, sleep_s: 30}"))
    commit(repo.root)
    register("toy-speed", repo, supersede=True)
    with pytest.raises(ClaimError, match="failed"):
        run("toy-speed", [1001], layout=repo)
    last = read_log(repo.log("toy-speed"))[-1]
    assert last["status"] == "failed" and "budget_minutes" in last["error"] and last["wall_s"] < 10


def test_a_seed_killed_after_its_budget_leaves_no_process_behind(repo):
    """A descendant in a session of its own (as a benchmark's stage workers start) dies with the seed:
    a process-group kill alone would leave it running."""
    import os
    import time

    (repo.designs / "toy-speed.yaml").write_text(DESIGN.replace("budget_minutes: 1", "budget_minutes: 0.05")
                                                 .replace("{speedup: 2.0}", "{speedup: 2.0, sleep_s: 60, grandchild: true}"))
    commit(repo.root)
    register("toy-speed", repo)
    with pytest.raises(ClaimError, match="failed"):
        run("toy-speed", [1000], layout=repo)
    pidfile = next(repo.work.glob("toy-speed-1000-*/grandchild.pid"))
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone too
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.2)
    else:
        os.kill(pid, 9)
        raise AssertionError(f"the seed's grandchild {pid} (own session) outlived the budget kill")


@pytest.mark.parametrize("edit,field", [
    (("seeds: [1000, 1001, 1002, 1003]", "seeds: [0, 1, 2]"), "seeds"),
    (("label: simulated", "label: measured"), "label"),
    (("kind: speed_ratio", "kind: superiority"), "kind"),
    (("direction: lower", "direction: down"), "metric.direction"),
    (("command: \"toyclaim:run_seed\"", "command: \"toyclaim.run_seed\""), "command"),
    (("id: toy-speed", "id: other"), "id"),
    (("budget_minutes: 1\n", ""), "budget_minutes"),
])
def test_a_bad_design_names_its_file_and_field(repo, edit, field):
    p = repo.designs / "toy-speed.yaml"
    p.write_text(DESIGN.replace(*edit))
    with pytest.raises(DesignError, match=rf"toy-speed.yaml: field '{field}'"):
        load_design(p)


def test_the_shipped_designs_are_valid():
    from benchmarks.claims.design import DESIGNS

    for p in sorted(DESIGNS.glob("*.yaml")):
        d = load_design(p)
        assert min(d.seeds) >= 1000 and d.budget_minutes > 0, p


THREE = '''
def run_seed(seed, arm_order, workdir, slow_b=2.0, slow_c=1.1):
    """Arm a takes 1 s (+ a seed wobble); b takes slow_b times as long, c slow_c times."""
    a = 1.0 + (seed % 3) / 10
    return {"a": {"wall_s": a}, "b": {"wall_s": a * slow_b + (seed % 2) / 100}, "c": {"wall_s": a * slow_c}}
'''


def test_a_claim_against_several_arms_is_shown_only_when_shown_against_each(repo):
    (repo.root / "toythree.py").write_text(THREE)
    design = (DESIGN.replace("id: toy-speed", "id: toy-three").replace("arms: [fast, slow]", "arms: [a, b, c]")
              .replace('"toyclaim:run_seed"', '"toythree:run_seed"').replace("params: {speedup: 2.0}", "params: {}")
              .replace('rule: "shown', 'against: [b, c], rule: "shown'))
    (repo.designs / "toy-three.yaml").write_text(design)
    git(repo.root, "add", ".")
    commit(repo.root, "three arms")
    register("toy-three", repo)
    recs = run("toy-three", layout=repo, in_process=True)
    assert [r["arm_order"] for r in recs][:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    s = json.loads(repo.summary.read_text())["claims"]["toy-three"]
    m = s["metrics"]["wall_s"]
    assert m["verdicts_against"] == {"b": "shown", "c": "not shown"}  # 2x against b; 1.1x < 1.5 against c
    assert m["versus"]["c"]["estimate"] == pytest.approx(1.1)
    assert s["verdict"] == "not shown"


def test_claims_json_is_what_the_registry_and_logs_give():
    """benchmarks/results/claims.json is never edited by hand: it equals a fresh summary."""
    from benchmarks.claims.runner import summarize

    committed = json.loads(Layout().summary.read_text())
    assert committed == json.loads(json.dumps(summarize(Layout()))), \
        "claims.json is stale: python -m benchmarks.claims summarize"


TOY_ACC = '''
def run_seed(seed, arm_order, workdir, speedup=2.0):
    """Two metrics per run: a time (speed claim) and an accuracy (non-inferiority claim)."""
    acc = {1000: (0.50, 0.52), 1001: (0.61, 0.60), 1002: (0.55, 0.58), 1003: (0.70, 0.69)}[seed]
    return {"fast": {"wall_s": 1.0 / speedup, "acc": acc[0]}, "slow": {"wall_s": 1.0, "acc": acc[1]}}
'''

def with_fields(design: str, **fields: str) -> str:
    """``design`` (YAML text, one top-level key a line) with the value text of each of ``fields``
    put in place of its line's, or appended as a new line when the key is not there."""
    lines = design.splitlines()
    for key, value in fields.items():
        at = [i for i, line in enumerate(lines) if line.startswith(f"{key}:")]
        if at:
            lines[at[0]] = f"{key}: {value}"
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


# the accuracy claim: toy-speed's arms, seeds, params and budget, decided on toy-speed's runs
ACC_DESIGN = with_fields(
    DESIGN, id="toy-acc", paper='"A toy paper, section 2"',
    statement='"fast is not worse than slow by more than 5 points"',
    metric="{name: acc, unit: fraction, direction: higher}", kind="non_inferiority",
    unit='"one seed of toy-speed\'s runs"', test='"paired t-interval"',
    decision_rule='{margin: 0.05, rule: "shown if ci95 lower > -0.05"}', order='"toy-speed\'s"',
    warmup='"toy-speed\'s"', command='"toyacc:run_seed"', runs_from="toy-speed")


def _acc_repo(repo, acc_design):
    """The speed claim and the accuracy claim both on ``toyacc:run_seed`` (a module of its own: the
    other tests' ``toyclaim`` stays imported in this process), committed and both registered."""
    (repo.root / "toyacc.py").write_text(TOY_ACC)
    speed = repo.designs / "toy-speed.yaml"
    speed.write_text(speed.read_text().replace("toyclaim:run_seed", "toyacc:run_seed"))
    (repo.designs / "toy-acc.yaml").write_text(acc_design)
    git(repo.root, "add", ".")
    commit(repo.root, "accuracy claim on the speed claim's runs")
    register("toy-speed", repo)
    register("toy-acc", repo)


def test_a_claim_decided_on_another_claims_runs(repo):
    """runs_from: the accuracy claim is decided on the speed claim's logged runs (one run, two claims):
    it runs nothing itself, and its summary is the paired interval over exactly those runs' accuracies."""
    _acc_repo(repo, ACC_DESIGN)
    with pytest.raises(ClaimError, match="runs_from.*run toy-speed|decided on toy-speed"):
        run("toy-acc", layout=repo, in_process=True)
    run("toy-speed", seeds=[1000, 1001, 1002], layout=repo, in_process=True)
    summary = json.loads(repo.summary.read_text())["claims"]
    acc = summary["toy-acc"]
    assert acc["runs_from"] == "toy-speed" and acc["log"].endswith("toy-speed.jsonl")
    assert acc["seeds"]["run"] == 3 and acc["status"] == "incomplete" and acc["verdict"] == "incomplete"
    # mean of (fast - slow) over seeds 1000-1002: (-0.02 + 0.01 - 0.03) / 3
    assert acc["estimate"] == pytest.approx(-0.04 / 3)
    assert not repo.log("toy-acc").exists()
    run("toy-speed", seeds=[1003], layout=repo, in_process=True)
    acc = json.loads(repo.summary.read_text())["claims"]["toy-acc"]
    assert acc["seeds"]["run"] == 4 and acc["estimate"] == pytest.approx(-0.03 / 4)
    assert summary["toy-speed"]["estimate"] == pytest.approx(2.0)


def test_runs_from_refuses_a_source_with_other_params(repo):
    _acc_repo(repo, ACC_DESIGN.replace("speedup: 2.0", "speedup: 3.0"))
    with pytest.raises(ClaimError, match="command and params must equal toy-speed"):
        run("toy-acc", layout=repo, in_process=True)
