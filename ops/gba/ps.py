"""The parameter-server modes over torch.distributed.rpc (TensorPipe): rank 0 is the PS ("ps":
token control, dense parameters, table shard 0), ranks 1..num_ps-1 the table shards ("ps1", ...,
``--role shard``), ranks num_ps..num_ps+W-1 the workers (GBA, arXiv 2205.11048 §3; docs/gba.md).

Launch: ``python -m ops.gba.launch_ps --spec spec.json --out DIR`` (``ops.launch.worker_main``)
starts rank 0, which starts its shard processes and W workers itself (``--role shard|worker``;
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) as children in its process group, so a launch
timeout kills them all. Rank 0 routes each pull's rows and each update's rows to their owning
shard (``ops.gba.model.ServerModel``; RPC from rank 0 to a shard, never to a worker); a shard that
dies fails the run (its rows are gone), keeping the checkpoints. Why not torchrun: its elastic agent
stops every rank when one fails, which is the opposite of GBA's Invariant 4 (a failed worker drops
its token and batch; nothing else breaks). Rank 0 watches its workers' processes and declares a
worker lost when it exits before being told to stop. On several hosts, start workers with the same
command and ``--role worker`` (same environment contract).

Protocol (every call ``rpc_sync`` with an explicit timeout; the PS never calls a worker, so a dead
worker can block nothing): ``hello`` -> first batch number; ``pull(batch, ids)`` -> token, rows,
dense parameters (only when changed) or wait/stop; ``push(token, batch, gradient)`` -> next batch
number or stop. Waits (start barrier, SSP bound, Hop-BW step) are polls bounded by
``cluster.wait_timeout_s``. Rank 0 reports evaluation points through Dagster Pipes
(``ops.launch.rank0_pipes``), logs progress lines (samples applied / total, rate, ETA), writes
``progress.jsonl`` and ``workers.json`` and returns the result, which ``worker_main`` writes as
``result.json``. A run that cannot finish (every worker lost, ``run_timeout_s``) raises
``RunFailed`` and writes no result: the launch exits non-zero and keeps its checkpoints.

Resume: the PS checkpoints into ``--out`` every ``cluster.checkpoint_every`` global steps
(``ops.gba.server``, ``ops.gba.checkpoint``); launched again with the same ``--out`` and spec it
loads the last checkpoint before its workers connect and continues from that global step, logging
the Dagster retry number (``PipesContext.retry_number``). Fresh workers start; the batches the
killed run had handed out but not applied are handed out again first. A finished run removes its
checkpoints (its ``result.json`` is the record), so a later launch over the folder starts afresh.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ops.launcher import free_port

from .errors import RunFailed

_SERVER = None        # the ParameterServer of this process (rank 0 only)
_READY = threading.Event()    # set once _SERVER is built (workers may call as soon as the RPC world is up)
_SHARD = None         # the TableShard of a shard process
_SHARD_STOP = threading.Event()
_READY_TIMEOUT_S = 120.0


def _server():
    if not _READY.wait(_READY_TIMEOUT_S):
        raise RuntimeError(f"the parameter server was not ready after {_READY_TIMEOUT_S} s")
    return _SERVER


# -- RPC handlers (run on the PS's RPC threads) ----------------------------------------------------
def _hello(w: int):
    return _server().hello(w)


def _pull(w: int, batch: int, ids: dict, version: int):
    return _server().pull(w, batch, ids, version)


def _push(w: int, token: int, batch: int, grad):
    return _server().push(w, token, batch, grad)


# -- shard handlers (on a shard process; only rank 0 calls them) ------------------------------------
def _shard_rows(ids: dict):
    return _SHARD.rows(ids)


def _shard_read(ids: dict):
    return _SHARD.read(ids)


def _shard_apply(sparse: dict):
    return _SHARD.apply(sparse)


def _shard_save(folder: str, name: str):
    return _SHARD.save(folder, name)


def _shard_load(folder: str, name: str):
    return _SHARD.load(folder, name)


def _shard_save_handover(folder: str, k: int, num_ps: int):
    return _SHARD.save_handover(folder, k, num_ps)


def _shard_load_handover(folder: str, k: int, num_ps: int):
    return _SHARD.load_handover(folder, k, num_ps)


def _shard_stop():
    _SHARD_STOP.set()


class ShardClient:
    """Rank 0's handle on shard process ``k`` (RPC name ``ps<k>``): TableShard's methods, each one
    ``rpc_sync`` with the run's RPC timeout."""

    def __init__(self, k: int, timeout_s: float):
        self.name, self.timeout = f"ps{k}", timeout_s

    def _call(self, fn, *args):
        import torch.distributed.rpc as rpc

        return rpc.rpc_sync(self.name, fn, args=args, timeout=self.timeout)

    def rows(self, ids):
        return self._call(_shard_rows, ids)

    def read(self, ids):
        return self._call(_shard_read, ids)

    def apply(self, sparse):
        return self._call(_shard_apply, sparse)

    def save(self, folder, name):
        return self._call(_shard_save, folder, name)

    def load(self, folder, name):
        return self._call(_shard_load, folder, name)

    def save_handover(self, folder, k, num_ps):
        return self._call(_shard_save_handover, folder, k, num_ps)

    def load_handover(self, folder, k, num_ps):
        return self._call(_shard_load_handover, folder, k, num_ps)

    def stop(self):
        return self._call(_shard_stop)


