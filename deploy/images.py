#!/usr/bin/env python3
"""Local base images for the compose stack on a machine without a container registry.

    python3 deploy/images.py          # or: python3 dev.py images
    export COMPOSE_FILE=docker-compose.yml:deploy/compose.local.yml
    docker compose up -d              # the same commands as with a registry

Builds, from Debian packages only (no registry pull):

* ``local/debian:bookworm``  ``debootstrap --variant=minbase`` from the machine's own Debian mirror
  (the first ``URIs:``/``deb`` line of its apt sources) imported with ``docker import``; made once
  and kept, so every image above it keeps its cached layers;
* ``local/python:3.11``      python3.11, venv, git; trusts the machine's extra CA certificates
  (``/usr/local/share/ca-certificates``) for apt, pip and other TLS clients;
* ``local/postgres:15`` and ``local/redis:7``  drop-in for the stock ``postgres``/``redis`` images
  as docker-compose.yml uses them.

``deploy/compose.local.yml`` is the compose override that uses them.  Docker's legacy builder is
used (``DOCKER_BUILDKIT=0``): it needs no buildx plugin and works with Debian's docker.io.  Also
importable: the deploy test uses :func:`ensure_dockerd`, :func:`build_base_images` and
:func:`compose_command`.  Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
BASE = "local/debian:bookworm"
IMAGES = {"local/python:3.11": "python", "local/postgres:15": "postgres", "local/redis:7": "redis"}
LOCAL_OVERRIDE = DEPLOY / "compose.local.yml"
CA_DIR = Path("/usr/local/share/ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DOCKERD_LOG = Path("/var/log/ampci-dockerd.log")


def _log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def docker_env() -> dict[str, str]:
    """The environment for docker/compose commands: the legacy builder (no buildx needed)."""
    return dict(os.environ, DOCKER_BUILDKIT="0", COMPOSE_DOCKER_CLI_BUILD="0")


def docker_ready(timeout: float = 10.0) -> bool:
    """True when ``docker info`` reaches a daemon within ``timeout`` seconds."""
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=timeout,
                              env=docker_env()).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def ensure_dockerd(wait: float = 60.0) -> str | None:
    """Make a Docker daemon reachable: start ``dockerd`` in the background (root only, log in
    /var/log/ampci-dockerd.log) when none answers.  Returns None when ready, else the reason."""
    if docker_ready():
        return None
    if not shutil.which("docker"):
        return "the docker client is not installed (apt-get install docker.io)"
    dockerd = shutil.which("dockerd")
    if not dockerd:
        return "no Docker daemon answers and dockerd is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "no Docker daemon answers and only root can start dockerd"
    _log(f"starting dockerd (log: {DOCKERD_LOG})")
    with open(DOCKERD_LOG, "ab") as log:
        subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if docker_ready():
            return None
        time.sleep(1.0)
    tail = DOCKERD_LOG.read_text(errors="replace").strip().splitlines()[-1:] if DOCKERD_LOG.exists() else []
    return f"dockerd did not answer within {wait:.0f} s: {' '.join(tail)}"


def compose_command() -> list[str] | None:
    """The compose client: ``docker compose`` (v2 plugin) when present, else ``docker-compose`` (v1)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, env=docker_env())
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def image_exists(name: str) -> bool:
    """True when the local daemon has an image tagged ``name``."""
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True,
                          env=docker_env()).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror of this machine's apt sources (deb822 ``URIs:`` or one-line ``deb``)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            m = re.match(r"^URIs:\s*(\S+)", line) or re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", line)
            if m and "security" not in m.group(1):
                return m.group(1).rstrip("/")
    return DEFAULT_MIRROR


def build_debian_base(mirror: str | None = None) -> float:
    """debootstrap a minbase bookworm and ``docker import`` it as local/debian:bookworm; seconds taken."""
    if not shutil.which("debootstrap"):
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    mirror = mirror or debian_mirror()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ampci-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _log(f"debootstrap --variant=minbase bookworm from {mirror}")
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], check=True,
                       stdout=subprocess.DEVNULL)
        (rootfs / "etc/apt/sources.list").write_text(f"deb {mirror} bookworm main\n")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", BASE], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL,
                       env=docker_env())
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap root failed")
    return time.monotonic() - t0


def _ca_certificates() -> list[Path]:
    return sorted(CA_DIR.rglob("*.crt")) if CA_DIR.is_dir() else []


def image_inputs(folder: str) -> str:
    """A digest of what ``folder``'s image is made of: its files, the CA certificates and the Debian
    base image's id.  An image labelled with the same digest is up to date (no build, whatever the
    docker client's build cache says)."""
    h = hashlib.sha256()
    for path in [*sorted((DEPLOY / folder).iterdir()), *_ca_certificates()]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    base = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", BASE], capture_output=True, text=True,
                          env=docker_env()).stdout.strip()
    h.update(base.encode())
    return h.hexdigest()


def _label(tag: str) -> str:
    proc = subprocess.run(["docker", "image", "inspect", "-f", '{{index .Config.Labels "ampci.inputs"}}', tag],
                          capture_output=True, text=True, env=docker_env())
    return proc.stdout.strip() if proc.returncode == 0 else ""


def build_image(tag: str, folder: str) -> float:
    """``docker build`` deploy/<folder> as ``tag`` (with the machine's CA certificates in certs/) unless
    the image already carries the digest of these inputs; seconds taken."""
    t0 = time.monotonic()
    digest = image_inputs(folder)
    if _label(tag) == digest:
        return time.monotonic() - t0
    with tempfile.TemporaryDirectory(prefix="ampci-img-") as tmp:
        ctx = Path(tmp)
        for item in (DEPLOY / folder).iterdir():
            shutil.copy2(item, ctx / item.name)
        certs = ctx / "certs"
        certs.mkdir()
        for crt in _ca_certificates():
            shutil.copy2(crt, certs / crt.name)
        subprocess.run(["docker", "build", "-q", "--label", f"ampci.inputs={digest}", "-t", tag, str(ctx)],
                       check=True, env=docker_env(), stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def build_base_images(rebuild_base: bool = False) -> dict[str, float]:
    """Build every local image (the Debian root only when missing or asked); seconds per image."""
    times: dict[str, float] = {}
    if rebuild_base or not image_exists(BASE):
        times[BASE] = build_debian_base()
    for tag, folder in IMAGES.items():
        _log(f"{tag} (built only when deploy/{folder}/, the CA certificates or the Debian base changed)")
        times[tag] = build_image(tag, folder)
    return times


def main(argv: list[str]) -> int:
    """CLI: build the local images (``--rebuild-base`` also re-runs debootstrap)."""
    if any(a in {"-h", "--help"} for a in argv):
        print(__doc__)
        return 0
    problem = ensure_dockerd()
    if problem:
        print(f"images: {problem}", file=sys.stderr)
        return 1
    try:
        times = build_base_images(rebuild_base="--rebuild-base" in argv)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    for tag, seconds in times.items():
        _log(f"{tag}: {seconds:.0f} s")
    rel = LOCAL_OVERRIDE.relative_to(ROOT)
    print(f"local images ready; use them with:\n  export COMPOSE_FILE=docker-compose.yml:{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
