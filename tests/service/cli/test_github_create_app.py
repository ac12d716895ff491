"""``ampci github create-app`` end to end (issue 41, item 5): the command runs as a real process against the
loopback stand-in of GitHub's manifest endpoints (tests/service/github_auth/manifest_standin.py); the test plays
the browser (opens the printed page, reads its form) and GitHub (creates the App from the posted manifest and
redirects back with a code).  The credentials land where docker-compose.yml reads them, the key mode 600,
every other .env line kept; a wrong state is refused; every failure is one line and writes nothing; no secret
is ever printed."""

from __future__ import annotations

import fnmatch
import html
import http.client
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import yaml

from service.cli.env_file import read_env
from service.cli.github_cmd import DEFAULT_KEY_NAME, KEY_PATH_VARIABLE, SECRET_TARGET, SERVICE_UID
from service.github_auth.app import AppAuth, auth_from_settings
from service.github_auth.manifest import convert_code
from service.settings import Settings
from tests.docs_text import guide_text
from tests.service.github_auth.manifest_standin import ManifestStandIn
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
OLD_ENV = "# ampci deployment\nPOSTGRES_PASSWORD=pw\nAMPCI_WEBHOOK_SECRET=old-secret\n\nAMPCI_PUBLIC_URL=https://ci.example.com\n"


@pytest.fixture
def github() -> Iterator[ManifestStandIn]:
    standin = ManifestStandIn()
    yield standin
    standin.close()


@pytest.fixture(autouse=True)
def no_command_left() -> Iterator[None]:
    """A command a failed test left waiting for GitHub is stopped."""
    yield
    while Command.started:
        proc = Command.started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Command:
    """``ampci github create-app ARGS`` as a process, its output collected line by line."""

    started: list[subprocess.Popen[str]] = []

    def __init__(self, cwd: Path, api_url: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
        env.update(AMPCI_GITHUB_API_URL=api_url, AMPCI_DATA_DIR=str(cwd / "data"), PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "github", "create-app", *args],
                                     cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        Command.started.append(self.proc)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda s=stream, ls=lines: ls.extend(iter(s.readline, "")), daemon=True)
                        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    def start_url(self) -> str:
        found = wait_until(lambda: re.search(r"http://127\.0\.0\.1:\d+/start/\S+", "".join(self.out))
                           or self.proc.poll() is not None, "the page address", detail=lambda: self.err)
        assert found is not True, f"exited {self.proc.returncode}: {self.err}"
        return str(found.group(0))

    def finish(self) -> tuple[int, str, str]:
        code = self.proc.wait(timeout=600)
        for reader in self.readers:  # each ends at its stream's end
            reader.join(timeout=600)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code, "".join(self.out), "".join(self.err)


def _get(url: str, host: str | None = None) -> tuple[int, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                 headers={"Host": host} if host else {})
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body


def _form(page: str) -> tuple[str, dict[str, Any]]:
    """The form's action and its ``manifest`` field, as a browser would post them."""
    action = html.unescape(re.search(r'<form method="post" action="([^"]*)"', page).group(1))
    value = html.unescape(re.search(r'<input type="hidden" name="manifest" value="([^"]*)"', page).group(1))
    return action, json.loads(value)


def _browse_to_github(cmd: Command) -> tuple[str, str, dict[str, Any]]:
    """Open the printed page: (its state, GitHub's action URL, the manifest posted)."""
    status, page = _get(cmd.start_url())
    assert status == 200
    action, manifest = _form(page)
    return parse_qs(urlsplit(action).query)["state"][0], action, manifest


def _redirect(manifest: dict[str, Any], code: str, state: str) -> tuple[int, str]:
    return _get(f"{manifest['redirect_url']}?{urlencode({'code': code, 'state': state})}")


@pytest.fixture
def deploy(tmp_path: Path) -> Path:
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / ".env").write_text(OLD_ENV)
    (folder / ".env").chmod(0o640)
    return folder


