"""HMAC-SHA256 webhook signatures (``X-Hub-Signature-256``), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` header value GitHub sends for ``body`` under ``secret``."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return PREFIX + digest


class SignatureStream:
    """The HMAC-SHA256 of a body fed chunk by chunk as it arrives (:meth:`update`), so a large
    delivery is verified without a second pass; :meth:`matches` compares it like :func:`verify_signature`."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._mac = hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha256)

    def update(self, chunk: bytes) -> None:
        self._mac.update(chunk)

    def matches(self, header: str | None) -> bool:
        """True only when ``header`` is exactly ``sha256=<hex HMAC of what was fed>`` under a non-empty secret."""
        if not self.secret or not header:
            return False
        expected = PREFIX + self._mac.hexdigest()
        # compare_digest on bytes of equal-length ASCII; non-ASCII headers simply fail the comparison.
        try:
            given = header.strip().encode("ascii")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(expected.encode("ascii"), given)


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """True only when ``header`` is exactly the HMAC-SHA256 of ``body`` under a non-empty ``secret``.

    Guarantees: the comparison runs in constant time (``hmac.compare_digest``) over the full
    header; a missing header, a header without the ``sha256=`` prefix, or an empty secret is False.
    """
    stream = SignatureStream(secret)
    stream.update(body)
    return stream.matches(header)
