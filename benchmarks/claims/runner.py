"""Register a claim's design, run its seeds, keep the append-only log, and summarise every claim.

* ``register``: the design file must be tracked by git and unmodified against HEAD; records
  ``{design_sha256, registered_commit, registered_at}`` in ``registry.json``. A registered claim whose
  design changed must be registered again with ``supersede=True`` (the old entry is kept under
  ``superseded``; runs logged under the old sha no longer count).
* ``run``: refuses when the design's sha256 differs from the registry's, and a seed that already has a
  successful run in the log. Each seed runs ``run_seed(seed, arm_order, workdir, **params)`` in a fresh
  child process (its own process group, killed after the design's ``budget_minutes``), then one JSON line
  is appended to ``benchmarks/results/claims/<id>.jsonl`` (a failed seed too, with its error: nothing
  replaced, nothing selected), and ``claims.json`` is rewritten from all logs.
* ``summarize``: per claim, over every successful logged run under the registered sha: the estimate,
  its 95% interval and the verdict of the registered rule (``benchmarks.claims.stats``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from benchmarks._cli import jsonl_records
from benchmarks.claims.design import Design, DesignError, design_path, load_design, sha256_of
from benchmarks.claims.stats import delta_method_ratio_interval, paired_t_interval, ratio_of_means_interval, verdict

ROOT = Path(__file__).resolve().parents[2]


class ClaimError(RuntimeError):
    """The runner refuses: an unregistered or changed design, a seed already logged, a bad result."""


@dataclass(frozen=True)
class Layout:
    """Where a repository keeps its claims (tests point it at a temporary git repository)."""

    root: Path = ROOT

    @property
    def designs(self) -> Path:
        return self.root / "benchmarks" / "claims" / "designs"

    @property
    def registry(self) -> Path:
        return self.root / "benchmarks" / "claims" / "registry.json"

    @property
    def logs(self) -> Path:
        return self.root / "benchmarks" / "results" / "claims"

    @property
    def summary(self) -> Path:
        return self.root / "benchmarks" / "results" / "claims.json"

    @property
    def work(self) -> Path:
        return self.root / "benchmarks" / ".work" / "claims"

    def log(self, claim_id: str) -> Path:
        return self.logs / f"{claim_id}.jsonl"

    def rel(self, p: Path) -> str:
        return Path(p).resolve().relative_to(self.root.resolve()).as_posix()


def _git(layout: Layout, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=layout.root, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ClaimError(f"git {' '.join(args)} failed in {layout.root}: {r.stderr.strip()}")
    return r.stdout.strip()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def machine() -> dict:
    """CPU model (``/proc/cpuinfo``'s model name, else ``platform.processor()``), logical cores, the
    cores this process may use, and the OS."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": model, "cores": os.cpu_count(), "usable_cores": usable, "os": platform.platform()}


def read_json(path: Path) -> dict:
    """A JSON object file ({} when absent). Raises ClaimError naming the file when it is not JSON."""
    if not Path(path).exists():
        return {}
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ClaimError(f"{path}: not valid JSON: {e}") from e