def test_the_app_is_created_and_its_credentials_land_where_compose_reads_them(deploy: Path,
                                                                               github: ManifestStandIn) -> None:
    cmd = Command(deploy, github.url, "--org", "acme", "--name", "ampci-test")
    state, action, manifest = _browse_to_github(cmd)
    assert action.startswith(f"{github.url}/organizations/acme/settings/apps/new?")
    port = urlsplit(cmd.start_url()).port
    assert manifest["redirect_url"] == f"http://127.0.0.1:{port}/callback"
    assert manifest["hook_attributes"]["url"] == "https://ci.example.com/webhooks/github"
    assert manifest["name"] == "ampci-test" and manifest["default_permissions"]["checks"] == "write"
    assert _get(cmd.start_url().rsplit("/", 1)[0] + "/guess")[0] == 404  # the page needs the printed nonce
    assert _get(cmd.start_url(), host="evil.example:80")[0] == 400      # a rebinding page is refused
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", urlsplit(cmd.start_url()).path, body=b"x")
    assert conn.getresponse().status == 405
    conn.close()
    code = github.register(manifest)
    wrong = _redirect(manifest, code, "not-the-state")
    assert wrong[0] == 400 and cmd.proc.poll() is None  # refused; the command keeps waiting
    status, page = _redirect(manifest, code, state)
    assert status == 200 and "https://github.com/apps/ampci-test/installations/new" in page
    rc, out, err = cmd.finish()
    assert rc == 0, err
    app = github.apps[0]

    key = deploy / "github-app.pem"
    assert key.read_text() == app.pem and stat.S_IMODE(key.stat().st_mode) == 0o600
    if os.geteuid() == 0:
        assert key.stat().st_uid == SERVICE_UID and "chown" not in out
    else:
        assert f"sudo chown {SERVICE_UID} {key}" in out
    env_text = (deploy / ".env").read_text()
    assert env_text.startswith("# ampci deployment\nPOSTGRES_PASSWORD=pw\n"
                               f"AMPCI_WEBHOOK_SECRET={app.webhook_secret}\n\nAMPCI_PUBLIC_URL=https://ci.example.com\n")
    assert stat.S_IMODE((deploy / ".env").stat().st_mode) == 0o640
    written = read_env(deploy / ".env")
    assert written["AMPCI_GITHUB_APP_ID"] == str(app.id)
    assert written["AMPCI_GITHUB_PRIVATE_KEY_FILE"] == SECRET_TARGET
    assert written[KEY_PATH_VARIABLE] == "./github-app.pem"
    assert written["AMPCI_GITHUB_REPORT"] == "status,comment,check"
    assert sorted(p.name for p in deploy.iterdir()) == [".env", "github-app.pem"]  # no temporary file left
    # what the api will do with them: the App identity starts (the key file at the path compose mounts it)
    auth = auth_from_settings(Settings.from_env({**written, "AMPCI_GITHUB_PRIVATE_KEY_FILE": str(key)}))
    assert isinstance(auth, AppAuth) and auth.app_id == str(app.id)

    for secret in (app.pem.splitlines()[1], app.webhook_secret, code, state):
        assert secret not in out and secret not in err
    assert err == "" and "https://github.com/apps/ampci-test/installations/new" in out
    with pytest.raises(ConnectionRefusedError):  # the receiver is gone once done
        _redirect(manifest, code, state)
    assert github.codes == {}  # the code was used
    with pytest.raises(Exception, match="does not know"):
        convert_code(github.url, code)


def test_the_compose_file_mounts_the_key_the_command_writes_where_the_readme_says() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    name = SECRET_TARGET.rsplit("/", 1)[1]
    assert name in compose["services"]["api"]["secrets"]  # compose mounts secret NAME at /run/secrets/NAME
    assert compose["secrets"][name]["file"] == f"${{{KEY_PATH_VARIABLE}:-/dev/null}}"
    for service, svc in compose["services"].items():  # the workers run untrusted code: only by an override
        assert service == "api" or "secrets" not in svc, service
    readme = guide_text()  # the README and the guide pages (docs/github.md, docs/deployment.md)
    assert f"AMPCI_GITHUB_PRIVATE_KEY_FILE={SECRET_TARGET}" in readme and "ampci github create-app" in readme
    assert f"secrets: [{name}]" in readme  # the workers' override names the same secret
    for ignore in (".gitignore", ".dockerignore"):  # the key written beside .env enters neither git nor the image
        patterns = (ROOT / ignore).read_text().split()
        assert any(fnmatch.fnmatch(DEFAULT_KEY_NAME, p) for p in patterns), ignore


