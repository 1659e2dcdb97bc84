"""The teacher resource: one OpenAI-compatible client for every teacher.

Embedded default (``base_url`` empty): the resource starts the embedded server
(:mod:`ops.teacher.serve`, which samples each request from its own seeded generator) on 127.0.0.1
with SmolLM2-135M-Instruct (converted at setup into ``$CRUCIBLE_MODELS``) and checks its health.
Inside a Dagster run the server is the run's: started by the first step that opens a session (or calls
``prestart``), reused by the later steps of the same process after a ``/health`` check (``annotated_problems``
and ``distilled_problems`` of one curation run load the model once) and stopped when Dagster tears the
resource down at the end of the run (of the step, under the multiprocess executor). The server exits by
itself when the process that started it dies. Outside a run (a resource built by hand) each session
starts and stops its own. Production: set ``base_url`` (vLLM, SGLang, a provider), ``model`` and the API key's
environment variable — the asset code does not change.
"""

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from ops.docstrings import describe_fields


def default_model_dir() -> str:
    """``<models>/SmolLM2-135M-Instruct``: ``$CRUCIBLE_MODELS``, else ``<repo>/.models`` in a checkout,
    else ``<venv>/share/crucible/models`` (where ``crucible setup`` converts it; ops/data_packages.py)."""
    from ops.data_packages import MODEL_NAME, default_models_dir

    return str(default_models_dir() / MODEL_NAME)


@describe_fields  # the attribute docstrings are the UI descriptions
class TeacherResource(dg.ConfigurableResource):
    """Where the teacher is and how to call it."""

    base_url: str = ""
    """OpenAI-compatible endpoint ending in ``/v1``; empty starts the embedded server."""
    model: str = ""
    """Model name sent to the endpoint (required with ``base_url``; embedded default: the served directory)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (never the key itself)."""
    model_dir: str = ""
    """Embedded server's model directory (empty: ``<models>/SmolLM2-135M-Instruct``, models =
    ``$CRUCIBLE_MODELS``, else ``<repo>/.models`` in a checkout, else ``<venv>/share/crucible/models``)."""
    port: int = 0
    """Embedded server's TCP port on 127.0.0.1 (0 = a free port)."""
    timeout_s: float = 180.0
    """Per-request timeout of ``TeacherClient`` (s; connect, read, write each; > 0)."""
    max_retries: int = 3
    """Retries after a request's first attempt (>= 0); retries and their backoff are the openai SDK's."""
    concurrency: int = 16
    """Requests in flight (>= 1); throughput of the embedded server per concurrency:
    benchmarks/results/teacher.json."""
    request_budget: int = 5000
    """Maximum HTTP attempts over the client's life (>= 0); past it requests fail as ``budget exhausted``."""
    startup_timeout_s: float = 180.0
    """How long to wait for the embedded server's ``/health`` check (s)."""
    max_batch: int = 16
    """Concurrent requests the embedded server decodes together (>= 1; 1 = one at a time)."""
    seed_honoured: bool = False
    """The endpoint at ``base_url`` samples each seeded request from its own seeded generator (vLLM does)
    though its responses do not say so (the embedded server says so itself). False: a sample counts as
    seeded only when its response says so."""

    _run_scoped: bool = PrivateAttr(False)
    _server: Any = PrivateAttr(None)
    _healthy: bool = PrivateAttr(False)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Dagster's hook at the start of a run (of a step, multiprocess executor): from here the
        embedded server outlives a session until :meth:`teardown_after_execution`."""
        self._run_scoped = True

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Dagster's hook at the end of the run (step): stop the run's embedded server, if one started."""
        with self._lock:
            server, self._server, self._healthy = self._server, None, False
        if server is not None:
            server.stop()

    @property
    def embedded(self) -> bool:
        return not self.base_url

    def model_name(self) -> str:
        """The name recorded in ``response_source`` (``teacher:<name>``)."""
        if self.model:
            return self.model
        return Path(self.model_dir or default_model_dir()).name if self.embedded else "unknown"

    @contextmanager
    def session(self, cache_path: str | Path, log: object = None) -> Iterator[object]:
        """Yield a ready ``TeacherClient``. Embedded teacher: on the run's server (started on first use,
        see the module docstring), or, outside a run, on a server started and stopped with the session."""
        from ops.teacher.cache import ResponseCache
        from ops.teacher.client import TeacherClient

        cache = ResponseCache(cache_path)
        server = own = None
        try:
            if self.embedded:
                server, own = self._embedded_server(Path(cache_path).parent / "server.log", log)
                base_url, model = server.base_url, self.model or server.model
            else:
                base_url, model = self.base_url, self.model
                if not model:
                    raise ValueError("teacher.model must be set when teacher.base_url is set")
            client = TeacherClient(base_url, model, api_key=os.environ.get(self.api_key_env, ""), timeout_s=self.timeout_s,
                                   max_retries=self.max_retries, concurrency=self.concurrency,
                                   request_budget=self.request_budget, cache=cache, cache_model=self.model_name(),
                                   seed_honoured=self.seed_honoured and not self.embedded)
            try:
                yield client
                if server is not None:
                    server.check_alive()  # responses that failed because the server died: say so
            finally:
                client.close()
        finally:
            if own is not None:
                own.stop()
            cache.close()

    def prestart(self, cache_path: str | Path) -> None:
        """Start the run's embedded server now without waiting for it, so that it loads the model while
        the step does its own work; the first ``session`` waits for it. Nothing happens with an
        endpoint (``base_url``) or outside a Dagster run (a session there owns its server). Raises
        nothing: a server that cannot start (no model directory, port taken) fails the first session."""
        if self.embedded and self._run_scoped:
            from ops.teacher.server import TeacherServerError

            with self._lock:
                try:
                    self._launch(Path(cache_path).parent / "server.log")
                except TeacherServerError:
                    self._server = None        # the step may not need the teacher; a session raises it again

    def _new_server(self, log_path: Path):
        """A ``LocalTeacherServer`` (not started) with this resource's model, port, batch and timeout."""
        from ops.teacher.server import LocalTeacherServer

        return LocalTeacherServer(self.model_dir or default_model_dir(), port=self.port,
                                  startup_timeout_s=self.startup_timeout_s, max_batch=self.max_batch, log_path=log_path)

    def _launch(self, log_path: Path) -> None:
        """Under the lock: the run's server process, launched unless a live one is there."""
        if self._server is None or self._server.proc is None or self._server.proc.poll() is not None:
            self._server = self._new_server(log_path).launch()
            self._healthy = False

    def _embedded_server(self, log_path: Path, log: object = None) -> tuple[object, object]:
        """(a healthy embedded server, the server the session must stop itself or None). In a run: the
        run's server, launched here unless ``prestart`` did or when the one before has died. Raises
        ``TeacherServerError`` (no model, port taken, start-up timeout)."""
        if not self._run_scoped:
            server = self._new_server(log_path).start()
            if log:
                log.info(f"embedded teacher server on {server.base_url} for this session (log {server.log_path})")
            return server, server
        with self._lock:
            if self._server is not None and self._healthy and not self._server.healthy():  # died or hung since
                self._server.stop()
                self._server = None
            self._launch(log_path)
            if not self._healthy:
                try:
                    self._server.wait_healthy()
                except BaseException:
                    self._server.stop()
                    self._server = None
                    raise
                self._healthy = True
                if log:
                    log.info(f"embedded teacher server on {self._server.base_url} for this run "
                             f"(log {self._server.log_path})")
            return self._server, None
