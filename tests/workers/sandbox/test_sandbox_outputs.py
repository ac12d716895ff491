"""Outputs are data the pass cannot aim (issue 40): a FIFO, a sparse file or a symlink as the converted model
is refused by name, without blocking the supervisor, costing the host the file's size, or following the link;
and the pass runs with ``no_new_privs`` set."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from workers.revision.convert import ConvertOutcome, convert_in_subprocess
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
_WHY = sb.full_sandbox_error(sb.SandboxPolicy())
#: Namespaces can be made here (a probe that fails only at the filter, which needs no_new_privs, still runs the
#: test: it must then fail, not skip).
needs_namespaces = pytest.mark.skipif(_WHY is not None and "system-call filter" not in _WHY, reason=f"{_WHY}")

_HEAD = '''
import json, os, sys
dst = sys.argv[sys.argv.index("-o") + 1]
rep = sys.argv[sys.argv.index("--report") + 1]
with open(rep, "w") as f:
    json.dump({"dtype": "fp16", "kept_fp32": [], "seconds": 0.01}, f)
'''
BODIES = {
    "fifo": 'os.mkfifo(dst)\n',
    "sparse": 'fd = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644)\nos.ftruncate(fd, 512 * 2**20)\nos.close(fd)\n',
    "symlink": 'os.symlink("/etc/passwd", dst)\n',
    "total": 'with open(dst, "wb") as f:\n    f.write(b"x" * (70 * 2**20))\n',  # dense, over 4 x input + 64 MiB
    "descriptors": ('fds = {}\nfor fd in os.listdir("/proc/self/fd"):\n'
                    '    try:\n        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")\n'
                    '    except OSError:\n        pass\n'
                    'print("amp_pass: error: FDS " + json.dumps(fds), file=sys.stderr)\nsys.exit(2)\n'),
    "no_new_privs": ('nnp = [ln for ln in open("/proc/self/status") if ln.startswith("NoNewPrivs:")]\n'
                     'print("amp_pass: error: " + (nnp[0].strip() if nnp else "NoNewPrivs: ?"), file=sys.stderr)\n'
                     'sys.exit(2)\n'),
}


def _convert(tmp_path: Path, body: str, mode: str = "require") -> ConvertOutcome:
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""A hostile pass."""\n')
    (root / "amp_pass" / "__main__.py").write_text(textwrap.dedent(_HEAD) + BODIES[body])
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    return convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                 root, timeout_s=60, memory_bytes=2 * 2**30, warm=False,
                                 sandbox=sb.SandboxPolicy(mode=mode))


@needs_full
@pytest.mark.parametrize("kind,why", [("fifo", "not a regular file"), ("sparse", "sparse"),
                                      ("symlink", "not a regular file"), ("total", "over the size limit")])
def test_an_output_that_is_not_plain_data_is_refused_by_name(tmp_path: Path, kind: str, why: str) -> None:
    out = _convert(tmp_path, kind)
    assert out.status == "convert_error" and f"out.onnx ({why}" in out.message, out  # a FIFO: not a timeout
    dst = tmp_path / "out.onnx"
    assert not dst.exists() or (dst.stat().st_blocks * 512 < 2**20 and b"root:" not in dst.read_bytes())


@needs_namespaces
def test_the_pass_runs_with_no_new_privs(tmp_path: Path) -> None:
    out = _convert(tmp_path, "no_new_privs")
    assert out.status == "convert_error" and "NoNewPrivs:\t1" in out.message, out


@needs_full
@pytest.mark.parametrize("mode", ["require", "best-effort"])
def test_no_descriptor_but_stdio_is_open_in_the_pass(tmp_path: Path, mode: str) -> None:
    """stdin on /dev/null, stdout/stderr its own files, and the listing's own descriptor: nothing of the
    supervisor's (its /, /proc, cgroup files, O_PATH descriptors of the interpreter's trees)."""
    import json

    out = _convert(tmp_path, "descriptors", mode)
    assert out.status == "convert_error" and "FDS " in out.message, out
    fds = json.loads(out.message.split("FDS ", 1)[1].splitlines()[0])
    assert fds.pop("0") == "/dev/null", fds
    assert fds.pop("1").endswith(".stdout") and fds.pop("2").endswith(".stderr"), fds
    if mode == "best-effort":  # and the import trees behind a directory the dropped uid may not traverse
        for tree in _unreachable_import_trees():
            assert tree in fds.values(), (tree, fds)
            fds = {k: v for k, v in fds.items() if v != tree}
    assert all(v.startswith("/proc/") for v in fds.values()) and len(fds) <= 1, fds  # os.listdir's own


def _unreachable_import_trees() -> set[str]:
    """The directories just below an untraversable one on the way to this interpreter's import roots, which a
    best-effort root worker's pass reaches through one O_PATH descriptor each (none where the worker is not
    root)."""
    import os
    import sys

    if os.geteuid() != 0:
        return set()
    unpriv = sb.loader()._unpriv
    uid = sb.loader().SESSION_UID_BASE + 1
    trees = set()
    for root in [*sys.path, *sb.interpreter_trees()]:
        if os.path.isabs(root) and os.path.exists(root):
            blocked = unpriv.blocked_ancestor(root, uid)
            if blocked and blocked != os.path.abspath(root):
                trees.add(os.path.join(blocked, os.path.relpath(root, blocked).split("/")[0]))
    return trees


@needs_full
def test_the_pass_can_neither_list_nor_read_the_cache_or_data_directory(tmp_path: Path,
                                                                       request: pytest.FixtureRequest) -> None:
    """The worker's own policy (WorkerConfig.sandbox_policy) hides its cache (zoo models, fp32 references, other
    revisions' trees) and data directories: listing shows nothing, reading a file there fails."""
    import dataclasses

    from workers.revision.config import WorkerConfig

    top = Path(tempfile.mkdtemp(prefix="ampci-cache-", dir="/var/tmp"))  # outside /tmp, which is hidden anyway
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    top.chmod(0o755)
    cfg = WorkerConfig(cache_dir=top / "cache", data_dir=top / "data")
    for d in (cfg.cache_dir, cfg.data_dir):
        d.mkdir(parents=True, exist_ok=True)
        (d / "zoo-model.onnx").write_text("CACHED-SECRET")
        d.chmod(0o755)
        (d / "zoo-model.onnx").chmod(0o644)
    policy = dataclasses.replace(cfg.sandbox_policy(), mode="require")
    dirs = [str(cfg.cache_dir), str(cfg.data_dir)]
    probe = (f"got = {{}}\nfor d in {dirs!r}:\n    try:\n        got[d] = os.listdir(d)\n    except OSError as e:\n"
             "        got[d] = str(e)\n    try:\n        got[d + '/f'] = open(d + '/zoo-model.onnx').read()\n"
             "    except OSError as e:\n        got[d + '/f'] = 'error'\n"
             "print('amp_pass: error: SEEN ' + json.dumps(got), file=sys.stderr)\nsys.exit(2)\n")
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""A hostile pass."""\n')
    (root / "amp_pass" / "__main__.py").write_text(textwrap.dedent(_HEAD) + probe)
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "models")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=60, memory_bytes=2 * 2**30, warm=False, sandbox=policy)
    assert out.status == "convert_error" and "SEEN " in out.message, out
    assert "CACHED-SECRET" not in out.message and "zoo-model.onnx" not in out.message, out.message
