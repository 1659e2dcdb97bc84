"""OpenAI-compatible chat-completions client on the openai SDK: concurrency, per-request timeout,
the SDK's bounded retries (backoff, ``Retry-After``), immediate failure on non-retryable 4xx, a
request budget, and a persistent cache.

One code path for every teacher: the embedded server (:mod:`ops.teacher.serve`), vLLM, SGLang or a
provider — only ``base_url``/``model``/``api_key`` change (Logics-STEM §2, stage 4: the teacher is a
resource).

Seeds: a request's ``seed`` goes out as the OpenAI ``seed`` field (``chat.completions.create(seed=...)``)
and is part of the cache key. The spec makes it best effort, so each result records the response's
``system_fingerprint`` and whether the endpoint said it honoured the seed (``"seed_honoured": true``,
which the embedded server sends), or the client was told so (``seed_honoured=True``: an endpoint
known to seed each request, e.g. vLLM).

Retry policy (per request; the SDK's own, ``openai.OpenAI(max_retries=...)``): connection errors,
timeouts, HTTP 408/409/429 and 5xx are retried up to ``max_retries`` times with exponential backoff
from 0.5 s (doubling, at most 8 s, minus up to 25% jitter); a ``Retry-After``/``retry-after-ms``
header of up to 120 s wins (a longer one is not retried), and the endpoint's ``x-should-retry``
header is obeyed; any other 4xx fails at once. Every HTTP attempt, retries included, counts
against ``request_budget`` (counted by a request hook on the SDK's HTTP client); when the budget is
spent, remaining requests fail with ``budget exhausted`` without being sent (recorded as failed,
never as a wrong answer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import openai

from .cache import ResponseCache, request_key
from .requests import ChatRequest, ChatResult  # noqa: F401  (re-exported: the client's request/result types)


@dataclass
class ClientStats:
    http_requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class BudgetExhausted(openai.OpenAIError):
    """The client's ``request_budget`` is spent. An ``OpenAIError``, so the SDK propagates it from
    the request hook at once instead of retrying it as a connection error."""


class TeacherClient:
    """Chat-completions client for an OpenAI-compatible ``base_url`` (ending in ``/v1``).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: model name sent with each request; also part of the cache key.
        api_key: bearer token (empty for local servers: the SDK requires one, so ``EMPTY`` is sent).
        timeout_s: per-request timeout (connect, read, write each), > 0.
        max_retries: retries after the first attempt (>= 0), scheduled by the SDK.
        concurrency: requests in flight (>= 1).
        request_budget: maximum HTTP attempts over the client's life (>= 0).
        cache: a :class:`ResponseCache`; finished responses are stored as they arrive.
        cache_model: the model's name in cache keys (default ``model``); lets an embedded server
            whose ``model`` is a local path share the cache across checkouts.
        seed_honoured: the endpoint is known to sample each seeded request from its own seeded
            generator even when it does not say so in the response (False: trust the response only).
    Raises:
        ValueError: a parameter outside its range (named in the message).
    """

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 60.0, max_retries: int = 3,
                 concurrency: int = 4, request_budget: int = 10_000, cache: ResponseCache | None = None,
                 cache_model: str | None = None, seed_honoured: bool = False):
        for name, value, ok in (("timeout_s", timeout_s, timeout_s > 0), ("max_retries", max_retries, max_retries >= 0),
                                ("concurrency", concurrency, concurrency >= 1), ("request_budget", request_budget, request_budget >= 0)):
            if not ok:
                raise ValueError(f"teacher.{name} out of range: {value}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.request_budget = request_budget
        self.cache = cache
        self.cache_model = cache_model or model
        self.seed_honoured = seed_honoured
        self.stats = ClientStats()
        self._attempts = threading.local()  # HTTP attempts of the request this thread is making
        # The SDK runs a request's retries in the calling thread and calls the HTTP client's request
        # hooks before every attempt: there the budget is spent and the attempt counted.
        http = openai.DefaultHttpxClient(event_hooks={"request": [self._on_attempt]})
        self._client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                     max_retries=max_retries, http_client=http)

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _on_attempt(self, request: Any) -> None:
        """Request hook: spend one unit of the budget (or raise BudgetExhausted: nothing is sent)."""
        with self.stats.lock:
            if self.stats.http_requests >= self.request_budget:
                raise BudgetExhausted(f"request budget of {self.request_budget} exhausted")
            self.stats.http_requests += 1
            if self._attempts.n:
                self.stats.retries += 1
        self._attempts.n += 1

    def _post(self, req: ChatRequest) -> ChatResult:
        self._attempts.n = 0
        t0 = time.monotonic()
        body = req.body(self.model)
        kwargs: dict[str, Any] = {"model": body.pop("model"), "messages": body.pop("messages")}
        if "seed" in body:
            kwargs["seed"] = body.pop("seed")
        try:
            # sampling parameters go out as-is (extra_body): the SDK's typed arguments would drop
            # server-specific ones such as top_k
            completion = self._client.chat.completions.create(**kwargs, extra_body=body)
            text = completion.choices[0].message.content or ""
            usage = completion.usage
            extra = completion.model_extra or {}
            honoured = req.seed is not None and (extra.get("seed_honoured") is True or self.seed_honoured)
            return ChatResult(req, "ok", text=text, completion_tokens=usage.completion_tokens if usage else None,
                              latency_s=time.monotonic() - t0, attempts=self._attempts.n,
                              system_fingerprint=completion.system_fingerprint or None, seed_honoured=honoured)
        except BudgetExhausted as e:
            error = str(e)
        except openai.APIStatusError as e:  # a non-retryable status, or a retryable one past max_retries
            error = f"HTTP {e.status_code}: {e.response.text[:200]}"
        except openai.APIConnectionError as e:  # APITimeoutError included
            cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ else ""
            error = f"{type(e).__name__}: {e}{cause}"[:300]
        except (openai.APIResponseValidationError, AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
            error = f"malformed response: {e!r}"[:300]
        return ChatResult(req, "failed", error=error, latency_s=time.monotonic() - t0, attempts=self._attempts.n)

    def complete(self, requests: Iterable[ChatRequest], on_result: Callable[[ChatResult], None] | None = None) -> list[ChatResult]:
        """Run every request (cache first), ``concurrency`` at a time; results in request order.

        Each finished response is written to the cache before ``on_result`` is called, so a
        killed run loses at most the requests in flight.
        """
        requests = list(requests)
        results: list[ChatResult | None] = [None] * len(requests)
        todo = []
        for idx, req in enumerate(requests):
            hit = self.cache.get(request_key(self.cache_model, req)) if self.cache else None
            if hit is not None:
                results[idx] = ChatResult(req, "ok", text=hit["text"], completion_tokens=hit["completion_tokens"],
                                          latency_s=hit["latency_s"], cached=True,
                                          system_fingerprint=hit["system_fingerprint"], seed_honoured=hit["seed_honoured"])
                with self.stats.lock:
                    self.stats.cache_hits += 1
                if on_result:
                    on_result(results[idx])
            else:
                todo.append(idx)

        def run(idx: int) -> None:
            res = self._post(requests[idx])
            if self.cache:
                self.cache.put(request_key(self.cache_model, res.request), self.cache_model, res)
            if res.status != "ok":
                with self.stats.lock:
                    self.stats.failed += 1
            results[idx] = res
            if on_result:
                on_result(res)

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            list(pool.map(run, todo))
        return results  # type: ignore[return-value]
