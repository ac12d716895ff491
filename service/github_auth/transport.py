"""One bounded HTTP exchange with GitHub: a total deadline, a size cap, safe decoding.

A hostile or broken answer must not stall the reporter (issue 33, point 7), so every exchange of
:class:`BoundedHTTP` guarantees:

* **a total deadline**: resolving the host name, connecting, sending and reading the whole answer end
  ``deadline`` seconds after the call began, however the server paces its bytes (a socket timeout per
  read would let a server trickling one byte every 5 s hold the call for ever) and however long the
  resolver takes.  Every socket operation of the call waits at most the time left
  (:class:`_DeadlineBackend`), so a trickle is cut at the deadline; the name is resolved in a daemon
  thread joined with the time left (:func:`_resolve`), so a hanging resolver is abandoned at the
  deadline (a late answer is dropped) instead of blocking ``getaddrinfo`` for as long as it likes;
* **a size cap**: at most ``max_bytes`` are read off the wire (a larger ``Content-Length`` is refused
  before reading) and at most ``max_bytes`` are decoded from a ``gzip`` or ``deflate`` answer, so a
  decompression bomb costs ``max_bytes`` of memory, not its expansion;
* **one error kind**: anything that goes wrong is an :class:`ExchangeError` with a one-line message
  (``deadline``: the deadline passed; otherwise a network error or an over-size or undecodable answer).

:func:`strict_json` parses an answer as GitHub writes it and refuses what it never writes (``NaN``,
``Infinity``, numbers that overflow a float), and :func:`retry_delay` reads ``Retry-After`` and
``X-RateLimit-Reset`` clamped to a sane range.  Redirects are never followed (httpcore does not).
"""

from __future__ import annotations

import ipaddress
import json
import math
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpcore

from service.json_types import JsonValue

MAX_ANSWER_BYTES = 16 * 1024 * 1024   # a page of 100 comments of 65,536 characters fits
MIN_RETRY_DELAY = 1.0                 # a Retry-After of 0 or less still waits this long
MAX_RETRY_DELAY = 3600.0              # GitHub's primary rate limit resets within an hour
DEFAULT_RATE_LIMIT_DELAY = 60.0       # a rate limit that names no delay (GitHub's advice: a minute)
_CHUNK = 64 * 1024
MAX_PENDING_RESOLUTIONS = 16          # abandoned lookups still hanging: beyond this, refuse at once


class ExchangeError(Exception):
    """The exchange did not produce a complete answer; ``deadline`` when its deadline passed."""

    def __init__(self, message: str, *, deadline: bool = False) -> None:
        super().__init__(message)
        self.deadline = deadline


class MalformedJSONError(ValueError):
    """An answer that is not the JSON GitHub writes (invalid, or numbers no float holds)."""


@dataclass(frozen=True)
class Answer:
    """A complete, decoded answer: status, headers (lower-case names) and at most the cap of bytes."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> JsonValue:
        """The answer as JSON (:func:`strict_json`); MalformedJSONError when it is not."""
        return strict_json(self.content)


def _no_constant(name: str) -> float:
    raise MalformedJSONError(f"invalid JSON: {name} is not a number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MalformedJSONError(f"invalid JSON: number {text[:30]} overflows")
    return value


def strict_json(content: bytes) -> JsonValue:
    """``content`` parsed as UTF-8 JSON with finite numbers only; MalformedJSONError otherwise
    (one line: what was wrong, never the content)."""
    try:
        return json.loads(content.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except MalformedJSONError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedJSONError(f"invalid JSON: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}") \
            from None


def _clamp(seconds: float) -> float:
    return min(MAX_RETRY_DELAY, max(MIN_RETRY_DELAY, seconds))


def retry_delay(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds GitHub asks to wait before the next call: ``Retry-After`` (seconds), else the
    ``X-RateLimit-Reset`` epoch when ``X-RateLimit-Remaining`` is 0; clamped to
    [:data:`MIN_RETRY_DELAY`, :data:`MAX_RETRY_DELAY`].  A value that is no finite number (``inf``,
    ``nan``, an HTTP date, garbage) counts as :data:`DEFAULT_RATE_LIMIT_DELAY`; None when neither
    header says anything."""
    raw = headers.get("retry-after")
    if raw is not None:
        try:
            value = float(raw.strip())
        except ValueError:
            return DEFAULT_RATE_LIMIT_DELAY
        return _clamp(value) if math.isfinite(value) else DEFAULT_RATE_LIMIT_DELAY
    if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
        try:
            reset = float(headers["x-ratelimit-reset"].strip())
        except ValueError:
            return DEFAULT_RATE_LIMIT_DELAY
        if not math.isfinite(reset):
            return DEFAULT_RATE_LIMIT_DELAY
        return _clamp(reset - (time.time() if now is None else now))
    return None


