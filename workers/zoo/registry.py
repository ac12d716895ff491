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
    stay the same (any rewrite, truncation or replacement changes one of them and rehashes).

    The memo lives in this process only, never in the cache: a stamp kept on disk could be rewritten
    along with the file, and mtime, size and inode can all be kept by an in-place edit (``os.utime``),
    but ctime is set to the present by every change and cannot be set back without root."""
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

    Guarantees: the returned file's sha256 equals ``sha256`` (checked on every call, see
    :func:`verified_sha256`); a cached file that differs is deleted and extracted again, and a cached wheel
    that is corrupt or gives a file with another sha256 is deleted and downloaded again (once per call);
    the wheel is otherwise downloaded at most once per cache; concurrent callers never see a partial file
    (atomic rename).  A FetchError names the cache path when the file still differs.
    """
    dest = cache_dir / "files" / sha256[:2] / sha256 / Path(member).name
    if dest.exists():
        if verified_sha256(dest) == sha256:
            return dest
        dest.unlink(missing_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    wheels = cache_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    got = ""
    for again in (False, True):
        wheel, downloaded = _wheel(package, wheels, timeout)
        try:
            tmp_path, got = _extract(wheel, member, dest.parent)
        except KeyError:
            raise FetchError(f"{package} has no file {member}") from None
        except zipfile.BadZipFile:
            wheel.unlink(missing_ok=True)
            if downloaded or again:
                raise FetchError(f"wheel {wheel} of {package} is corrupt; deleted, fetch again") from None
            continue
        if got == sha256:
            os.replace(tmp_path, dest)
            return dest
        os.unlink(tmp_path)
        if downloaded or again:
            break
        wheel.unlink(missing_ok=True)  # a cached wheel that gives another file: download it again
    raise FetchError(f"checksum mismatch for {member} from {package} (cache {dest}): expected {sha256}, got {got}")


def _wheel(package: str, wheels: Path, timeout: float) -> tuple[Path, bool]:
    """The cached wheel of ``package`` in ``wheels``, downloaded first if absent; and whether it was."""
    name = package.split("==")[0].replace("-", "_").lower()
    version = package.split("==")[1] if "==" in package else ""
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}")]
    if found:
        return found[0], False
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
    return found[0], True


def _extract(wheel: Path, member: str, folder: Path) -> tuple[Path, str]:
    """``member`` of ``wheel`` copied to a temporary file in ``folder``; (its path, its sha256)."""
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            shutil.copyfileobj(src, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp), sha256_file(Path(tmp))
