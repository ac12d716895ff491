"""A cgroup per job where the host offers one (issue 40): the pass process and everything it forks are in a group
of their own with ``pids.max`` = ``AMPCI_SANDBOX_MAX_PROCS`` and a memory limit of the conversion's memory + the
scratch tmpfs; where a controller is not delegated, that limit is left out and ``/healthz`` says so in one line.

The pass reads its own groups (``/proc/self/cgroup``) and their limit files; a controller this host lacks skips
its test with the reason.  The host-independent part (where a limit can be set, the note) runs on made-up
``mountinfo``/``cgroup`` texts."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from workers.revision.convert import convert_in_subprocess
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

cgl = sb.loader()._cgl
HAVE = cgl.available()
_WHY = sb.full_sandbox_error(sb.SandboxPolicy())
MAX_PROCS, MEMORY, SCRATCH = 24, 2 * 2**30, 512 * 2**20

_MAIN = '''
import json, os, sys
MOUNTS = {mounts!r}
own = {{}}
for line in open("/proc/self/cgroup"):
    _, names, path = line.rstrip("\\n").split(":", 2)
    for name in names.split(",") if names else [""]:
        own[name] = path
found = {{}}
for controller, (mount, v2, limit_file) in MOUNTS.items():
    path = own["" if v2 else controller]
    try:
        limit = open(os.path.join(mount, path.lstrip("/"), limit_file)).read().strip()
    except OSError as exc:
        limit = "error " + type(exc).__name__
    found[controller] = {{"group": path, "limit": limit}}
print("amp_pass: error: CGROUP " + json.dumps(found), file=sys.stderr)
sys.exit(2)
'''


def _mounts() -> dict[str, tuple[str, bool, str]]:
    """controller -> (its hierarchy's mount point, v2?, the limit file) for the controllers this host offers."""
    out = {}
    for c in cgl.CONTROLLERS:
        w = cgl.where(c)
        if w is not None:
            mount = next(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                         if w[0].startswith(line.split()[4]) and " - cgroup" in line
                         and (w[1] == (" - cgroup2 " in line)) and (w[1] or c in line.split()[-1].split(",")))
            out[c] = (mount, w[1], cgl.FILES[w[1], c])
    return out


@pytest.mark.parametrize("mode", ["require", "best-effort"])
@pytest.mark.parametrize("controller", cgl.CONTROLLERS)
def test_the_pass_is_in_a_group_of_its_own_with_the_limit(tmp_path: Path, mode: str, controller: str) -> None:
    if HAVE[controller] is None:
        pytest.skip(cgl.note({controller: None}))
    if mode == "require" and _WHY is not None:
        pytest.skip(f"no full sandbox here: {_WHY}")
    if mode == "require" and HAVE[controller] == "cgroup v2" and sb.loader()._accounting.own_cgroup_dir() is None:
        pytest.skip("no cgroup v2 group of the session here")
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""Reads its cgroups."""\n')
    (root / "amp_pass" / "__main__.py").write_text(textwrap.dedent(_MAIN.format(mounts=_mounts())))
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=60, memory_bytes=MEMORY, warm=False,
                                sandbox=sb.SandboxPolicy(mode=mode, max_procs=MAX_PROCS, scratch_bytes=SCRATCH))
    assert out.status == "convert_error" and "CGROUP " in out.message, out
    got = json.loads(out.message.split("CGROUP ", 1)[1].splitlines()[0])[controller]
    assert got["group"].rsplit("/", 1)[-1].startswith(cgl.PREFIX), got  # a group of its own, not the worker's
    want = MAX_PROCS if controller == "pids" else MEMORY + SCRATCH
    assert int(got["limit"]) == want, got
    # the session's end removes its group (the supervisor's /sys is read-only by then: it must not need a path)
    group = Path(_mounts()[controller][0]) / got["group"].lstrip("/")
    deadline = time.monotonic() + 5
    while group.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group.exists(), f"{group} left behind after its session ended"


V1_HYBRID = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
             "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
V1_CGROUP = "8:pids:/\n4:memory:/job/7\n0::/\n"
V2_ONLY = "41 23 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def test_where_finds_a_v1_hierarchy_and_no_undelegated_v2_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgl.os, "access", lambda path, mode: True)
    assert cgl.where("pids", V1_HYBRID, V1_CGROUP) == ("/sys/fs/cgroup/pids/", False)
    assert cgl.where("memory", V1_HYBRID, V1_CGROUP) == ("/sys/fs/cgroup/memory/job/7", False)
    # a v2-only host whose own group's children get no controller (cgroup.subtree_control unreadable/empty here)
    monkeypatch.setattr(cgl, "_read", lambda path: "" if path.endswith("subtree_control") else "")
    assert cgl.where("pids", V2_ONLY, "0::/worker\n") is None
    monkeypatch.setattr(cgl, "_read", lambda path: "cpu pids" if path.endswith("subtree_control") else "")
    assert cgl.where("pids", V2_ONLY, "0::/worker\n") == ("/sys/fs/cgroup/worker", True)
    assert cgl.where("memory", V2_ONLY, "0::/worker\n") is None


def test_the_note_names_only_what_is_missing_in_one_line() -> None:
    assert cgl.note({"pids": "cgroup v1", "memory": "cgroup v2"}) is None
    line = cgl.note({"pids": "cgroup v1", "memory": None})
    assert line is not None and "memory" in line and "pids" not in line and "\n" not in line