# -- the deadline ---------------------------------------------------------------------------------

_deadline = threading.local()


def _bounded(timeout: float | None, kind: type[Exception]) -> float | None:
    """The socket timeout of one operation of this thread's exchange: the smaller of ``timeout`` and
    the time left before the deadline; ``kind`` (an httpcore timeout) when none is left."""
    at: float | None = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise kind("deadline")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every read and write ends by the deadline of the exchange using it."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)


_pending_lock = threading.Lock()
_pending = 0  # lookups running in a daemon thread right now (abandoned ones included)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _resolve(host: str, port: int, timeout: float | None) -> list[str]:
    """The addresses of ``host`` (in the resolver's order, duplicates dropped) within ``timeout``
    (None: the deadline's time left).

    ``socket.getaddrinfo`` cannot be interrupted, so it runs in a daemon thread that is joined with
    the time left: when the deadline passes first, the lookup is abandoned (its late answer dropped)
    and httpcore's ConnectTimeout is raised.  A failed lookup is a one-line ConnectError.  At most
    :data:`MAX_PENDING_RESOLUTIONS` lookups may hang at once: beyond that a call is refused at once
    (a ConnectError), so a dead resolver cannot pile up threads."""
    global _pending
    if _is_address(host):
        return [host]
    wait = _bounded(timeout, httpcore.ConnectTimeout)
    outcome: list[list[str] | BaseException] = []
    done = threading.Event()

    def lookup() -> None:
        global _pending
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            outcome.append(list(dict.fromkeys(str(info[4][0]) for info in infos)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller (or dropped when abandoned)
            outcome.append(exc)
        finally:
            with _pending_lock:
                _pending -= 1
            done.set()

    with _pending_lock:
        if _pending >= MAX_PENDING_RESOLUTIONS:
            raise httpcore.ConnectError(f"name resolution of {host[:100]}: {_pending} earlier lookups still "
                                        "pending (the resolver does not answer)")
        _pending += 1
    threading.Thread(target=lookup, name=f"resolve {host[:60]}", daemon=True).start()
    if not done.wait(wait):
        raise httpcore.ConnectTimeout(f"name resolution of {host[:100]} did not end in time")
    result = outcome[0]
    if isinstance(result, BaseException):
        reason = str(result).splitlines()[0][:200] if str(result) else type(result).__name__
        raise httpcore.ConnectError(f"name resolution of {host[:100]} failed: {reason}")
    if not result:
        raise httpcore.ConnectError(f"name resolution of {host[:100]} gave no address")
    return result


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend with every name resolution, connect, read and write bounded by the
    exchange's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        # Resolved here, within the deadline; each address is then connected to as a literal (no second
        # lookup), in the resolver's order, as socket.create_connection would.  TLS still verifies the
        # host name: httpcore passes it to start_tls as server_hostname.
        failure: httpcore.ConnectError | None = None
        for address in _resolve(host, port, timeout):
            try:
                return _DeadlineStream(self._inner.connect_tcp(
                    address, port, _bounded(timeout, httpcore.ConnectTimeout), local_address, socket_options))
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not used")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# -- decoding -------------------------------------------------------------------------------------

def _decode(content: bytes, encoding: str, cap: int) -> bytes:
    """``content`` decoded per its ``Content-Encoding``, never more than ``cap`` bytes of output."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return content
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ExchangeError(f"unsupported Content-Encoding {encoding[:30]!r}")
    try:
        if encoding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send it
            try:
                return _inflate(content, zlib.decompressobj(15), cap)
            except zlib.error:
                return _inflate(content, zlib.decompressobj(-15), cap)
        return _inflate(content, zlib.decompressobj(31), cap)
    except zlib.error as exc:
        raise ExchangeError(f"undecodable {encoding} answer: {exc}") from None


class _Inflater(Protocol):
    """The part of a :func:`zlib.decompressobj` that :func:`_inflate` uses."""

    @property
    def unconsumed_tail(self) -> bytes: ...

    @property
    def eof(self) -> bool: ...

    def decompress(self, data: bytes, max_length: int = 0, /) -> bytes: ...

    def flush(self, length: int = 16384, /) -> bytes: ...


def _inflate(content: bytes, d: _Inflater, cap: int) -> bytes:
    out = d.decompress(content, cap + 1)
    if len(out) > cap or d.unconsumed_tail:
        raise ExchangeError(f"answer larger than {cap} bytes once decoded")
    out += d.flush(cap + 1 - len(out)) if not d.eof else b""
    if len(out) > cap:
        raise ExchangeError(f"answer larger than {cap} bytes once decoded")
    return out


class BoundedHTTP:
    """A thread-safe pooled HTTP client whose every exchange is bounded (module docstring).

    ``deadline``: seconds per exchange, everything included; ``max_bytes``: cap on the answer, on the
    wire and decoded; ``headers``: sent with every request."""

    def __init__(self, *, deadline: float, max_bytes: int = MAX_ANSWER_BYTES,
                 headers: Mapping[str, str] | None = None) -> None:
        self.deadline = float(deadline)
        self.max_bytes = int(max_bytes)
        self.headers = {"Accept-Encoding": "gzip, deflate", **(headers or {})}
        self._pool = httpcore.ConnectionPool(network_backend=_DeadlineBackend(), max_connections=32,
                                             keepalive_expiry=30.0, retries=0)

    def close(self) -> None:
        self._pool.close()

    def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                json_body: object = None) -> Answer:
        """One exchange; the complete answer (any status), or ExchangeError within the deadline."""
        sent = {**self.headers, **(headers or {})}
        content = b""
        if json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            sent["Content-Type"] = "application/json"
        previous = getattr(_deadline, "at", None)
        _deadline.at = time.monotonic() + self.deadline
        limit = {"connect": self.deadline, "read": self.deadline, "write": self.deadline, "pool": self.deadline}
        try:
            with self._pool.stream(method, url, headers=list(sent.items()), content=content,
                                   extensions={"timeout": limit}) as resp:
                answer_headers = _headers(resp.headers)
                size = answer_headers.get("content-length", "")
                if size.isdigit() and int(size) > self.max_bytes:
                    raise ExchangeError(f"answer of {int(size)} bytes is larger than {self.max_bytes}")
                body = bytearray()
                for chunk in resp.iter_stream():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise ExchangeError(f"answer larger than {self.max_bytes} bytes")
            decoded = _decode(bytes(body), answer_headers.get("content-encoding", ""), self.max_bytes)
            return Answer(resp.status, answer_headers, decoded)
        except httpcore.TimeoutException as exc:
            cut = time.monotonic() >= _deadline.at - 0.001
            raise ExchangeError(f"no complete answer within {self.deadline:g}s ({type(exc).__name__})"
                                if cut else f"{type(exc).__name__}", deadline=cut) from None
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise ExchangeError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") \
                from None
        finally:
            _deadline.at = previous


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out
