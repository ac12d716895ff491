"""A non-root worker's jobs have per-job kernel state too (issue 40), though not a uid of their own: an
unprivileged user namespace maps only its creator's uid, so every job's pass runs as the worker's uid; but each
session is a user namespace of its own, and the kernel counts ``RLIMIT_NPROC`` per user namespace (ucounts,
Linux >= 5.14), so one job's pass holding its process limit leaves another job's forking.

Run for real as an unprivileged uid (``setpriv`` to 65534) with the system's Python 3 driving
:func:`workers.sandbox._sandbox.supervise` directly (standard library only: the sandbox code needs nothing else; the
conversion stack's packages are not readable by that uid here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

SANDBOX = Path(__file__).resolve().parents[3] / "workers" / "sandbox" / "_sandbox.py"
PY = "/usr/bin/python3"

_RUN = '''
import importlib.util, json, os, sys, sysconfig, time
SANDBOX, TOP = sys.argv[1], sys.argv[2]
spec_ = importlib.util.spec_from_file_location("_ampci_sandbox", SANDBOX)
m = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(m)
trees = sorted({sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"]})
why = m.probe({"mode": "full", "uid": 65534, "gid": 65534, "hide": ["/run"], "lib": [], "interpreter": trees,
               "max_procs": 16, "max_file_bytes": 1 << 30, "scratch_bytes": 1 << 28, "env": {}, "preimport": [],
               "fresh_modules": []})
if why:
    print("NOSANDBOX " + why)
    sys.exit(0)

def start(name):
    spec = {"mode": "full", "uid": 65534, "gid": 65534, "hide": ["/run"], "lib": [f"{TOP}/{name}"],
            "interpreter": trees, "max_procs": 16, "max_file_bytes": 1 << 30, "scratch_bytes": 1 << 28,
            "env": {"PATH": "/usr/bin:/bin"}, "preimport": ["amp_pass"], "fresh_modules": ["amp_pass"]}
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        m.supervise(spec, r1, w2)
    os.close(r1)
    os.close(w2)
    req = {"module": "amp_pass", "argv": [], "inputs": [], "outputs": {}, "stdout": f"{TOP}/{name}.out",
           "stderr": f"{TOP}/{name}.err", "memory": 1 << 30}
    os.write(w1, (json.dumps(req) + "\\n").encode())
    return pid, w1, r2

def held():
    n = 0
    for p in os.listdir("/proc"):
        try:
            n += p.isdigit() and sys.argv[3].encode() in open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            pass
    return n

bomb = start("bomb")
deadline = time.monotonic() + 30
while time.monotonic() < deadline and held() < 10:
    time.sleep(0.05)
print("HELD", held())
honest = start("honest")
for pid, w, r in (honest, bomb):
    os.read(r, 4096)
    os.close(w)
    os.waitpid(pid, 0)
print(open(f"{TOP}/bomb.err").read().strip())
print(open(f"{TOP}/honest.err").read().strip())
'''

_BOMB = '''
import os, sys, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", {mark!r}])
    n += 1
print("BOMB forked", n, "uid", os.getuid(), file=sys.stderr)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
'''

_HONEST = '''
import os, sys, time
kids = []
for _ in range(10):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("HONEST forked", len(kids), "of 10 uid", os.getuid(), file=sys.stderr)
'''


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not Path(PY).is_file(),
                    reason="runs the sandbox as an unprivileged uid: needs root, setpriv and the system's python3")
def test_a_non_root_workers_fork_bomb_leaves_its_other_job_forking(request: pytest.FixtureRequest) -> None:
    top = Path(tempfile.mkdtemp(prefix="ampci-nonroot-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    top.chmod(0o777)
    mark = f"6.{uuid.uuid4().int % 10**6:06d}"  # the bomb's children: marked sleeps of at most 7 s
    for name, main in (("bomb", _BOMB.format(mark=mark)), ("honest", _HONEST)):
        (top / name / "amp_pass").mkdir(parents=True)
        (top / name / "amp_pass" / "__init__.py").write_text("")
        (top / name / "amp_pass" / "__main__.py").write_text(textwrap.dedent(main))
    (top / "run.py").write_text(_RUN)
    for p in top.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY, str(top / "run.py"),
                           str(SANDBOX), str(top), mark], capture_output=True, text=True, timeout=120)
    if proc.stdout.startswith("NOSANDBOX "):
        pytest.skip(f"no unprivileged sandbox here: {proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert int(out.split("HELD ")[1].split()[0]) >= 10, out  # the honest job started while the bomb held
    assert "BOMB forked" in out and "HONEST forked" in out, out
    bomb = int(out.split("BOMB forked ")[1].split()[0])
    assert 10 <= bomb < 16, out  # it held (nearly) its whole limit of 16 ...
    assert "HONEST forked 10 of 10 uid 65534" in out, out  # ... and the other job, same uid, forked all it asked
