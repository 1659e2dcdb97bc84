"""RollArc's elastic reward pool: stateless verifier replicas on Ray Serve that scale with queue depth.

RollArc (arXiv 2512.22560, statefulness-aware placement; docs/rollarc.md, "Reward pool") sends stateless components —
reward models and verifiers — to an elastic, serverless-style pool, while stateful environments stay
on CPU workers. Here the pool is a Ray Serve application whose deployment ``RewardVerifier`` is
autoscaled by Serve between ``min_replicas`` and ``max_replicas`` on the number of queued + ongoing
requests per replica (Ray Serve autoscaling: ``target_ongoing_requests``, ``upscale_delay_s``,
``downscale_delay_s``, ``look_back_period_s``). Replicas ask for 0 CPUs and one unit of the named
pool's custom resource (``reward``), so the pool's size is bounded by what the cluster advertises.

Request (one item): ``{"key", "kind": "math" | "frozenlake", "attempt", ...}``; ``math`` adds
``response, answer, solution, answer_type`` and is scored by ``ops.rl.reward.score_one`` (rule-based,
math-verify); ``frozenlake`` adds ``spec, actions`` and is scored by
``ops.rl.rollarc.envs.verify_frozenlake``. Optional ``fault = {"fail_attempts": n, "delay_s": s}``
(tests): the replica raises on attempts < n and sleeps s seconds before scoring; every other line
of the path is the production one. Response: ``{"key", "score", "status", "error", "replica"}``.

math-verify uses SIGALRM, which only works in a process's main thread, and Serve runs user code in
other threads: each replica scores in its own small Pebble process pool (one worker by default), with
a wall-clock limit per item; a verifier that overruns it or crashes gives a ``failed`` item.

Driver side (``RewardPool``), case ``reward-service-faults``: a per-request timeout, bounded retries
with exponential backoff on replica errors and timeouts, and a ``failed`` result (score None, status
``failed``, error text) when they are spent — never 0.0; ``health`` before training starts; the
step-level threshold is ``ops.rl.reward.check_failed_fraction``. Each trajectory is an asyncio task
awaiting its own reward (``ascore``); ``submit``/``score`` are the thread-safe sync path.

``ray`` is imported inside functions only; the caller owns Ray (``ray.init`` before ``start``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
import warnings
from collections import deque
from typing import Optional, Sequence, Union

from ops.rl.reward import RewardItem, RewardResult, RewardServiceError, score_one

KINDS = ("math", "frozenlake")
DEPLOYMENT = "RewardVerifier"
_PROBE = RewardItem("health/probe", "so the answer is \\boxed{2}", "2")
DEFAULT_AUTOSCALING = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1.0, "upscale_delay_s": 1.0,
                       "downscale_delay_s": 30.0, "look_back_period_s": 2.0, "metrics_interval_s": 0.5}
"""Ray Serve ``autoscaling_config`` of a pool whose ``start`` is given none; a given dict's keys override these."""


def _score_frozenlake(key: str, spec: dict, actions: list) -> RewardResult:
    """FrozenLake replay in a verifier process: 1.0 ``verified`` when the actions reach the goal, else
    0.0 ``wrong``. A bad spec or action raises ValueError (the replica records the item ``failed``).
    envs is imported here so math scoring does not depend on it (nor on gymnasium)."""
    from ops.rl.rollarc.envs import verify_frozenlake

    s = float(verify_frozenlake(spec, actions))
    return RewardResult(key, s, "verified" if s > 0 else "wrong")


