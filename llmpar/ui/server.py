"""The page's local web server, on the standard library's `ThreadingHTTPServer`.

Safe by default: it listens on 127.0.0.1 (a free port unless one is given) and answers
only clients on this machine, unless `allow_remote` (`llmpar ui --host ADDR`) says
otherwise; on a loopback address it also requires the `Host` header to name that
address (a web page elsewhere cannot reach it through a name it points at 127.0.0.1).
It serves the page's own files (a fixed list, shipped in the package), the spec it was
started with, presets by name, the spec's JSON Schema (`llmpar schema`, from which the
page's form is generated) and the JSON API (`llmpar.ui.api`); nothing else on disk.
Request bodies are JSON, at most `MAX_BODY_BYTES`; POSTs must say so in their
`Content-Type` (a form on another site cannot send one without the browser asking).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import socket
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from llmpar.errors import PluginError, SpecError
from llmpar.report.json_format import strict_json
from llmpar.session import Session
from llmpar.ui import api

MAX_BODY_BYTES = 1 << 20
"""The largest request body: 1 MiB (llmpar's own limit on a spec file is larger than any
spec typed into a page needs)."""
MAX_SEARCHES = 4
"""Searches kept (running or finished); the oldest finished one is dropped first."""
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/style.css": ("style.css", "text/css; charset=utf-8")}
"""The page's files: URL path -> (file in llmpar/ui/static, content type)."""
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"}


def _static(name: str) -> bytes:
    return resources.files("llmpar.ui").joinpath("static", name).read_bytes()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