def _write_json(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def read_log(path: Path) -> list[dict]:
    """Every line of a claim's log, in order. Raises ClaimError naming the file and line when a line
    is not a JSON object."""
    if not Path(path).exists():
        return []
    return [rec for _, rec in jsonl_records(path, ClaimError)]


def _append_log(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # append only: earlier lines are never rewritten
        f.write(json.dumps(record, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------------------- register
def register(claim_id: str, layout: Layout = Layout(), supersede: bool = False) -> dict:
    """Register the committed design of ``claim_id``; returns its registry entry.

    Raises:
        DesignError: the design is invalid. ClaimError: the file is not tracked by git, differs from
            HEAD (uncommitted edits), or is registered already (same sha: nothing to do; another sha:
            pass ``supersede``).
    """
    path = design_path(claim_id, layout.designs)
    design = load_design(path)
    rel = layout.rel(path)
    if not _git(layout, "ls-files", "--", rel):
        raise ClaimError(f"{rel} is not committed: commit the design before registering it")
    if _git(layout, "status", "--porcelain", "--", rel):
        raise ClaimError(f"{rel} has uncommitted changes: commit the design before registering it")
    head = _git(layout, "rev-parse", "HEAD")
    committed = subprocess.run(["git", "show", f"{head}:{rel}"], cwd=layout.root, capture_output=True,
                               timeout=60).stdout
    import hashlib

    if hashlib.sha256(committed).hexdigest() != design.sha256:
        raise ClaimError(f"{rel} differs from its committed version at {head[:12]}")
    reg = read_json(layout.registry)
    old = reg.get(claim_id)
    if old and old["design_sha256"] == design.sha256:
        raise ClaimError(f"{claim_id} is already registered with this design ({design.sha256[:12]}, "
                         f"commit {old['registered_commit'][:12]})")
    if old and not supersede:
        raise ClaimError(f"{claim_id} is registered with another design ({old['design_sha256'][:12]}); "
                         "a changed design is a new registration: pass --supersede (earlier runs stop counting)")
    entry = {"design_sha256": design.sha256, "registered_commit": head, "registered_at": _now(),
             "design": rel}
    if old:
        entry["superseded"] = old.pop("superseded", []) + [old]
    reg[claim_id] = entry
    _write_json(dict(sorted(reg.items())), layout.registry)
    return entry


def registered_design(claim_id: str, layout: Layout = Layout()) -> tuple[Design, dict]:
    """The design and its registry entry. Raises ClaimError when the claim is not registered or its
    design file's sha256 differs from the registered one."""
    design = load_design(design_path(claim_id, layout.designs))
    entry = read_json(layout.registry).get(claim_id)
    if entry is None:
        raise ClaimError(f"{claim_id} is not registered: python -m benchmarks.claims register {claim_id}")
    if entry["design_sha256"] != design.sha256:
        raise ClaimError(f"{claim_id}: the design changed after registration (registered "
                         f"{entry['design_sha256'][:12]}, file {design.sha256[:12]}); refusing to run")
    return design, entry


# ---------------------------------------------------------------------------------------------- run
def _check_result(design: Design, seed: int, result: object) -> dict:
    where = f"{design.id} seed {seed}: run_seed's result"
    if not isinstance(result, dict):
        raise ClaimError(f"{where} must be a dict arm -> {{metric: value}}, got {type(result).__name__}")
    for arm in design.arms:
        if arm not in result or not isinstance(result[arm], dict):
            raise ClaimError(f"{where} has no metrics for arm {arm!r} (arms {list(design.arms)})")
        for m in design.metrics:
            if m.name not in result[arm]:
                raise ClaimError(f"{where}: arm {arm!r} lacks metric {m.name!r}")
            v = result[arm][m.name]
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v != v):
                raise ClaimError(f"{where}: arm {arm!r} metric {m.name!r} must be a number or null, got {v!r}")
    return result


def _kill_tree(pid: int) -> None:
    """SIGKILL a seed's child ``pid``, its process group, and every descendant found before the kill,
    including those that started a session of their own (a benchmark's stage workers, Ray's
    processes), which a process-group kill does not reach (``ops.launch.process_tree`` /
    ``kill_processes``, the launch watchdog's own). Waits up to 30 s for them to go."""
    from ops.launch import alive, kill_processes, process_tree

    procs = process_tree(pid, groups=(pid,))
    kill_processes(procs)
    deadline = time.monotonic() + 30
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.1)


def _run_child(design: Design, seed: int, order: list[str], workdir: Path, layout: Layout) -> dict:
    """run_seed in a fresh Python process (own process group; killed after budget_minutes)."""
    out = workdir / "result.json"
    spec = {"command": design.command, "params": design.params, "seed": seed, "arm_order": order,
            "workdir": str(workdir), "out": str(out)}
    path = [str(layout.root), str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    timeout = design.budget_minutes * 60
    with open(workdir / "stdout.log", "w") as out_f, open(workdir / "stderr.log", "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.claims.child", json.dumps(spec)],
                                cwd=layout.root, env=env, start_new_session=True, stdout=out_f, stderr=err_f)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait(timeout=60)
            raise ClaimError(f"{design.id} seed {seed}: run_seed exceeded budget_minutes={design.budget_minutes}")
    if rc != 0 or not out.exists():
        tail = (workdir / "stderr.log").read_text()[-2000:]
        raise ClaimError(f"{design.id} seed {seed}: run_seed failed (exit {rc}): {tail}")
    return json.loads(out.read_text())


def source_runs(design: Design, layout: Layout = Layout()) -> tuple[Design, dict, list[dict]]:
    """For a design with ``runs_from``: the source claim's design, registry entry and log records
    under its registered sha whose seed is one of ``design``'s seeds.

    Raises:
        ClaimError: the source is not registered or changed since, or its command, params or arms
            differ from ``design``'s, or ``design`` lists a seed the source does not register.
    """
    src, entry = registered_design(design.runs_from, layout)
    where = f"{design.id} (runs_from {src.id})"
    if (src.command, src.params) != (design.command, design.params):
        raise ClaimError(f"{where}: command and params must equal {src.id}'s: the runs are that claim's")
    if set(src.arms) != set(design.arms):
        raise ClaimError(f"{where}: arms {list(design.arms)} differ from {src.id}'s {list(src.arms)}")
    extra = [s for s in design.seeds if s not in src.seeds]
    if extra:
        raise ClaimError(f"{where}: seeds {extra} are not registered by {src.id} ({list(src.seeds)})")
    recs = [r for r in read_log(layout.log(src.id))
            if r.get("design_sha256") == entry["design_sha256"] and r.get("seed") in design.seeds]
    return src, entry, recs


def logged_seeds(claim_id: str, sha: str, layout: Layout = Layout()) -> set[int]:
    """Seeds with a successful run under design ``sha`` in the claim's log."""
    return {r["seed"] for r in read_log(layout.log(claim_id))
            if r.get("design_sha256") == sha and r.get("status") == "ok"}


def run(claim_id: str, seeds: Optional[Sequence[int]] = None, layout: Layout = Layout(),
        in_process: bool = False) -> list[dict]:
    """Run registered seeds of a claim, append each to its log, rewrite claims.json.

    Args:
        seeds: a subset of the registered seeds; None: every registered seed not yet logged.
        in_process: call run_seed in this process (tests); the default is a fresh child process per seed.

    Returns:
        The log records appended, in order.

    Raises:
        ClaimError: not registered, the design changed, a seed outside the registered list or already
            logged. A seed whose run_seed fails is logged with status "failed" and the error, and the
            remaining seeds still run; ClaimError is raised at the end naming the failed seeds.
    """
    design, entry = registered_design(claim_id, layout)
    if design.runs_from:
        source_runs(design, layout)  # validates the pairing
        raise ClaimError(f"{claim_id} is decided on {design.runs_from}'s runs (runs_from): "
                         f"python -m benchmarks.claims run {design.runs_from}")
    done = logged_seeds(claim_id, design.sha256, layout)
    if seeds is None:
        todo = [s for s in design.seeds if s not in done]
    else:
        todo = list(seeds)
        bad = [s for s in todo if s not in design.seeds]
        if bad:
            raise ClaimError(f"{claim_id}: seeds {bad} are not registered (registered: {list(design.seeds)})")
        again = [s for s in todo if s in done]
        if again:
            raise ClaimError(f"{claim_id}: seeds {again} are already in the log {layout.rel(layout.log(claim_id))}; "
                             "a logged run is never replaced")
    commit = _git(layout, "rev-parse", "HEAD")
    # the code a seed runs on: tracked files outside benchmarks/results/ (the runner itself rewrites
    # claims.json and the logs there, which must not mark the next claim's runs as dirty)
    dirty = bool(_git(layout, "status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results"))
    host = machine()
    records, failed = [], []
    for seed in todo:
        order = design.arm_order(seed)
        layout.work.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f"{claim_id}-{seed}-", dir=layout.work))
        started, t0 = _now(), time.perf_counter()
        status, error, result = "ok", None, None
        try:
            if in_process:
                from benchmarks.claims.child import as_json, resolve

                result = as_json(resolve(design.command)(seed=seed, arm_order=order, workdir=workdir,
                                                         **design.params))
            else:
                result = _run_child(design, seed, order, workdir, layout)
            result = _check_result(design, seed, result)
        except Exception as e:  # logged, never dropped
            status, error = "failed", f"{type(e).__name__}: {e}"
            failed.append(seed)
        rec = {"claim": claim_id, "design_sha256": design.sha256, "registered_commit": entry["registered_commit"],
               "seed": seed, "arm_order": order, "status": status, "metrics": result, "error": error,
               "wall_s": round(time.perf_counter() - t0, 3), "commit": commit, "worktree_dirty": dirty,
               "machine": host, "started_at": started, "finished_at": _now(), "exploratory": False}
        _append_log(layout.log(claim_id), rec)
        records.append(rec)
    write_summary(layout)
    if failed:
        raise ClaimError(f"{claim_id}: seeds {failed} failed (logged with their errors in "
                         f"{layout.rel(layout.log(claim_id))})")
    return records


