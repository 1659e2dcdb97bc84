"""Lifecycle of the embedded teacher server (:mod:`ops.teacher.serve`, seeded per request) on 127.0.0.1.

Start in its own process group, wait for ``GET /health`` (bounded), fail clearly when the port is
taken or the process dies (with the tail of its log), stop the whole group at the end (SIGTERM,
then SIGKILL after a grace period — some sandboxes ignore SIGTERM).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ops.launcher import free_port


class TeacherServerError(RuntimeError):
    """The local server could not start or died (message carries the reason and log tail)."""


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class LocalTeacherServer:
    """``python -m ops.teacher.serve --model-dir <model_dir>`` as a context manager.

    Args:
        model_dir: a Hugging Face model directory (see :mod:`ops.teacher.convert`).
        port: TCP port on 127.0.0.1; 0 picks a free one.
        startup_timeout_s: how long to wait for ``/health``.
        max_batch: concurrent requests decoded together (1 = one at a time); each request still
            samples from its own seeded generator.
        dtype: ``float64`` (a seeded sample does not depend on the batch it ran in) or ``float32``.
    Raises:
        TeacherServerError: missing model dir, port taken, process exit or health timeout.
    """

    def __init__(self, model_dir: str | Path, port: int = 0, startup_timeout_s: float = 180.0,
                 max_batch: int = 16, log_path: str | Path | None = None, dtype: str = "float64"):
        self.model_dir = Path(model_dir)
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        if max_batch < 1:
            raise ValueError(f"teacher max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.dtype = dtype
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="teacher-server-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.instance = uuid.uuid4().hex  # the server reports it: tells this server from another on the port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        """The model name requests must carry (the served directory)."""
        return str(self.model_dir)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def start(self) -> "LocalTeacherServer":
        """Start the server and wait until it is healthy (``launch`` then ``wait_healthy``)."""
        self.launch()
        self.wait_healthy()
        return self

    def launch(self) -> "LocalTeacherServer":
        """Start the server process without waiting for it (it loads the model meanwhile); call
        ``wait_healthy`` before the first request. Raises TeacherServerError (no model, port taken)."""
        if not (self.model_dir / "config.json").exists():
            raise TeacherServerError(f"teacher model directory {self.model_dir} has no config.json; run `make setup`")
        if port_in_use(self.port):
            raise TeacherServerError(f"port {self.port} on 127.0.0.1 is already in use; choose another teacher port")
        cmd = [sys.executable, "-m", "ops.teacher.serve", "--model-dir", str(self.model_dir), "--host", "127.0.0.1",
               "--port", str(self.port), "--max-batch", str(self.max_batch), "--dtype", self.dtype,
               "--instance-id", self.instance, "--parent-pid", str(os.getpid())]
        root = str(Path(__file__).resolve().parents[2])  # the repository, so that `-m ops.teacher.serve` resolves
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # its own process group (stop() signals the group); it exits when this process dies
        # (--parent-pid: serve.watch_parent), so a killed step or run leaves no server behind
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        return self

    def wait_healthy(self) -> None:
        """Wait up to ``startup_timeout_s`` for ``/health`` (and this server's instance id behind it).
        Raises TeacherServerError, the server stopped, when it exits, another process serves the port
        or the time runs out."""
        import httpx

        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TeacherServerError(f"teacher server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy(timeout_s=2.0):
                try:
                    about = httpx.get(f"{self.base_url}/teacher", timeout=5.0).json()
                except (httpx.HTTPError, ValueError):
                    about = None
                if about is not None:
                    if about.get("instance") != self.instance:
                        self.stop()
                        raise TeacherServerError(f"port {self.port} on 127.0.0.1 is served by another process "
                                                 "(not this teacher server); choose another teacher port")
                    return
            time.sleep(0.5)
        self.stop()
        raise TeacherServerError(f"teacher server not healthy after {self.startup_timeout_s}s:\n{self.log_tail()}")

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """The process is running and ``/health`` answers 200 within ``timeout_s``."""
        import httpx

        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def check_alive(self) -> None:
        """Raise TeacherServerError if the server process has died."""
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise TeacherServerError(f"teacher server is not running (exit code {code}):\n{self.log_tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:                       # it exited after poll()
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "LocalTeacherServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
