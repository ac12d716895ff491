#!/usr/bin/env python3
"""A stale ampci image refuses to start: the image's code is compared with the checkout's at start.

``docker compose up -d`` without ``--build`` reuses ``ampci:latest`` as built from whatever the checkout was
then; Debian's docker-compose v1 has no ``pull_policy: build`` (it accepts the key and ignores it), so compose
cannot be made to rebuild on every ``up``.  Instead:

* at build time the Dockerfile records the digest of the image's code (``write``): one SHA-256 per entry of
  :data:`SOURCE_PATHS` into :data:`IMAGE_DIGEST`;
* docker-compose.yml mounts those entries of the checkout -- the code only, never the checkout root, whose
  ``.env`` holds the secrets -- read-only under :data:`CHECKOUT` and starts every ampci service through
  ``run``, which compares them with the image's digest and ``exec``\\ s the service's command when they
  match, else prints one line naming what differs and the fix, and exits :data:`EXIT_STALE`.

The digest of a tree covers each regular file's path and content and each symbolic link's target under the
entry, in path order; hidden names (``.env``, editor and tool caches), ``__pycache__``, ``*.pyc``/``*.pyo``
and ``*.egg-info`` are left out on both sides, so a checkout that was only used (bytecode, caches) is
not stale.  File modes and times are not part of it.  Standard library only (it runs before anything else
in the container, and on the host in tests).

    python3 deploy/source_digest.py write ROOT FILE          # the Dockerfile: ROOT's digest into FILE
    python3 deploy/source_digest.py check ROOT               # ROOT's digest against the image's (exit 0/78)
    python3 deploy/source_digest.py run [ROOT [DIGEST]] -- CMD ...
                     # compose's entrypoint: ROOT (default CHECKOUT) against DIGEST (default IMAGE_DIGEST),
                     # then exec CMD
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

#: What the image's behaviour is built from: the packages, the sweeps and zoo it reads, its dependencies
#: and the Dockerfile itself (relative to the checkout root; directories and files).
SOURCE_PATHS = ("amp_pass", "workers", "service", "migrations", "sweeps", "zoo.toml", "pyproject.toml",
                "Dockerfile")
#: Where the image keeps the digest of its own code (written by the Dockerfile).
IMAGE_DIGEST = Path("/opt/ampci/source-digest.json")
#: Where docker-compose.yml mounts the checkout's :data:`SOURCE_PATHS` (read-only).
CHECKOUT = Path("/srv/ampci-checkout")
#: Exit status of a refused start (EX_CONFIG): compose's restart policy retries, the logs say why.
EXIT_STALE = 78
FIX = "rebuild it: docker compose up -d --build (docker-compose v1: docker-compose up -d --build)"
_SKIPPED_SUFFIXES = (".pyc", ".pyo", ".egg-info")


def _skipped(name: str) -> bool:
    return name.startswith(".") or name == "__pycache__" or name.endswith(_SKIPPED_SUFFIXES)


def _entry_digest(root: Path, rel: str) -> str:
    """SHA-256 over the files under ``root/rel`` (see the module docstring); ``missing`` when absent.
    OSError when a file cannot be read."""
    top = root / rel
    if not top.exists() and not top.is_symlink():
        return "missing"
    h = hashlib.sha256()

    def add(path: Path) -> None:
        name = path.relative_to(root).as_posix().encode()
        if path.is_symlink():
            h.update(b"L\0" + name + b"\0" + os.readlink(path).encode() + b"\0")
            return
        h.update(b"F\0" + name + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\0")

    if top.is_symlink() or not top.is_dir():
        add(top)
        return h.hexdigest()
    for here, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not _skipped(d))
        base = Path(here)
        for link in (d for d in dirs if (base / d).is_symlink()):
            add(base / link)  # a link to a directory: its target, not what it points at
        for name in sorted(f for f in files if not _skipped(f)):
            add(base / name)
    return h.hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """Entry of :data:`SOURCE_PATHS` -> its digest under ``root``; equal trees give equal maps.
    OSError when a file cannot be read."""
    return {rel: _entry_digest(root, rel) for rel in SOURCE_PATHS}


def stale_reason(image: dict[str, str], checkout: Path) -> str | None:
    """None when ``checkout`` holds the code the image was built from (``image``: :func:`tree_digest` of the
    image's tree); else one line naming the entries that differ and the fix."""
    try:
        current = tree_digest(checkout)
    except OSError as exc:
        return (f"ampci: error: cannot read the checkout's code mounted at {checkout} to compare it with this "
                f"image ({type(exc).__name__}: {exc.strerror or exc}); the files must be readable by uid "
                f"{os.getuid()}")
    differ = [rel for rel in SOURCE_PATHS if image.get(rel) != current[rel]]
    if not differ:
        return None
    return (f"ampci: error: this image was built from other code than the checkout it runs from "
            f"(differs: {', '.join(differ)}): it is stale; {FIX}")


def _load(path: Path) -> dict[str, str] | str:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return (f"ampci: error: this image has no readable code digest at {path} ({type(exc).__name__}); "
                f"it was built by an older Dockerfile: {FIX}")
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        return f"ampci: error: the code digest at {path} is not a map of digests; {FIX}"
    return {str(k): v for k, v in data.items()}


def check(checkout: Path, image_digest: Path = IMAGE_DIGEST) -> str | None:
    """None when the image's recorded digest matches ``checkout``; else the one-line error."""
    image = _load(image_digest)
    if isinstance(image, str):
        return image
    return stale_reason(image, checkout)


def main(argv: list[str]) -> int:
    """The command line of the module docstring; ``run`` replaces this process with the command."""
    if len(argv) == 3 and argv[0] == "write":
        Path(argv[2]).write_text(json.dumps(tree_digest(Path(argv[1])), indent=1, sort_keys=True) + "\n")
        return 0
    if len(argv) == 2 and argv[0] == "check":
        problem = check(Path(argv[1]))
        print(problem or "ampci: the image matches the checkout", file=sys.stderr if problem else sys.stdout)
        return EXIT_STALE if problem else 0
    if argv and argv[0] == "run" and "--" in argv:
        split = argv.index("--")
        where, command = argv[1:split], argv[split + 1:]
        if len(where) <= 2 and command:
            problem = check(Path(where[0]) if where else CHECKOUT, Path(where[1]) if len(where) > 1 else IMAGE_DIGEST)
            if problem:
                print(problem, file=sys.stderr, flush=True)
                return EXIT_STALE
            os.execvp(command[0], command)
    print("usage: source_digest.py write ROOT FILE | check ROOT | run [ROOT [DIGEST]] -- CMD ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