class RewardVerifier:
    """The body of one stateless replica (wrapped by ``serve.deployment`` in ``RewardPool.start``).

    Args:
        item_timeout_s: wall-clock seconds allowed to score one item (> 0); past it the item is
            ``failed`` ("verifier timed out") and its worker process is replaced.
        workers: verifier processes in this replica (>= 1); Serve's ``target_ongoing_requests``
            should match it (one item computes per process).

    Raises (at replica start, so Serve marks the replica unhealthy): RuntimeError when the verifier
    does not score the probe item (``\\boxed{2}`` vs ``2``) as verified within 120 s.
    """

    def __init__(self, item_timeout_s: float = 10.0, workers: int = 1):
        from pebble import ProcessPool

        import ops.curation.verify  # noqa: F401 - imported before the fork so workers start warm

        self.item_timeout_s = float(item_timeout_s)
        self.pool = ProcessPool(max_workers=int(workers))
        r = self.pool.schedule(score_one, args=(_PROBE,)).result(timeout=120)
        if r.status != "verified":
            raise RuntimeError(f"reward verifier failed its start probe: {r}")

    def _replica(self) -> str:
        from ray import serve

        try:
            return serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Serve (e.g. a direct unit call)
            return "local"

    async def __call__(self, req: dict) -> dict:
        """Score one request (shape in the module docstring). Raises RuntimeError for an injected
        fault only; verifier errors and overruns come back as ``failed`` items."""
        fault = req.get("fault") or {}
        if int(req.get("attempt", 0)) < int(fault.get("fail_attempts", 0)):
            raise RuntimeError(f"injected replica fault on attempt {req.get('attempt', 0)} of {req['key']}")
        if fault.get("delay_s"):
            await asyncio.sleep(float(fault["delay_s"]))
        key, kind = str(req["key"]), req["kind"]
        if kind == "math":
            item = RewardItem(key, str(req.get("response") or ""), req.get("answer"), req.get("solution"),
                              req.get("answer_type") or "numeric")
            fut = self.pool.schedule(score_one, args=(item,), timeout=self.item_timeout_s)
        elif kind == "frozenlake":
            fut = self.pool.schedule(_score_frozenlake, args=(key, req["spec"], list(req["actions"])),
                                     timeout=self.item_timeout_s)
        else:
            raise ValueError(f"reward request kind must be one of {KINDS}, got {kind!r}")
        try:
            r = await asyncio.wrap_future(fut)  # cancelling the request cancels (kills) the verifier job
        except concurrent.futures.TimeoutError:
            r = RewardResult(key, None, "failed", error=f"verifier timed out after {self.item_timeout_s:.1f}s")
        except Exception as e:  # noqa: BLE001 - a crashed verifier is a failed score, not 0
            r = RewardResult(key, None, "failed", error=repr(e)[:200])
        return {"key": key, "score": r.score, "status": r.status, "error": r.error, "replica": self._replica()}

    async def ping(self) -> dict:
        """Score the probe item end to end: ``{"status", "replica"}`` (``verified`` when healthy)."""
        r = await asyncio.wrap_future(self.pool.schedule(score_one, args=(_PROBE,), timeout=self.item_timeout_s))
        return {"status": r.status, "replica": self._replica()}

    def check_health(self) -> None:
        """Serve's periodic replica health check: raises when the verifier process pool is gone."""
        if not self.pool.active:
            raise RuntimeError("reward verifier process pool is not running")

    def __del__(self):
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.stop()
            pool.join(timeout=5)


def _request(item: Union[RewardItem, dict]) -> dict:
    """The wire request for one item. Raises ValueError on a malformed item (the caller's bug, not a
    service fault, so it is not retried)."""
    if isinstance(item, RewardItem):
        return {"key": item.key, "kind": "math", "response": item.response, "answer": item.answer,
                "solution": item.solution, "answer_type": item.answer_type}
    if not isinstance(item, dict) or "key" not in item:
        raise ValueError(f"a reward item is a RewardItem or a dict with 'key' and 'kind', got {item!r:.200}")
    kind = item.get("kind")
    need = {"math": ("response", "answer"), "frozenlake": ("spec", "actions")}.get(kind)
    if need is None:
        raise ValueError(f"reward item {item['key']!r}: kind must be one of {KINDS}, got {kind!r}")
    missing = [f for f in need if f not in item]
    if missing:
        raise ValueError(f"reward item {item['key']!r} of kind {kind!r} lacks {missing}")
    return {k: v for k, v in item.items() if k != "attempt"}


def _quiet_metrics_interval_warning() -> None:
    """Serve 2.60 warns that ``metrics_interval_s`` is deprecated on every ``serve.status()`` of a
    deployment that sets it, yet handles and replicas still push queue metrics at that period (the
    env vars it names are read nowhere in 2.60): keep the knob, silence exactly that warning."""
    warnings.filterwarnings("ignore", message="The `metrics_interval_s` field in AutoscalingConfig is deprecated",
                            category=DeprecationWarning)


