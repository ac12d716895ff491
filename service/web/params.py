"""Strict parsing of integer parameters taken from URLs (ids in paths, limits in queries).

Python's ``int()`` accepts far more than a URL should carry: any Unicode decimal digit
(``int('٣') == 3``; ``'²'.isdigit()`` is true but ``int('²')`` raises), surrounding whitespace,
a sign and underscores (``int(' +1_0 ') == 10``), and numbers of any length.  Every route reads
integers through :func:`strict_int` instead: ASCII digits only, at most :data:`MAX_DIGITS` of
them, inside the route's range.  :data:`StrictInt` applies the same rule to FastAPI-typed
parameters (the JSON API: a 422 error), :func:`path_id` / :func:`query_int` raise the service's
NotFoundError (404) / UserError (400) for hand-parsed ones (the dashboard's HTML error pages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BeforeValidator

from service.errors import NotFoundError, UserError
from service.since import SINCE_FORMS, since_time

if TYPE_CHECKING:
    from datetime import datetime

MAX_DIGITS = 18            # every such number fits an int64; longer input is refused unread
MAX_ID = 2**31 - 1         # the database's integer ids
_ASCII_DIGITS = frozenset("0123456789")


def strict_int(raw: str, lo: int = 0, hi: int = MAX_ID) -> int | None:
    """``int(raw)`` when ``raw`` is 1..MAX_DIGITS ASCII digits (nothing else: no sign, space, ``_``
    or other Unicode digit) and ``lo <= value <= hi``; otherwise None.  Never raises."""
    if not isinstance(raw, str) or not 1 <= len(raw) <= MAX_DIGITS or not _ASCII_DIGITS.issuperset(raw):
        return None
    value = int(raw)
    return value if lo <= value <= hi else None


def query_since(raw: str, name: str = "since") -> datetime | None:
    """A query parameter's time (:func:`service.since.since_time`: ``7d``, ``12h``, an ISO date or
    datetime), None when it is empty, else UserError (400)."""
    if raw == "":
        return None
    value = since_time(raw)
    if value is None:
        raise UserError(f"{name}: expected {SINCE_FORMS}, got {raw[:40]!r}")
    return value


def path_id(raw: str, what: str) -> int:
    """The id 1..MAX_ID in a URL path, or NotFoundError ("no run '…'"): a malformed id names no record."""
    value = strict_int(raw, 1, MAX_ID)
    if value is None:
        raise NotFoundError(f"no {what} {raw[:40]!r}")
    return value


def query_int(raw: str, name: str, lo: int, hi: int, default: int) -> int:
    """A query parameter's integer in ``lo..hi``, ``default`` when it is empty, else UserError (400)."""
    if raw == "":
        return default
    value = strict_int(raw, lo, hi)
    if value is None:
        raise UserError(f"{name}: give a whole number from {lo} to {hi} (ASCII digits), got {raw[:40]!r}")
    return value


def _ascii_digits(value: object) -> object:
    """Before FastAPI's own int validation: a string must be plain ASCII digits (bounded length);
    an int (a default) passes through."""
    if isinstance(value, str):
        parsed = strict_int(value, 0, 10**MAX_DIGITS - 1)
        if parsed is None:
            raise ValueError("expected a whole number of ASCII digits (no sign, spaces or '_'; "
                             f"at most {MAX_DIGITS} digits)")
        return parsed
    return value


#: ``Annotated[int, StrictInt, Path(...)]``: an int parameter that accepts only ASCII digit strings.
StrictInt = BeforeValidator(_ascii_digits)
