"""The sandbox works wherever Python lives (issue 39): a clone and its virtual environment under ``/tmp``, which the
sandbox covers with an empty tmpfs, still run the README's quick start with every cell passing, and a venv inside a
hidden data directory is bound back without showing the directory's other files.

The clone is a copy of this working tree; its venv is made with ``venv`` and gets this checkout's
``site-packages`` as hard links (same file system) -- a venv whose files physically live under ``/tmp`` -- with
the editable install pointed at the copy, as ``pip install -e`` there would have written it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.sandbox import policy as sb

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")


def _make_venv(prefix: Path, clone: Path) -> Path:
    """A venv at ``prefix`` whose site-packages are hard links of this interpreter's (skips where /tmp is another
    file system), with the editable install mapped to ``clone``; returns its python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = prefix / ours.relative_to(sys.prefix)
    shutil.rmtree(theirs)
    if subprocess.run(["cp", "-al", str(ours), str(theirs)], capture_output=True).returncode != 0:
        pytest.skip(f"{ours} cannot be hard-linked under {prefix} (another file system)")
    for finder in theirs.glob("__editable__*finder.py"):
        text = finder.read_text().replace(str(ROOT) + "/", str(clone) + "/")
        finder.unlink()  # a hard link: never write through it into this checkout's venv
        finder.write_text(text)
    python = prefix / "bin" / "python"
    script = (Path(sys.prefix) / "bin" / "ampci").read_text().split("\n", 1)[1]
    (prefix / "bin" / "ampci").write_text(f"#!{python}\n{script}")
    (prefix / "bin" / "ampci").chmod(0o755)
    return python


@pytest.fixture(scope="module")
def layout() -> Iterator[Path]:
    """``/tmp/ampci-tmp-*/clone`` (this working tree's files) with its ``.venv``; the directory is removed after."""
    base = Path(tempfile.mkdtemp(prefix="ampci-tmp-", dir="/tmp"))
    try:
        clone = base / "clone"
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.split(b"\0")
        for name in filter(None, files):
            src = ROOT / os.fsdecode(name)
            if src.is_file():
                dst = clone / os.fsdecode(name)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        _make_venv(clone / ".venv", clone)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _env(base: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMPCI_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(AMPCI_DATA_DIR=str(base / "data"), AMPCI_CACHE_DIR=str(base / "cache"), AMPCI_SANDBOX="require",
               **extra)
    return env


def test_the_quick_start_passes_from_a_clone_and_venv_under_tmp(layout: Path) -> None:
    clone = layout / "clone"
    ampci = str(clone / ".venv" / "bin" / "ampci")
    assert clone.resolve().is_relative_to("/tmp") and (clone / ".venv").resolve().is_relative_to("/tmp")
    sweep = subprocess.run([ampci, "sweep", "--json"], cwd=clone, env=_env(layout), capture_output=True, text=True,
                           timeout=600)
    assert sweep.stdout.strip(), sweep.stderr[-3000:]
    results = json.loads(sweep.stdout)["results"]
    assert len(results) == 6 and {r["status"] for r in results} == {"pass"}, \
        [(r["model"], r["dtype"], r["status"], r["message"]) for r in results]
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    model = layout / "model.onnx"
    export = subprocess.run([ampci, "zoo", "export", "conv_net", "-o", str(model)], cwd=clone, env=_env(layout),
                            capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    check = subprocess.run([ampci, "check", str(model)], cwd=clone, env=_env(layout), capture_output=True,
                           text=True, timeout=600)
    assert check.returncode == 0, (check.stdout[-2000:], check.stderr[-2000:])


_PROBE_PASS = '''
import argparse, json, os, shutil, sys
import onnx.inliner  # not imported by any process before the sandbox was made
p = argparse.ArgumentParser()
p.add_argument("cmd"); p.add_argument("src"); p.add_argument("-o", dest="dst")
for flag in ("--dtype", "--policy", "--target", "--report"):
    p.add_argument(flag)
a = p.parse_args()
seen = {}
for d in (PROBE_DATA, PROBE_CACHE):
    try:
        seen[d] = sorted(os.listdir(d))
    except OSError as exc:
        seen[d] = str(exc)
try:
    seen["secret"] = open(os.path.join(PROBE_DATA, "secret.txt")).read()
except OSError:
    seen["secret"] = None
try:
    open(os.path.join(PROBE_SITE, "pwned.py"), "w").write("x")
    seen["wrote_site"] = True
except OSError:
    seen["wrote_site"] = False
shutil.copyfile(a.src, a.dst)
json.dump({"dtype": a.dtype, "policy": a.policy, "target": a.target, "seconds": 0.0, "seen": seen},
          open(a.report, "w"))
'''

_DRIVER = '''
import json, sys
from pathlib import Path
from workers.sandbox import policy as sb
from workers.revision.convert import convert_in_subprocess
from workers.zoo.synthetic import synthetic_model_path

data, cache, root, out = map(Path, sys.argv[1:5])
src, _ = synthetic_model_path("conv_net", 0, cache)
got = convert_in_subprocess(src, out / "out.onnx", out / "report.json", "fp16", "default", "cpu", root,
                            timeout_s=120, memory_bytes=2 * 2**30, warm=False,
                            sandbox=sb.SandboxPolicy(mode="require", hide=(str(data), str(cache))))
print(json.dumps({"status": got.status, "message": got.message, "sandbox": got.sandbox,
                  "seen": got.report.get("seen")}))
'''


@pytest.mark.parametrize("under", ["/tmp", "/var/tmp"])
def test_a_venv_inside_the_hidden_data_dir_is_bound_back_alone(layout: Path, under: str) -> None:
    """The venv lives in the data directory (hidden from the pass; under /tmp, or elsewhere, where the data
    directory is a read-only tmpfs of its own): the pass imports from it, and still sees none of the directory's
    other files, nor the cache's, and cannot write into the venv."""
    if not os.path.isdir(under):
        pytest.skip(f"no {under} here")
    home = Path(tempfile.mkdtemp(prefix="ampci-venv-", dir=under))
    try:
        _venv_in_data_dir(layout, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _venv_in_data_dir(layout: Path, home: Path) -> None:
    data, cache, out = home / "data", home / "cache", home / "out"
    for d in (data, cache, out):
        d.mkdir()
    (data / "secret.txt").write_text("the data dir's secret\n")
    python = _make_venv(data / "venv", layout / "clone")
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    root = home / "probe-pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text("")
    (root / "amp_pass" / "__main__.py").write_text(
        f"PROBE_DATA, PROBE_CACHE, PROBE_SITE = {str(data)!r}, {str(cache)!r}, {str(site)!r}\n" + _PROBE_PASS)
    env = _env(layout)
    got = subprocess.run([str(python), "-c", _DRIVER, str(data), str(cache), str(root), str(out)],
                         cwd=layout / "clone", env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    said = json.loads(got.stdout.strip().splitlines()[-1])
    assert said["status"] == "ok" and said["sandbox"] == "full", said["message"]
    seen = said["seen"]
    assert seen[str(data)] == ["venv"], seen  # only the bound-back venv's mount point
    assert seen[str(cache)] in ([], f"[Errno 2] No such file or directory: '{cache}'"), seen  # empty or gone
    assert seen["secret"] is None, seen
    assert seen["wrote_site"] is False and not (site / "pwned.py").exists()
