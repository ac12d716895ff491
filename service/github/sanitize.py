"""What a webhook payload may carry into the database: bounded JSON, storable text, sane timestamps.

Every value a signed delivery contributes to a stored row passes through here at intake (in
:mod:`service.github.events`), so that nothing answered 202 can fail later because of its content
(a NUL byte PostgreSQL refuses, a lone surrogate no driver can encode, a string longer than its
column, a timestamp the database stores but cannot hand back).

* :func:`check_json_depth` bounds nesting with a linear scan (no recursion), before ``json.loads``.
* :func:`free_text` (messages, titles, author names): NUL removed, lone surrogates replaced by
  U+FFFD, cut to a length; never raises.
* :func:`name_text` (refs, branch names): refused (``ValueError``) when it holds a control
  character or a lone surrogate or is longer than its limit — an identifier is never altered.
* :func:`sane_time`: timezone-normalised to UTC (a naive value is taken as UTC) and refused outside
  ``[EARLIEST, LATEST)``.

The limits are the column lengths of :mod:`service.db.models` (a test keeps them in step).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from service.vocabulary import EARLIEST, LATEST

MAX_JSON_DEPTH = 64
BRANCH_MAX = 200      # revisions.branch
AUTHOR_MAX = 300      # revisions.author
REPOSITORY_MAX = 200  # webhook_deliveries.repository
REF_MAX = 255         # a pushed ref (refs/heads/<branch>); the branch itself must fit BRANCH_MAX
MESSAGE_MAX = 65_536  # revisions.message is text; bounded to keep the pending payload small

_TOKENS = re.compile(r'\\.|["\[\]{}]', re.S)
_SURROGATES = re.compile("[\ud800-\udfff]")
_UNSAFE_NAME = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


class TooDeepError(ValueError):
    """JSON nested deeper than the limit (the message is the one-line reason)."""


def check_json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`TooDeepError` when arrays/objects in ``text`` nest deeper than ``limit``.

    Guarantees: linear in ``len(text)``, no recursion; exact for valid JSON (brackets inside
    strings, escaped quotes included, do not count); for invalid JSON it may err either way, which
    ``json.loads`` then reports — but ``json.loads`` never reaches a depth this scan did not see,
    since everything it parses before that depth is a valid prefix.
    """
    depth = 0
    in_string = False
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok == '"':
            in_string = not in_string
        elif in_string or len(tok) == 2:
            continue
        elif tok in "[{":
            depth += 1
            if depth > limit:
                raise TooDeepError(f"JSON nested deeper than {limit}")
        else:
            depth -= 1


def free_text(value: str | None, limit: int) -> str | None:
    """``value`` storable in any text column: NUL bytes removed, lone surrogates replaced by U+FFFD,
    at most ``limit`` characters (None stays None)."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "")
    value = _SURROGATES.sub("\ufffd", value)
    return value[:limit]


def name_text(value: str, limit: int) -> str:
    """``value`` unchanged if it is a storable name: ``ValueError`` (one line, the value not echoed)
    when it holds a control character (NUL included) or a lone surrogate or exceeds ``limit``."""
    if _UNSAFE_NAME.search(value):
        raise ValueError("contains a control character or an invalid unicode code point")
    if len(value) > limit:
        raise ValueError(f"longer than {limit} characters")
    return value


def sane_time(value: datetime | None) -> datetime | None:
    """``value`` in UTC (naive: taken as UTC); ``ValueError`` when it is before 1970 or from 2100
    on (after normalisation), which no commit or pull request can honestly carry."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        value = value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError("timestamp out of range (1970 to 2100 UTC)") from None
    if not EARLIEST <= value < LATEST:
        raise ValueError("timestamp out of range (1970 to 2100 UTC)")
    return value
