"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions protocol, with scripted
faults (status codes, hangs, delays). For client tests only: it answers with a fixed text."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ops.httpjson import send_json


class JSONHandler(BaseHTTPRequestHandler):
    """The base of the test servers' handlers: no request log, ``GET`` answers the health check
    ``{"status": "ok"}``, ``_send`` replies JSON (``ops.httpjson.send_json``); subclasses answer ``POST``."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._send(200, {"status": "ok"})

    def _send(self, code, obj, headers=None):
        send_json(self, code, obj, headers)


class StubOpenAI:
    """``script``: list of actions consumed in order, then ``default``. An action is an int status
    code, ``"hang"`` (sleep ``hang_s`` before answering), or ``"ok"``. ``extra``: fields added to
    every successful response (e.g. ``system_fingerprint``)."""

    def __init__(self, script=None, default="ok", reply="The answer is \\boxed{4}.", delay_s=0.0, hang_s=5.0, retry_after=None,
                 extra=None):
        self.script = list(script or [])
        self.default = default
        self.reply = reply
        self.delay_s = delay_s
        self.hang_s = hang_s
        self.retry_after = retry_after
        self.extra = dict(extra or {})
        self.requests = 0
        self.bodies = []  # every request body received, in arrival order
        self.lock = threading.Lock()
        stub = self

        class Handler(JSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with stub.lock:
                    stub.requests += 1
                    stub.bodies.append(body)
                    action = stub.script.pop(0) if stub.script else stub.default
                if action == "hang":
                    time.sleep(stub.hang_s)
                    action = "ok"
                if action != "ok":
                    headers = {"Retry-After": str(stub.retry_after)} if stub.retry_after is not None else {}
                    return self._send(int(action), {"error": f"scripted {action}"}, headers)
                time.sleep(stub.delay_s)
                self._send(200, {"id": "x", "object": "chat.completion", "model": body.get("model"),
                                 "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": stub.reply}}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}, **stub.extra})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
