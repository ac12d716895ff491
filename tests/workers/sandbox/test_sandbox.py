"""The pass under test runs in a sandbox (issue 31): a hostile revision gets nothing and the job still ends cleanly.

Driven through :func:`workers.revision.convert.convert_in_subprocess`, warm (zygote forked from the fork server) and cold,
with a deployment's secrets in the worker's environment; the local pool and Celery paths are in
``tests/distributed/test_sandbox_paths.py``.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.workers.fakes import fake_pass
from tests.workers.hostile import FAKE_TOKEN, findings, hostile_pass, processes_with
from workers.redact import MARK, redact
from workers.revision.convert import convert_in_subprocess
from workers.sandbox import policy as sb
from workers.sandbox import zygotes
from workers.zoo.synthetic import synthetic_model_path

SECRETS = {"AMPCI_WEBHOOK_SECRET": "whsec-test-0123456789", "AMPCI_API_TOKEN": "api-token-0123456789",
           "AMPCI_GITHUB_TOKEN": "ghs_" + "Z" * 36,
           "AMPCI_DATABASE_URL": "postgresql+psycopg://ampci:dbpassw0rd@127.0.0.1:5432/test"}

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")


@pytest.fixture
def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


def _hostile_run(tmp_path: Path, listener: socket.socket, warm: bool, monkeypatch: pytest.MonkeyPatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    cache = tmp_path / "cache"
    src, _ = synthetic_model_path("conv_net", 0, cache)
    victims = [cache / "victim.txt", tmp_path / "victim.txt", tmp_path / "pass" / "amp_pass" / "__init__.py"]
    for v in victims[:2]:
        v.write_text("clean\n")
    mark = f"4242.{uuid.uuid4().int % 10**6}"
    root = hostile_pass(tmp_path / "pass", [5432, 6379, listener.getsockname()[1]], victims, mark)
    before = {v: v.read_bytes() for v in victims}
    policy = sb.SandboxPolicy(mode="require", hide=(str(cache),), max_procs=32, max_file_bytes=8 * 2**20)
    if warm:
        zygotes.start_forkserver()
    try:
        out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default",
                                    "cpu", root, timeout_s=120, memory_bytes=2 * 2**30, warm=warm, sandbox=policy)
    finally:
        zygotes.shutdown()
        zygotes.stop_forkserver()
    return out, victims, before, mark


@needs_full
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_hostile_pass_gets_nothing_and_the_job_ends_cleanly(tmp_path: Path, listener: socket.socket, warm: bool,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    out, victims, before, mark = _hostile_run(tmp_path, listener, warm, monkeypatch)
    assert out.status == "convert_error" and out.sandbox == "full", out
    got = findings(out.message)
    # environment: an allowlist, no setting, no credential, not even in /proc
    assert got["ampci_env"] == [] and got["self_environ_ampci"] in (False, "error")  # unreadable or clean
    assert got["parent_environ_ampci"] is False
    assert set(got["env"]) <= {*sb.ENV_ALLOWED, "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE"}, got["env"]
    # a root worker runs each session's pass as a uid of its own (per-uid kernel state is per job)
    assert got["uid"] >= sb.loader().SESSION_UID_BASE if os.geteuid() == 0 else True
    assert got["sockets_inherited"] == 0
    assert got["connected"] == []  # no PostgreSQL, no Redis, not even the test's own loopback listener
    assert got["wrote"] == [] and all(v.read_bytes() == before[v] for v in victims)
    assert got["pids_seen"] <= 3  # its own PID namespace: itself, its init, perhaps the daemon
    assert got["forked"] < 32  # RLIMIT_NPROC of the sandbox uid
    assert got["big_file_bytes"] <= 8 * 2**20  # RLIMIT_FSIZE
    # the daemon died with the conversion's PID namespace
    deadline = time.monotonic() + 5
    while processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(mark) == []
    # its stdout went to a file of its own, not to ours; its error text is redacted before anyone stores it
    assert "HOSTILE-STDOUT" not in capfd.readouterr().out
    assert FAKE_TOKEN not in out.message and "s3cr3tv4lue" not in out.message and MARK in out.message
    assert not any(v in out.message for v in SECRETS.values())


def test_best_effort_keeps_the_environment_and_descriptors_clean(tmp_path: Path, listener: socket.socket,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    mark = f"31.{uuid.uuid4().int % 10**6}"  # its daemon sleeps at most 31 s
    root = hostile_pass(tmp_path / "pass", [], [], mark, kill_parent=False)
    try:
        out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                    root, timeout_s=120, memory_bytes=2 * 2**30, warm=False,
                                    sandbox=sb.SandboxPolicy(mode="best-effort"))
    finally:  # best effort has no PID namespace: a daemon in its own session survives; ours to stop, by pid
        for pid in processes_with(mark):
            os.kill(pid, 9)
    assert out.status == "convert_error" and out.sandbox == "best-effort"
    got = findings(out.message)
    assert got["ampci_env"] == [] and got["self_environ_ampci"] is False and got["sockets_inherited"] == 0
    # its home (where it wrote its big file) is a scratch directory of its own, removed after the conversion
    assert got["home"].startswith(tempfile.gettempdir() + "/ampci-pass-")
    deadline = time.monotonic() + 10  # removed by its supervisor as the session ends (not waited for by the job)
    while Path(got["home"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(got["home"]).exists()


@needs_full
def test_a_benign_pass_converts_in_the_sandbox_with_outputs_copied_out(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", "perturb")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=120, memory_bytes=2 * 2**30, warm=False, repeats=2,
                                sandbox=sb.SandboxPolicy(mode="require"))
    assert out.status == "ok" and out.sandbox == "full", out.message
    assert (tmp_path / "out.onnx").stat().st_size > 0 and out.report["dtype"] == "fp16"
    assert len(out.samples_s) == 2 and all(0 < s < 60 for s in out.samples_s)
    assert not list(tmp_path.glob(".repeat*"))  # the repeat's outputs are removed


@needs_full
def test_an_output_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", "perturb")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=120, memory_bytes=2 * 2**30, warm=False,
                                sandbox=sb.SandboxPolicy(mode="require", max_file_bytes=64))
    assert out.status in {"convert_error", "crash"}, out  # RLIMIT_FSIZE cut the model: never a usable result


def test_require_refuses_where_no_namespace_can_be_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sb, "full_sandbox_error", lambda policy: "unshare(user namespace): Operation not permitted")
    with pytest.raises(sb.SandboxUnavailable, match="AMPCI_SANDBOX=require.*Operation not permitted"):
        sb.resolve_mode(sb.SandboxPolicy(mode="require"))
    assert sb.resolve_mode(sb.SandboxPolicy(mode="auto")) == "best-effort"
    assert sb.resolve_mode(sb.SandboxPolicy(mode="best-effort")) == "best-effort"


def test_every_mode_is_understood() -> None:
    from service.settings import SANDBOX_MODES

    assert SANDBOX_MODES == sb.MODES
    for mode in sb.MODES:
        assert sb.resolve_mode(sb.SandboxPolicy(mode=mode)) in {"full", "best-effort"}


def test_pass_env_is_an_allowlist() -> None:
    env = sb.pass_env({"PATH": "/bin", "AMPCI_API_TOKEN": "x", "HOME": "/root", "PYTHONPATH": "/evil",
                       "LD_PRELOAD": "/evil.so", "OPENBLAS_CORETYPE": "Haswell", "DATABASE_URL": "pg://a:b@c"})
    assert env["PATH"] == "/bin" and env["OPENBLAS_CORETYPE"] == "Haswell" and env["OMP_NUM_THREADS"] == "1"
    assert not {"AMPCI_API_TOKEN", "HOME", "PYTHONPATH", "LD_PRELOAD", "DATABASE_URL"} & set(env)


@pytest.mark.parametrize("text", [
    "token " + FAKE_TOKEN, "AMPCI_WEBHOOK_SECRET=hunter22", "postgresql+psycopg://u:pw123456@db/x",
    "Authorization: Bearer abcdefgh12345678", "github_pat_" + "x" * 30, "api_key: 'abcdef123'",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
    "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjMifQ.c2lnbmF0dXJlLXZhbHVl", "AKIAABCDEFGHIJKLMNOP"])
def test_credentials_are_redacted(text: str) -> None:
    out = redact(text)
    assert MARK in out and redact(out) == out
    for secret in ("hunter22", "pw123456", "abcdefgh12345678", "abcdef123", "MIIE", FAKE_TOKEN):
        assert secret not in out


@pytest.mark.parametrize("text", ["KeyError: 'input_ids'", "tokenizer=bert", "commit " + "a" * 40,
                                  "pass rejected the input: policy 'nope' does not exist"])
def test_ordinary_error_text_is_kept(text: str) -> None:
    assert redact(text) == text


@needs_full
@pytest.mark.skipif(os.geteuid() != 0, reason="the pass runs as another uid only when the worker is root")
def test_a_pass_root_the_sandbox_uid_cannot_read_is_a_one_line_error(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", "perturb")
    root.chmod(0o700)
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=60, memory_bytes=2 * 2**30, warm=False,
                                sandbox=sb.SandboxPolicy(mode="require"))
    assert out.status == "error" and "is not readable by the sandbox's uid" in out.message, out
    assert "(mode 700)" in out.message, out