def autoscaling_config(overrides: Optional[dict] = None, where: str = "reward_pool.autoscaling") -> dict:
    """``overrides`` (Ray Serve ``autoscaling_config`` keys) over ``DEFAULT_AUTOSCALING``, checked by Serve's
    own ``ray.serve.config.AutoscalingConfig`` (``min_replicas <= max_replicas``, positive targets, ...).
    Returns the merged dict. Raises ValueError naming (after ``where``) an unknown key or the value Serve
    rejects."""
    from pydantic import ValidationError
    from ray.serve.config import AutoscalingConfig

    merged = {**DEFAULT_AUTOSCALING, **(overrides or {})}
    unknown = sorted(set(merged) - set(AutoscalingConfig.model_fields))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (Ray Serve AutoscalingConfig has "
                         f"{sorted(AutoscalingConfig.model_fields)})")
    _quiet_metrics_interval_warning()
    try:
        AutoscalingConfig(**merged)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "config"
        raise ValueError(f"{where}.{field}: {err['msg']} (config {merged})") from None
    return merged


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


def _deployment(serve, options: dict, attempts: int = 5):
    """``serve.deployment(RewardVerifier).options(**options)``, retried on Serve's pickle-registry race.

    Building a Serve ``DeploymentConfig`` registers Serve's request-router module with cloudpickle,
    pickles the router class and unregisters the module: a process-global registry with no lock. When
    another thread of this process builds one at the same moment (a Serve thread: a running pool's
    router deserialises one from each deployment-config update it receives), the second unregister
    raises ``ValueError: ... is not registered for pickle by value`` (seen in CI with Ray 2.60).
    Nothing is half-done by then, so the build is simply repeated, up to ``attempts`` times, 50 ms
    apart. Any other error is raised at once.
    """
    for attempt in range(attempts):
        try:
            return serve.deployment(RewardVerifier).options(**options)
        except ValueError as e:
            if "registered for pickle by value" not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(0.05)


def _short(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]