# ---------------------------------------------------------------------------------------- summarise
def _orient(values: list[float], direction: str) -> list[float]:
    return values if direction == "higher" else [-v for v in values]


def compare(design: Design, runs: list[dict], metric, treatment: str, baseline: str) -> dict:
    """Estimate and 95% interval of ``treatment`` against ``baseline`` on one metric over ``runs``
    (successful log records). speed_ratio: mean(baseline)/mean(treatment) for a lower-is-better
    metric (time), mean(treatment)/mean(baseline) for a higher-is-better one (throughput); otherwise
    the mean per-seed difference, signed so that positive favours the treatment."""
    pairs = [(r["metrics"][treatment][metric.name], r["metrics"][baseline][metric.name]) for r in runs]
    usable = [(t, b) for t, b in pairs if t is not None and b is not None]
    out = {"n": len(usable), "missing": len(pairs) - len(usable), "estimate": None, "ci95": None}
    if design.kind == "speed_ratio":
        out["definition"] = (f"mean {metric.name} of {baseline} / of {treatment}" if metric.direction == "lower"
                             else f"mean {metric.name} of {treatment} / of {baseline}")
    else:
        out["definition"] = (f"mean over seeds of ({treatment} - {baseline}) {metric.name}, {metric.unit}"
                             if metric.direction == "higher" else
                             f"mean over seeds of ({baseline} - {treatment}) {metric.name}, {metric.unit}")
    if len(usable) < 2:
        return out
    t = [p[0] for p in usable]
    b = [p[1] for p in usable]
    if design.kind == "speed_ratio":
        num, den = (b, t) if metric.direction == "lower" else (t, b)
        if design.ratio_interval == "delta":
            est, lo, hi = delta_method_ratio_interval(num, den)
        else:
            est, lo, hi = ratio_of_means_interval(num, den, n_resamples=design.n_resamples,
                                                  rng_seed=design.rng_seed)
    else:
        diffs = _orient([x - y for x, y in zip(t, b)], metric.direction)
        est, lo, hi = paired_t_interval(diffs)
    out["estimate"], out["ci95"] = est, [lo, hi]
    return out


