"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1 for the tests (judges, proposers, VLM policies).

A test subclasses ``ChatHandler`` and writes ``answer(body)`` (the request's JSON -> the assistant's text, or
``(status, json_or_None)`` for an error answer), or builds one from a function with ``chat_handler``; ``serve``
runs it on a free port for the ``with`` block and gives its base URL (``http://127.0.0.1:<port>/v1``). Every POST
is recorded in the handler's own ``requests`` (``path``, ``body``, ``auth``: the Authorization header or None).
``tests/`` is on ``sys.path`` (pytest's rootdir conftest), so test files anywhere below import it as
``from chat_endpoint import ...``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT_PATH = "/v1/chat/completions"


class ChatHandler(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions`` answers ``answer(body)`` as a chat.completion; any other POST path is a 404.
    ``GET /v1/models`` lists ``models`` (id -> root, what ``served_model_digest`` reads). Each subclass has its own
    ``requests`` list; ``base_url`` is set while ``serve`` runs it."""

    requests: list[dict] = []
    models: dict[str, str] = {}
    base_url = ""

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        cls.requests = []

    def answer(self, body: dict) -> str | tuple[int, dict | None]:
        raise NotImplementedError

    @classmethod
    def bodies(cls) -> list[dict]:
        return [r["body"] for r in cls.requests]

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, payload: dict | None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(code)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/v1/models" or not self.models:
            return self._send(404, {"error": {"message": f"no {self.path} here"}})
        self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "root": root}
                                                    for m, root in self.models.items()]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.path != CHAT_PATH:
            return self._send(404, {"error": {"message": f"no {self.path} here, only {CHAT_PATH}"}})
        out = self.answer(body)
        if isinstance(out, tuple):
            return self._send(*out)
        self._send(200, {"id": "chat", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": out}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def chat_handler(reply: Callable[[dict], str | tuple[int, dict | None]]) -> type[ChatHandler]:
    """A ``ChatHandler`` answering by the function ``reply`` (request body -> text or (status, json_or_None))."""
    return type("ScriptedChat", (ChatHandler,), {"answer": lambda self, body: reply(body)})


@contextmanager
def serve(handler: type[ChatHandler]) -> Iterator[str]:
    """Serves ``handler`` on 127.0.0.1 (a free port, a thread per request) for the block; yields its base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    handler.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        yield handler.base_url
    finally:
        srv.shutdown()
        srv.server_close()
