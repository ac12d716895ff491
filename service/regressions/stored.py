"""Stored results and findings as the rules read them: plain records, built by the store layer
(:mod:`service.db.series`), never a database row.

A :class:`StoredResult` carries its result's columns and its ``results.data`` document *as stored* (text, or
an object where a driver hands JSON back decoded): :func:`sample` parses it, once, only when a rule needs that
result (a result fetched and then passed over costs no parse; :class:`Samples` keeps each parse for the rest
of one detection).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, TypedDict

from service.json_types import JsonValue
from service.regressions.measured import floats, graph_fields, stored_error_unit
from service.regressions.rules import CellSample
from service.vocabulary import CellColumns

Cell = tuple[str, str, str, str]  # (model, dtype, policy, target)


@dataclass(frozen=True, slots=True)
class StoredResult:
    """One stored result of a cell: what a rule or a baseline search reads of it (``doc``: its ``results.data``
    as stored, parsed by :func:`sample`)."""

    cell: Cell
    id: int
    run_id: int
    revision_sha: str
    status: str
    max_abs: float | None
    cosine: float | None
    final_error: float | None
    diverged: bool | None
    low_precision_fraction: float | None
    casts_inserted: int | None
    env_fingerprint: str | None
    latency_p50_ms: float | None
    doc: str | bytes | Mapping[str, JsonValue] | None


class StoredFinding(CellColumns, Protocol):
    """What the rules read of every stored finding (a ``regressions`` row, e.g.
    :class:`service.db.records.RegressionInfo`): its id, cell, kind and metric, the revision it regressed at and
    its state.  :class:`service.regressions.confirm.Suspected` and :class:`service.regressions.detect.OpenRegression`
    add what confirmation and resolving read besides."""

    @property
    def id(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def revision_sha(self) -> str: ...
    @property
    def state(self) -> str: ...


class StoredRun(Protocol):
    """What the rules read of a stored run (e.g. :class:`service.db.records.RunInfo`): its trigger, status,
    ``meta`` (the sweep options, a JSON object) and recorded verdict in brief (None: not judged)."""

    @property
    def trigger(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def meta(self) -> Mapping[str, JsonValue]: ...
    @property
    def verdict(self) -> Mapping[str, JsonValue] | None: ...


class FindingRow(TypedDict):
    """The ``regressions`` column values of one finding detection stores
    (:func:`service.regressions.detect.finding_rows`, written by :func:`service.db.findings.store_findings`)."""

    run_id: int
    revision_sha: str
    baseline_sha: str | None
    model: str
    dtype: str
    policy: str
    target: str
    kind: str
    category: str
    severity: str
    metric: str
    baseline_value: float | None
    value: float | None
    delta: float | None
    ratio: float | None
    p_value: float | None
    detail: str
    result_id: int
    baseline_result_id: int | None
    created_at: datetime
    state: str
    state_by: str | None
    state_note: str | None


class FindingUpdate(TypedDict, total=False):
    """The ``regressions`` columns a decision on a stored finding writes (each key present is written):
    resolving (:func:`service.regressions.detect.resolutions`), confirming
    (:mod:`service.regressions.confirm`), written by :func:`service.db.findings.set_finding`."""

    state: str
    state_before: str | None
    state_by: str | None
    state_at: datetime | None
    state_note: str | None
    resolved_by_result_id: int | None


@dataclass(frozen=True, slots=True)
class HistoryResult:
    """One result of a cell in an earlier run (a nightly series, the flaky lineage), oldest first."""

    cell: Cell
    run_id: int
    id: int
    status: str
    latency_p50_ms: float | None
    env_fingerprint: str | None


@dataclass(frozen=True, slots=True)
class LineFinding:
    """An earlier unresolved regression of a cell found at a revision of a first-parent line (drift reads
    these to tell what is already reported)."""

    cell: Cell
    kind: str
    metric: str | None
    revision_sha: str
    state: str


def sample(result: StoredResult) -> CellSample:
    """The CellSample of ``result``, its ``doc`` parsed here.

    The convergence error unit is the stored result's ``convergence.error_unit``; a result stored
    before the job recorded one has ``absolute`` errors (as :meth:`workers.result.JobResult.from_dict`
    reads it).  The measured compute counts, conversion-time samples and the pass's convergence come from
    ``results.data`` (:func:`service.regressions.measured.graph_fields`).  A path whose key is missing or
    whose step is not an object reads as None, as the JSON-path operators read it."""
    doc = result.doc
    data = json.loads(doc) if isinstance(doc, str | bytes) else doc
    latency, graph, convergence = _obj(data, "latency"), _obj(data, "graph"), _obj(data, "convergence")
    return CellSample(status=result.status, max_abs=result.max_abs, cosine=result.cosine,
                      final_error=result.final_error, diverged=result.diverged,
                      low_precision_fraction=result.low_precision_fraction, casts_inserted=result.casts_inserted,
                      latency_samples=floats(latency.get("samples_ms")),
                      fp32_latency_samples=floats(latency.get("fp32_samples_ms")),
                      env_fingerprint=result.env_fingerprint,
                      error_unit=stored_error_unit(convergence.get("error_unit")),
                      cpu_latency_samples=floats(latency.get("cpu_samples_ms")),
                      fp32_cpu_latency_samples=floats(latency.get("fp32_cpu_samples_ms")),
                      **graph_fields(graph))


_NO_OBJECT: Mapping[str, JsonValue] = {}


def _obj(data: JsonValue, key: str) -> Mapping[str, JsonValue]:
    """``data[key]`` when ``data`` and it are JSON objects, else an empty mapping (every key reads None)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else _NO_OBJECT


#: A stored result's ``results.data`` as a driver hands it back (see :class:`StoredResult`).
Doc = str | bytes | Mapping[str, JsonValue] | None


class Samples:
    """:func:`sample` of stored results, each result's document parsed once (by result id).

    Results read without their document (:meth:`defer`: a query that left ``data`` out, their ``doc`` None)
    get it from ``load_docs`` (result ids -> their documents as stored) when first sampled, or ahead of use
    for many at once (:meth:`prefetch`): drift judging reads 16 revisions of each cell's line but samples
    three of them, so it leaves the other documents on the server."""

    def __init__(self, load_docs: Callable[[Sequence[int]], Mapping[int, Doc]] | None = None) -> None:
        self._by_id: dict[int, CellSample] = {}
        self._load_docs = load_docs
        self._deferred: set[int] = set()
        self._docs: dict[int, Doc] = {}

    def defer(self, results: Iterable[StoredResult]) -> None:
        """``results`` were read without their documents: fetch each when it is first sampled."""
        if self._load_docs is None:
            raise ValueError("results read without their documents need a Samples that can load them")
        self._deferred.update(r.id for r in results)

    def prefetch(self, results: Iterable[StoredResult]) -> None:
        """Fetch, in one call of ``load_docs``, the documents of those deferred ``results`` not fetched yet."""
        ids = sorted({r.id for r in results if r.id in self._deferred and r.id not in self._docs
                      and r.id not in self._by_id})
        if ids and self._load_docs is not None:
            got = self._load_docs(ids)
            self._docs.update((i, got.get(i)) for i in ids)

    def __call__(self, result: StoredResult) -> CellSample:
        """The CellSample of ``result``, built on its first request (with its document fetched when deferred)."""
        got = self._by_id.get(result.id)
        if got is None:
            if result.id in self._deferred:
                self.prefetch([result])
                result = replace(result, doc=self._docs[result.id])
            got = self._by_id[result.id] = sample(result)
        return got

