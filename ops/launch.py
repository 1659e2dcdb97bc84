"""The worker side of the launch protocol (the asset side is ``assets.launch``; docs/architecture.md,
"Launching out-of-process work").

Every out-of-process driver is a module run as ``python -m <module> --spec SPEC.json --out RUN_DIR
--fingerprint FP`` (on several ranks through ``accelerate launch -m`` / ``torchrun -m``). Its
``main`` is one line, and the module ends through ``exit_worker``::

    def main(argv=None) -> int:
        return worker_main(RunSpec.from_json, run, argv, description=__doc__)

    if __name__ == "__main__":
        exit_worker(main())

where ``run(spec, out, fingerprint, pipes)`` trains, resumes from what it saved under ``out`` and
returns the result dict on rank 0 (``None`` on other ranks). ``worker_main`` parses the arguments,
validates the spec, opens the Pipes channel on rank 0 only (when every rank opens it the step fails
with "multiple materialize results", docs/platform-notes.md) and writes ``out/result.json``
atomically with the fingerprint, which is how the asset side recognises a finished launch.

On other ranks, or when a driver runs by hand without Dagster, ``pipes`` is a stand-in with the
same methods that logs to stderr and reports nothing. No Dagster import: only ``dagster_pipes``.
"""

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn


def rank() -> int:
    """This process's global rank (``RANK`` as set by torchrun/accelerate; 0 when launched alone)."""
    return int(os.environ.get("RANK", "0"))


class _LocalPipes:
    """What non-zero ranks (and hand-run scripts) get instead of a Pipes context."""

    def __init__(self, rank: int):
        self.log = logging.getLogger(f"crucible.rank{rank}")
        if not self.log.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter(f"[rank {rank}] %(message)s"))
            self.log.addHandler(h)
            self.log.setLevel(logging.INFO)
        self.extras: dict[str, Any] = {}
        self.partition_key = None

    def report_custom_message(self, payload: Any) -> None:
        pass

    def report_asset_materialization(self, *args: Any, **kwargs: Any) -> None:
        pass

    def report_asset_check(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextmanager
def rank0_pipes() -> Iterator[Any]:
    """Yield the Dagster Pipes context on rank 0 of a Pipes launch, else a local stand-in."""
    r = rank()
    if r == 0 and os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            yield pipes
    else:
        yield _LocalPipes(r)


PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when its parent thread exits (linux/prctl.h)."""


def _prctl():
    """libc's ``prctl`` through ctypes (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(sig: int = 9, parent_pid: "int | None" = None) -> bool:
    """Ask Linux to send this process ``sig`` (default SIGKILL) when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``), so a rank never outlives the launcher that started it.

    Linux delivers the signal when the parent *thread* that forked this process exits, not when the
    parent process does: the launchers (accelerate, torchrun) and ``ComputeResource.run`` start
    their children from a thread that waits for them, so the two coincide here. The setting survives
    ``execve`` (not of a set-user-ID binary) and is not inherited by this process's own children.

    Args:
        sig: the signal number.
        parent_pid: the parent this process expects (default: the parent it has now). When the
            parent is already gone (it died before the request took effect: this process was
            re-parented), this process sends itself ``sig`` at once.
    Returns:
        True when the request is in place; False off Linux (nothing done).
    Raises:
        OSError: ``prctl`` refused (errno and message).
    """
    prctl = _prctl()
    if prctl is None:
        return False
    expected = os.getppid() if parent_pid is None else parent_pid
    if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG, {sig}) failed: {os.strerror(err)}")
    if os.getppid() != expected or expected == 1:
        os.kill(os.getpid(), sig)
    return True


def pdeathsig_preexec(sig: int = 9) -> "Callable[[], None] | None":
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child die with ``sig`` when the
    calling thread exits (``die_with_parent``, done between fork and exec). Everything is resolved
    before the fork; the child only calls ``prctl`` and ``getppid`` (no import, no allocation worth
    a lock), which is what keeps a ``preexec_fn`` safe in a process that has other threads (the
    Dagster step has its Pipes reader). None off Linux."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent, getppid, _exit = os.getpid(), os.getppid, os._exit

    def _preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 or getppid() != parent:
            _exit(125)

    return _preexec


