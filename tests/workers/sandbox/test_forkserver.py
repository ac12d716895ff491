"""Zygotes forked from a worker's preloaded fork server (issue 25) keep the isolation of fresh ones.

Each check runs in a subprocess of its own that imports *this checkout's* ``amp_pass`` first (as a
worker may have), starts the fork server, and converts with pass roots under test: the revision's
``amp_pass`` is imported in the forked zygote only, the time and memory limits and crash isolation
hold, a new pass version is picked up, and the fork server dies with its worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    import amp_pass  # this checkout's: must not leak into a revision's zygote
    from workers.sandbox import zygotes
    assert zygotes.start_forkserver()
    from tests.workers.fakes import fake_pass
    from workers.revision.convert import convert_in_subprocess
    from workers.zoo.synthetic import synthetic_model_path

    tmp = Path(sys.argv[1])
    src, _ = synthetic_model_path("conv_net", 0, tmp / "cache")
    out = {"forkserver": zygotes._FORKSERVER.pid, "worker": os.getpid()}

    def convert(root, timeout=60.0):
        r = convert_in_subprocess(src, tmp / "o.onnx", tmp / "r.json", "fp16", "default", "cpu", root,
                                  timeout_s=timeout, memory_bytes=1024**3)
        z = zygotes.zygote_of(root)
        return [r.status, r.message, bool(z and z.forked), z.pid if z else None]

    for behaviour in ("perturb", "reject", "segfault", "memory", "hang"):
        out[behaviour] = convert(fake_pass(tmp / behaviour, behaviour), 1.5 if behaviour == "hang" else 60.0)
    old = tmp / "old"
    (old / "amp_pass").mkdir(parents=True)
    (old / "amp_pass" / "__init__.py").write_text("")
    (old / "amp_pass" / "__main__.py").write_text(sys.argv[2])
    out["old"] = convert(old)
    changing = fake_pass(tmp / "changing", "segfault")
    first = convert(changing)
    fake_pass(changing, "reject")
    os.utime(changing / "amp_pass" / "__main__.py", ns=(1, 1))
    out["changed"] = [first, convert(changing)]
    print(json.dumps(out), flush=True)
    if len(sys.argv) > 3:  # stay alive until killed
        time.sleep(600)
''')

OLD_MAIN = textwrap.dedent('''
    import sys
    try:
        import amp_pass.converter  # in this checkout's amp_pass, absent from this revision
    except ModuleNotFoundError:
        print("amp_pass: error: isolated", file=sys.stderr)
        sys.exit(2)
    print("amp_pass: error: leaked " + amp_pass.converter.__file__, file=sys.stderr)
    sys.exit(2)
''')


def _probe(tmp: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", PROBE, str(tmp), OLD_MAIN, *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_forked_zygotes_convert_isolated_with_limits(tmp_path: Path) -> None:
    proc = _probe(tmp_path)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    out = json.loads(stdout.strip().splitlines()[-1])
    expected = {"perturb": ("ok", ""), "reject": ("convert_error", "policy 'nope'"),
                "segfault": ("crash", "SIGSEGV"), "memory": ("crash", "out of memory"),
                "hang": ("timeout", "time limit of 1.5s"), "old": ("convert_error", "isolated")}
    for name, (status, message) in expected.items():
        got_status, got_message, forked, _ = out[name]
        assert forked, f"{name}: the zygote was a fresh interpreter, not forked from the fork server"
        assert got_status == status and message in got_message, (name, out[name])
    first, changed = out["changed"]
    assert first[0] == "crash" and changed[0] == "convert_error" and changed[3] != first[3]  # a new zygote


def test_the_fork_server_and_its_zygotes_die_with_their_worker(tmp_path: Path) -> None:
    proc = _probe(tmp_path, "stay")
    assert proc.stdout is not None
    out = json.loads(proc.stdout.readline())
    pids = [out["forkserver"], *(v[3] for k, v in out.items() if isinstance(v, list) and len(v) == 4 and v[3])]
    assert all(_alive(p) for p in pids[:1])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "fork server or zygotes outlived their worker"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


FALLBACK = textwrap.dedent('''
    import json, os, signal, sys, time
    from pathlib import Path
    from workers.sandbox import zygotes
    assert zygotes.start_forkserver()
    from tests.workers.fakes import fake_pass
    from workers.revision.convert import convert_in_subprocess
    from workers.zoo.synthetic import synthetic_model_path

    tmp = Path(sys.argv[1])
    os.kill(zygotes._FORKSERVER.pid, signal.SIGKILL)
    os.waitpid(zygotes._FORKSERVER.pid, 0)
    src, _ = synthetic_model_path("conv_net", 0, tmp / "cache")
    root = fake_pass(tmp / "pass", "perturb")
    r = convert_in_subprocess(src, tmp / "o.onnx", tmp / "r.json", "fp16", "default", "cpu", root,
                              timeout_s=60, memory_bytes=1024**3)
    z = zygotes.zygote_of(root)
    print(json.dumps([r.status, z.forked, zygotes._FORKSERVER is None]))
''')


def test_a_dead_fork_server_falls_back_to_fresh_zygotes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", FALLBACK, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["ok", False, True]