@pytest.mark.parametrize("refuse", ["used", "422"])
def test_a_refused_code_is_one_line_and_writes_nothing(deploy: Path, github: ManifestStandIn, refuse: str) -> None:
    cmd = Command(deploy, github.url)
    state, _, manifest = _browse_to_github(cmd)
    code = github.register(manifest, refuse=refuse == "422")
    if refuse == "used":
        convert_code(github.url, code)
    status, page = _redirect(manifest, code, state)
    rc, out, err = cmd.finish()
    assert (status, rc) == (502, 2) and len(err.strip().splitlines()) == 1 and err.startswith("ampci: error: ")
    assert ("does not know this manifest code" if refuse == "used" else "422 Validation Failed") in err + page
    assert (deploy / ".env").read_text() == OLD_ENV and sorted(p.name for p in deploy.iterdir()) == [".env"]
    assert code not in out + err


def test_an_unreachable_github_is_one_line_exit_3_and_writes_nothing(deploy: Path, github: ManifestStandIn) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    cmd = Command(deploy, closed)
    state, _, manifest = _browse_to_github(cmd)
    status, _ = _redirect(manifest, github.register(manifest), state)
    rc, _, err = cmd.finish()
    assert (status, rc) == (502, 3) and len(err.strip().splitlines()) == 1 and "cannot reach GitHub" in err
    assert (deploy / ".env").read_text() == OLD_ENV and sorted(p.name for p in deploy.iterdir()) == [".env"]


def test_a_target_that_cannot_be_written_after_the_exchange_leaves_nothing_behind(tmp_path: Path,
                                                                                  github: ManifestStandIn) -> None:
    env_dir, key_dir = tmp_path / "compose", tmp_path / "keys"
    env_dir.mkdir()
    key_dir.mkdir()
    cmd = Command(tmp_path, github.url, "--env-file", str(env_dir / ".env"), "--key-file", str(key_dir / "k.pem"),
                  "--url", "https://ci.example.com")
    state, _, manifest = _browse_to_github(cmd)
    shutil.rmtree(env_dir)  # the .env's folder goes away while the user is on GitHub
    status, _ = _redirect(manifest, github.register(manifest), state)
    rc, out, err = cmd.finish()
    assert (status, rc) == (502, 2) and len(err.strip().splitlines()) == 1 and str(env_dir) in err
    assert list(key_dir.iterdir()) == []  # the key was not left without its .env
    assert github.apps[0].webhook_secret not in out + err


@pytest.mark.parametrize("case", ["missing folder", "key exists", "no public url", "port taken"])
def test_bad_targets_are_refused_before_github_is_asked(deploy: Path, github: ManifestStandIn, case: str) -> None:
    args = ["--url", "https://ci.example.com", "--wait", "60"]  # (a safety net: refused at once, or fails)
    (deploy / ".env").write_text("POSTGRES_PASSWORD=pw\n")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    if case == "missing folder":
        args += ["--env-file", str(deploy / "nowhere" / ".env")]
    elif case == "key exists":
        (deploy / "github-app.pem").write_text("an older App's key\n")
    elif case == "no public url":
        args = ["--wait", "60"]
    else:
        args += ["--port", str(taken.getsockname()[1])]
    rc, out, err = Command(deploy, github.url, *args).finish()
    taken.close()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("ampci: error: "), err
    assert github.requests == [] and (deploy / ".env").read_text() == "POSTGRES_PASSWORD=pw\n"
    if case == "key exists":
        assert (deploy / "github-app.pem").read_text() == "an older App's key\n"
