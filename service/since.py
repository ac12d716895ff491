"""The ``since`` of a finding list: ``7d``/``12h`` ago or an ISO date/datetime, read alike by the CLI's
``--since`` (:func:`service.cli.argtypes.since_time`) and the dashboard's ``/regressions?since=``
(:func:`service.web.params.query_since`).  Standard library only (the CLI imports it at start-up)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from service.vocabulary import EARLIEST, LATEST

MAX_SINCE_DAYS = 36_500    # `since=100y` is the most a finding list can mean
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
#: What a ``since`` value may be, for error messages.
SINCE_FORMS = f"a date like 2026-11-01, a datetime, or 7d/12h (at most {MAX_SINCE_DAYS}d)"


def since_time(raw: str, now: datetime | None = None) -> datetime | None:
    """``Nd``/``Nh`` before ``now`` (default: the current time; at most :data:`MAX_SINCE_DAYS`) or an ISO
    date/datetime (UTC when no zone is given) from 1970 to 2100, as an aware UTC datetime; None for
    anything else (control characters, non-ASCII, other units).  Never raises."""
    text = raw.strip() if isinstance(raw, str) else ""
    if not text.isascii() or _UNSAFE.search(text):
        return None
    if text[-1:] in ("d", "h") and text[:-1].isdigit() and len(text) <= 12:
        amount = int(text[:-1])
        days = amount if text[-1] == "d" else amount / 24
        return None if days > MAX_SINCE_DAYS else (now or datetime.now(UTC)) - timedelta(days=days)
    try:
        value = datetime.fromisoformat(text)
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    return value if EARLIEST <= value < LATEST else None