def summarize_claim(design: Design, entry: Optional[dict], records: list[dict]) -> dict:
    """One claim's entry of claims.json (see docs/claims.md, "claims.json")."""
    base = {"id": design.id, "statement": design.statement, "paper": design.paper, "label": design.label,
            "kind": design.kind, "arms": list(design.arms), "margin": design.margin,
            "metric": {"name": design.metrics[0].name, "unit": design.metrics[0].unit,
                       "direction": design.metrics[0].direction, "decimals": design.metrics[0].decimals},
            "design": f"benchmarks/claims/designs/{design.id}.yaml", "log": f"benchmarks/results/claims/{design.id}.jsonl"}
    if entry is None:
        return {**base, "status": "not registered", "design_sha256": design.sha256, "registered_commit": None,
                "seeds": {"run": 0, "planned": len(design.seeds), "failed": 0}, "estimate": None, "ci95": None,
                "verdict": None, "machine": []}
    sha = entry["design_sha256"]
    mine = [r for r in records if r.get("design_sha256") == sha]
    if design.runs_from:  # records are the source claim's, already filtered to its registered sha
        mine = records
        base["runs_from"] = design.runs_from
        base["log"] = f"benchmarks/results/claims/{design.runs_from}.jsonl"
    ok = [r for r in mine if r.get("status") == "ok"]
    failed = [r for r in mine if r.get("status") != "ok"]
    planned = len(design.seeds)
    metrics = {}
    for m in design.metrics:
        c = compare(design, ok, m, design.arms[0], design.arms[1])
        lo, hi = (c["ci95"] if c["ci95"] else (None, None))
        c["margin"] = m.margin
        c["verdict"] = verdict(design.kind, lo, hi, m.margin, len(ok), planned)
        c["versus"] = {arm: {k: v for k, v in compare(design, ok, m, design.arms[0], arm).items()
                             if k in ("estimate", "ci95", "n")}
                       for arm in design.arms[2:]}
        metrics[m.name] = c
    verdicts = []
    for m in design.metrics:
        c = metrics[m.name]
        c["decides"] = m.decide
        c["verdicts_against"] = {design.arms[1]: c["verdict"]}
        for arm in design.against:
            if arm != design.arms[1]:
                v = c["versus"][arm]
                lo, hi = v["ci95"] if v["ci95"] else (None, None)
                c["verdicts_against"][arm] = verdict(design.kind, lo, hi, m.margin, len(ok), planned)
        if m.decide:
            verdicts += [c["verdicts_against"][a] for a in design.against]
    if "incomplete" in verdicts:
        overall = "incomplete"
    elif all(v == "shown" for v in verdicts):
        overall = "shown"
    elif "not shown" in verdicts:
        overall = "not shown"
    else:
        overall = "inconclusive"
    arm_means: dict = {}
    for arm in design.arms:
        keys = sorted({k for r in ok for k, v in r["metrics"][arm].items() if isinstance(v, (int, float))})
        arm_means[arm] = {k: sum(vals) / len(vals) for k in keys
                          if (vals := [r["metrics"][arm][k] for r in ok
                                       if isinstance(r["metrics"][arm].get(k), (int, float))])}
    machines = []
    for r in ok:
        mm = {k: r["machine"].get(k) for k in ("cpu_model", "cores")}
        if mm not in machines:
            machines.append(mm)
    first = metrics[design.metrics[0].name]
    status = "registered, not yet run" if not ok else ("incomplete" if len(ok) < planned else "complete")
    return {**base, "status": status, "design_sha256": sha, "registered_commit": entry["registered_commit"],
            "registered_at": entry["registered_at"],
            "seeds": {"run": len(ok), "planned": planned, "failed": len(failed),
                      "list": sorted(r["seed"] for r in ok)},
            "estimate": first["estimate"], "ci95": first["ci95"], "verdict": overall, "metrics": metrics,
            "arm_means": arm_means, "machine": machines,
            "commits": sorted({r["commit"] for r in ok})}


