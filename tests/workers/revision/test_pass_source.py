"""The pass repository a webhook delivery names: which clone URLs a worker clones, and how a token reaches git.

Real git throughout: a bare repository with a commit made after this checkout's HEAD is cloned through a
``file://`` URL; a token is carried to a loopback HTTP server in a header and seen by it (and not by another
host); a ``git`` wrapper on ``PATH`` records every argument vector, so the token is shown absent from argv, the
error, the log and the clone's config.
"""

from __future__ import annotations

import base64
import http.server
import logging
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.revision.config import WorkerConfig
from workers.revision.git_commands import RevisionError, git
from workers.revision.pass_source import CloneUrlError, GitCredential, check_clone_url
from workers.revision.revisions import RevisionCache

TOKEN = "ghs_" + "T0kEn" * 8
REPO = "acme/amp-pass"


@pytest.mark.parametrize("url", [
    "https://github.com/acme/amp-pass.git",
    "https://github.com/acme/amp-pass",
    "https://GitHub.com/Acme/Amp-Pass.git",
    "https://ghe.example.com:8443/acme/amp-pass.git",
])
def test_https_clone_urls_of_the_delivery_repository_are_accepted(url: str) -> None:
    assert check_clone_url(url, repo=REPO) == url


@pytest.mark.parametrize(("url", "why"), [
    ("ext::sh -c touch% /tmp/pwned", "transport helper"),
    ("ext::sh -c id", "transport helper"),
    ("--upload-pack=touch /tmp/pwned", "option"),
    ("-uhttps://github.com/acme/amp-pass.git", "option"),
    ("ssh://git@github.com/acme/amp-pass.git", "not https"),
    ("git@github.com:acme/amp-pass.git", "not https"),
    ("git://github.com/acme/amp-pass.git", "not https"),
    ("http://github.com/acme/amp-pass.git", "not https"),
    ("fd::17/acme", "transport helper"),
    ("https://x-access-token:secret@github.com/acme/amp-pass.git", "user info"),
    ("https://github.com/acme/amp-pass.git?upload-pack=x", "query"),
    ("https://github.com/acme/amp-pass.git#frag", "query"),
    ("https://github.com/acme/other.git", "does not name"),
    ("https://github.com/evil/amp-pass.git", "does not name"),
    ("https://github.com/acme/amp-pass/../../evil/x.git", "relative"),
    ("https://github.com/acme/amp%2dpass.git", "escaped"),
    ("https://github.com/acme/amp-pass.git\n", "whitespace"),
    ("https://github.com/acme/amp pass.git", "whitespace"),
    ("https://github.com/acme/amp-pass.git/extra/path", "path"),
    ("https:///acme/amp-pass.git", "host"),
    ("/srv/pass.git", "not https"),
    ("file:///srv/pass.git", "not allowed"),
    ("", "missing"),
    ("https://github.com/" + "a" * 600 + "/x.git", "longer"),
])
def test_clone_urls_that_could_run_or_reach_something_else_are_refused(url: str, why: str) -> None:
    with pytest.raises(CloneUrlError, match=why) as exc:
        check_clone_url(url, repo=REPO)
    assert len(str(exc.value)) < 300  # never the whole URL back


def test_file_urls_only_when_explicitly_allowed() -> None:
    assert check_clone_url("file:///srv/pass.git", allow_file=True, repo=REPO) == "file:///srv/pass.git"
    for bad in ("file://host/srv/pass.git", "file:///", "file://relative/x"):
        with pytest.raises(CloneUrlError):
            check_clone_url(bad, allow_file=True, repo=REPO)
    with pytest.raises(CloneUrlError, match="not a string"):
        check_clone_url(["https://github.com/acme/amp-pass.git"], repo=REPO)


def test_a_credential_exists_for_https_only_and_hides_its_token() -> None:
    assert GitCredential.for_url("file:///srv/pass.git", TOKEN) is None
    assert GitCredential.for_url("https://github.com/acme/amp-pass.git", "") is None
    cred = GitCredential.for_url("https://GitHub.com/acme/amp-pass.git", TOKEN)
    assert cred is not None and cred.scope == "https://github.com/"
    assert TOKEN not in repr(cred)
    env = cred.env()
    assert env["GIT_CONFIG_KEY_0"] == "http.https://github.com/.extraHeader"
    assert env["GIT_CONFIG_VALUE_1"] == "false"  # http.followRedirects: the header follows no redirect
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert cred.scrub(f"fatal: {TOKEN} and {basic} refused") == "fatal: *** and *** refused"
    assert TOKEN not in repr(WorkerConfig(pass_repo_token=TOKEN))
    assert WorkerConfig(pass_repo_token=TOKEN).without_credentials().pass_repo_token == ""


