"""HMAC-SHA256 webhook signatures (``X-Hub-Signature-256``), compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` header value GitHub sends for ``body`` under ``secret``."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return PREFIX + digest


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """True only when ``header`` is exactly the HMAC-SHA256 of ``body`` under a non-empty ``secret``.

    Guarantees: the comparison runs in constant time (``hmac.compare_digest``) over the full
    header; a missing header, a header without the ``sha256=`` prefix, or an empty secret is False.
    """
    if not secret or not header:
        return False
    expected = sign(secret, body)
    # compare_digest on bytes of equal-length ASCII; non-ASCII headers simply fail the comparison.
    try:
        given = header.strip().encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(expected.encode("ascii"), given)
