"""Rule-based math reward, its service body and its fault-tolerant client.

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

Service: ``RewardScorer`` is the verifier pool; in a RollPacker run it lives in a Ray actor and the
driver calls it through Ray (``RayRewardTransport``: a cross-node actor call, no HTTP server).
An external reward endpoint is reached over HTTP (``HttpRewardTransport``: ``GET /health``,
``POST /score``). ``RewardClient`` wraps either with a per-request timeout and bounded retries with
exponential backoff on retryable faults (unreachable, timeout, 408/429/5xx, a dead actor; case
``reward-service-faults``); a request that still fails yields ``failed`` scores.
``check_failed_fraction`` fails the step only above a configured threshold.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

# one think-block rule for curation and RL (case reward-think-block), defined beside the verifier;
# re-exported here as ops.rl.reward.final_answer_text
from ops.curation.verify import final_answer_text  # noqa: F401

SCORES = {"verified": 1.0, "wrong": 0.0, "unparseable": 0.0}


class RewardServiceError(RuntimeError):
    """The reward service is unhealthy, or too many scores failed in a step."""


@dataclass
class RewardItem:
    """One response to score."""

    key: str
    """The caller's id (e.g. ``uid/index``), returned in the result."""
    response: str
    """The response text; its last ``\\boxed{}`` outside think blocks is the final answer."""
    answer: Optional[str]
    """The reference answer."""
    solution: Optional[str] = None
    """The reference solution (its last ``\\boxed{}`` is the fallback when answer does not parse)."""
    answer_type: str = "numeric"
    """``numeric`` | ``expression`` | ``multiple_choice`` | ``text``."""


@dataclass
class RewardResult:
    """``score`` is None when it could not be computed (``failed``/``bad_gold``: ``failed`` flag set)."""

    key: str
    """The item's key."""
    score: Optional[float]
    """1.0 verified, 0.0 wrong or unparseable, None when it could not be computed (failed, bad_gold)."""
    status: str
    """``verified`` | ``wrong`` | ``unparseable`` | ``bad_gold`` | ``failed``."""
    attempts: int = 0
    """Requests the client made for it (``RewardClient``, retries included); 0 when scored in process."""
    error: Optional[str] = None
    """Why it failed (None when scored)."""

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


class RewardScorer:
    """The reward service's body: a pool of verifier processes with a per-item wall-clock limit
    (a context manager). It runs where it is placed: inside the Ray reward actor of a RollPacker
    run (``ops.rl.ray_actors``, called through Ray), or in the calling process (RollArc's
    monolithic baseline, tests). There is no HTTP server: on a cluster the driver reaches it
    through a Ray actor call, which works across nodes.

    Args:
        workers: verifier processes (>= 1).
        item_timeout_s: wall-clock limit per scored item (the item is ``failed`` past it); with
            ``adaptive`` it is t_max, and a problem whose correct answers verified in ``a`` seconds
            gets min(max(t_min, lam * a), t_max) (the problem is the key up to its last ``/``).
        adaptive: use AdaptiveTimeout (RollPacker §4.2).

    Raises ValueError naming ``reward.workers`` / ``reward.item_timeout_s`` when out of range.
    """

    def __init__(self, workers: int = 1, item_timeout_s: float = 10.0, adaptive: bool = True):
        if workers < 1:
            raise ValueError(f"reward.workers must be >= 1, got {workers}")
        if not item_timeout_s > 0:
            raise ValueError(f"reward.item_timeout_s must be > 0, got {item_timeout_s}")
        self.workers, self.item_timeout_s = workers, item_timeout_s
        self.adaptive = AdaptiveTimeout(t_min=min(2.0, item_timeout_s), t_max=item_timeout_s) if adaptive else None
        self.pool = None
        self.requests = 0

    def health(self) -> dict:
        """``{"status": "ok", "workers": n}`` once started. Raises RewardServiceError when not started."""
        if self.pool is None:
            raise RewardServiceError("reward scorer is not started")
        return {"status": "ok", "workers": self.workers}

    def score(self, items: list[RewardItem]) -> list[RewardResult]:
        """Score items in the worker pool (thread-safe); a timed-out or crashed item is ``failed``."""
        from concurrent.futures import TimeoutError as FutureTimeout

        self.health()
        self.requests += 1
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

    def score_dicts(self, items: list[dict]) -> list[dict]:
        """``score`` on the wire form: ``items`` as ``item_dict`` gives them, results as
        ``{"key", "score", "status", "error"}``. Raises ValueError naming the record and field
        when an item lacks ``key`` (a bad request: not retried)."""
        return [result_dict(r) for r in self.score([item_from_dict(d, i) for i, d in enumerate(items)])]

    def start(self) -> "RewardScorer":
        from pebble import ProcessPool

        self.pool = ProcessPool(max_workers=self.workers)
        self.pool.schedule(score_one, args=(RewardItem("warmup", "\\boxed{1}", "1"),)).result(timeout=120)
        return self

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool.join(timeout=10)
            self.pool = None

    def __enter__(self) -> "RewardScorer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def item_dict(it: RewardItem) -> dict:
    """The wire form of a reward item (JSON- and Ray-serialisable)."""
    return {"key": it.key, "response": it.response, "answer": it.answer, "solution": it.solution,
            "answer_type": it.answer_type}


def item_from_dict(d: dict, index: int = 0) -> RewardItem:
    """A RewardItem from its wire form. Raises ValueError naming the record index when ``key`` is missing."""
    if not isinstance(d, dict) or "key" not in d:
        raise ValueError(f"reward item {index}: field 'key' is missing (expected {{'key', 'response', 'answer', ...}})")
    return RewardItem(str(d["key"]), str(d.get("response") or ""), d.get("answer"), d.get("solution"),
                      d.get("answer_type") or "numeric")


