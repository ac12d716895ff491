"""Best-effort never runs the pass as root (issue 40): with ``AMPCI_SANDBOX=best-effort`` (no namespaces) a root
worker's pass drops to its session's unprivileged uid with no groups and no capabilities, so a hostile revision
cannot read a root process's ``/proc/<pid>/environ`` or a root-only key, cannot write into the cache, data
directory or repository, and leaves no daemon behind; an honest pass still converts, its outputs copied out by
the trusted side.

Each hostile test fails when the drop (``workers/sandbox/_passproc.py:drop_privileges``) is removed: the pass is then
root and gets every one of those.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.fakes import fake_pass
from tests.workers.hostile import processes_with
from workers.revision.convert import ConvertOutcome, convert_in_subprocess
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the drop is a root worker's (a non-root one is no root)")

SECRET = "best-effort-secret-0123456789"

_MAIN = '''
import ctypes, json, os, sys
dst = sys.argv[sys.argv.index("-o") + 1]
TARGETS = {targets!r}
found = {{"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}}
status = dict(ln.split(":", 1) for ln in open("/proc/self/status") if ":" in ln)
found["cap_eff"] = status["CapEff"].strip()
found["cap_prm"] = status["CapPrm"].strip()
found["no_new_privs"] = status["NoNewPrivs"].strip()
try:
    found["environ"] = "read %d bytes" % len(open(f"/proc/{{TARGETS['victim_pid']}}/environ", "rb").read())
except OSError as exc:
    found["environ"] = "error " + type(exc).__name__
try:
    found["key"] = "read %d bytes" % len(open(TARGETS["key"]).read())
except OSError as exc:
    found["key"] = "error " + type(exc).__name__
found["wrote"] = []
for path in TARGETS["victims"]:
    try:
        with open(path, "a") as fh:
            fh.write("pwned\\n")
        found["wrote"].append(path)
    except OSError:
        pass
for d in TARGETS["dirs"]:
    try:
        with open(os.path.join(d, "planted.py"), "w") as fh:
            fh.write("pwned")
        found["wrote"].append(d)
    except OSError:
        pass
if os.fork() == 0:  # a daemon in a session of its own: outside the supervisor's process group
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", TARGETS["mark"]])
    os._exit(0)
os.wait()
print("amp_pass: error: DROP " + json.dumps(found), file=sys.stderr)
sys.exit(2)
'''


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[dict[str, object]]:
    """What a root worker's host holds: a root process with a secret in its environment, a root-only key, and
    a cache, data directory and repository (root's, mode 755/644: readable, not writable, by other users)
    under a directory any user may traverse."""
    top = Path(tempfile.mkdtemp(prefix="ampci-host-", dir="/var/tmp"))
    top.chmod(0o755)
    victim = subprocess.Popen(["/bin/sleep", "120"], env={"AMPCI_DATABASE_URL": f"postgresql://u:{SECRET}@db/x"})
    key = top / "key.pem"
    key.write_text(f"-----BEGIN PRIVATE KEY-----{SECRET}")
    key.chmod(0o600)
    dirs = [top / "cache", top / "data", top / "repo"]
    victims = []
    for d in dirs:
        d.mkdir()
        d.chmod(0o755)
        (d / "file.txt").write_text("clean\n")
        (d / "file.txt").chmod(0o644)
        victims.append(d / "file.txt")
    mark = f"97.{uuid.uuid4().int % 10**6}"
    yield {"victim_pid": victim.pid, "key": str(key), "victims": [str(v) for v in victims],
           "dirs": [str(d) for d in dirs], "mark": mark, "top": top}
    victim.kill()
    victim.wait()
    for pid in processes_with(mark):  # never left by a passing test; ours to stop, by pid
        os.kill(pid, 9)
    shutil.rmtree(top, ignore_errors=True)


def _convert(root: Path, out: Path, models: Path) -> ConvertOutcome:
    src, _ = synthetic_model_path("conv_net", 0, models)
    out.mkdir(parents=True, exist_ok=True)
    return convert_in_subprocess(src, out / "out.onnx", out / "report.json", "fp16", "default", "cpu", root,
                                 timeout_s=120, memory_bytes=2 * 2**30, warm=False,
                                 sandbox=sb.SandboxPolicy(mode="best-effort"))


def _hostile(root: Path, world: dict[str, object]) -> Path:
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""A hostile pass."""\n')
    targets = {k: v for k, v in world.items() if k != "top"}
    (root / "amp_pass" / "__main__.py").write_text(textwrap.dedent(_MAIN.format(targets=targets)))
    return root


@pytest.mark.parametrize("where", ["private", "traversable"])
def test_a_best_effort_pass_is_no_root_and_reaches_nothing_of_roots(tmp_path: Path, world: dict[str, object],
                                                                     where: str) -> None:
    """``private``: the pass root lies where the dropped uid cannot reach it (pytest's /tmp/pytest-of-root is
    700): the sandbox imports a read-only copy; ``traversable``: it is imported in place."""
    base = tmp_path if where == "private" else Path(str(world["top"]))
    root = _hostile(base / "pass", world)
    out = _convert(root, tmp_path / "out", tmp_path / "models")
    assert out.status == "convert_error" and out.sandbox == "best-effort" and "DROP " in out.message, out
    got = json.loads(out.message.split("DROP ", 1)[1].splitlines()[0])
    # its own uid (per session: 0x20000000 + its supervisor's pid), no groups, no capabilities, no_new_privs
    assert got["uid"] == got["euid"] >= sb.loader().SESSION_UID_BASE and got["gid"] != 0, got
    assert got["groups"] == [] and int(got["cap_eff"], 16) == 0 and int(got["cap_prm"], 16) == 0, got
    assert got["no_new_privs"] == "1", got
    # a root process's environment, a root-only key: unreadable
    assert got["environ"] == "error PermissionError" and SECRET not in out.message, got
    assert got["key"] == "error PermissionError", got
    # the cache, data directory and repository: nothing written, nothing planted
    assert got["wrote"] == [], got
    for v in world["victims"]:  # type: ignore[attr-defined]
        assert Path(v).read_text() == "clean\n"
    for d in world["dirs"]:  # type: ignore[attr-defined]
        assert not (Path(d) / "planted.py").exists()
    # the daemon it left in a session of its own went with the session (every process of its uid)
    deadline = time.monotonic() + 10
    while processes_with(str(world["mark"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(str(world["mark"])) == []


def test_an_honest_pass_converts_in_best_effort_as_its_own_uid(tmp_path: Path) -> None:
    root = fake_pass(tmp_path / "pass", "perturb")
    out = _convert(root, tmp_path / "out", tmp_path / "models")
    assert out.status == "ok" and out.sandbox == "best-effort", out.message
    model = tmp_path / "out" / "out.onnx"
    assert model.stat().st_size > 0 and model.stat().st_uid == 0  # copied out by the trusted side
    assert out.report["dtype"] == "fp16"
    assert not list(Path(tempfile.gettempdir()).glob(f"ampci-pass-*/lib/0/{tmp_path.name}"))


@pytest.mark.parametrize("attack", ["symlink", "hardlink"])
def test_a_best_effort_output_cannot_bring_a_host_file_out(tmp_path: Path, world: dict[str, object],
                                                          attack: str) -> None:
    """An output made a symlink (to the root-only key) or a hard link (to a file of the host's: the scratch
    directory shares /tmp's filesystem) is refused by name; the key never comes out."""
    link = (f'os.symlink({world["key"]!r}, dst)\n' if attack == "symlink" else
            'import tempfile\nsrc = tempfile.mkstemp(dir=os.environ["HOME"])[1]\nopen(src, "w").write("x")\n'
            'os.link(src, dst)\n')
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""A hostile pass."""\n')
    (root / "amp_pass" / "__main__.py").write_text(
        'import os, sys\ndst = sys.argv[sys.argv.index("-o") + 1]\n' + link + 'sys.exit(0)\n')
    out = _convert(root, tmp_path / "out", tmp_path / "models")
    assert out.status == "convert_error" and "out.onnx (not a" in out.message, out
    dst = tmp_path / "out" / "out.onnx"
    assert not dst.exists() or SECRET not in dst.read_text(errors="replace")


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_the_dropped_pass_imports_the_standard_library_it_has_not_imported_yet(tmp_path: Path, warm: bool) -> None:
    """Submodules of packages the zygote imported already (found on the package's ``__path__``, not ``sys.path``)
    and fresh modules alike -- also where the interpreter lies behind a directory the dropped uid may not
    traverse (a pyenv under /root, 700: reached through a descriptor)."""
    from workers.sandbox import zygotes
    names = ["concurrent.futures.thread", "json.tool", "email.mime.text", "xml.dom.minidom", "sqlite3", "csv"]
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""Imports."""\n')
    (root / "amp_pass" / "__main__.py").write_text(
        "import importlib, sys\nbad = []\n"
        f"for name in {names!r}:\n    try:\n        importlib.import_module(name)\n"
        "    except Exception as exc:\n        bad.append(f'{name}: {exc!r}')\n"
        "print('amp_pass: error: IMPORTS ' + ('; '.join(bad) or 'ok'), file=sys.stderr)\nsys.exit(2)\n")
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "models")
    if warm:
        zygotes.start_forkserver()
    try:
        out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                    root, timeout_s=120, memory_bytes=2 * 2**30, warm=warm,
                                    sandbox=sb.SandboxPolicy(mode="best-effort"))
    finally:
        zygotes.shutdown()
        zygotes.stop_forkserver()
    assert out.status == "convert_error" and "IMPORTS ok" in out.message, out


def test_processes_of_a_killed_sessions_uid_are_swept() -> None:
    """A supervisor killed on a timeout cannot kill its uid's processes: the sweep (each best-effort session's
    start, the worker's zygote shutdown) kills every process of a session uid whose supervisor is gone, and none
    of a live one's."""
    base = sb.loader().SESSION_UID_BASE
    dead = next(p for p in range(2**22 - 1, 1, -1) if not Path(f"/proc/{p}").exists())
    mark = f"98.{uuid.uuid4().int % 10**6}"

    def as_uid(uid: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["/bin/sleep", mark], preexec_fn=lambda: (os.setgroups([]), os.setresgid(uid, uid, uid),
                                                                         os.setresuid(uid, uid, uid)))

    orphan, kept = as_uid(base + dead), as_uid(base + os.getpid())
    try:
        sb.loader().sweep_session_cgroups()
        assert orphan.wait(timeout=10) == -9
        assert kept.poll() is None  # its supervisor (here: this process) is alive
    finally:
        for p in (orphan, kept):
            p.kill()
            p.wait()
