"""s3:// zoo sources against a real S3 API server on loopback (moto's ThreadedMotoServer)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.fakes import write_manifest
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec
from workers.revision.config import WorkerConfig
from workers.zoo import s3 as s3mod
from workers.zoo.fetch import cached_download_path, fetch_entry
from workers.zoo.manifest import ZooError, load_zoo
from workers.zoo.registry import FetchError
from workers.zoo.synthetic import generate

boto3 = pytest.importorskip("boto3", reason="s3 sources need the 's3' extra (boto3)")
moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (dev extra)")

BUCKET = "models"
_CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port with one bucket; stopped at the end."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in _CREDS.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            mp.delenv(k, raising=False)
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
        try:
            yield url
        finally:
            server.stop()


@pytest.fixture
def model() -> bytes:
    return generate("stateful_rnn", 0).SerializeToString()


def _put(endpoint: str, key: str, data: bytes) -> None:
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=BUCKET, Key=key, Body=data)


def _manifest(tmp_path: Path, endpoint: str, key: str, sha: str) -> Path:
    return write_manifest(tmp_path / "zoo.toml", f'''
        [models.rnn]
        source = {{ url = "s3://{BUCKET}/{key}", endpoint_url = "{endpoint}" }}
        sha256 = "{sha}"
        inputs.x = {{ shape = [1, 8] }}
        inputs.h = {{ shape = [1, 32], dist = "zeros" }}
    ''')


def test_s3_fetch_streams_verifies_and_is_never_repeated(tmp_path: Path, endpoint: str, model: bytes,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _put(endpoint, "team/rnn.onnx", model)
    sha = hashlib.sha256(model).hexdigest()
    entry, cache = load_zoo(_manifest(tmp_path, endpoint, "team/rnn.onnx", sha)).get("rnn"), tmp_path / "cache"
    first = fetch_entry(entry, cache)
    assert first.sha256 == sha and first.path.read_bytes() == model
    assert first.path == cached_download_path(cache, sha, entry.source.ref)

    def no_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached s3 model was fetched again")

    monkeypatch.setattr(s3mod, "_client", no_client)  # any request needs a client
    assert fetch_entry(entry, cache) == first


def test_s3_checksum_mismatch_deletes_the_download(tmp_path: Path, endpoint: str, model: bytes) -> None:
    _put(endpoint, "bad.onnx", model)
    bad = "e" * 64
    entry, cache = load_zoo(_manifest(tmp_path, endpoint, "bad.onnx", bad)).get("rnn"), tmp_path / "cache"
    with pytest.raises(FetchError, match=f"checksum mismatch for s3://{BUCKET}/bad.onnx: expected {bad}.*deleted"):
        fetch_entry(entry, cache)
    assert not cached_download_path(cache, bad, entry.source.ref).exists()
    assert not [p for p in (cache / "files").rglob("*") if p.is_file()]


def test_s3_missing_object_is_bad_model_with_one_line(tmp_path: Path, endpoint: str) -> None:
    man = _manifest(tmp_path, endpoint, "nope/missing.onnx", "a" * 64)
    settings = WorkerConfig(cache_dir=tmp_path / "cache", latency_runs=1, latency_warmup=0)
    r = run_job(JobSpec(model="rnn", dtype="fp16", zoo_path=man), settings)
    assert r.status == "bad_model", r.message
    assert f"cannot download s3://{BUCKET}/nope/missing.onnx: NoSuchKey" in r.message and "\n" not in r.message
    assert not [p for p in (tmp_path / "cache" / "files").rglob("*") if p.is_file()]


def test_s3_without_boto3_says_which_extra_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    entry = load_zoo(_manifest(tmp_path, "http://127.0.0.1:9", "m.onnx", "a" * 64)).get("rnn")
    with pytest.raises(FetchError, match=r"rnn: s3:// model sources need boto3: pip install 'ampci\[s3\]'"):
        fetch_entry(entry, tmp_path / "cache")


@pytest.mark.parametrize(("source", "match"), [
    ('{ url = "https://h/m.onnx", endpoint_url = "http://e" }', "only for s3:// url sources"),
    ('{ url = "s3://bucket-only" }', "s3://BUCKET/KEY"),
])
def test_s3_manifest_errors(tmp_path: Path, source: str, match: str) -> None:
    man = write_manifest(tmp_path / "zoo.toml", f'[models.a]\nsource = {source}\nsha256 = "{"0" * 64}"\n'
                         'inputs.x = { shape = [1] }\n')
    with pytest.raises(ZooError, match=match):
        load_zoo(man)
