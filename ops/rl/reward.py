"""Rule-based math reward, served over HTTP, and its fault-tolerant client.

Reward (RollPacker §2 and DeepSeekMath-style rule rewards): the last ``\\boxed{}`` of the
response's *final answer* — its text outside ``<think>...</think>`` reasoning blocks
(``final_answer_text``) — is compared with the reference through the project's verifier
(``ops.curation.verify``: math-verify with its guards). An answer inside a think block never counts
as the final answer (case ``reward-think-block``). Status and score:

    verified      1.0
    wrong         0.0
    unparseable   0.0   (no ``\\boxed{}`` in the final answer, or nothing parseable in it; counted
                         apart from wrong)
    bad_gold      None  (the reference itself does not parse: not the policy's fault)
    failed        None  (timeout, crash or the service could not be reached) — never 0.0

math-verify uses SIGALRM, so it runs in the main thread of worker processes (a Pebble pool with a
per-item wall-clock timeout), never in the server's request threads.

Service: ``RewardServer`` is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 — ``GET /health`` and
``POST /score`` with JSON ``{"items": [{"key", "response", "answer", "solution", "answer_type"}]}``
-> ``{"scores": [{"key", "score", "status"}]}``. ``RewardClient`` calls it (httpx) with a
per-request timeout and bounded retries with exponential backoff on connection errors, timeouts,
408/429 and 5xx (case ``reward-service-faults``); a request that still fails yields ``failed``
scores. ``check_failed_fraction`` fails the step only above a configured threshold.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional, Sequence

from ops.httpjson import send_json

SCORES = {"verified": 1.0, "wrong": 0.0, "unparseable": 0.0}

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


def final_answer_text(response: str) -> str:
    """The response without its reasoning: the text outside ``<think>...</think>`` blocks (tags
    case-insensitive), which is where the final answer must be.

    Rules (case ``reward-think-block``, shared/cases/training.json):
    * a closed block ``<think>...</think>`` is removed, wherever it is (several may occur);
    * an unclosed ``<think>`` runs to the end of the response: the reasoning never ended, so nothing
      after it is a final answer (a ``\\boxed{}`` in it scores ``unparseable``, not ``verified``);
    * a ``</think>`` with no open block closes a block that began at the start of the response
      (chat templates such as DeepSeek-R1's put the opening ``<think>`` in the prompt);
    * a response without tags is its own final answer.
    """
    out, pos, inside = [], 0, False
    for m in _THINK_TAG.finditer(response):
        closing = m.group(1) == "/"
        if closing:
            if not inside:
                out = []                                   # everything so far was reasoning
            inside = False
        elif not inside:
            out.append(response[pos:m.start()])
            inside = True
        pos = m.end()
    if not inside:
        out.append(response[pos:])
    return "".join(out)


class RewardServiceError(RuntimeError):
    """The reward service is unhealthy, or too many scores failed in a step."""


@dataclass
class RewardItem:
    """One response to score. ``key`` is the caller's id (e.g. ``uid/index``)."""

    key: str
    response: str
    answer: Optional[str]
    solution: Optional[str] = None
    answer_type: str = "numeric"


@dataclass
class RewardResult:
    """``score`` is None when it could not be computed (``failed``/``bad_gold``: ``failed`` flag set)."""

    key: str
    score: Optional[float]
    status: str
    attempts: int = 0
    error: Optional[str] = None

    @property
    def failed(self) -> bool:
        return self.score is None

    @property
    def value(self) -> float:
        """The score as a float: NaN when failed (GRPO then excludes it from its group)."""
        return math.nan if self.score is None else self.score


class AdaptiveTimeout:
    """RollPacker's adaptive reward timeout (arXiv 2509.21009 §4.2): per test (here: per problem),
    timeout = min(max(t_min, lam * anchor), t_max), where anchor is the longest runtime of a
    *correct* answer seen on that test; t_max until a correct answer has been seen.
    Defaults are the paper's (lam 1.5, t_min 2 s, t_max 30 s). Thread-safe.
    """

    def __init__(self, lam: float = 1.5, t_min: float = 2.0, t_max: float = 30.0):
        if not (lam > 0 and 0 < t_min <= t_max):
            raise ValueError(f"reward.adaptive_timeout needs lam > 0 and 0 < t_min <= t_max, got {lam}, {t_min}, {t_max}")
        self.lam, self.t_min, self.t_max = lam, t_min, t_max
        self.anchor: dict[str, float] = {}
        self._lock = threading.Lock()

    def timeout(self, test: str) -> float:
        with self._lock:
            a = self.anchor.get(test)
        return self.t_max if a is None else min(max(self.t_min, self.lam * a), self.t_max)

    def observe(self, test: str, runtime_s: float, correct: bool) -> None:
        if correct:
            with self._lock:
                self.anchor[test] = max(self.anchor.get(test, 0.0), runtime_s)


def _timed_score(item: "RewardItem") -> tuple["RewardResult", float]:
    t = time.perf_counter()
    r = score_one(item)
    return r, time.perf_counter() - t


def score_one(item: RewardItem) -> RewardResult:
    """Score one response in this process (math-verify: call it in a process's main thread)."""
    from ops.curation.verify import VerifyItem, last_boxed, verify_one

    boxed = last_boxed(final_answer_text(item.response))
    if boxed is None or not boxed.strip():
        return RewardResult(item.key, 0.0, "unparseable")
    pred = boxed if item.answer_type == "multiple_choice" else f"$\\boxed{{{boxed}}}$"
    r = verify_one(VerifyItem(item.key, item.answer, item.solution, pred, item.answer_type))
    status = {"verified": "verified", "wrong": "wrong", "unparseable_prediction": "unparseable",
              "unparseable_gold": "bad_gold"}.get(r["status"], "failed")
    return RewardResult(item.key, SCORES.get(status), status)


def _score_chunk(items: list[RewardItem]) -> list[RewardResult]:
    return [score_one(it) for it in items]


class RewardServer:
    """The reward service on 127.0.0.1 (a context manager; ``url`` once started).

    Args:
        port: 0 picks a free port.
        workers: verifier processes (>= 1).
        item_timeout_s: wall-clock limit per scored item (the item is ``failed`` past it); with
            ``adaptive`` it is t_max, and a problem whose correct answers verified in ``a`` seconds
            gets min(max(t_min, lam * a), t_max) (the problem is the key up to its last ``/``).
        adaptive: use AdaptiveTimeout (RollPacker §4.2).
    """

    def __init__(self, port: int = 0, workers: int = 1, item_timeout_s: float = 10.0, adaptive: bool = True):
        if workers < 1:
            raise ValueError(f"reward.workers must be >= 1, got {workers}")
        if not item_timeout_s > 0:
            raise ValueError(f"reward.item_timeout_s must be > 0, got {item_timeout_s}")
        self.port, self.workers, self.item_timeout_s = port, workers, item_timeout_s
        self.adaptive = AdaptiveTimeout(t_min=min(2.0, item_timeout_s), t_max=item_timeout_s) if adaptive else None
        self.pool = None
        self.httpd: Optional[ThreadingHTTPServer] = None
        self.thread: Optional[threading.Thread] = None
        self.requests = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def score(self, items: list[RewardItem]) -> list[RewardResult]:
        """Score items in the worker pool; a timed-out or crashed item is ``failed``."""
        from concurrent.futures import TimeoutError as FutureTimeout

        tests = [it.key.rsplit("/", 1)[0] for it in items]
        limits = [self.adaptive.timeout(t) if self.adaptive else self.item_timeout_s for t in tests]
        futs = [self.pool.schedule(_timed_score, args=(it,), timeout=lim) for it, lim in zip(items, limits)]
        out = []
        for it, test, lim, f in zip(items, tests, limits, futs):
            try:
                r, runtime = f.result()
                if self.adaptive:
                    self.adaptive.observe(test, runtime, r.status == "verified")
                out.append(r)
            except FutureTimeout:
                out.append(RewardResult(it.key, None, "failed", error=f"verifier timed out after {lim:.1f}s"))
            except Exception as e:  # noqa: BLE001 - a crashed verifier is a failed score, not 0
                out.append(RewardResult(it.key, None, "failed", error=repr(e)[:200]))
        return out

    def start(self) -> "RewardServer":
        from pebble import ProcessPool

        self.pool = ProcessPool(max_workers=self.workers)
        self.pool.schedule(score_one, args=(RewardItem("warmup", "\\boxed{1}", "1"),)).result(timeout=120)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path.rstrip("/") == "/health":
                    return self._send(200, {"status": "ok", "workers": server.workers})
                self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self):
                if self.path.rstrip("/") != "/score":
                    return self._send(404, {"error": f"no route {self.path}"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                    items = [RewardItem(str(d["key"]), str(d.get("response") or ""), d.get("answer"), d.get("solution"),
                                        d.get("answer_type") or "numeric") for d in body["items"]]
                except (ValueError, KeyError, TypeError) as e:
                    return self._send(400, {"error": f"bad /score body: {e!r}; expected {{'items': [{{'key', 'response', "
                                                     f"'answer', ...}}]}}"})
                server.requests += 1
                res = server.score(items)
                self._send(200, {"scores": [{"key": r.key, "score": r.score, "status": r.status, "error": r.error}
                                            for r in res]})

            def _send(self, code, obj):
                send_json(self, code, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="reward-http", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        if self.pool is not None:
            self.pool.stop()
            self.pool.join(timeout=10)
            self.pool = None

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RewardClient:
    """Client of a reward service.

    Args:
        base_url: ``http://host:port`` of the service.
        timeout_s: per-request timeout (connect and read).
        max_retries: retries after the first attempt (>= 0).
        backoff_s: base of the exponential backoff ``backoff_s * 2**attempt`` (+ up to 25% jitter).
    """

    RETRYABLE = {408, 429}

    def __init__(self, base_url: str, timeout_s: float = 30.0, max_retries: int = 3, backoff_s: float = 0.5):
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"reward.max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.stats = {"requests": 0, "retries": 0, "failed_requests": 0}
        self._lock = threading.Lock()

    def health(self, timeout_s: Optional[float] = None) -> None:
        """``GET /health`` once. Raises RewardServiceError naming the URL when it is not 200."""
        import httpx

        try:
            r = httpx.get(f"{self.base_url}/health", timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as e:
            raise RewardServiceError(f"reward service at {self.base_url} is unreachable: {e!r}") from e
        if r.status_code != 200:
            raise RewardServiceError(f"reward service at {self.base_url} is unhealthy: HTTP {r.status_code}")

    def score(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Score items in one request (with retries). Never raises for service faults: the items
        come back ``failed`` (score None) with the last error."""
        import httpx

        body = {"items": [{"key": it.key, "response": it.response, "answer": it.answer, "solution": it.solution,
                           "answer_type": it.answer_type} for it in items]}
        err = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
            with self._lock:
                self.stats["requests"] += 1
            try:
                r = httpx.post(f"{self.base_url}/score", json=body, timeout=self.timeout_s)
            except httpx.HTTPError as e:
                err = f"{type(e).__name__}: {e}"
                continue
            if r.status_code == 200:
                by_key = {d["key"]: d for d in r.json()["scores"]}
                out = []
                for it in items:
                    d = by_key.get(it.key)
                    if d is None:
                        out.append(RewardResult(it.key, None, "failed", attempt + 1, "missing from the response"))
                    else:
                        s = d.get("score")
                        out.append(RewardResult(it.key, None if s is None else float(s), d["status"], attempt + 1,
                                                d.get("error")))
                return out
            err = f"HTTP {r.status_code}"
            if not (r.status_code >= 500 or r.status_code in self.RETRYABLE):
                break
        with self._lock:
            self.stats["failed_requests"] += 1
        return [RewardResult(it.key, None, "failed", self.max_retries + 1, err) for it in items]


def reward_counts(results: Sequence[RewardResult]) -> dict:
    """Counts by status and the failed fraction (failed + bad_gold over all)."""
    counts = {s: 0 for s in ("verified", "wrong", "unparseable", "bad_gold", "failed")}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    n = max(1, len(results))
    counts["failed_fraction"] = sum(r.failed for r in results) / n
    return counts


def check_failed_fraction(results: Sequence[RewardResult], max_failed_fraction: float) -> float:
    """The failed fraction; raises RewardServiceError when it exceeds ``max_failed_fraction``
    (the step must fail rather than train on a reward that was not computed)."""
    frac = reward_counts(results)["failed_fraction"]
    if frac > max_failed_fraction:
        errs = sorted({r.error for r in results if r.failed and r.error})[:3]
        raise RewardServiceError(f"{frac:.0%} of the step's rewards failed, above reward.max_failed_fraction "
                                 f"{max_failed_fraction:.0%}: {errs}")
    return frac
