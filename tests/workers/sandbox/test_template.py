"""The sandbox template shared by a pool's workers (issue 42): one fresh interpreter with the allow-listed
environment that preloads the pass's dependencies, never imports the pass, and forks zygotes that keep none of
its sockets -- so sharing it costs the isolation between jobs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers.sandbox import policy as sb
from workers.sandbox import zygotes
from workers.sandbox.template import start_template

ROOT = Path(__file__).resolve().parents[3]
needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_templates_environment_is_the_allowlist_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", "postgresql://ampci:s3cret-db@db/ampci")
    monkeypatch.setenv("AMPCI_GITHUB_TOKEN", "ghp_s3cret-token")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    template = start_template()
    assert template is not None
    try:
        env = _environ(template.proc.pid)
        assert env == sb.pass_env(), set(env) ^ set(sb.pass_env())
        assert not any("s3cret" in v for v in env.values())
        assert os.readlink(f"/proc/{template.proc.pid}/cwd") == "/"
        cmdline = Path(f"/proc/{template.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1] == b"-I"  # a fresh interpreter, isolated mode: never a fork of this process
    finally:
        template.stop()


PROBE = textwrap.dedent('''
    import json, os, socket, sys
    from pathlib import Path
    import amp_pass  # this checkout's, imported by the worker: it must not reach the template
    from service.orchestration import localpool
    from tests.workers.fakes import fake_pass
    from workers.sandbox import zygotes
    from workers.revision.convert import convert_in_subprocess
    from workers.sandbox.template import start_template
    from workers.zoo.synthetic import synthetic_model_path

    tmp = Path(sys.argv[1])
    template = start_template()
    first, second = template.connect(), template.connect()  # two workers' connections
    zygotes.use_template(first)
    src, _ = synthetic_model_path("conv_net", 0, tmp / "cache")
    root = fake_pass(tmp / "pass", "perturb")
    out = convert_in_subprocess(src, tmp / "o.onnx", tmp / "r.json", "fp16", "default", "cpu", root,
                                timeout_s=120, memory_bytes=2**31)
    z = zygotes.zygote_of(root)
    fds = os.listdir(f"/proc/{z.pid}/fd")
    sockets = [os.readlink(f"/proc/{z.pid}/fd/{fd}") for fd in fds]
    sockets = [s for s in sockets if s.startswith("socket:")]
    parent = int(Path(f"/proc/{z.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    print(json.dumps({"status": out.status, "message": out.message, "forked": z.forked,
                      "parent": parent, "template": template.proc.pid, "sockets": sockets,
                      "modules": template.modules()}), flush=True)
    zygotes.shutdown()
    zygotes.stop_forkserver()
    second.close()
    template.stop()
''')


@needs_full
def test_zygotes_come_from_the_template_which_never_imports_the_pass_and_keep_none_of_its_sockets(
        tmp_path: Path) -> None:
    import json

    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok", out["message"]
    assert out["forked"] is True and out["parent"] == out["template"]
    # the zygote holds its two pipes only: not the template's control socket, not this worker's connection,
    # not the other worker's (a zygote -- and the supervisors it forks -- could otherwise ask for more)
    assert out["sockets"] == [], out["sockets"]
    assert {"numpy", "onnx", "onnx_ir"} <= set(out["modules"])
    assert not {"amp_pass", "workers", "service"} & set(out["modules"]), out["modules"]


def test_a_worker_given_a_template_connection_never_kills_the_template() -> None:
    template = start_template()
    assert template is not None
    try:
        sock = template.connect()
        assert sock is not None
        zygotes.use_template(sock)
        zygotes.stop_forkserver()  # the worker's way out: its connection closes, the template stays
        assert sock.fileno() == -1 and template.alive()
        assert {"numpy", "onnx", "onnx_ir"} <= set(template.modules())
    finally:
        template.stop()
    assert not template.alive()