def _rpc_options(spec, port: int):
    import torch.distributed.rpc as rpc

    return rpc.TensorPipeRpcBackendOptions(rpc_timeout=spec.cluster.rpc_timeout_s, init_method=f"tcp://127.0.0.1:{port}",
                                           num_worker_threads=max(4, spec.cluster.workers + spec.cluster.num_ps + 2))


class Watchdog:
    """A daemon thread that ends this process (``os._exit(1)``, after ``on_fail``) when ``check()``
    returns a reason, or when ``started`` is not set within ``start_timeout_s``: rpc.init_rpc has
    no timeout of its own (its TCP rendezvous waits 30 minutes for a missing rank)."""

    def __init__(self, name: str, start_timeout_s: float, check, on_fail=lambda: None):
        self.started = threading.Event()
        self.name, self.timeout, self.check, self.on_fail = name, start_timeout_s, check, on_fail
        threading.Thread(target=self._run, name=f"{name}-watchdog", daemon=True).start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            time.sleep(0.2)
            reason = self.check()
            if reason is None and not self.started.is_set() and time.monotonic() > deadline:
                reason = f"the RPC world was not up after cluster.start_timeout_s = {self.timeout} s"
            if reason is not None:
                print(f"[{self.name}] giving up: {reason}", file=sys.stderr, flush=True)
                self.on_fail()
                os._exit(1)


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc} before it was told to stop"