def result_dict(r: RewardResult) -> dict:
    """The wire form of a reward result."""
    return {"key": r.key, "score": r.score, "status": r.status, "error": r.error}


class RetryableRewardError(RewardServiceError):
    """A transport fault worth retrying (unreachable, timed out, overloaded, a dead actor)."""


class HttpRewardTransport:
    """An external reward endpoint over HTTP (a reward model or verifier served elsewhere):
    ``GET /health`` and ``POST /score`` with ``{"items": [item_dict...]}`` -> ``{"scores": [...]}``.
    Connection errors, timeouts, 408/429 and 5xx are retryable; other statuses are not."""

    RETRYABLE = {408, 429}

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")

    def __str__(self) -> str:
        return f"reward service at {self.base_url}"

    def health(self, timeout_s: float) -> None:
        import httpx

        try:
            r = httpx.get(f"{self.base_url}/health", timeout=timeout_s)
        except httpx.HTTPError as e:
            raise RewardServiceError(f"{self} is unreachable: {e!r}") from e
        if r.status_code != 200:
            raise RewardServiceError(f"{self} is unhealthy: HTTP {r.status_code}")

    def score(self, items: list[dict], timeout_s: float) -> list[dict]:
        import httpx

        try:
            r = httpx.post(f"{self.base_url}/score", json={"items": items}, timeout=timeout_s)
        except httpx.HTTPError as e:
            raise RetryableRewardError(f"{type(e).__name__}: {e}") from e
        if r.status_code == 200:
            return r.json()["scores"]
        err = f"HTTP {r.status_code}"
        if r.status_code >= 500 or r.status_code in self.RETRYABLE:
            raise RetryableRewardError(err)
        raise RewardServiceError(err)


class RayRewardTransport:
    """The built-in reward service as a Ray actor (``ops.rl.ray_actors``' reward actor, a
    ``RewardScorer``): a Ray actor call, so it works from a driver on any node of the cluster.
    A timed-out call is cancelled and retryable, as is a dead or restarting actor; an error raised
    by the scorer itself (a bad request) is not."""

    def __init__(self, actor):
        self.actor = actor

    def __str__(self) -> str:
        return "reward actor"

    def health(self, timeout_s: float) -> None:
        import ray

        try:
            ray.get(self.actor.health.remote(), timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - GetTimeoutError, RayActorError, RayTaskError
            raise RewardServiceError(f"{self} is unhealthy: {type(e).__name__}: {e}") from e

    def score(self, items: list[dict], timeout_s: float) -> list[dict]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        ref = self.actor.score_dicts.remote(items)
        try:
            return ray.get(ref, timeout=timeout_s)
        except GetTimeoutError as e:
            ray.cancel(ref)
            raise RetryableRewardError(f"reward actor call timed out after {timeout_s}s") from e
        except RayActorError as e:
            raise RetryableRewardError(f"reward actor unavailable: {type(e).__name__}") from e
        except RayTaskError as e:
            raise RewardServiceError(f"reward actor raised: {str(e).splitlines()[-1][:200]}") from e


class LocalRewardTransport:
    """A ``RewardScorer`` in this process, called directly (tests, debugging; ``LocalActors``)."""

    def __init__(self, scorer: RewardScorer):
        self.scorer = scorer

    def __str__(self) -> str:
        return "in-process reward scorer"

    def health(self, timeout_s: float) -> None:
        self.scorer.health()

    def score(self, items: list[dict], timeout_s: float) -> list[dict]:
        return self.scorer.score_dicts(items)


class RewardClient:
    """Fault-tolerant client of a reward service (case ``reward-service-faults``).

    Args:
        target: a transport (``RayRewardTransport``, ``LocalRewardTransport``, ``HttpRewardTransport``)
            or an ``http://host:port`` URL of an external endpoint (wrapped in ``HttpRewardTransport``).
        timeout_s: per-request timeout (s).
        max_retries: retries after the first attempt (>= 0), on retryable faults only.
        backoff_s: base of the exponential backoff ``backoff_s * 2**attempt`` (+ up to 25% jitter).

    Raises ValueError naming ``reward.timeout_s`` / ``reward.max_retries`` when out of range.
    """

    def __init__(self, target, timeout_s: float = 30.0, max_retries: int = 3, backoff_s: float = 0.5):
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"reward.max_retries must be >= 0, got {max_retries}")
        self.transport = HttpRewardTransport(target) if isinstance(target, str) else target
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.stats = {"requests": 0, "retries": 0, "failed_requests": 0}
        self._lock = threading.Lock()

    def health(self, timeout_s: Optional[float] = None) -> None:
        """One health check. Raises RewardServiceError naming the service when it is unreachable or unhealthy."""
        self.transport.health(timeout_s or self.timeout_s)

    def score(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Score items in one request (with retries). Never raises for service faults: the items
        come back ``failed`` (score None) with the last error."""
        body = [item_dict(it) for it in items]
        err = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
            with self._lock:
                self.stats["requests"] += 1
            try:
                scores = self.transport.score(body, self.timeout_s)
            except RetryableRewardError as e:
                err = str(e)
                continue
            except RewardServiceError as e:
                err = str(e)
                break
            by_key = {d["key"]: d for d in scores}
            out = []
            for it in items:
                d = by_key.get(it.key)
                if d is None:
                    out.append(RewardResult(it.key, None, "failed", attempt + 1, "missing from the response"))
                else:
                    sc = d.get("score")
                    out.append(RewardResult(it.key, None if sc is None else float(sc), d["status"], attempt + 1,
                                            d.get("error")))
            return out
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
