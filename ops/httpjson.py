"""The JSON replies of the project's small HTTP servers on ``http.server`` (the reward service,
``ops.rl.reward``; the embedded teacher, ``ops.teacher.serve``)."""

import json
from http.server import BaseHTTPRequestHandler


def send_json(handler: BaseHTTPRequestHandler, code: int, obj, headers: dict[str, str] | None = None) -> None:
    """Reply ``code`` with ``obj`` as a JSON body (content-type and content-length set, then
    ``headers``, e.g. ``Retry-After``). A client that has gone away (broken pipe, reset) is not an
    error of the server: the reply is dropped."""
    data = json.dumps(obj).encode()
    try:
        handler.send_response(code)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
