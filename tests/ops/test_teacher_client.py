"""The teacher client against real HTTP servers on 127.0.0.1: retries, timeouts, 4xx, budget, cache."""

import time

import pytest

from ops.teacher.cache import ResponseCache
from ops.teacher.client import ChatRequest, TeacherClient
from tests.stub_openai import StubOpenAI


def reqs(n, params=None):
    return [ChatRequest.make([{"role": "user", "content": f"q{i}"}], params or {"max_tokens": 8}, 0, f"p{i}") for i in range(n)]


def test_503_twice_then_success_is_retried():
    with StubOpenAI(script=[503, 503]) as stub:
        with TeacherClient(stub.base_url, "m", backoff_s=0.01, max_retries=3, concurrency=1) as c:
            [res] = c.complete(reqs(1))
    assert res.status == "ok" and res.attempts == 3 and "boxed{4}" in res.text
    assert stub.requests == 3 and c.stats.retries == 2


def test_hang_past_timeout_fails_after_bounded_retries():
    with StubOpenAI(default="hang", hang_s=3.0) as stub:
        t = time.monotonic()
        with TeacherClient(stub.base_url, "m", timeout_s=0.3, max_retries=1, backoff_s=0.01, concurrency=1) as c:
            [res] = c.complete(reqs(1))
        assert time.monotonic() - t < 2.5
    assert res.status == "failed" and "Timeout" in res.error and res.attempts == 2


def test_other_4xx_fails_at_once_and_429_honours_retry_after():
    with StubOpenAI(script=[400]) as stub:
        with TeacherClient(stub.base_url, "m", backoff_s=0.01, concurrency=1) as c:
            [res] = c.complete(reqs(1))
    assert res.status == "failed" and res.error.startswith("HTTP 400") and res.attempts == 1 and stub.requests == 1
    with StubOpenAI(script=[429], retry_after=0.2) as stub:
        with TeacherClient(stub.base_url, "m", backoff_s=5.0, concurrency=1) as c:
            t = time.monotonic()
            [res] = c.complete(reqs(1))
    assert res.status == "ok" and 0.2 <= time.monotonic() - t < 2.0  # Retry-After (0.2 s), not backoff (5 s)


def test_request_budget_marks_the_rest_failed():
    with StubOpenAI() as stub:
        with TeacherClient(stub.base_url, "m", request_budget=2, concurrency=1) as c:
            res = c.complete(reqs(4))
    assert [r.status for r in res] == ["ok", "ok", "failed", "failed"]
    assert "budget" in res[3].error and stub.requests == 2


def test_cache_serves_finished_responses_and_retries_failed_ones(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    with StubOpenAI(script=["ok", 500]) as stub:
        with TeacherClient(stub.base_url, "m", max_retries=0, concurrency=1, cache=cache) as c:
            first = c.complete(reqs(2))
        assert [r.status for r in first] == ["ok", "failed"]
        assert cache.counts() == {"ok": 1, "failed": 1}
        with TeacherClient(stub.base_url, "m", max_retries=0, concurrency=1, cache=cache) as c:
            second = c.complete(reqs(2))
        assert [r.cached for r in second] == [True, False] and [r.status for r in second] == ["ok", "ok"]
        assert c.stats.http_requests == 1 and stub.requests == 3
    assert cache.counts() == {"ok": 2}


def test_cache_key_covers_params_and_sample_index(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    with StubOpenAI() as stub:
        with TeacherClient(stub.base_url, "m", cache=cache) as c:
            c.complete(reqs(1, {"max_tokens": 8}))
            c.complete(reqs(1, {"max_tokens": 9}))
            c.complete([ChatRequest.make([{"role": "user", "content": "q0"}], {"max_tokens": 8}, 1, "p0")])
            assert c.stats.http_requests == 3 and c.stats.cache_hits == 0


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"concurrency": 0}, {"max_retries": -1}])
def test_bad_parameters_are_named(kw):
    with pytest.raises(ValueError, match=f"teacher.{list(kw)[0]}"):
        TeacherClient("http://127.0.0.1:1/v1", "m", **kw)


def test_label_parsing_is_strict():
    from ops.curation.annotate import DOMAINS
    from ops.teacher.prompts import parse_label

    assert parse_label("Physics.", list(DOMAINS)) == "physics"
    assert parse_label(" Biology", list(DOMAINS)) == "biology_medicine"
    assert parse_label("A. Do algae consume other organisms?", list(DOMAINS)) is None
    assert parse_label("", list(DOMAINS)) is None


def test_prompt_templates_are_overridable_and_validated():
    from ops.teacher.prompts import TEMPLATES, solve_messages, validate_templates

    default = solve_messages("What is $x^{2}$ at $x=3$?", "numeric")[1]["content"]
    assert default.startswith("What is $x^{2}$ at $x=3$?") and default.endswith("\\boxed{}.")  # LaTeX braces kept
    custom = solve_messages("Q", "multiple_choice", {"multiple_choice": "Pick one. {problem} Answer: \\boxed{?}"})
    assert custom[1]["content"] == "Pick one. Q Answer: \\boxed{?}"
    assert set(TEMPLATES) == {"numeric", "expression", "text", "proof", "multiple_choice"}
    with pytest.raises(ValueError, match="must contain '{problem}'"):
        validate_templates({"numeric": "no placeholder"})
    with pytest.raises(ValueError, match="unknown answer type 'essay'"):
        validate_templates({"essay": "{problem}"})
