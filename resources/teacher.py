"""The teacher resource: one OpenAI-compatible client for every teacher.

Embedded default (``base_url`` empty): the resource starts the embedded server
(:mod:`ops.teacher.serve`, which samples each request from its own seeded generator) on 127.0.0.1
with SmolLM2-135M-Instruct (converted at setup into ``$CRUCIBLE_MODELS``), checks its health, and
stops it when the step's session ends. Production: set ``base_url`` (vLLM, SGLang, a provider), ``model``
and the API key's environment variable — the asset code does not change.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

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
        """Yield a ready ``TeacherClient`` (starting and stopping the embedded server if needed)."""
        from ops.teacher.cache import ResponseCache
        from ops.teacher.client import TeacherClient
        from ops.teacher.server import LocalTeacherServer

        cache = ResponseCache(cache_path)
        server = None
        try:
            if self.embedded:
                server = LocalTeacherServer(self.model_dir or default_model_dir(), port=self.port,
                                            startup_timeout_s=self.startup_timeout_s,
                                            max_batch=self.max_batch,
                                            log_path=Path(cache_path).parent / "server.log")
                server.start()
                if log:
                    log.info(f"embedded teacher server on {server.base_url} (log {server.log_path})")
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
            if server is not None:
                server.stop()
            cache.close()