def summarize(layout: Layout = Layout()) -> dict:
    """claims.json's content: every design file, registered or not, summarised from its log."""
    reg = read_json(layout.registry)
    claims = {}
    for path in sorted(layout.designs.glob("*.yaml")):
        design = load_design(path)
        if design.runs_from and reg.get(design.id):
            records = source_runs(design, layout)[2]
        else:
            records = read_log(layout.log(design.id))
        claims[design.id] = summarize_claim(design, reg.get(design.id), records)
    missing = sorted(set(reg) - set(claims))
    if missing:
        raise ClaimError(f"{layout.rel(layout.registry)} registers {missing} but no design file exists")
    return {"about": "Confirmatory claims: generated by `python -m benchmarks.claims summarize` from "
                     "benchmarks/claims/registry.json and the append-only logs under benchmarks/results/claims/; "
                     "never edited by hand (docs/claims.md).",
            "claims": claims}


def write_summary(layout: Layout = Layout()) -> Path:
    """Rewrite claims.json from the registry and logs; returns its path."""
    _write_json(summarize(layout), layout.summary)
    return layout.summary


def ids(layout: Layout = Layout()) -> Iterable[str]:
    """Every claim id with a design file."""
    return [p.stem for p in sorted(layout.designs.glob("*.yaml"))]


__all__ = ["ClaimError", "DesignError", "Layout", "register", "run", "summarize", "write_summary",
           "registered_design", "read_log", "machine", "ids", "sha256_of"]
