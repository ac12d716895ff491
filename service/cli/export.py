"""``--csv``: the rows a query command prints with ``--json``, as RFC 4180 CSV (:mod:`csv`).

Guarantees: one header row, then one row per JSON row, in the same order; the columns are the keys of
the rows in the order they first appear (a key some rows lack is an empty field in those); a number,
string or boolean is written as JSON would spell it (``true``/``false``, ``null`` as an empty field); a
nested object is flattened into dotted columns (``compare``'s ``a.cosine``, ``b.cosine``,
``deltas.cosine``; a run's ``verdict.state``), and a list is one field holding its JSON.  Fields are quoted when they hold
a comma, quote or line break, and lines end in CRLF, as RFC 4180 says.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from service.json_types import JsonObject, JsonValue


def _field(value: JsonValue) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _flat(row: JsonObject, prefix: str = "") -> JsonObject:
    """``row`` with nested objects spread into ``outer.inner`` keys, in order."""
    flat: JsonObject = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def write_csv(rows: Sequence[JsonObject], out: TextIO | None = None) -> None:
    """Write ``rows`` as CSV on ``out`` (default stdout); see the module docstring."""
    rows = [_flat(row) for row in rows]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    writer = csv.writer(out if out is not None else sys.stdout, lineterminator="\r\n")
    writer.writerow(list(columns))
    for row in rows:
        writer.writerow([_field(row.get(c)) for c in columns])
