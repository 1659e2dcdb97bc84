"""The math reward, its scorer and client: statuses (unparseable apart from wrong), and case
reward-service-faults both against real HTTP endpoints on 127.0.0.1 (an external reward service:
503 twice then ok; a hang; down) and against the built-in reward as a real Ray actor (a hang, a
dead actor, a bad request)."""

import json
import logging
import math
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from ops.rl.reward import (AdaptiveTimeout, LocalRewardTransport, RayRewardTransport, RewardClient, RewardItem,
                            RetryableRewardError, RewardScorer, RewardServiceError, check_failed_fraction,
                            reward_counts, score_one)
from tests.stub_openai import JSONHandler


class FaultyRewardService:
    """A real HTTP reward service with scripted faults: each POST consumes one action — an int
    status, "hang" (sleep hang_s) or "ok" (every item scored 1.0 / verified)."""

    def __init__(self, script=(), default="ok", hang_s=3.0):
        self.script, self.default, self.hang_s, self.posts = list(script), default, hang_s, 0
        svc = self

        class H(JSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                svc.posts += 1
                act = svc.script.pop(0) if svc.script else svc.default
                if act == "hang":
                    time.sleep(svc.hang_s)
                if act not in ("ok", "hang"):
                    return self._send(int(act), {"error": "scripted"})
                self._send(200, {"scores": [{"key": d["key"], "score": 1.0, "status": "verified"} for d in body["items"]]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


ITEM = RewardItem("q/0", "so \\boxed{4}", "4")


def test_math_reward_counts_unparseable_apart_from_wrong():
    res = [score_one(RewardItem("a", "The sum is \\boxed{4}.", "4")), score_one(RewardItem("b", "\\boxed{5}", "4")),
           score_one(RewardItem("c", "I think it is 4", "4")), score_one(RewardItem("d", "\\boxed{\\frac{1}{2}}", "0.5"))]
    assert [(r.status, r.score) for r in res] == [("verified", 1.0), ("wrong", 0.0), ("unparseable", 0.0), ("verified", 1.0)]
    c = reward_counts(res)
    assert (c["verified"], c["wrong"], c["unparseable"], c["failed_fraction"]) == (2, 1, 1, 0.0)


def test_case_reward_service_faults():
    flaky, hung = FaultyRewardService([503, 503]), FaultyRewardService(default="hang", hang_s=3.0)
    try:
        # 503 twice then success: bounded retries with backoff
        ok = RewardClient(flaky.url, timeout_s=1.0, max_retries=3, backoff_s=0.05)
        ok.health()
        [r1] = ok.score([ITEM])
        assert (r1.score, r1.status, r1.attempts, flaky.posts) == (1.0, "verified", 3, 3)
        # a hanging service: per-request timeout, then failed (NaN + flag), never 0.0
        t = time.monotonic()
        [r2] = RewardClient(hung.url, timeout_s=0.3, max_retries=1, backoff_s=0.05).score([ITEM])
        assert time.monotonic() - t < 2.0
        assert r2.failed and r2.score is None and math.isnan(r2.value) and r2.status == "failed" and r2.attempts == 2
        # a service that is down: the health check before training fails, scores fail fast
        down = RewardClient(dead_url(), timeout_s=0.5, max_retries=2, backoff_s=0.01)
        with pytest.raises(RewardServiceError, match="unreachable"):
            down.health()
        [r3] = down.score([ITEM])
        assert r3.failed and r3.score is None and "Connect" in r3.error
        # the step fails only above the failed-fraction threshold
        assert check_failed_fraction([r1, r2, r3], max_failed_fraction=0.7) == pytest.approx(2 / 3)
        with pytest.raises(RewardServiceError, match="reward.max_failed_fraction"):
            check_failed_fraction([r1, r2, r3], max_failed_fraction=0.5)
    finally:
        flaky.close()
        hung.close()


def test_a_client_error_is_not_retried():
    svc = FaultyRewardService([400])
    try:
        [r] = RewardClient(svc.url, timeout_s=1.0, max_retries=3, backoff_s=0.01).score([ITEM])
        assert r.failed and r.error == "HTTP 400" and svc.posts == 1
    finally:
        svc.close()


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()


class _SlowScorer:
    """A reward actor body that answers after ``hang_s`` (a hung service behind a Ray actor)."""

    def __init__(self, hang_s):
        self.hang_s = hang_s

    def health(self):
        return {"status": "ok"}

    def score_dicts(self, items):
        time.sleep(self.hang_s)
        return [{"key": d["key"], "score": 1.0, "status": "verified"} for d in items]


def _wait_dead(ray, actor, timeout_s: float = 60.0) -> None:
    """Block until calls on a killed ``actor`` fail (RayActorError), at most ``timeout_s`` seconds."""
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.health.remote(), timeout=5.0)
        except RayActorError:
            return
        except GetTimeoutError:                  # a loaded machine: ask again
            continue
        time.sleep(0.1)
    raise AssertionError(f"the killed actor still answers after {timeout_s} s")


def test_the_reward_actor_scores_through_ray_with_the_fault_contract(ray_local):
    from ops.rl.ray_actors import _RewardImpl

    actor = ray_local.remote(num_cpus=0, max_concurrency=4)(_RewardImpl).remote(1, 20.0)
    c = RewardClient(RayRewardTransport(actor), timeout_s=30, max_retries=1)
    c.health()
    res = c.score([RewardItem("a", "\\boxed{6}", "6"), RewardItem("b", "\\boxed{7}", "6"),
                   RewardItem("c", "six", "6"), RewardItem("d", "\\boxed{1}", None)])
    assert [r.status for r in res] == ["verified", "wrong", "unparseable", "bad_gold"]
    assert [r.score for r in res] == [1.0, 0.0, 0.0, None] and res[3].failed
    # a bad request is the caller's fault: not retried, failed with the scorer's error naming the field
    with pytest.raises(RewardServiceError, match="field 'key' is missing") as bad:
        RayRewardTransport(actor).score([{"response": "x"}], 30)
    assert not isinstance(bad.value, RetryableRewardError)
    # a hung actor: each call times out (and is cancelled), then failed (NaN + flag), never 0.0
    slow = ray_local.remote(num_cpus=0, max_concurrency=4)(_SlowScorer).remote(5.0)
    t = time.monotonic()
    [rh] = RewardClient(RayRewardTransport(slow), timeout_s=0.5, max_retries=1, backoff_s=0.05).score([ITEM])
    assert time.monotonic() - t < 4.0
    assert rh.failed and rh.score is None and math.isnan(rh.value) and rh.attempts == 2 and "timed out" in rh.error
    # a dead actor: the health check before training fails; scores fail after bounded retries
    ray_local.kill(actor)
    _wait_dead(ray_local, actor)                 # kill is asynchronous: a loaded machine may answer once more
    dead = RewardClient(RayRewardTransport(actor), timeout_s=5.0, max_retries=2, backoff_s=0.01)
    with pytest.raises(RewardServiceError, match="unhealthy"):
        dead.health()
    [rd] = dead.score([ITEM])
    assert rd.failed and rd.score is None and rd.attempts == 3 and "unavailable" in rd.error
    assert dead.stats == {"requests": 3, "retries": 2, "failed_requests": 1}


def test_the_in_process_scorer_has_no_server_and_refuses_before_start():
    scorer = RewardScorer(workers=1, item_timeout_s=20)
    with pytest.raises(RewardServiceError, match="not started"):
        LocalRewardTransport(scorer).health(1.0)
    with scorer:
        [r] = RewardClient(LocalRewardTransport(scorer), timeout_s=30).score([RewardItem("a", "\\boxed{6}", "6")])
    assert (r.status, r.score) == ("verified", 1.0)
    with pytest.raises(ValueError, match="reward.workers"):
        RewardScorer(workers=0)


def test_adaptive_timeout_follows_the_slowest_correct_answer():
    t = AdaptiveTimeout(lam=1.5, t_min=2.0, t_max=30.0)
    assert t.timeout("q1") == 30.0                          # no correct answer yet: T_max
    t.observe("q1", 0.1, correct=True)
    assert t.timeout("q1") == 2.0                           # lam * 0.1 below T_min
    t.observe("q1", 8.0, correct=True)
    t.observe("q1", 25.0, correct=False)                    # a wrong answer never sets the anchor
    assert t.timeout("q1") == 12.0 and t.timeout("q2") == 30.0
    t.observe("q1", 40.0, correct=True)
    assert t.timeout("q1") == 30.0
