"""The loopback HTTP server of the chat endpoint: `POST /v1/chat/completions` and `GET /v1/models`.

It binds 127.0.0.1 on a free port and answers every request whose bearer key the per-run secret does not open with
401. Each request runs on its own thread, which hands the decoded body to `serve(key, body)` and writes what it
returns; `serve` bounds its own wait (see `AgentRunner`), so a request never holds its thread past its episode's
deadline.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .protocol import RequestError, error_body

MAX_BODY_BYTES = 16 * 2**20

# serve(episode key, decoded body) -> (HTTP status, response body)
ServeFn = Callable[[str, object], "tuple[int, dict]"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode may connect at once (the default backlog of 5 drops the others' SYNs)


class ChatEndpoint:
    """A running endpoint. `key(episode_id)` is the API key of one episode: the run's secret and the episode's id;
    `serve` receives the episode id of a request that carries a valid key. `close()` stops it."""

    def __init__(self, serve: Callable[[str, object], tuple[int, dict]], model_name: str = "policy"):
        self.secret = secrets.token_urlsafe(32)
        self.model_name = model_name
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 120  # seconds a connection may stall mid-request (a hung client) before its thread gives up

            def log_message(self, *args):  # quiet: one line per request would flood the training log
                pass

            def do_GET(self):
                if endpoint._episode(self.headers.get("Authorization")) is None:
                    return self._send(401, error_body("missing or wrong API key for this training run", 401))
                if self.path.rstrip("/") != "/v1/models":
                    return self._send(404, error_body(f"no route {self.path}", 404))
                self._send(200, {"object": "list", "data": [{"id": endpoint.model_name, "object": "model",
                                                             "owned_by": "trl-multiturn"}]})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self.close_connection = True
                    return self._send(413, error_body(f"request body of {length} bytes exceeds {MAX_BODY_BYTES}",
                                                      413))
                raw = self.rfile.read(length)
                episode = endpoint._episode(self.headers.get("Authorization"))
                if episode is None:
                    return self._send(401, error_body("missing or wrong API key for this training run", 401))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, error_body(f"no route {self.path}: use /v1/chat/completions", 404))
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    body = RequestError(f"the request body is not JSON: {exc}")
                status, out = serve(episode, body)
                self._send(status, out)

            def _send(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-endpoint", daemon=True)
        self._thread.start()

    def key(self, episode_id: str) -> str:
        return f"{self.secret}.{episode_id}"

    def _episode(self, authorization: str | None) -> str | None:
        """The episode id of a bearer key the run's secret opens, else None."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        secret, _, episode = authorization[len("Bearer "):].strip().partition(".")
        if not episode or not hmac.compare_digest(secret.encode(), self.secret.encode()):
            return None
        return episode

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
