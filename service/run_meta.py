"""A run's ``meta``: how the options of its cells are written (one encoding) and read back.

Every run-creating path (``ampci sweep``, nightly, the webhook, baseline runs, approvals) writes its
cells' options through :func:`encode`, and every reader (the worker starting a job, bisection,
confirmation) reads one cell's options through :func:`cell_options`.  The encoding is compact: the
options most cells share once under ``cell_defaults``, and under ``options`` (keyed ``model|dtype|
policy|target``) only the cells whose options differ; ``requested_revision`` is the revision as
the user named it.  A meta that lists every cell under ``options`` (runs stored before this
encoding was the only one, confirmation runs) reads back the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Protocol

from service.json_types import JsonObject, JsonValue

Cell = tuple[str, str, str, str]


class CellWithOptions(Protocol):
    """A planned cell (:class:`service.orchestration.sweeps.PlannedCell`): its cell and its options."""

    @property
    def cell(self) -> Cell: ...

    def options(self) -> JsonObject: ...


def cell_key(cell: Cell) -> str:
    """The key of ``cell`` under ``meta["options"]``: ``model|dtype|policy|target``."""
    return "|".join(cell)


def encode(cells: Iterable[CellWithOptions], requested_revision: str) -> JsonObject:
    """The meta of a run of ``cells``: the most common options once (``cell_defaults``), under
    ``options`` only the cells that differ from them, and ``requested_revision``."""
    cells = list(cells)
    counts: dict[str, int] = {}
    for c in cells:
        key = json.dumps(c.options(), sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    defaults = json.loads(max(counts, key=counts.__getitem__)) if counts else {}
    return {"cell_defaults": defaults, "requested_revision": requested_revision,
            "options": {cell_key(c.cell): c.options() for c in cells if c.options() != defaults}}


def cell_options(meta: Mapping[str, JsonValue] | None, cell: Cell) -> JsonObject:
    """The options ``meta`` stores for ``cell`` (its own entry, else the run's ``cell_defaults``; {} when
    the meta has neither)."""
    meta = meta or {}
    return dict(meta.get("options", {}).get(cell_key(cell), meta.get("cell_defaults", {})))
