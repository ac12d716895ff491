"""Zoo files in the cache are verified on every use: a changed file is fetched or made again, never used
(issue 31: code under test could write the cache)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.workers.fakes import write_manifest
from workers.jobs import job as jobmod
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec
from workers.revision.config import WorkerConfig
from workers.zoo import materialise, registry
from workers.zoo.fetch import FetchedModel, fetch_entry
from workers.zoo.manifest import load_zoo
from workers.zoo.registry import FetchError, fetch_wheel_member
from workers.zoo.synthetic import generate


def _edit_in_place(path: Path, data: bytes | None = None) -> None:
    """Overwrite ``path`` with other bytes of the same size, keeping its inode and mtime (only its ctime
    tells), as a careful attacker would."""
    st = path.stat()
    old = path.read_bytes()
    new = data if data is not None else bytes([old[0] ^ 0xFF]) + old[1:]
    with open(path, "r+b") as f:
        f.write(new)
        f.truncate(len(new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.read_bytes() != old


def _url_zoo(tmp_path: Path) -> tuple[Path, Path, bytes]:
    data = generate("stateful_rnn", 0).SerializeToString()
    src = tmp_path / "store" / "m.onnx"
    src.parent.mkdir()
    src.write_bytes(data)
    man = write_manifest(tmp_path / "zoo.toml", f'''
        [models.m]
        source = {{ url = "file://{src}" }}
        sha256 = "{hashlib.sha256(data).hexdigest()}"
        inputs.x = {{ shape = [1, 8] }}
        inputs.h = {{ shape = [1, 32], dist = "zeros" }}
        stateful = {{ state = {{ h = "h_new" }}, steps = 8, cap = 0.5 }}
    ''')
    return man, src, data


def test_a_changed_downloaded_model_is_fetched_again(tmp_path: Path) -> None:
    man, _, data = _url_zoo(tmp_path)
    entry, cache = load_zoo(man).get("m"), tmp_path / "cache"
    first = fetch_entry(entry, cache)
    assert fetch_entry(entry, cache) == first  # a later job: the file is known to this process now
    _edit_in_place(first.path)
    again = fetch_entry(entry, cache)
    assert again == first and again.path.read_bytes() == data


def test_a_model_still_wrong_after_fetching_again_is_bad_model_naming_the_cache_path(tmp_path: Path) -> None:
    man, src, _ = _url_zoo(tmp_path)
    settings = WorkerConfig(cache_dir=tmp_path / "cache")
    cached = fetch_entry(load_zoo(man).get("m"), settings.cache_dir).path
    _edit_in_place(cached)
    _edit_in_place(src)  # the source now gives the wrong file too
    r = run_job(JobSpec(model="m", dtype="fp16", zoo_path=man), settings)
    assert r.status == "bad_model", r.message
    assert "checksum mismatch" in r.message and str(cached) in r.message
    assert not cached.exists()


def test_a_changed_synthetic_model_is_made_again(tmp_path: Path) -> None:
    entry = load_zoo(write_manifest(tmp_path / "zoo.toml", '''
        [models.c]
        source = { synthetic = "conv_net" }
        inputs.x = { shape = [4, 3, 32, 32] }
    ''')).get("c")
    first = fetch_entry(entry, tmp_path / "cache")
    good = first.path.read_bytes()
    assert fetch_entry(entry, tmp_path / "cache") == first
    _edit_in_place(first.path)
    assert fetch_entry(entry, tmp_path / "cache") == first and first.path.read_bytes() == good


def test_a_materialised_model_is_checked_against_what_this_process_makes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    entry = load_zoo().get("light_squeezenet")
    cache = tmp_path / "cache"
    first = fetch_entry(entry, cache)
    good = first.path.read_bytes()
    assert hashlib.sha256(good).hexdigest() == first.sha256
    _edit_in_place(first.path)  # changed while this process knows what it made
    assert fetch_entry(entry, cache) == first and first.path.read_bytes() == good
    # a new process knows nothing yet; a replaced file with a matching sha256 written next to it (what the
    # cache used to trust) is still not used
    monkeypatch.setattr(materialise, "_MADE", {}, raising=False)
    monkeypatch.setattr(registry, "_VERIFIED", {})
    evil = generate("conv_net", 0).SerializeToString()
    first.path.write_bytes(evil)
    first.path.with_suffix(".sha256").write_text(hashlib.sha256(evil).hexdigest() + "\n")
    assert fetch_entry(entry, cache) == first and first.path.read_bytes() == good


def _wheel(path: Path, member: str, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
    return path


def test_a_changed_wheel_member_or_wheel_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    member, data = "fakepkg/m.onnx", generate("conv_net", 0).SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    served = _wheel(tmp_path / "index" / "fakepkg-1.0-py3-none-any.whl", member, data)
    downloads: list[str] = []

    def pip_download(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        """Stands in for ``pip download`` (tests ask no registry for a made-up package)."""
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / served.name).write_bytes(served.read_bytes())
        downloads.append(cmd[-1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(registry, "subprocess", SimpleNamespace(run=pip_download,
                                                                TimeoutExpired=subprocess.TimeoutExpired))
    cache = tmp_path / "cache"
    path = fetch_wheel_member("fakepkg==1.0", member, sha, cache)
    assert path.read_bytes() == data and len(downloads) == 1
    assert fetch_wheel_member("fakepkg==1.0", member, sha, cache) == path
    _edit_in_place(path)  # the extracted file changed: extracted again from the cached wheel
    assert fetch_wheel_member("fakepkg==1.0", member, sha, cache).read_bytes() == data and len(downloads) == 1
    _edit_in_place(path)  # ... and the cached wheel gives a wrong file: the wheel is downloaded again
    _wheel(cache / "wheels" / served.name, member, b"evil")
    assert fetch_wheel_member("fakepkg==1.0", member, sha, cache).read_bytes() == data and len(downloads) == 2
    _edit_in_place(path)  # ... and the registry serves a wrong file too: an error naming the cache path
    _wheel(cache / "wheels" / served.name, member, b"evil")
    _wheel(served, member, b"evil")
    with pytest.raises(FetchError, match=f"checksum mismatch.*{re.escape(str(path))}"):
        fetch_wheel_member("fakepkg==1.0", member, sha, cache)
    assert not path.exists() and len(downloads) == 3


def test_model_bytes_that_differ_from_the_verified_sha256_are_bad_model(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The file can change between its check and its read: the bytes the job runs are hashed again."""
    man, _, data = _url_zoo(tmp_path)
    other = tmp_path / "other.onnx"
    other.write_bytes(generate("stateful_rnn", 1).SerializeToString())
    monkeypatch.setattr(jobmod, "fetch_entry",
                        lambda entry, cache_dir: FetchedModel(other, hashlib.sha256(data).hexdigest()))
    r = run_job(JobSpec(model="m", dtype="fp16", zoo_path=man), WorkerConfig(cache_dir=tmp_path / "cache"))
    assert r.status == "bad_model" and f"model file {other} changed after it was verified" in r.message