# -- rank 0 ----------------------------------------------------------------------------------------
def serve(spec, spec_path: str, out: Path, pipes) -> dict:
    """Rank 0: start the workers, serve until the configured global steps are applied, report
    through ``pipes``. Returns the result (even with lost workers; its checkpoints removed: the
    result is the record). Raises RunFailed when the run could not finish (every worker lost, run
    timeout), keeping its checkpoints so that a relaunch resumes."""
    global _SERVER
    import torch
    import torch.distributed.rpc as rpc

    from ops.progress import Progress

    from .checkpoint import Checkpoints, crash_if_asked, fingerprint
    from .data import load
    from .server import ParameterServer

    torch.set_num_threads(spec.cluster.threads)
    P = spec.cluster.num_ps
    port, world = free_port(), spec.cluster.workers + P
    t0 = time.monotonic()
    data = load(spec.events_path, spec.train.crosses, spec.data_cache)   # fills the cache before the workers read it

    def start(role: str, i: int, rank: int):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(spec.cluster.threads)}
        return subprocess.Popen([sys.executable, "-m", "ops.gba.launch_ps", "--role", role, "--index", str(i),
                                 "--port", str(port), "--spec", spec_path, "--out", str(out)], env=env)

    shard_procs = [start("shard", k, k) for k in range(1, P)]
    procs = [start("worker", i, P + i) for i in range(spec.cluster.workers)]
    (out / "workers.json").write_text(json.dumps({**{f"worker{i}": p.pid for i, p in enumerate(procs)},
                                                  **{f"ps{k + 1}": p.pid for k, p in enumerate(shard_procs)}}))
    progress = (out / "progress.jsonl").open("a")
    try:
        def on_eval(point: dict) -> None:
            progress.write(json.dumps(point) + "\n")
            progress.flush()
            pipes.report_custom_message(point)
            pipes.log.info(f"{spec.mode}: global step {point['global_step']:.1f}, {point['train_s']:.1f} s, "
                           f"test AUC {point['auc']:.4f}, log loss {point['logloss']:.4f}")

        fp = fingerprint(spec)
        ckpts = Checkpoints(out, fp) if spec.cluster.checkpoint_every else None
        prog: dict = {"line": None, "early": 0}        # the line starts when the RPC world is up

        def on_progress(n: int) -> None:
            if prog["line"] is None:
                prog["early"] += n
            else:
                prog["line"].update(n)

        def on_checkpoint(rec: dict) -> None:
            pipes.log.info(f"{spec.mode}: checkpoint {rec['count']} at global step {rec['global_step']:.1f}")
            crash_if_asked(rec["count"], pipes.log.info)

        def on_switch(ev: dict) -> None:
            pipes.report_custom_message({"switch": ev})
            pipes.log.info(f"auto: switch {ev['from']} -> {ev['to']} at global step {ev['global_step']:.1f} "
                           f"({ev['train_s']:.1f} s): {ev['reason']}")

        t1 = time.monotonic()

        def early_exit():
            for name, p in [*((f"worker{i}", p) for i, p in enumerate(procs)),
                            *((f"ps{k + 1}", p) for k, p in enumerate(shard_procs))]:
                if p.poll() is not None:
                    return f"{name} {describe_exit(p.returncode)} before the RPC world was up"

        def kill_children():
            for p in procs + shard_procs:
                p.kill()

        guard = Watchdog("ps", spec.cluster.start_timeout_s, lambda: None if guard.started.is_set() else early_exit(),
                         kill_children)
        rpc.init_rpc("ps", rank=0, world_size=world, rpc_backend_options=_rpc_options(spec, port))
        guard.started.set()
        shards = [ShardClient(k, spec.cluster.rpc_timeout_s) for k in range(1, P)]
        try:
            _SERVER = ParameterServer(spec, data, on_eval=on_eval, checkpoints=ckpts, on_checkpoint=on_checkpoint,
                                      on_progress=on_progress, shards=shards, on_switch=on_switch)
            _READY.set()
            total = _SERVER.steps_target * spec.global_batch
            resumed = _SERVER.resumed_from
            if ckpts is not None and ckpts.skipped:
                pipes.log.warning(f"{spec.mode}: {ckpts.skipped}")
            if resumed:
                pipes.log.info(f"{spec.mode}: resuming from checkpoint {resumed['checkpoint']} at global step "
                               f"{resumed['global_step']:.1f} ({resumed['samples']} of {total} samples applied, "
                               f"{resumed['reissued_batches']} batch(es) handed out again) on Dagster retry "
                               f"{getattr(pipes, 'retry_number', 'n/a')}")
            done = resumed["samples"] if resumed else _SERVER.start_samples      # a hand-over's start
            label = f"{spec.mode}: training" + (f" (resumed at global step {resumed['global_step']:.1f})" if resumed else "")
            with _SERVER.lock:
                prog["line"] = Progress(total - done, label, pipes.log.info, unit="samples")
                if prog["early"]:
                    prog["line"].update(prog["early"])
            pipes.log.info(f"{spec.mode}: PS ready (data + model {t1 - t0:.1f} s, RPC world of {world} up after "
                           f"{time.monotonic() - t1:.1f} s)")
            _watch(_SERVER, procs, spec, pipes.log, shard_procs)
            res = _SERVER.result()
            for lw in res["lost_workers"]:
                pipes.log.warning(f"{lw['worker']} lost ({lw['reason']}): dropped tokens {lw['dropped_tokens']}, "
                                  f"batches {lw['dropped_batches']}")
            pipes.log.info(f"{spec.mode}: {res['optimizer_steps']} optimizer steps, {res['global_steps']:.1f} global steps, "
                           f"{res['samples_per_s']:.0f} samples/s, final AUC {res['final']['auc']:.4f}")
            if res["failure"]:                                            # checkpoints kept: a rerun resumes
                raise RunFailed(f"{spec.mode}: {res['failure']}" + (
                    f" (checkpoints kept in {ckpts.root}: a relaunch resumes from the last one)" if ckpts else ""))
            return res
        finally:
            # let every worker receive its stop reply before the RPC agent goes (graceful=False drops replies in flight)
            end = time.monotonic() + spec.cluster.stop_timeout_s
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.02)
            for c in shards:
                try:
                    c.stop()
                except Exception as e:  # noqa: BLE001 - a dead shard is already reported by _watch
                    pipes.log.warning(f"{c.name}: stop failed ({e})")
            rpc.shutdown(graceful=False)
    finally:
        progress.close()
        for p in procs + shard_procs:
            try:
                p.wait(timeout=spec.cluster.stop_timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def _watch(server, procs, spec, log, shard_procs=()) -> None:
    """Until the run finishes: declare workers whose process exited unasked lost; fail the run when
    a shard process exits; bound the run by ``run_timeout_s`` and the end by ``stop_timeout_s``."""
    deadline = time.monotonic() + spec.cluster.run_timeout_s
    done_at = None
    seen: set[int] = set()
    while not server.finished.wait(0.05):
        for k, p in enumerate(shard_procs):
            if p.poll() is not None:
                why = f"table shard ps{k + 1} {describe_exit(p.returncode)}: its rows are gone"
                log.error(why)
                server.failure = why
                server.stop_all()
                return
        for i, p in enumerate(procs):
            rc = p.poll()
            if rc is not None and i not in seen:
                seen.add(i)
                if i not in server.stopped or rc != 0:
                    log.warning(f"worker{i} {describe_exit(rc)}")
                    server.worker_lost(i, describe_exit(rc))
        now = time.monotonic()
        if server.control.done and done_at is None:
            done_at = now
        if done_at is not None and now - done_at > spec.cluster.stop_timeout_s:
            log.warning(f"workers {sorted(server.control.live - server.stopped)} did not collect their stop in "
                        f"{spec.cluster.stop_timeout_s} s; shutting down without them")
            return
        if now > deadline:
            server.stop_all()
            log.error(f"run exceeded cluster.run_timeout_s = {spec.cluster.run_timeout_s} s")
            return


# -- workers ---------------------------------------------------------------------------------------
def shard(spec, k: int, port: int) -> None:
    """Table shard ``k`` (rank k, RPC name ``ps<k>``): hold the rows of the ids with id % num_ps == k
    and serve rank 0's lookups, updates and checkpoint writes until rank 0 says stop (or is gone)."""
    global _SHARD
    import torch
    import torch.distributed.rpc as rpc

    from .data import load
    from .model import TableShard

    torch.set_num_threads(spec.cluster.threads)
    data = load(spec.events_path, spec.train.crosses, spec.data_cache)
    _SHARD = TableShard(data.fields, spec.train)
    parent = os.getppid()
    guard = Watchdog(f"ps{k}", spec.cluster.start_timeout_s,
                     lambda: "its parameter server (parent process) is gone" if os.getppid() != parent else None)
    rpc.init_rpc(f"ps{k}", rank=k, world_size=spec.cluster.workers + spec.cluster.num_ps,
                 rpc_backend_options=_rpc_options(spec, port))
    guard.started.set()
    try:
        deadline = time.monotonic() + spec.cluster.run_timeout_s + spec.cluster.stop_timeout_s + 60
        while not _SHARD_STOP.wait(0.2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ps{k}: no stop from rank 0 within the run's time limit")
    finally:
        rpc.shutdown(graceful=False)


def work(spec, index: int, port: int) -> None:
    """Worker ``index`` (rank num_ps + index): pull, compute one local batch (as many forward/backward
    passes as the straggler trace says, keeping the first), push; until stopped by the PS. Raises
    TimeoutError naming the wait that took longer than ``cluster.wait_timeout_s``."""
    import torch
    import torch.distributed.rpc as rpc

    from . import ps
    from .data import SampleStream, load, take
    from .model import WorkerModel

    torch.set_num_threads(spec.cluster.threads)
    c, W = spec.cluster, spec.cluster.workers
    data = load(spec.events_path, spec.train.crosses, spec.data_cache)
    model = WorkerModel(data.fields, spec.train, index)
    stream = SampleStream(data.n_train, spec.local_batch, spec.train.seed)
    k = 0                                               # local batches computed (the straggler trace's counter)
    if spec.handover_from:                              # continue the dropout stream and trace of worker = rank index
        from .handover import read, worker_rng

        rng = worker_rng(spec.handover_from, index)
        if rng is not None:
            torch.set_rng_state(rng)
        tp = read(spec.handover_from)["trace_position"]
        k = tp[index] if index < len(tp) else 0
    parent = os.getppid()
    guard = Watchdog(f"worker{index}", c.start_timeout_s,
                     lambda: "its parameter server (parent process) is gone" if os.getppid() != parent else None)
    P = c.num_ps
    rpc.init_rpc(f"worker{index}", rank=P + index, world_size=W + P, rpc_backend_options=_rpc_options(spec, port))
    guard.started.set()

    def call(fn, *args):
        return rpc.rpc_sync("ps", fn, args=args, timeout=c.rpc_timeout_s)

    def waited(since: float, reason: str) -> None:
        if time.monotonic() - since > c.wait_timeout_s:
            raise TimeoutError(f"worker{index} waited more than cluster.wait_timeout_s = {c.wait_timeout_s} s: {reason}")

    try:
        since = time.monotonic()
        r = call(ps._hello, index)
        while r[0] == "wait":
            waited(since, r[2])
            time.sleep(r[1])
            r = call(ps._hello, index)
        batch = r[1] if r[0] == "go" else None
        version = -1
        since = None
        while batch is not None:
            idx = stream.indices(batch)
            b, y = take(data.train, idx), data.y_train[idx]
            ids = model.ids(b)
            r = call(ps._pull, index, batch, {t: u for t, (u, _) in ids.items()}, version)
            if r[0] == "wait":
                since = since or time.monotonic()
                waited(since, r[2])
                time.sleep(r[1])
                continue
            since = None
            if r[0] == "stop":
                break
            _, token, rows, dense, version = r
            t = time.perf_counter()
            grad = model.gradient(b, y, ids, rows, dense, passes=spec.trace.passes(index, k, W))
            grad.compute_s = time.perf_counter() - t
            if spec.stop_at:                     # the dropout stream after this batch, for the hand-over
                grad.rng = torch.get_rng_state()
            k += 1
            r = call(ps._push, index, token, batch, grad)
            batch = r[1] if r[0] == "go" else None
    finally:
        rpc.shutdown(graceful=False)


def _role_args(ap) -> None:
    ap.add_argument("--role", choices=["ps", "shard", "worker"], default="ps")
    ap.add_argument("--index", type=int, default=0, help="worker index (rank - num_ps) or shard number (rank)")
    ap.add_argument("--port", type=int, default=0, help="rendezvous port of rank 0")


def run(spec_args, out: Path, fp: str, pipes) -> dict | None:
    """The ``run`` of ``ops.launch.worker_main``: the parameter server (``--role ps``, the launch:
    returns the result) or one of its workers (``--role worker``, started by the PS: returns None)."""
    spec, a = spec_args
    if a.role == "worker":
        work(spec, a.index, a.port)
        return None
    if a.role == "shard":
        shard(spec, a.index, a.port)
        return None
    return serve(spec, a.spec, out, pipes)


def main(argv: list[str] | None = None) -> int:
    """``python -m ops.gba.launch_ps --spec SPEC --out DIR [--fingerprint FP]`` (the PS, which
    starts its workers with ``--role worker --index i --port P``); see the module docstring."""
    from ops.launch import worker_main

    from .config import load_spec

    return worker_main(load_spec, run, argv, description=__doc__, extra_args=_role_args,
                       scratch=("checkpoints",))