class RewardPool:
    """Driver-side client and owner of one named reward pool (a Serve application).

    Args:
        name: Serve application name (distinct names let pools coexist).
        timeout_s: per-request timeout in seconds (> 0): an attempt still running past it is
            cancelled and counts as failed.
        max_retries: retries after the first attempt (>= 0), on replica errors and timeouts.
        backoff_s: base of the exponential backoff ``backoff_s * 2**(retry - 1)`` (+ up to 25% jitter).
        resource: the named pool: the Ray custom resource each replica requests one unit of.
        sample_interval_s: period of the replica/queue sampler thread (> 0).
        max_samples: the time series keeps the latest ``max_samples`` samples (>= 1).

    Raises:
        ValueError: a parameter out of range.
    """

    def __init__(self, name: str = "reward_pool", timeout_s: float = 30.0, max_retries: int = 3,
                 backoff_s: float = 0.5, resource: str = "reward", sample_interval_s: float = 0.5,
                 max_samples: int = 50_000):
        if not timeout_s > 0:
            raise ValueError(f"reward_pool.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"reward_pool.max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0 or not sample_interval_s > 0 or max_samples < 1:
            raise ValueError(f"reward_pool needs backoff_s >= 0, sample_interval_s > 0, max_samples >= 1; got "
                             f"{backoff_s}, {sample_interval_s}, {max_samples}")
        self.name, self.resource = name, resource
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.sample_interval_s, self.max_samples = sample_interval_s, max_samples
        self._handle = self._ping = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._reset_stats()

    def _reset_stats(self) -> None:
        self._stats = {"requests": 0, "attempts": 0, "retries": 0, "timeouts": 0, "errors": 0, "failures": 0,
                       "peak_replicas": 0}
        self._in_flight = 0
        self._served_by: dict[str, int] = {}
        self._series: deque[tuple[float, int, int, int]] = deque(maxlen=self.max_samples)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, autoscaling: Optional[dict] = None, max_ongoing_requests: int = 2, item_timeout_s: float = 10.0,
              workers: int = 1, ready_timeout_s: float = 120.0) -> "RewardPool":
        """Deploy the pool and wait (at most ``ready_timeout_s``) until Serve reports it RUNNING.

        ``autoscaling`` is Ray Serve's ``autoscaling_config`` (keys of ``ray.serve.config.AutoscalingConfig``)
        over ``DEFAULT_AUTOSCALING``, validated by Serve's own model. Serve keeps ``ceil((queued + ongoing
        requests) / target_ongoing_requests)`` replicas, averaged over ``look_back_period_s``, clipped to
        [min_replicas, max_replicas]; a decision must hold ``upscale_delay_s`` / ``downscale_delay_s``
        seconds before it is applied (Ray Serve autoscaling docs). ``metrics_interval_s`` is how often
        handles push their queue length (Serve deprecates the field for an env var but still uses it in
        2.60). ``max_ongoing_requests`` caps requests per replica (the rest queue in the handle).

        Raises:
            ValueError: an unknown autoscaling key or a value Serve rejects (both named), the other
                bounds out of range, or the cluster advertises fewer than ``min_replicas`` units of
                ``resource``.
            RewardServiceError: Ray is not initialised, the deploy failed or timed out.
        """
        import ray
        from ray import serve
        from ray.serve.api import RunTarget

        scaling = autoscaling_config(autoscaling)
        if not (max_ongoing_requests >= 1 and item_timeout_s > 0 and workers >= 1):
            raise ValueError("reward_pool needs max_ongoing_requests >= 1, item_timeout_s > 0, workers >= 1; got "
                             f"{max_ongoing_requests}, {item_timeout_s}, {workers}")
        if not ray.is_initialized():
            raise RewardServiceError(f"reward pool {self.name}: Ray is not initialised (the caller owns Ray: "
                                     f"ray.init(resources={{'{self.resource}': N}}))")
        have = ray.cluster_resources().get(self.resource, 0)
        min_replicas = scaling["min_replicas"]
        if have < max(1, min_replicas):
            raise ValueError(f"reward pool {self.name}: the cluster advertises {have:g} '{self.resource}' units, "
                             f"fewer than min_replicas {max(1, min_replicas)}")
        serve.start(proxy_location="Disabled")  # handles only, no HTTP proxy (no-op if Serve runs)
        _quiet_metrics_interval_warning()
        options = dict(
            name=DEPLOYMENT, ray_actor_options={"num_cpus": 0, "resources": {self.resource: 1}},
            max_ongoing_requests=max_ongoing_requests,
            # a replica being stopped checks for requests in flight every 0.2 s, not Serve's 2 s: at
            # shutdown every reward has been awaited, so the first check lets it go
            graceful_shutdown_wait_loop_s=0.2,
            autoscaling_config=scaling)
        app = _deployment(serve, options).bind(item_timeout_s=item_timeout_s, workers=workers)
        (handle,) = serve.run_many([RunTarget(app, name=self.name, route_prefix=None)],
                                   wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            st = serve.status().applications.get(self.name)
            status = str(getattr(st, "status", "NOT_STARTED"))
            if status.endswith("RUNNING"):
                break
            if status.endswith("DEPLOY_FAILED") or time.monotonic() > deadline:
                msg = getattr(st, "message", "") or ""
                serve.delete(self.name)
                raise RewardServiceError(f"reward pool {self.name} did not start within {ready_timeout_s:.0f}s: "
                                         f"{status} {msg[:500]}")
            time.sleep(0.2)
        self._handle, self._ping = handle, handle.options(method_name="ping")
        self._reset_stats()
        self._t0 = time.monotonic()
        self._stop.clear()
        self._loop = asyncio.new_event_loop()
        self._threads = [threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True),
                         threading.Thread(target=self._sample_loop, name=f"{self.name}-sampler", daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def shutdown(self) -> None:
        """Stop the sampler and the driver loop and delete the Serve application (Serve bounds the
        wait at 60 s). Ray and Serve themselves stay up: the caller owns them. Idempotent."""
        from ray import serve

        self._stop.set()
        if self._loop is not None and self._loop.is_running():
            try:  # in-flight items end as cancelled futures rather than pending tasks
                asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop).result(timeout=10)
            except Exception:  # noqa: BLE001 - the loop is stopped below regardless
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        for t in self._threads:
            t.join(timeout=10)
        if self._loop is not None and not self._loop.is_running():
            self._loop.close()
        self._threads, self._loop = [], None
        handles, self._handle, self._ping = (self._handle, self._ping), None, None
        for h in handles:  # stop the driver-side routers: they push queue metrics to the controller,
            if h is not None:  # and after a later ray.shutdown() that would auto-start a new cluster
                t = threading.Thread(target=h.shutdown, name=f"{self.name}-router-stop", daemon=True)
                t.start()
                t.join(timeout=10)
        if handles[0] is not None and self.name in serve.status().applications:
            serve.delete(self.name)

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- state -------------------------------------------------------------------------------------
    def _deployment_status(self):
        from ray import serve

        app = serve.status().applications.get(self.name)
        return None if app is None else app.deployments.get(DEPLOYMENT)

    def replicas(self) -> dict:
        """Replica counts from Serve's status: ``{"running", "starting", "stopping", "status"}`` (status
        is the deployment status, e.g. HEALTHY / UPSCALING / DOWNSCALING; "NOT_DEPLOYED" when absent)."""
        d = self._deployment_status()
        if d is None:
            return {"running": 0, "starting": 0, "stopping": 0, "status": "NOT_DEPLOYED"}
        n = {str(getattr(k, "value", k)): v for k, v in d.replica_states.items()}
        return {"running": n.get("RUNNING", 0),
                "starting": n.get("STARTING", 0) + n.get("UPDATING", 0) + n.get("RECOVERING", 0),
                "stopping": n.get("STOPPING", 0) + n.get("PENDING_MIGRATION", 0),
                "status": str(getattr(d.status, "value", d.status))}

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.sample_interval_s):
            try:
                r = self.replicas()
            except Exception:  # noqa: BLE001 - a missed sample (controller busy, shutting down)
                continue
            with self._lock:
                self._series.append((round(time.monotonic() - self._t0, 3), r["running"], r["starting"],
                                     self._in_flight))
                self._stats["peak_replicas"] = max(self._stats["peak_replicas"], r["running"])

    def stats(self) -> dict:
        """Counters since ``start``: requests (items), attempts, retries, timeouts, errors (replica
        exceptions), failures (items returned ``failed`` by the driver), peak_replicas (most RUNNING
        replicas sampled), in_flight now, ``served_by`` {replica id: items it answered}, and
        ``series``: [(t_s since start, running replicas, starting replicas, in-flight items = queued
        in the handle + ongoing at replicas + waiting to retry)], the latest ``max_samples``."""
        with self._lock:
            return {**self._stats, "in_flight": self._in_flight, "served_by": dict(self._served_by),
                    "series": list(self._series)}

    # -- health ------------------------------------------------------------------------------------
    def health(self, timeout_s: float = 30.0) -> dict:
        """Run before training starts: Serve reports the application RUNNING and a replica scores the
        probe item (``\\boxed{2}`` vs ``2``) as verified within ``timeout_s``. Callable from any thread,
        including one running an event loop. Returns ``replicas()``.

        Raises:
            RewardServiceError: not started / shut down / deleted, not RUNNING, or the probe failed or
                timed out.
        """
        from ray import serve

        if self._handle is None or self._loop is None:
            raise RewardServiceError(f"reward pool {self.name} is not deployed (call start())")
        app = serve.status().applications.get(self.name)
        status = str(getattr(app, "status", "NOT_STARTED"))
        if app is None or not status.endswith("RUNNING"):
            raise RewardServiceError(f"reward pool {self.name} is not running: {status}")
        fut = asyncio.run_coroutine_threadsafe(asyncio.wait_for(self._ping.remote(), timeout_s), self._loop)
        try:
            out = fut.result(timeout=timeout_s + 5)
        except Exception as e:  # noqa: BLE001 - any probe failure means unhealthy
            fut.cancel()
            raise RewardServiceError(f"reward pool {self.name} failed its health probe: {_short(e)}") from e
        if out.get("status") != "verified":
            raise RewardServiceError(f"reward pool {self.name}: probe scored {out}, expected verified")
        return self.replicas()

    # -- scoring -----------------------------------------------------------------------------------
    def _count(self, **inc) -> None:
        with self._lock:
            for k, v in inc.items():
                if k == "in_flight":
                    self._in_flight += v
                else:
                    self._stats[k] += v

    def _bound_s(self, timeout_s: float) -> float:
        """Longest time one item can take: every attempt times out, every backoff at its max."""
        backoff = sum(self.backoff_s * 2 ** (i - 1) * 1.25 for i in range(1, self.max_retries + 1))
        return timeout_s * (self.max_retries + 1) + backoff

    async def _score_request(self, req: dict, timeout_s: float) -> RewardResult:
        handle = self._handle
        if handle is None:
            raise RewardServiceError(f"reward pool {self.name} is not deployed (call start())")
        self._count(requests=1, in_flight=1)
        err = "no attempt"
        try:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    self._count(retries=1)
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
                self._count(attempts=1)
                resp = handle.remote({**req, "attempt": attempt})
                try:
                    out = await asyncio.wait_for(resp, timeout_s)
                except asyncio.CancelledError:
                    resp.cancel()
                    raise
                except TimeoutError:
                    resp.cancel()
                    self._count(timeouts=1)
                    err = f"timed out after {timeout_s:g}s"
                    continue
                except Exception as e:  # noqa: BLE001 - replica died/raised/unavailable: retry
                    self._count(errors=1)
                    err = _short(e)
                    continue
                with self._lock:
                    rid = str(out.get("replica"))
                    self._served_by[rid] = self._served_by.get(rid, 0) + 1
                return RewardResult(req["key"], None if out["score"] is None else float(out["score"]),
                                    out["status"], attempt + 1, out.get("error"))
            self._count(failures=1)
            return RewardResult(req["key"], None, "failed", self.max_retries + 1,
                                f"{err} (after {self.max_retries + 1} attempts)")
        finally:
            self._count(in_flight=-1)

    async def ascore(self, item: Union[RewardItem, dict], timeout_s: Optional[float] = None) -> RewardResult:
        """Score one item from any event loop (each trajectory's task awaits its own reward).

        ``timeout_s`` (default: the pool's) limits each attempt; the call returns within
        ``timeout_s * (max_retries + 1)`` plus the backoffs. Returns a RewardResult whose ``attempts``
        counts the tries; ``failed`` (score None) when every attempt errored or timed out.

        Raises:
            ValueError: a malformed item. RewardServiceError: the pool is not started.
        """
        return await self._score_request(_request(item), timeout_s or self.timeout_s)

    def submit(self, item: Union[RewardItem, dict],
               timeout_s: Optional[float] = None) -> "concurrent.futures.Future[RewardResult]":
        """Schedule one item on the pool's driver loop; returns a concurrent Future of its RewardResult
        (thread-safe). Raises ValueError on a malformed item, RewardServiceError when not started."""
        req = _request(item)
        if self._loop is None:
            raise RewardServiceError(f"reward pool {self.name} is not deployed (call start())")
        return asyncio.run_coroutine_threadsafe(self._score_request(req, timeout_s or self.timeout_s), self._loop)

    def score(self, items: Sequence[Union[RewardItem, dict]], timeout_s: Optional[float] = None) -> list[RewardResult]:
        """Score items concurrently (all in flight at once; Serve queues and autoscales). Returns one
        RewardResult per item, in order; never raises for service faults (those items are ``failed``).
        Blocks at most the per-item bound (see ``ascore``) + 30 s."""
        t = timeout_s or self.timeout_s
        reqs = [_request(it) for it in items]
        futs = [self.submit(r, t) for r in reqs]
        deadline = time.monotonic() + self._bound_s(t) + 30
        out = []
        for r, f in zip(reqs, futs):
            try:
                out.append(f.result(timeout=max(0.0, deadline - time.monotonic())))
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError) as e:
                f.cancel()
                self._count(failures=1)
                why = "driver deadline passed" if isinstance(e, concurrent.futures.TimeoutError) else "pool shut down"
                out.append(RewardResult(r["key"], None, "failed", 0, why))
        return out
