"""The launched driver of tests/test_killed_run.py: "trains" ``steps`` steps of ``step_s`` seconds
each, saving its progress in ``<out>/state/state.json`` after every step (the commit point a retry
resumes from), and writes its output ``model.txt`` into the staged output folder the spec names
(``assets.launch.staged``), never into the lake. Ends through exit_worker."""

import json
import sys
import time
from pathlib import Path

from ops.launch import exit_worker, worker_main


def run(spec, out, fingerprint, pipes):
    from ops.lake import write_json_atomic

    state = out / "state" / "state.json"
    done = json.loads(state.read_text())["step"] if state.exists() else 0
    resumed_from = done
    pipes.log.info(f"kill driver: starting at step {done} of {spec['steps']}")
    while done < spec["steps"]:
        time.sleep(spec["step_s"])
        done += 1
        state.parent.mkdir(exist_ok=True)
        write_json_atomic({"step": done}, state)
    stage = Path(spec["stage"])
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "model.txt").write_text(f"trained {spec['steps']} steps, tag {spec['tag']}\n")
    return {"steps": done, "resumed_from": resumed_from}


if __name__ == "__main__":
    exit_worker(worker_main(json.loads, run, sys.argv[1:], scratch=("state",)))
