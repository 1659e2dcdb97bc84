"""The teacher client (on the openai SDK) against real HTTP servers on 127.0.0.1: retries, timeouts,
4xx, Retry-After, budget, cache."""

import time

import pytest

from ops.teacher.cache import ResponseCache
from ops.teacher.client import ChatRequest, TeacherClient
from tests.stub_openai import StubOpenAI


def reqs(n, params=None):
    return [ChatRequest.make([{"role": "user", "content": f"q{i}"}], params or {"max_tokens": 8}, 0, f"p{i}") for i in range(n)]


def test_503_twice_then_success_is_retried():
    with StubOpenAI(script=[503, 503]) as stub:
        with TeacherClient(stub.base_url, "m", max_retries=3, concurrency=1) as c:
            [res] = c.complete(reqs(1))
    assert res.status == "ok" and res.attempts == 3 and "boxed{4}" in res.text
    assert stub.requests == 3 and c.stats.retries == 2


def test_hang_past_timeout_fails_after_bounded_retries():
    with StubOpenAI(default="hang", hang_s=3.0) as stub:
        t = time.monotonic()
        with TeacherClient(stub.base_url, "m", timeout_s=0.3, max_retries=1, concurrency=1) as c:
            [res] = c.complete(reqs(1))
        assert time.monotonic() - t < 2.9  # 2 x 0.3 s + one SDK backoff (<= 0.5 s), not 2 x the 3 s hang
    assert res.status == "failed" and "Timeout" in res.error and res.attempts == 2


def test_other_4xx_fails_at_once_and_429_honours_retry_after():
    with StubOpenAI(script=[400]) as stub:
        with TeacherClient(stub.base_url, "m", concurrency=1) as c:
            [res] = c.complete(reqs(1))
    assert res.status == "failed" and res.error.startswith("HTTP 400") and res.attempts == 1 and stub.requests == 1
    with StubOpenAI(script=[429], retry_after=1.5) as stub:
        with TeacherClient(stub.base_url, "m", concurrency=1) as c:
            t = time.monotonic()
            [res] = c.complete(reqs(1))
    # Retry-After (1.5 s) wins over the first backoff (<= 0.5 s)
    assert res.status == "ok" and res.attempts == 2 and 1.5 <= time.monotonic() - t < 10.0


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


# ------------------------------------------------------------------------------------------ seeds


def _seeded(seed):
    return ChatRequest.make([{"role": "user", "content": "q0"}], {"max_tokens": 8}, 0, "p0", seed=seed)


def test_seed_is_sent_as_the_openai_field_and_keys_the_cache(tmp_path):
    import hashlib
    import json

    from ops.teacher.cache import request_key

    cache = ResponseCache(tmp_path / "c.sqlite")
    with StubOpenAI() as stub:
        with TeacherClient(stub.base_url, "m", cache=cache, concurrency=1) as c:
            c.complete([_seeded(1), _seeded(2), _seeded(None)])
        assert [b.get("seed", "absent") for b in stub.bodies] == [1, 2, "absent"]
        with TeacherClient(stub.base_url, "m", cache=cache, concurrency=1) as c:
            again = c.complete([_seeded(2), _seeded(1), _seeded(None), _seeded(3)])
        assert [r.cached for r in again] == [True, True, True, False] and stub.requests == 4
    keys = {request_key("m", _seeded(s)) for s in (None, 0, 1, 2)}
    assert len(keys) == 4  # seed 0 is a seed, not "no seed"
    # an unseeded request keeps the key it had before seeds existed: older caches still serve it
    legacy = hashlib.sha256(json.dumps(["m", [["user", "q0"]], [["max_tokens", 8]], 0], sort_keys=True).encode()).hexdigest()
    assert request_key("m", _seeded(None)) == legacy
    with pytest.raises(ValueError, match="seed=..."):
        ChatRequest.make([{"role": "user", "content": "q"}], {"seed": 3})


def test_seed_honoured_is_what_the_endpoint_says_and_survives_the_cache(tmp_path):
    with StubOpenAI() as stub:  # says nothing: best effort, not honoured
        with TeacherClient(stub.base_url, "m", concurrency=1) as c:
            [res] = c.complete([_seeded(5)])
        assert res.status == "ok" and res.seed_honoured is False and res.system_fingerprint is None
        with TeacherClient(stub.base_url, "m", concurrency=1, seed_honoured=True) as c:  # declared by the operator
            seeded, unseeded = c.complete([_seeded(5), _seeded(None)])
        assert seeded.seed_honoured is True and unseeded.seed_honoured is False
    cache = ResponseCache(tmp_path / "c.sqlite")
    with StubOpenAI(extra={"system_fingerprint": "fp_abc", "seed_honoured": True}) as stub:
        with TeacherClient(stub.base_url, "m", concurrency=1, cache=cache) as c:
            [fresh] = c.complete([_seeded(7)])
            [hit] = c.complete([_seeded(7)])
    assert (fresh.system_fingerprint, fresh.seed_honoured, fresh.cached) == ("fp_abc", True, False)
    assert (hit.system_fingerprint, hit.seed_honoured, hit.cached) == ("fp_abc", True, True)


def test_a_cache_file_from_before_seeds_opens_and_still_serves(tmp_path):
    import sqlite3

    from ops.teacher.cache import request_key

    path = tmp_path / "old.sqlite"
    old_schema = ("create table responses (key text primary key, model text not null, tag text, sample_index integer, "
                  "status text not null, text text, error text, completion_tokens integer, latency_s real, attempts integer, "
                  "created_at real not null)")
    with sqlite3.connect(path) as db:
        db.execute(old_schema)
        db.execute("insert into responses values (?,?,?,?,?,?,?,?,?,?,?)",
                   (request_key("m", _seeded(None)), "m", "p0", 0, "ok", "old text", None, 3, 0.1, 1, 0.0))
    cache = ResponseCache(path)
    assert cache.get(request_key("m", _seeded(None))) == {"text": "old text", "completion_tokens": 3, "latency_s": 0.1,
                                                          "system_fingerprint": None, "seed_honoured": False}
    with StubOpenAI(extra={"system_fingerprint": "fp"}) as stub:
        with TeacherClient(stub.base_url, "m", concurrency=1, cache=cache) as c:
            [res] = c.complete([_seeded(9)])
    assert cache.get(request_key("m", _seeded(9)))["system_fingerprint"] == "fp" and res.text