class SearchJobs:
    """Searches started from the page, run one thread each, polled by id."""

    def __init__(self, session: Session, planner: threading.Lock):
        self._session = session
        self._planner = planner
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)

    def start(self, body: Mapping[str, Any]) -> dict[str, Any]:
        job_id = str(next(self._ids))
        state: dict[str, Any] = {"id": job_id, "done": False, "stage": "preparing",
                                 "layouts_done": 0, "layouts_total": 0, "result": None}
        with self._lock:
            finished = [k for k, job in self._jobs.items() if job["done"]]
            for key in finished[:max(0, len(self._jobs) - MAX_SEARCHES + 1)]:
                del self._jobs[key]
            self._jobs[job_id] = state

        def progress(stage: str, done: int, total: int) -> None:
            with self._lock:
                state.update(stage=stage, layouts_done=done, layouts_total=total)

        def work() -> None:
            try:
                with self._planner:
                    result = api.search(self._session, body, progress)
            except Exception as error:  # a bug must reach the page, not kill the thread
                result = {"ok": False, "problems": [{"path": "$", "message":
                                                     f"search failed: {error!r}"}]}
            with self._lock:
                state.update(done=True, result=result)

        threading.Thread(target=work, daemon=True, name=f"llmpar-search-{job_id}").start()
        return {"ok": True, "id": job_id}

    def poll(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            state = self._jobs.get(job_id)
            return None if state is None else dict(state)


class UiServer(ThreadingHTTPServer):
    """The server: a session, the spec it was started with, and its searches."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], session: Session, initial: dict[str, Any],
                 *, allow_remote: bool = False):
        if ":" in address[0]:  # an IPv6 address (`--host ::1`)
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.session = session
        self.initial = initial
        """{"toml": text, "label": name} of the spec given on the command line, or {}."""
        self.allow_remote = allow_remote
        self.planner = threading.Lock()
        """Held while llmpar plans: one evaluation or search at a time, so that the
        session's caches and plugin bookkeeping see one caller."""
        self.searches = SearchJobs(session, self.planner)
        self.form = api.spec_form(session)
        """The page's form, from the session's spec schema (`llmpar.ui.form`)."""

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


class Handler(BaseHTTPRequestHandler):
    server: UiServer
    protocol_version = "HTTP/1.1"
    server_version = "llmpar-ui"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Quiet: the terminal shows the URL, not every request."""

    def _refuse_client(self) -> bool:
        """Answer 403 to a client this server does not serve; True when refused."""
        client = str(self.client_address[0])
        if not self.server.allow_remote and not is_loopback(client):
            self._send_json({"ok": False, "error": "this server answers this machine only "
                                                   "(llmpar ui --host ADDR to share it)"},
                            HTTPStatus.FORBIDDEN)
            return True
        host = (self.headers.get("Host") or "").strip()
        name = urlsplit(f"//{host}").hostname or ""
        if not self.server.allow_remote and name not in ("localhost",) and not is_loopback(
                name):
            self._send_json({"ok": False, "error": "unexpected Host header"},
                            HTTPStatus.FORBIDDEN)
            return True
        return False

    def _send(self, body: bytes, content_type: str, status: HTTPStatus = HTTPStatus.OK) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, data: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        try:
            text = strict_json(data)
        except SpecError as error:  # a number JSON cannot carry, named by its path
            text = json.dumps({"ok": False, "problems": [
                {"path": p.path, "message": p.message} for p in error.problems]})
        self._send(text.encode("utf-8"), "application/json", status)

    def do_GET(self) -> None:
        if self._refuse_client():
            return
        path = urlsplit(self.path).path
        if path in STATIC:
            name, content_type = STATIC[path]
            self._send(_static(name), content_type)
        elif path == "/api/presets":
            self._send_json({**api.presets(self.server.session, self.server.form),
                             "initial": self.server.initial})
        elif path == "/api/schema":
            from llmpar.loading.json_schema import spec_json_schema

            session = self.server.session
            self._send_json(spec_json_schema(session.strategies, session.workloads))
        elif path.startswith("/api/search/"):
            state = self.server.searches.poll(path.removeprefix("/api/search/"))
            if state is None:
                self._send_json({"ok": False, "error": "no such search"}, HTTPStatus.NOT_FOUND)
            else:
                self._send_json(state)
        else:
            self._send_json({"ok": False, "error": "not found"}, HTTPStatus.NOT_FOUND)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        if self._refuse_client():
            return
        routes: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
            "/api/evaluate": self._evaluate,
            "/api/example": lambda body: api.example(self.server.session, body.get("name")),
            "/api/search": self.server.searches.start}
        route = routes.get(urlsplit(self.path).path)
        if route is None:
            self._send_json({"ok": False, "error": "not found"}, HTTPStatus.NOT_FOUND)
            return
        body = self._body()
        if body is None:
            return
        try:
            answer = route(body)
        except PluginError as error:
            answer = {"ok": False, "problems": [{"path": "$",
                                                 "message": f"plugin error: {error}"}]}
        except Exception as error:  # a bug: said on the page, the server stays up
            self._send_json({"ok": False, "problems": [{"path": "$", "message":
                                                        f"llmpar failed: {error!r}"}]},
                            HTTPStatus.INTERNAL_SERVER_ERROR)
            return
        self._send_json(answer)

    def _evaluate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        with self.server.planner:
            return api.evaluate(self.server.session, body, self.server.form)

    def _body(self) -> dict[str, Any] | None:
        """The request's JSON object, or None after answering why not."""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type != "application/json":
            self._send_json({"ok": False, "error": "expected Content-Type: application/json"},
                            HTTPStatus.UNSUPPORTED_MEDIA_TYPE)
            return None
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._send_json({"ok": False, "error": "expected a Content-Length"},
                            HTTPStatus.LENGTH_REQUIRED)
            return None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send_json({"ok": False, "error": f"a request body is at most "
                                                   f"{MAX_BODY_BYTES:,} bytes"},
                            HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            return None
        try:
            body = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            self._send_json({"ok": False, "error": "expected a JSON object"},
                            HTTPStatus.BAD_REQUEST)
            return None
        return body


def make_server(session: Session, initial: dict[str, Any] | None = None, *,
                host: str = "127.0.0.1", port: int = 0,
                allow_remote: bool = False) -> UiServer:
    """A server bound to `host`:`port` (0: a free port), not yet serving."""
    return UiServer((host, port), session, initial or {}, allow_remote=allow_remote)