def _proc_table() -> "dict[int, tuple[int, int, int]]":
    """pid -> (parent pid, process group, start time in clock ticks since boot), from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()          # after "pid (comm) "
        if fields[0] in ("Z", "X"):                          # a zombie holds no resources and runs nothing
            continue
        out[int(d)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return out


def process_tree(root: int, groups: "tuple[int, ...]" = ()) -> "dict[int, int]":
    """The live processes under ``root`` (``root`` included) and every member of the process groups
    ``groups``: pid -> start time (clock ticks since boot; with the pid it names one process even
    after the pid is reused). Processes whose parent died and were re-parented are found only
    through their group: watch a tree while its root is alive (``watch_launch``)."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = {}, [root] + [p for p, (_, g, _) in table.items() if g in groups]
    while todo:
        p = todo.pop()
        if p in table and p not in found:
            found[p] = table[p][2]
            todo.extend(kids.get(p, ()))
    return found


def alive(procs: "dict[int, int]") -> "dict[int, int]":
    """The processes of ``procs`` (pid -> start time, as ``process_tree`` gives) still running."""
    table = _proc_table()
    return {p: t for p, t in procs.items() if p in table and table[p][2] == t}


def kill_processes(procs: "dict[int, int]", sig: int = 9) -> None:
    """Send ``sig`` to every process of ``procs`` still running (pid and start time both match)."""
    for p in alive(procs):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def watch_launch(step_pid: int, launch_pid: int, poll_s: float = 0.5) -> int:
    """The launch watchdog (``python -m ops.launch watch STEP_PID LAUNCH_PID``), started by
    ``ComputeResource.run`` in a session of its own beside every launch: every ``poll_s`` seconds it
    records the processes of the launch (the tree under ``launch_pid`` and its process group, which
    holds the ranks and a local Ray cluster's gcs_server, raylet and agents, and keeps them after
    their parent died), and when the step process ``step_pid`` is gone (this process was
    re-parented) it SIGKILLs them all and exits. ``die_with_parent`` kills the launcher and ranks
    when their parent dies; this is what kills the rest: a local Ray cluster's dashboard and
    runtime-env agents survived their raylet for more than 30 s (measured, Ray 2.60). Ends with 0
    when the step is gone, or is killed by the step when the launch is over.
    """
    import time

    seen: dict[int, int] = {}
    while True:
        gone = os.getppid() != step_pid
        seen.update(process_tree(launch_pid, (launch_pid,)))
        seen.pop(os.getpid(), None)
        if gone:
            for _ in range(3):                              # a process forked while we kill is caught next round
                kill_processes(seen)
                try:
                    os.killpg(launch_pid, 9)
                except (ProcessLookupError, PermissionError):
                    pass
                time.sleep(0.2)
                seen.update(process_tree(launch_pid, (launch_pid,)))
                seen.pop(os.getpid(), None)
            return 0
        seen = alive(seen)
        time.sleep(poll_s)


