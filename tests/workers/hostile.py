"""A hostile pass revision for the sandbox tests (issue 31): it tries what a pull request's attacker would.

Its ``amp_pass/__main__.py`` reads its environment and its parent's, counts the processes it can see and its own
open descriptors, reads its ``NoNewPrivs``, adds a key to its user keyring, connects to host unix sockets by path,
lists the directories ampci keeps, opens TCP connections (PostgreSQL, Redis, a listener of the test), writes into every path it is given, leaves a daemon
(``sleep`` with a unique argument, double-forked, in its own session), kills its parent, forks until refused,
writes a file over the size cap, floods its stdout, and then fails with one line ``FINDINGS {json}`` followed by
a fake token and a setting's value -- the error text a job stores.  :func:`findings` reads that line back.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

#: A token-shaped string the hostile pass puts in its error message: must never be stored as is.
FAKE_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"

_MAIN = '''
import json, os, signal, socket, sys, time

PORTS = {ports!r}
VICTIMS = {victims!r}
DAEMON_MARK = {mark!r}
KILL_PARENT = {kill_parent!r}
UNIX_PATHS = {unix_paths!r}
found = {{"uid": os.getuid(), "env": sorted(os.environ), "home": os.environ.get("HOME", "")}}
found["fds"] = len(os.listdir("/proc/self/fd")) - 1  # (listdir's own descriptor not counted)
found["no_new_privs"] = next((line.split()[1] for line in open("/proc/self/status") if line.startswith("NoNewPrivs")), "?")
import ctypes, platform
_ADD_KEY = {{"x86_64": 248, "aarch64": 217}}.get(platform.machine())
if _ADD_KEY is not None:  # a key in the user keyring: a channel to a later job of the same uid
    _libc = ctypes.CDLL(None, use_errno=True)
    found["add_key"] = _libc.syscall(_ADD_KEY, b"user", b"ampci-probe", b"x", 1, -4) >= 0
found["unix_connected"] = []
for path in UNIX_PATHS:  # a host process's socket by path: namespaces and read-only mounts do not stop it
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect(path)
        s.close()
        found["unix_connected"].append(path)
    except OSError:
        pass
found["listed"] = []
for path in VICTIMS:  # the directories ampci keeps (cache, data) must look empty
    try:
        if os.path.basename(path) in os.listdir(os.path.dirname(path)):
            found["listed"].append(os.path.dirname(path))
    except OSError:
        pass
found["ampci_env"] = [k for k in os.environ if k.startswith("AMPCI_")]
try:
    found["self_environ_ampci"] = b"AMPCI_" in open("/proc/self/environ", "rb").read()
except OSError as exc:
    found["self_environ_ampci"] = "error"
try:
    found["parent_environ_ampci"] = b"AMPCI_" in open(f"/proc/{{os.getppid()}}/environ", "rb").read()
except OSError:
    found["parent_environ_ampci"] = False
found["pids_seen"] = len([p for p in os.listdir("/proc") if p.isdigit()])
found["sockets_inherited"] = 0
for fd in os.listdir("/proc/self/fd"):
    try:
        if os.readlink(f"/proc/self/fd/{{fd}}").startswith("socket:"):
            found["sockets_inherited"] += 1
    except OSError:
        pass
found["connected"] = []
for port in PORTS:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        found["connected"].append(port)
    except OSError:
        pass
found["wrote"] = []
for path in VICTIMS:
    try:
        with open(path, "a") as fh:
            fh.write("pwned\\n")
        found["wrote"].append(path)
    except OSError:
        pass
if os.fork() == 0:  # a daemon: double fork, own session, exec a marked sleep
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", DAEMON_MARK])
    os._exit(0)
if KILL_PARENT:
    try:
        os.kill(os.getppid(), signal.SIGKILL)
    except OSError:
        pass
children = []
try:
    for _ in range(400):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
except OSError:
    pass
found["forked"] = len(children)
for pid in children:
    os.kill(pid, signal.SIGKILL)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
written = 0
try:
    with open(os.path.join(os.environ.get("HOME", "/tmp"), "big.bin"), "wb") as fh:
        for _ in range(64):
            fh.write(b"x" * (1 << 20))
            fh.flush()
            written += 1 << 20
except OSError:
    pass
found["big_file_bytes"] = written
sys.stdout.write("HOSTILE-STDOUT\\n" * 1000)
sys.stdout.flush()
secret = os.environ.get("AMPCI_WEBHOOK_SECRET", "")
print("FINDINGS " + json.dumps(found, separators=(",", ":")) + " {token} AMPCI_API_TOKEN=" + (secret or "s3cr3tv4lue"),
      file=sys.stderr)
sys.exit(1)
'''


def hostile_pass(root: Path, ports: list[int], victims: list[Path], mark: str, kill_parent: bool = True,
                 unix_paths: list[Path] | tuple[Path, ...] = ()) -> Path:
    """Write the hostile ``amp_pass`` under ``root`` (a pass root); return ``root``.  ``kill_parent``: it also
    SIGKILLs its parent (in the sandbox, an init that signals from inside its namespace do not reach).
    ``unix_paths``: sockets of the host it tries to connect to by path."""
    pkg = root / "amp_pass"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""Hostile pass for the sandbox tests."""\n')
    (pkg / "__main__.py").write_text(textwrap.dedent(_MAIN).format(
        ports=list(ports), victims=[str(v) for v in victims], mark=mark, token=FAKE_TOKEN,
        kill_parent=kill_parent, unix_paths=[str(p) for p in unix_paths]))
    return root


def findings(message: str) -> dict:
    """The findings the hostile pass put in its error ``message``."""
    assert "FINDINGS " in message, message
    return json.loads(message.split("FINDINGS ", 1)[1].split(" ", 1)[0])


def processes_with(mark: str) -> list[int]:
    """Pids of processes whose command line holds ``mark`` (the hostile pass's daemon)."""
    out = []
    for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            if mark.encode() in (pid / "cmdline").read_bytes():
                out.append(int(pid.name))
        except OSError:
            continue
    return out
