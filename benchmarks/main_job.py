"""Wall time of the main job (`crucible demo`) on the embedded default, in a fresh lake/instance.

    .venv/bin/python benchmarks/main_job.py [--out benchmarks/results/main_job.json] [--skip training,posttrain]

Runs the same command as `make demo` in a subprocess with a temporary CRUCIBLE_HOME and
DAGSTER_HOME, and records the wall time of every run it launches and of the whole job.
"""

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, write_results  # noqa: E402


class _kept:
    def __init__(self, path: str):
        self.path = str(Path(path).resolve())

    def __enter__(self) -> str:
        Path(self.path).mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc) -> None:
        pass


def main() -> int:
    ap = bench_parser(__doc__, "main_job.json")
    ap.add_argument("--keep", default=None, help="run in this folder and keep the lake/instance (e.g. for "
                    "benchmarks/dcpt_bench.py --lake <folder>/lake) instead of a temporary one")
    ap.add_argument("--skip", default="", help="stages `crucible demo --skip` leaves out (e.g. training,posttrain "
                    "to time the curation and mixture groups alone); their figures are then null")
    args = ap.parse_args()
    with (tempfile.TemporaryDirectory() if args.keep is None else _kept(args.keep)) as tmp:
        env = {**os.environ, "CRUCIBLE_HOME": f"{tmp}/lake", "DAGSTER_HOME": f"{tmp}/dagster"}
        env.pop("CRUCIBLE_SOURCES", None)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "demo", *(["--skip", args.skip] if args.skip else [])],
                              cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    runs = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(.+?): ok in ([\d.]+)s", proc.stdout, re.M)}
    curation = sum(v for k, v in runs.items() if k.startswith("raw_problems[") or k == "curation graph")
    gba = sum(v for k, v in runs.items() if k.startswith("gba_run["))
    rollpacker = sum(v for k, v in runs.items() if k.startswith("rollpacker_run"))
    posttrain = sum(v for k, v in runs.items() if k.startswith("post-training"))
    mixture = sum(v for k, v in runs.items() if k.startswith("mixture:"))
    skipped = {x.strip() for x in args.skip.split(",") if x.strip()}
    ran = lambda stage, v: None if stage in skipped else round(v, 1)  # noqa: E731
    result = {
        "command": "crucible demo (= make demo after setup)" + (f" --skip {args.skip}" if args.skip else ""),
        "wall_s": round(wall, 1),
        "runs_s": runs,
        "curation_group_s": ran("curation", curation),
        "target_curation_group_s": 360,
        "meets_target": None if "curation" in skipped else curation < 360,
        "training_job_s": runs.get("training (ctr_events, ctr_model)"),
        "gba_all_modes_s": ran("training", gba), "target_gba_s": 90, "gba_meets_target": None if "training" in skipped else gba < 90,
        "rollpacker_s": ran("training", rollpacker), "target_rollpacker_s": 180,
        "rollpacker_meets_target": None if "training" in skipped else rollpacker < 180,
        "posttrain_s": ran("posttrain", posttrain), "target_posttrain_s": 240,
        "posttrain_meets_target": None if "posttrain" in skipped else posttrain < 240,
        "mixture_group_s": ran("mixture", mixture), "target_mixture_s": 360,
        "mixture_meets_target": None if "mixture" in skipped else mixture < 360,
        "load_average_at_end": os.getloadavg(),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"),
    }
    write_results(result, args.out, indent=2)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
