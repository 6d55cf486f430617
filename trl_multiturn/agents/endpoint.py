"""The loopback HTTP server of the agent endpoint: `POST /v1/chat/completions`, `/v1/responses` and `/v1/messages`
(the three dialects of `dialects.py`, streamed or not) and `GET /v1/models`.

It binds 127.0.0.1 on a free port and answers every request whose key (`Authorization: Bearer <key>`, or Anthropic's
`x-api-key: <key>`) the per-run secret does not open with 401, before it reads the body. Each request runs on its own
thread, which translates the body to a chat-completions body, hands it to `serve(key, body)`, and writes what that
returns in the request's dialect; `serve` bounds its own wait (see `AgentRunner`), so a request never holds its thread
past its episode's deadline.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .dialects import DIALECTS, ChatCompletions, sse
from .protocol import RequestError, error_body

MAX_BODY_BYTES = 16 * 2**20

# serve(episode key, chat-completions body or the RequestError it is) -> (HTTP status, chat completion or error body)
ServeFn = Callable[[str, object], "tuple[int, dict]"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode may connect at once (the default backlog of 5 drops the others' SYNs)


class ChatEndpoint:
    """A running endpoint. `key(episode_id)` is the API key of one episode: the run's secret and the episode's id;
    `serve` receives the episode id of a request that carries a valid key, and its body as a chat-completions body
    (or the `RequestError` it makes). `forget(episode_ids)` drops their stored Responses-API conversations;
    `close()` stops it."""

    def __init__(self, serve: ServeFn, model_name: str = "policy"):
        self.secret = secrets.token_urlsafe(32)
        self.model_name = model_name
        self._responses: dict[str, dict[str, list[dict]]] = {}  # episode -> its stored Responses-API conversations
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 120  # seconds a connection may stall mid-request (a hung client) before its thread gives up

            def log_message(self, *args):  # quiet: one line per request would flood the training log
                pass

            def do_GET(self):
                if endpoint._episode(self.headers) is None:
                    return self._send(401, error_body("missing or wrong API key for this training run", 401))
                path = self.path.split("?")[0].rstrip("/")
                if path not in ("/v1/models", f"/v1/models/{endpoint.model_name}"):
                    return self._send(404, error_body(f"no route {self.path}: the endpoint serves the model "
                                                      f"{endpoint.model_name!r} only", 404))
                if "anthropic-version" in self.headers:
                    model = {"type": "model", "id": endpoint.model_name, "display_name": endpoint.model_name,
                             "created_at": "1970-01-01T00:00:00Z"}
                    listed = {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
                else:
                    model = {"id": endpoint.model_name, "object": "model", "created": 0, "owned_by": "trl-multiturn"}
                    listed = {"object": "list", "data": [model]}
                self._send(200, listed if path == "/v1/models" else model)

            def do_POST(self):
                path = self.path.split("?")[0].rstrip("/")
                dialect = DIALECTS.get(path, ChatCompletions)  # the error shape, for a wrong route too
                episode = endpoint._episode(self.headers)
                if episode is None:  # refused before its body is read: the connection closes with it unread
                    self.close_connection = True
                    return self._send(401, dialect.error(401, "missing or wrong API key for this training run"))
                if path not in DIALECTS:
                    self.close_connection = True
                    return self._send(404, dialect.error(404, f"no route {self.path}: use one of {sorted(DIALECTS)}"))
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self.close_connection = True
                    return self._send(413, dialect.error(413, f"request body of {length} bytes exceeds "
                                                              f"{MAX_BODY_BYTES}"))
                raw = self.rfile.read(length)
                exchange = None
                try:
                    exchange = dialect(json.loads(raw), endpoint.model_name, endpoint._history(episode))
                    request: object = exchange.chat_body
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    request = RequestError(f"the request body is not JSON: {exc}")
                except RequestError as exc:
                    request = exc
                status, out = serve(episode, request)
                if status != 200:
                    return self._send(status, dialect.error(status, out["error"]["message"]))
                if not exchange.stream:
                    return self._send(200, exchange.reply(out))
                self._send_bytes(200, "text/event-stream", sse(exchange.events(out), done=dialect is ChatCompletions))

            def _send(self, status: int, body: dict):
                self._send_bytes(status, "application/json", json.dumps(body).encode())

            def _send_bytes(self, status: int, content_type: str, data: bytes):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-endpoint", daemon=True)
        self._thread.start()

    def key(self, episode_id: str) -> str:
        return f"{self.secret}.{episode_id}"

    def _episode(self, headers) -> str | None:
        """The episode id of the key (a bearer token, or Anthropic's x-api-key) the run's secret opens, else None."""
        authorization = headers.get("Authorization") or ""
        key = authorization[len("Bearer "):] if authorization.startswith("Bearer ") else headers.get("x-api-key")
        if not key:
            return None
        secret, _, episode = key.strip().partition(".")
        if not episode or not hmac.compare_digest(secret.encode(), self.secret.encode()):
            return None
        return episode

    def _history(self, episode: str) -> dict[str, list[dict]]:
        with self._lock:
            return self._responses.setdefault(episode, {})

    def forget(self, episodes) -> None:
        """Drop the stored Responses-API conversations of `episodes` (their rollout ended)."""
        with self._lock:
            for episode in episodes:
                self._responses.pop(episode, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
