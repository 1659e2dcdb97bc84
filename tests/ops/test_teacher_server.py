"""The embedded teacher: the real server (ops/teacher/serve.py) with SmolLM2-135M-Instruct on 127.0.0.1."""

import socket

import pytest

from ops.curation.distill import build_requests, summarize, verify_samples
from ops.teacher.client import TeacherClient
from ops.teacher.server import LocalTeacherServer, TeacherServerError
from resources.teacher import default_model_dir


@pytest.fixture(scope="module")
def server():
    with LocalTeacherServer(default_model_dir(), startup_timeout_s=180) as srv:
        yield srv


def test_health_and_one_batch_verified_end_to_end(server):
    import httpx

    assert httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5).json() == {"status": "ok"}
    rows = [{"problem_id": "a", "problem": "What is $2+3$?", "answer": "5", "solution": None, "answer_type": "numeric"},
            {"problem_id": "b", "problem": "Which is a gas at room temperature?\nA. iron\nB. oxygen", "answer": "B",
             "solution": None, "answer_type": "multiple_choice"}]
    requests = build_requests(rows, k=2, params={"temperature": 0.7, "max_tokens": 24})
    with TeacherClient(server.base_url, server.model, concurrency=2, timeout_s=120) as c:
        results = c.complete(requests)
    assert [r.status for r in results] == ["ok"] * 4 and all(r.text for r in results)
    samples = verify_samples(rows, results, timeout_s=10, workers=1)
    assert {s["status"] for s in samples} <= {"verified", "wrong", "unparseable_prediction"}
    per = summarize(samples)
    assert per["a"]["n_samples"] == 2 and per["a"]["n_failed"] == 0


def test_same_seed_same_text_alone_or_batched_other_seed_differs(server):
    """Each request samples from its own generator: a seeded request returns the same text whether
    it ran alone or in a batch with other requests, and another seed gives another text."""
    from ops.teacher.client import ChatRequest

    def req(problem, seed):
        return ChatRequest.make([{"role": "user", "content": problem}], {"temperature": 0.9, "max_tokens": 20}, tag=problem, seed=seed)

    target = "Name three colours and say why the sky is blue."
    others = [req(f"Write a sentence about the number {i}.", 100 + i) for i in range(3)]
    with TeacherClient(server.base_url, server.model, concurrency=4, timeout_s=300) as c:
        [alone] = c.complete([req(target, 11)])
        [again] = c.complete([req(target, 11)])
        batched = c.complete([others[0], req(target, 11), others[1], others[2]])  # decoded together
        [other_seed] = c.complete([req(target, 12)])
        [unseeded] = c.complete([req(target, None)])
    assert alone.status == "ok" and alone.completion_tokens == 20
    assert again.text == alone.text and batched[1].text == alone.text
    assert other_seed.text != alone.text and len({r.text for r in batched}) == 4
    assert alone.seed_honoured and batched[1].seed_honoured and not unseeded.seed_honoured
    assert alone.system_fingerprint.startswith("crucible-embedded-") and other_seed.system_fingerprint == alone.system_fingerprint
    import httpx

    about = httpx.get(f"{server.base_url}/teacher", timeout=10).json()
    assert about == {"instance": server.instance, "model": server.model, "seed_honoured": True,
                     "system_fingerprint": alone.system_fingerprint}


def test_bad_request_fields_are_a_400_naming_the_field(server):
    import httpx

    url = f"{server.base_url}/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    for body, field in (({"messages": msgs, "seed": "7"}, "seed"), ({"messages": msgs, "n": 2}, "'n'"),
                        ({"messages": msgs, "temperature": -1}, "temperature"), ({"messages": []}, "messages")):
        resp = httpx.post(url, json={"model": server.model, **body}, timeout=30)
        assert resp.status_code == 400 and field in resp.json()["error"]["message"], body


def test_port_taken_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(TeacherServerError, match=f"port {port} .* already in use"):
            LocalTeacherServer(default_model_dir(), port=port).start()


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(TeacherServerError, match="no config.json"):
        LocalTeacherServer(tmp_path / "nope").start()


def test_a_dead_server_is_reported_with_its_exit_code():
    import os
    import signal

    srv = LocalTeacherServer(default_model_dir(), startup_timeout_s=180).start()
    srv.check_alive()
    os.killpg(os.getpgid(srv.proc.pid), signal.SIGKILL)
    srv.proc.wait(timeout=30)
    with pytest.raises(TeacherServerError, match=r"not running \(exit code -9\)"):
        srv.check_alive()
    srv.stop()  # idempotent on a dead server


def test_a_killed_owner_leaves_no_server(tmp_path):
    """The embedded server exits when the process that started it dies (``serve.watch_parent``): a SIGKILLed
    step or run leaves no teacher server holding its port and model. Outside a Dagster run the session owns
    the server."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from ops.teacher.server import port_in_use

    script = ("import sys, time\n"
              "from resources.teacher import TeacherResource\n"
              "class Log:\n"
              "    def info(self, m): print(m, flush=True)\n"
              "with TeacherResource().session(sys.argv[1], log=Log()):\n"
              "    time.sleep(600)\n")
    root = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "cache.sqlite")], cwd=root,
                             stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert "embedded teacher server on http://127.0.0.1:" in line and "for this session" in line, line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        assert port_in_use(port)
        owner.kill()
        owner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while port_in_use(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not port_in_use(port)
    finally:
        owner.kill()


def test_a_run_shares_one_server_across_threads_and_replaces_a_dead_one(tmp_path):
    """In a run (Dagster called ``setup_for_execution``) the server outlives the short-lived thread that
    started it (the decontamination judge opens its session in one), later sessions reuse it, a killed
    one is replaced by the next session, and teardown stops it."""
    import os
    import signal
    import threading

    from ops.teacher.server import port_in_use
    from resources.teacher import TeacherResource

    res = TeacherResource()
    res.setup_for_execution(None)                     # what Dagster does at the start of a run
    first = []

    def judge_thread():
        with res.session(tmp_path / "cache.sqlite") as client:
            first.append(client.base_url)

    t = threading.Thread(target=judge_thread)
    t.start()
    t.join(timeout=300)
    srv = res._server
    try:
        assert first and srv.healthy()                # the thread is gone, its server is not
        with res.session(tmp_path / "cache.sqlite") as client:
            assert res._server is srv and client.base_url == first[0]
        os.killpg(os.getpgid(srv.proc.pid), signal.SIGKILL)
        srv.proc.wait(timeout=30)
        with res.session(tmp_path / "cache.sqlite") as client:
            assert res._server is not srv and res._server.healthy() and client.base_url == res._server.base_url
        new = res._server
    finally:
        res.teardown_after_execution(None)
    assert new.proc.poll() is not None and not port_in_use(new.port)
    assert res._server is None
