"""The loopback half of GitHub's manifest flow: a tiny HTTP server on 127.0.0.1 that hands the browser the
form posting the manifest to GitHub and receives GitHub's redirect back.

* ``GET /start/<nonce>`` (:attr:`Receiver.start_url`, printed by the command; the nonce is random, so
  another local user or a web page cannot fetch the form and its state) answers a page whose form posts
  the manifest (field ``manifest``) to GitHub's new-App page and submits itself.
* ``GET /callback?code=CODE&state=STATE`` (:attr:`Receiver.callback_url`, the manifest's ``redirect_url``)
  runs ``on_code(code)`` -- once: the first redirect carrying the right ``state`` (compared in constant
  time) is the flow's answer, and its outcome (a page for the browser, a value or an error for the
  command) ends :meth:`Receiver.wait`.  A redirect with a missing or wrong state is refused (400) and the
  flow keeps waiting; a later one is told the flow already ended (410).
* Anything else is 404 (other paths) or 405 (other methods); a ``Host`` other than this loopback address
  is refused (400), so a DNS-rebinding page cannot talk to the receiver.  The server logs nothing (the
  request line holds the code), and every page is ``no-store``.
"""

from __future__ import annotations

import hmac
import html
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from service.json_types import JsonObject

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Outcome:
    """How the flow ended: ``error`` is what ``on_code`` raised (None: it returned)."""

    error: Exception | None = None


class Receiver:
    """The receiver on ``127.0.0.1:port`` (0: any free port); see the module docstring.  Serves from
    :meth:`start` until :meth:`close`."""

    def __init__(self, port: int = 0) -> None:
        self._nonce = secrets.token_urlsafe(24)
        self.state = secrets.token_urlsafe(32)
        self._lock = threading.Lock()
        self._answered = False
        self._done = threading.Event()
        self._outcome = Outcome()
        self._page = ""
        self._on_code: Callable[[str], str] = _unset
        self._server = ThreadingHTTPServer((LOOPBACK, port), _handler(self))
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def start_url(self) -> str:
        """The page to open in a browser: it posts the manifest to GitHub."""
        return f"http://{LOOPBACK}:{self.port}/start/{self._nonce}"

    @property
    def callback_url(self) -> str:
        """The manifest's ``redirect_url``: where GitHub sends the browser back with the code."""
        return f"http://{LOOPBACK}:{self.port}/callback"

    def start(self, action: str, manifest: JsonObject, on_code: Callable[[str], str]) -> None:
        """Serve the form posting ``manifest`` to ``action`` and hand the code to ``on_code`` (it returns the
        line the browser shows, or raises: the error's message is shown)."""
        value = html.escape(json.dumps(manifest, separators=(",", ":")), quote=True)
        self._page = _html("Create the GitHub App", (
            f'<form method="post" action="{html.escape(action, quote=True)}">'
            f'<input type="hidden" name="manifest" value="{value}">'
            "<p>Sending ampci's App manifest to GitHub&hellip;</p>"
            '<button type="submit">Create the GitHub App on GitHub</button></form>'
            "<script>document.forms[0].submit()</script>"))
        self._on_code = on_code
        self._thread = threading.Thread(target=self._server.serve_forever, name="manifest receiver", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> Outcome | None:
        """The flow's outcome once a redirect with the right state was handled; None after ``timeout`` s."""
        return self._outcome if self._done.wait(timeout) else None

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    # -- the requests ---------------------------------------------------------------------------

    def _host_ok(self, host: str | None) -> bool:
        return host in (f"{LOOPBACK}:{self.port}", f"localhost:{self.port}")

    def _answer(self, path: str) -> tuple[int, str]:
        """Status and page of ``GET path`` (module docstring)."""
        parts = urlsplit(path)
        if parts.path == f"/start/{self._nonce}":
            return 200, self._page
        if parts.path != "/callback":
            return 404, _html("Not found", "<p>Nothing here.</p>")
        query = parse_qs(parts.query, keep_blank_values=True)
        state, code = query.get("state", [""])[0], query.get("code", [""])[0]
        if not hmac.compare_digest(state.encode(), self.state.encode()):
            return 400, _html("Refused", "<p>This redirect does not carry the state of the form this command "
                                         "served: refused.  Open the address the command printed.</p>")
        with self._lock:
            if self._answered:
                return 410, _html("Already done", "<p>This command already received GitHub's answer.</p>")
            self._answered = True
            try:
                line = self._on_code(code)
                self._outcome = Outcome()
                return 200, _html("Done", f"<p>{html.escape(line)}</p>")
            except Exception as exc:  # noqa: BLE001 - the command reports it (one line); the browser sees it
                self._outcome = Outcome(error=exc)
                return 502, _html("Failed", f"<p>{html.escape(str(exc))}</p>")

    def _finished(self) -> None:
        """Called once the answer to the flow's redirect was written: :meth:`wait` returns."""
        if self._answered:
            self._done.set()


def _unset(code: str) -> str:
    raise RuntimeError("the receiver was not started")


def _html(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>ampci: {html.escape(title)}</title></head>"
            f"<body><h1>{html.escape(title)}</h1>{body}</body></html>")


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ampci"
        sys_version = ""

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            """Nothing is logged: the request line carries the manifest code."""

        def _send(self, status: int, page: str) -> None:
            body = page.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Referrer-Policy", "no-referrer")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not receiver._host_ok(self.headers.get("Host")):
                self._send(400, _html("Refused", "<p>Open the address the command printed.</p>"))
                return
            status, page = receiver._answer(self.path)
            try:
                self._send(status, page)
            finally:
                if self.path.startswith("/callback") and status in (200, 502):
                    receiver._finished()

        def _refuse(self) -> None:
            self._send(405, _html("Method not allowed", "<p>Only GET.</p>"))

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    return Handler
