"""The embedded teacher: the real `transformers serve` with SmolLM2-135M-Instruct on 127.0.0.1."""

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