def worker_main(load_spec: Callable[[str], Any], run: Callable[[Any, Path, str, Any], "dict | None"],
                argv: "list[str] | None" = None, *, description: "str | None" = None,
                extra_args: "Callable[[argparse.ArgumentParser], None] | None" = None,
                scratch: "tuple[str, ...]" = ()) -> int:
    """The ``main`` of every launched driver (see the module docstring). It first asks for SIGKILL
    when this rank's parent (the launcher, or the step for a one-process launch) dies
    (``die_with_parent``), so no rank outlives its launch.

    Args:
        load_spec: parses the text of the spec file into the driver's spec and validates it; raises
            ValueError (or a subclass) naming the field on a bad value.
        run: ``run(spec, out, fingerprint, pipes)``; ``out`` exists. Returns the result dict on rank 0
            (written to ``out/result.json`` with ``fingerprint`` and ``retry_number`` added), ``None``
            elsewhere. When ``extra_args`` added options, ``spec`` is ``(spec, namespace)``.
        argv: the arguments (default ``sys.argv[1:]``).
        extra_args: adds driver-specific options to the parser.
        scratch: sub-folders of ``out`` that hold the driver's saved state (checkpoints); removed
            on rank 0 only after ``result.json`` is written, so a launch killed at any moment leaves
            either its saved state or its result (never neither) for the retry.
    Returns:
        0 (a failure raises).
    Raises:
        ValueError: the spec file is not valid JSON or ``load_spec`` rejects it; the message names
            the file.
    """
    import argparse

    die_with_parent()                                      # a rank never outlives its launcher
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the run spec (JSON) written by the asset")
    ap.add_argument("--out", required=True, help="the run folder: saved state, progress and result.json")
    ap.add_argument("--fingerprint", default="", help="the spec fingerprint the asset computed (ops.launch.spec_fingerprint)")
    if extra_args is not None:
        extra_args(ap)
    args = ap.parse_args(argv)
    spec_path = Path(args.spec)
    try:
        spec = load_spec(spec_path.read_text())
    except (ValueError, TypeError) as e:
        raise ValueError(f"{spec_path}: {e}") from e
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with rank0_pipes() as pipes:
        retry = (getattr(pipes, "extras", None) or {}).get("retry_number")
        if retry is not None:
            pipes.log.info(f"attempt {int(retry) + 1} (Dagster retry number {retry})")
        from ops.tracking import TrackedPipes, open_tracker

        tracker = open_tracker(out, spec, pipes)           # None unless CRUCIBLE_TRACKING_URI is set (rank 0)
        try:
            result = run((spec, args) if extra_args is not None else spec, out, args.fingerprint,
                         TrackedPipes(pipes, tracker) if tracker is not None else pipes)
        except BaseException:
            if tracker is not None:
                tracker.close(failed=True)
            raise
        if tracker is not None:
            tracker.close()
        if result is not None and rank() == 0:
            from ops.lake import write_json_atomic

            write_json_atomic({**result, "fingerprint": args.fingerprint, "retry_number": retry},
                              out / "result.json", indent=1)
            import shutil

            for name in scratch:                       # finished: the result is the record
                shutil.rmtree(out / name, ignore_errors=True)
    return 0


