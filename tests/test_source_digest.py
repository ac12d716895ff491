"""A stale ampci image refuses to start (deploy/source_digest.py), checked without building an image.

The mechanism is run directly on two trees, as the container runs it: the "image" tree is a copy of this
checkout's code with its digest written as the Dockerfile writes it, the "checkout" tree is another copy that is
then used (bytecode, caches: still current) or changed (stale).  ``run`` is the entrypoint docker-compose.yml
gives every ampci service: it starts the command only when the trees match.  The compose wiring itself (every
ampci service goes through it, with the code -- and only the code -- of the checkout mounted read-only) and the
Dockerfile's digest are checked on the files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.source_digest import (
    CHECKOUT,
    EXIT_STALE,
    IMAGE_DIGEST,
    SOURCE_PATHS,
    check,
    stale_reason,
    tree_digest,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "source_digest.py"


def _copy_code(to: Path) -> Path:
    """The checkout's SOURCE_PATHS copied under ``to`` (what COPY puts in the image, for these entries)."""
    to.mkdir()
    for rel in SOURCE_PATHS:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, to / rel, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
        else:
            shutil.copy2(src, to / rel)
    return to


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(image tree, its digest file as the Dockerfile writes it, a checkout tree with the same code)."""
    image = _copy_code(tmp_path / "image")
    digest = tmp_path / "source-digest.json"
    subprocess.run([sys.executable, str(SCRIPT), "write", str(image), str(digest)], check=True, timeout=120)
    return image, digest, _copy_code(tmp_path / "checkout")


def _run(checkout: Path, digest: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "run", str(checkout), str(digest), "--", *command],
                          capture_output=True, text=True, timeout=120)


def test_the_same_code_matches_even_after_use(trees: tuple[Path, Path, Path]):
    image, digest, checkout = trees
    assert json.loads(digest.read_text()) == tree_digest(image) == tree_digest(checkout)
    # what running tests or an editor leaves in a checkout is not code: still current
    (checkout / "service" / "__pycache__").mkdir(exist_ok=True)
    (checkout / "service" / "__pycache__" / "settings.cpython-311.pyc").write_bytes(b"\0bytecode")
    (checkout / "workers" / ".settings.py.swp").write_bytes(b"swap")
    (checkout / "service" / ".env").write_text("AMPCI_WEBHOOK_SECRET=not-code\n")
    (checkout / "service" / "settings.py").chmod(0o600)
    assert check(checkout, digest) is None
    proc = _run(checkout, digest, sys.executable, "-c", "print('service started')")
    assert proc.returncode == 0 and proc.stdout == "service started\n", proc.stderr


@pytest.mark.parametrize("change", ["edit", "new file", "removed file", "dependency", "symlink", "missing entry"])
def test_a_stale_image_refuses_to_start_with_one_line(trees: tuple[Path, Path, Path], change: str):
    image, digest, checkout = trees
    entry = {"edit": "service", "new file": "workers", "removed file": "amp_pass", "dependency": "pyproject.toml",
             "symlink": "sweeps", "missing entry": "migrations"}[change]
    if change == "edit":
        settings = checkout / "service" / "settings.py"
        settings.write_text(settings.read_text() + "# a change made after the image was built\n")
    elif change == "new file":
        (checkout / "workers" / "new_module.py").write_text('"""new"""\n')
    elif change == "removed file":
        (checkout / "amp_pass" / "__init__.py").unlink()
    elif change == "dependency":
        (checkout / "pyproject.toml").write_text((checkout / "pyproject.toml").read_text() + "\n# bump\n")
    elif change == "symlink":
        os.symlink("smoke.toml", checkout / "sweeps" / "alias.toml")
    else:
        shutil.rmtree(checkout / "migrations")
    reason = stale_reason(json.loads(digest.read_text()), checkout)
    assert reason is not None and "\n" not in reason
    assert f"(differs: {entry})" in reason and "docker compose up -d --build" in reason
    proc = _run(checkout, digest, sys.executable, "-c", "print('service started')")
    assert proc.returncode == EXIT_STALE and proc.stdout == "", proc.stdout  # the command never ran
    assert proc.stderr.splitlines() == [reason]


def test_an_image_without_a_digest_is_refused(trees: tuple[Path, Path, Path], tmp_path: Path):
    _, _, checkout = trees
    proc = _run(checkout, tmp_path / "no-such-digest.json", sys.executable, "-c", "print('service started')")
    assert proc.returncode == EXIT_STALE and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("ampci: error: this image has no readable code digest") and "--build" in line


def _ampci_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


def test_every_ampci_service_starts_through_the_check_with_only_the_code_mounted():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = _ampci_services(compose)
    assert {"migrate", "api", "beat", "worker-cpu", "worker-cuda"} <= set(services)
    want = {f"./{rel}:{CHECKOUT}/{rel}:ro" for rel in SOURCE_PATHS}
    for name, svc in services.items():
        assert svc["entrypoint"] == ["python3", f"/app/deploy/{SCRIPT.name}", "run", str(CHECKOUT), "--"], name
        mounts = [str(v) for v in svc.get("volumes", [])]
        from_checkout = {m for m in mounts if m.startswith(".")}
        assert from_checkout == want, f"{name}: {sorted(from_checkout ^ want)}"
        # the checkout root (with .env: the secrets) is never mounted, only the code entries
        assert not [m for m in mounts if m.split(":")[0] in {".", "./", "./.env"}], name
    # the entrypoint is in the image (deploy/ is not ignored) and the image records its digest where it is read
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not any(p.strip("/*") == "deploy" for p in ignored)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"python3 deploy/{SCRIPT.name} write /app {IMAGE_DIGEST}" in dockerfile
    copy_at = dockerfile.index("COPY --chown=10001:10001 . .")
    assert copy_at < dockerfile.index(f"deploy/{SCRIPT.name} write") < dockerfile.index("\nUSER ampci\n")