# -- real git ------------------------------------------------------------------------------------------------


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository holding a commit that exists nowhere else (a 'push made after the image was built')."""
    work = tmp_path / "work"
    (work / "amp_pass").mkdir(parents=True)
    (work / "amp_pass" / "__init__.py").write_text("VERSION = 'pushed later'\n")
    _git("init", "-q", "-b", "main", str(work))
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "new pass", cwd=work)
    bare = tmp_path / "pass.git"
    _git("clone", "-q", "--bare", str(work), str(bare))
    return bare, _git("rev-parse", "HEAD", cwd=work)


def test_a_commit_only_in_the_delivery_repository_is_checked_out(tmp_path: Path, remote: tuple[Path, str]) -> None:
    bare, sha = remote
    url = f"file://{bare}"
    config = WorkerConfig(cache_dir=tmp_path / "cache", pass_repo_url=url, pass_repo_allow_file=True)
    root = RevisionCache.from_config(config).checkout(sha)
    assert (root / "amp_pass" / "__init__.py").read_text() == "VERSION = 'pushed later'\n"
    # the default pass repository (this checkout) does not have it: the old behaviour, bad_spec
    with pytest.raises(RevisionError, match="is not in the pass repository"):
        RevisionCache.from_config(WorkerConfig(cache_dir=tmp_path / "cache")).checkout(sha)
    # AMPCI_PASS_REPO set wins over the delivery's URL
    pinned = WorkerConfig(cache_dir=tmp_path / "cache", pass_repo=str(tmp_path / "work"), pass_repo_url="x")
    assert RevisionCache.from_config(pinned).repo == str((tmp_path / "work").resolve())
    # the worker checks the URL again: file:// is refused unless allowed there too
    with pytest.raises(RevisionError, match="refused"):
        RevisionCache.from_config(WorkerConfig(cache_dir=tmp_path / "c2", pass_repo_url=url))
    with pytest.raises(RevisionError, match="refused"):
        RevisionCache.from_config(WorkerConfig(cache_dir=tmp_path / "c2", pass_repo_url="ext::sh -c id"))


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_servers() -> Iterator[tuple[int, int, type[_Recorder]]]:
    class Seen(_Recorder):
        seen: list[str | None] = []

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Seen) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield servers[0].server_port, servers[1].server_port, Seen
    for s in servers:
        s.shutdown()
        s.server_close()


def test_git_sends_the_token_in_a_header_to_its_own_host_only(http_servers: tuple[int, int, type[_Recorder]]) -> None:
    mine, other, seen = http_servers
    cred = GitCredential(f"http://127.0.0.1:{mine}/", TOKEN)  # a loopback stand-in (https is what workers use)
    with pytest.raises(RevisionError) as exc:
        git(["ls-remote", f"http://127.0.0.1:{mine}/acme/amp-pass.git"], credential=cred)
    assert TOKEN not in str(exc.value)
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert seen.seen and set(seen.seen) == {f"Basic {basic}"}
    seen.seen.clear()
    with pytest.raises(RevisionError):
        git(["ls-remote", f"http://127.0.0.1:{other}/acme/amp-pass.git"], credential=cred)
    assert seen.seen and set(seen.seen) == {None}, "the header went to another host"


def test_the_token_is_in_no_argv_error_log_or_clone_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    argv_log = tmp_path / "argv.log"
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {argv_log}\n'
                       f'env | grep -c "^GIT_CONFIG_VALUE_0=Authorization: Basic " >> {argv_log}.env\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    caplog.set_level(logging.DEBUG)
    url = "https://127.0.0.1:1/acme/amp-pass.git"  # nothing listens: the clone fails after git has the header
    config = WorkerConfig(cache_dir=tmp_path / "cache", pass_repo_url=url, pass_repo_token=TOKEN)
    cache = RevisionCache.from_config(config)
    with pytest.raises(RevisionError) as exc:
        cache.checkout("a" * 40)
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert "git clone failed" in str(exc.value)
    for text in (str(exc.value), caplog.text, argv_log.read_text(), repr(cache), repr(config)):
        assert TOKEN not in text and basic not in text
    assert (argv_log.parent / "argv.log.env").read_text().split() == ["1"]  # the clone had it, in its environment
    leftovers = "".join(p.read_text(errors="replace") for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert TOKEN not in leftovers and basic not in leftovers


def test_the_job_code_never_gets_the_token(tmp_path: Path, remote: tuple[Path, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """run_cell checks the pass out with the token, then hands the measurement a config without it."""
    import workers.jobs.job
    from workers.jobs.cell import run_cell
    from workers.result import JobResult

    bare, sha = remote
    seen: list[WorkerConfig] = []

    def measured(spec: object, config: WorkerConfig) -> JobResult:  # stands in for the measurement only
        seen.append(config)
        return JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass", revision=sha)

    monkeypatch.setattr(workers.jobs.job, "run_job", measured)
    config = WorkerConfig(cache_dir=tmp_path / "cache", pass_repo_url=f"file://{bare}", pass_repo_allow_file=True,
                          pass_repo_token=TOKEN)
    assert run_cell(("m", "fp16", "default", "cpu"), sha, config).status == "pass"
    assert seen and seen[0].pass_repo_token == "" and seen[0].pass_repo_url == f"file://{bare}"
