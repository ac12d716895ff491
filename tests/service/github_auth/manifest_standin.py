"""A loopback stand-in of GitHub's manifest endpoints, a real HTTP server on 127.0.0.1.

GitHub's side of "Register a GitHub App from a manifest": :meth:`ManifestStandIn.register` is what the user's
click on GitHub's page does (the manifest is checked as GitHub checks it: a name, a ``url``, a hook URL and a
``redirect_url``; an App is created and a one-time code issued), and ``POST /app-manifests/{code}/conversions``
(no credential) answers 201 with the App's id, slug, owner, html_url, client id/secret, webhook secret and a
real RSA private key (``pem``) -- once: a used or unknown code is 404, a code registered ``refuse=True`` is
GitHub's 422 shape.  Every request is recorded (method, path, whether it carried an Authorization header).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

OWNER = "octo-org"


@dataclass
class App:
    """An App the stand-in created: what its conversion returns."""

    id: int
    slug: str
    manifest: dict[str, Any]
    pem: str
    webhook_secret: str
    client_secret: str = field(default_factory=lambda: secrets.token_hex(20))


class ManifestStandIn:
    """The stand-in; ``url`` is its API base (what ``AMPCI_GITHUB_API_URL`` names)."""

    def __init__(self) -> None:
        self.apps: list[App] = []
        self.codes: dict[str, tuple[App, bool]] = {}   # code -> (app, refuse with 422)
        self.requests: list[tuple[str, str, bool]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()

    def register(self, manifest: dict[str, Any], *, refuse: bool = False) -> str:
        """Create the App of ``manifest`` as GitHub's confirmation page does; its one-time code."""
        for key in ("name", "url", "redirect_url"):
            assert isinstance(manifest.get(key), str) and manifest[key], f"GitHub refuses a manifest without {key}"
        assert manifest["hook_attributes"]["url"].startswith(("http://", "https://"))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption()).decode()
        with self._lock:
            app = App(id=100_000 + len(self.apps), slug=re.sub(r"[^a-z0-9-]+", "-", manifest["name"].lower()),
                      manifest=manifest, pem=pem, webhook_secret=secrets.token_hex(20))
            self.apps.append(app)
            code = secrets.token_hex(10)
            self.codes[code] = (app, refuse)
        return code

    def _convert(self, code: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            entry = self.codes.pop(code, None)
        if entry is None:
            return 404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        app, refuse = entry
        if refuse:
            return 422, {"message": "Validation Failed",
                         "errors": [{"resource": "Integration", "code": "custom",
                                     "message": "Name is already in use"}]}
        return 201, {"id": app.id, "slug": app.slug, "node_id": f"A_{app.id}", "name": app.manifest["name"],
                     "owner": {"login": OWNER, "type": "Organization"}, "client_id": f"Iv1.{app.id:x}",
                     "client_secret": app.client_secret, "webhook_secret": app.webhook_secret, "pem": app.pem,
                     "html_url": f"https://github.com/apps/{app.slug}",
                     "permissions": app.manifest.get("default_permissions", {}),
                     "events": app.manifest.get("default_events", [])}


def _handler(standin: ManifestStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            standin.requests.append(("POST", self.path, "Authorization" in self.headers))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            match = re.fullmatch(r"/app-manifests/([^/]+)/conversions", self.path)
            if match is None:
                self._reply(404, {"message": "Not Found"})
                return
            self._reply(*standin._convert(match.group(1)))

        def do_GET(self) -> None:  # noqa: N802
            standin.requests.append(("GET", self.path, "Authorization" in self.headers))
            self._reply(404, {"message": "Not Found"})

    return Handler