def exit_worker(code: int, barrier_timeout_s: float = 600.0) -> NoReturn:
    """End a launched driver's process with ``code``; a driver's last line is
    ``if __name__ == "__main__": exit_worker(main())``.

    Where this process is in a torch.distributed group (an ``accelerate launch`` / ``torchrun``
    launch of several ranks), every rank first meets at a barrier, so no rank leaves while another
    still uses the group (rank 0 arrives after writing ``result.json``). The barrier runs in a
    daemon thread joined for at most ``barrier_timeout_s`` seconds, whatever the backend (gloo:
    ``monitored_barrier``, which names a rank that does not arrive). Then stdout, stderr and
    logging are flushed and the process ends with ``os._exit(code)``, skipping the interpreter's
    finalisation. Why: with gloo, a rank that let the interpreter tear the group down aborted after
    its result was written ("terminate called without an active exception", SIGABRT, so the
    launch failed), also with ``destroy_process_group`` called first (docs/architecture.md,
    "Launching out-of-process work", for the measurement). A barrier that fails or times out is
    printed and the process still exits with ``code`` (the launcher sees a missing rank's own exit
    status). Without a group: ``sys.exit(code)``.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        sys.exit(code)
    import threading
    from datetime import timedelta

    failed: list[str] = []

    def _barrier() -> None:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=barrier_timeout_s))
            else:
                dist.barrier()
        except Exception as e:  # noqa: BLE001 - the exit status is the launch's, not the barrier's
            failed.append(repr(e))

    t = threading.Thread(target=_barrier, name="exit-barrier", daemon=True)
    t.start()
    t.join(barrier_timeout_s + 5.0)
    if t.is_alive():
        failed.append(f"no answer within {barrier_timeout_s:g} s")
    if failed:
        print(f"exit_worker: rank {rank()}: the exit barrier failed: {failed[0]}", file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def data_parallel(global_batch: int):
    """The accelerate ``Accelerator`` of a data-parallel worker started by ``ComputeResource`` (CPU when
    ``ACCELERATE_USE_CPU`` is set, as the embedded profile does), with the global batch split evenly.

    Returns:
        (accelerator, world_size, rank, local_batch) with local_batch = global_batch / world_size.
    Raises:
        ValueError: ``global_batch`` is not a multiple of the number of processes.
    """
    from accelerate import Accelerator

    acc = Accelerator(cpu=os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true"))
    world = acc.num_processes
    if global_batch % world:
        raise ValueError(f"global_batch {global_batch} is not a multiple of the {world} processes")
    return acc, world, acc.process_index, global_batch // world


def crash_after(env_var: str, unit: str) -> "int | None":
    """Fault injection shared by the training launches: the integer N in ``env_var`` (kill the launch
    after N ``unit``), or None when it is unset. Raises ValueError naming the variable when it is not
    an integer."""
    raw = os.environ.get(env_var, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{env_var} must be an integer ({unit} before the simulated crash), got {raw!r}") from None


class DriverState:
    """A training driver's saved progress in ``<out>/state/``: ``state.json`` (the commit point, with
    the spec ``fingerprint``) and the ``*.pt`` files it names. Subclasses list the JSON fields they
    keep in ``FIELDS`` (name -> default) and add what they save; ``load`` and ``commit`` do the file
    handling: a state of another spec is ignored (``skipped`` says why), a commit is atomic (temporary
    file + rename) and then removes the ``*.pt`` files the new state no longer names.

    Attributes: dir, path, fp, resumes (one dict per resume), skipped, seconds (time spent saving,
    over every launch), plus one attribute per ``FIELDS`` entry.
    """

    FIELDS: dict = {}

    def __init__(self, out, fp: str):
        import copy
        from pathlib import Path

        self.dir = Path(out) / "state"
        self.path = self.dir / "state.json"
        self.fp = fp
        self.resumes: list = []
        self.skipped = None
        self.seconds = 0.0
        for k, v in self.FIELDS.items():
            setattr(self, k, copy.deepcopy(v))

    def load(self) -> bool:
        """Read the saved state; True when there is one of this spec. Raises ValueError naming the
        file when it is not valid JSON."""
        import json

        if not self.path.exists():
            return False
        try:
            d = json.loads(self.path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"run state {self.path} is not valid JSON ({e}); delete {self.dir} to start over") from e
        if d.get("fingerprint") != self.fp:
            self.skipped = f"run state {self.path} is from another spec (fingerprint {d.get('fingerprint')}, this run {self.fp})"
            return False
        for k in self.FIELDS:
            setattr(self, k, d[k])
        self.resumes, self.seconds = d["resumes"], d.get("seconds", 0.0)
        return True

    def commit(self, t_start: float, keep_files: set) -> None:
        """Write ``state.json`` atomically (``t_start``: ``time.monotonic()`` when this save began),
        then delete the ``*.pt`` files not in ``keep_files``."""
        import time

        from ops.lake import write_json_atomic

        write_json_atomic({"fingerprint": self.fp, **{k: getattr(self, k) for k in self.FIELDS},
                           "resumes": self.resumes, "seconds": self.seconds + time.monotonic() - t_start},
                          self.path, indent=1)
        for f in self.dir.glob("*.pt"):
            if f.name not in keep_files:
                f.unlink(missing_ok=True)
        self.seconds += time.monotonic() - t_start


def spec_fingerprint(spec: dict, data_path: str) -> str:
    """Hash of what determines a run's steps: ``spec`` (JSON-serialisable, the caller drops the fields
    that do not, e.g. timeouts and addresses) plus the data file's resolved path, size and mtime (so a
    rewritten table is a new run). 16 hex digits."""
    import hashlib
    import json
    from pathlib import Path

    d = dict(spec)
    p = Path(data_path)
    if p.exists():
        st = p.stat()
        d["__data__"] = [str(p.resolve()), st.st_size, st.st_mtime_ns]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def init_ray(address, num_cpus: int, threads: int, resources: "dict | None" = None) -> None:
    """Start Ray for a training driver: ``auto`` inside a Ray Job (connect to the job's cluster; the
    job's runtime_env already carries the code and environment), connect to ``address`` (a
    cluster), or start a local instance with ``num_cpus`` and custom ``resources``; actors get this
    repository on PYTHONPATH and ``threads`` OpenMP threads. No dashboard, no log forwarding (the driver reports through Pipes)."""
    from pathlib import Path

    import ray

    if address == "auto":            # a Ray Job's driver: the job's runtime_env (working_dir, env) applies to every actor
        ray.init(address="auto", log_to_driver=False)
        return
    root = str(Path(__file__).resolve().parents[1])
    env = {"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, resources=resources or {}, include_dashboard=False, runtime_env=env,
                 log_to_driver=False, configure_logging=False)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        sys.exit(watch_launch(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit("usage: python -m ops.launch watch STEP_PID LAUNCH_PID")
