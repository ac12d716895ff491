"""Stream an ``s3://bucket/key`` object into an open file (users' own artifact stores).

boto3 is an optional dependency (``pip install 'ampci[s3]'``) and is imported only when an s3
source is fetched.  Credentials come from boto3's standard chain (environment, shared config and
credentials files, instance/role metadata); the endpoint is the entry's ``endpoint_url`` when
given, else boto3's own configuration (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` or the
config file), else AWS.  Every failure is a one-line :class:`~workers.zoo.registry.FetchError`.
"""

from __future__ import annotations

from typing import IO, Any

from workers.zoo.registry import FetchError

_CHUNK = 1 << 20


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``; FetchError when either part is empty."""
    rest = url[len("s3://"):] if url.startswith("s3://") else ""
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise FetchError(f"malformed s3 URL {url!r}: expected s3://BUCKET/KEY")
    return bucket, key


def _client(endpoint_url: str | None, timeout: float) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise FetchError("s3:// model sources need boto3: pip install 'ampci[s3]'") from None
    config = Config(connect_timeout=min(timeout, 60.0), read_timeout=timeout, retries={"max_attempts": 3})
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)


def stream_s3_object(url: str, out: IO[bytes], endpoint_url: str | None = None, timeout: float = 300.0,
                     on_chunk: Any = None) -> int:
    """Copy the object at ``url`` into ``out`` in 1 MiB chunks; return the byte count.

    ``on_chunk(bytes)`` sees every chunk (used to hash while streaming).  Raises FetchError with
    one line (missing bucket/object, access denied, no credentials, unreachable endpoint).
    """
    bucket, key = parse_s3_url(url)
    client = _client(endpoint_url, timeout)
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        total = 0
        try:
            for chunk in iter(lambda: body.read(_CHUNK), b""):
                out.write(chunk)
                if on_chunk is not None:
                    on_chunk(chunk)
                total += len(chunk)
        finally:
            body.close()
        return total
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code, msg = err.get("Code", "error"), " ".join(str(err.get("Message", "")).split())
        raise FetchError(f"cannot download {url}: {code}" + (f": {msg}" if msg else "")) from None
    except BotoCoreError as exc:
        raise FetchError(f"cannot download {url}: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
