"""A moto S3 server on loopback in its own process, for the object-store lake's tests and benchmark.

Its own process, not moto's in-process ``ThreadedMotoServer``: deltalake 1.6.6 keeps the GIL during
some requests (``DeltaTable.history``, ``is_deltatable``), which deadlocks a server thread in the
same interpreter (ops/lake/delta.py, ``DeltaTables.exists``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def moto_s3_server(bucket: str, start_timeout_s: float = 60.0) -> Iterator[str]:
    """Start ``python -m moto.server`` on 127.0.0.1 and a free port, create ``bucket``, yield the
    endpoint URL (``http://127.0.0.1:<port>``); stop the server (SIGTERM, then SIGKILL after 10 s)
    on exit. Credentials: the caller's environment (any values; moto does not check them).

    Raises:
        RuntimeError: the server did not answer within ``start_timeout_s`` (its stderr attached).
    """
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.TemporaryFile()              # werkzeug logs a line per request: never a pipe nobody reads
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
                              aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"))
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception as e:  # noqa: BLE001 - connection refused until the server listens
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    err = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"moto server on {endpoint} did not start in {start_timeout_s} s: {e}\n{err}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
