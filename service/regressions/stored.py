"""Stored results and findings as the rules read them: plain records, built by the store layer
(:mod:`service.db.series`), never a database row.

A :class:`StoredResult` carries its result's columns and its document *as stored* (text, or an object where a
driver hands JSON back decoded): the sample summary ``results.sample_doc`` (:func:`sample_doc`, the parts of
``results.data`` the rules read), or ``results.data`` itself for a result stored without one.  :func:`sample`
parses it, once, only when a rule needs that result (a result fetched and then passed over costs no parse;
:class:`Samples` keeps each parse for the rest of one detection).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from typing import NamedTuple, Protocol, TypeAlias, TypedDict, cast

from service.json_types import JsonValue
from service.regressions.measured import GraphFields, floats, graph_fields, stored_error_unit
from service.regressions.rules import CellSample
from service.vocabulary import CellColumns

Cell = tuple[str, str, str, str]  # (model, dtype, policy, target)


@dataclass(frozen=True, slots=True)
class StoredResult:
    """One stored result of a cell: what a rule or a baseline search reads of it (``doc``: its ``results.data``
    as stored, or ``summary``: its sample summary, parsed by :func:`sample`)."""

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
    #: its sample summary as stored (``results.sample_doc``: :func:`sample_doc`); when given, :func:`sample`
    #: reads it and not ``doc`` (which the store then leaves on the server: None)
    summary: str | None = None


class BriefResult(NamedTuple):
    """A stored result read in brief (a drift line: :func:`service.db.series.line_briefs`): its cell, id, run,
    revision and status, all a line's grouping and flaky lineage read; :class:`Samples` fetches the whole
    result when one is sampled.  A tuple: 3,200 of them are built per detection, at a fifth of the cost of a
    StoredResult each."""

    cell: Cell
    id: int
    run_id: int
    revision_sha: str
    status: str


#: A result of a drift line, whole or in brief.
LineResult: TypeAlias = StoredResult | BriefResult


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
    """The CellSample of ``result``: its columns, and what its document says, read from its ``summary`` when
    it has one (:func:`sample_doc`), else from ``doc``, parsed here.

    The convergence error unit is the stored result's ``convergence.error_unit``; a result stored
    before the job recorded one has ``absolute`` errors (as :meth:`workers.result.JobResult.from_dict`
    reads it).  The measured compute counts, conversion-time samples and the pass's convergence come from
    ``results.data`` (:func:`service.regressions.measured.graph_fields`).  A path whose key is missing or
    whose step is not an object reads as None, as the JSON-path operators read it."""
    if result.summary is not None:
        fields = _summary_fields(result.summary)
    else:
        doc = result.doc
        fields = _doc_fields(json.loads(doc) if isinstance(doc, str | bytes) else doc)
    return CellSample(status=result.status, max_abs=result.max_abs, cosine=result.cosine,
                      final_error=result.final_error, diverged=result.diverged,
                      low_precision_fraction=result.low_precision_fraction, casts_inserted=result.casts_inserted,
                      env_fingerprint=result.env_fingerprint, **fields)


class DocFields(GraphFields):
    """The CellSample keyword arguments a result's document gives (:func:`sample`)."""

    latency_samples: tuple[float, ...]
    fp32_latency_samples: tuple[float, ...]
    cpu_latency_samples: tuple[float, ...]
    fp32_cpu_latency_samples: tuple[float, ...]
    error_unit: str


def _doc_fields(data: JsonValue | Mapping[str, JsonValue]) -> DocFields:
    latency, graph, convergence = _obj(data, "latency"), _obj(data, "graph"), _obj(data, "convergence")
    return DocFields(latency_samples=floats(latency.get("samples_ms")),
                     fp32_latency_samples=floats(latency.get("fp32_samples_ms")),
                     cpu_latency_samples=floats(latency.get("cpu_samples_ms")),
                     fp32_cpu_latency_samples=floats(latency.get("fp32_cpu_samples_ms")),
                     error_unit=stored_error_unit(convergence.get("error_unit")),
                     **graph_fields(graph))


_NO_OBJECT: Mapping[str, JsonValue] = {}


def _obj(data: JsonValue | Mapping[str, JsonValue], key: str) -> Mapping[str, JsonValue]:
    """``data[key]`` when ``data`` and it are JSON objects, else an empty mapping (every key reads None)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else _NO_OBJECT


#: The format :func:`sample_doc` writes (its first element).  :func:`sample` reads it and format 1 (the summaries
#: written before it: the same fields, the samples as JSON lists); a reader of another format refuses it.
SUMMARY_FORMAT = 2
#: The fields of a format-1 summary after its format, in order (every DocFields key).
_SUMMARY_FIELDS = ("latency_samples", "fp32_latency_samples", "cpu_latency_samples", "fp32_cpu_latency_samples",
                   "error_unit", "compute_low", "compute_nodes", "compute_ops_version", "convert_samples",
                   "convert_reference", "convert_cpu", "pass_iterations", "pass_converged")
#: Those that are tuples of numbers (JSON lists in format 1; packed doubles in format 2, in this order).
_SAMPLE_FIELDS = ("latency_samples", "fp32_latency_samples", "cpu_latency_samples", "fp32_cpu_latency_samples",
                  "convert_samples", "convert_reference", "convert_cpu")
_SAMPLE_TUPLES = frozenset(_SAMPLE_FIELDS)
#: The other fields, in the order format 2 lists them after the packed samples.
_SCALAR_FIELDS = tuple(k for k in _SUMMARY_FIELDS if k not in _SAMPLE_TUPLES)


def sample_doc(data: JsonValue | Mapping[str, JsonValue]) -> str:
    """The sample summary of a result document (``results.sample_doc``, written with ``results.data`` in the
    same statement: :func:`service.db.extract.result_columns`): what :func:`sample` reads of ``data``, already
    read (the samples validated as numbers, the graph figures as the rules take them), as a compact JSON list:
    ``[2, [the length of each of the seven sample tuples], base64 of all their samples as little-endian IEEE
    doubles, error unit, compute low, compute nodes, compute-ops version, pass iterations, pass converged]``.
    Guarantee: :func:`sample` of a result with this summary equals :func:`sample` of the same result with
    ``data`` as its ``doc`` (a packed double is the float itself, infinities and NaN included), so detection
    decodes ~0.4 kB lists and one block of doubles (~8 us) instead of ~2 kB documents, or format 1's lists of
    decimal floats (~35 us), and walks none of their paths (issue 42)."""
    fields = _doc_fields(data)
    tuples = [fields[k] for k in _SAMPLE_FIELDS]  # type: ignore[literal-required]
    values = [x for t in tuples for x in t]
    packed = base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode("ascii")
    return json.dumps([SUMMARY_FORMAT, [len(t) for t in tuples], packed,
                       *(fields[k] for k in _SCALAR_FIELDS)],  # type: ignore[literal-required]
                      separators=(",", ":"))


def _summary_fields(summary: str) -> DocFields:
    got = json.loads(summary)
    if isinstance(got, list) and len(got) == len(_SCALAR_FIELDS) + 3 and got[0] == 2:
        return _packed_fields(got)
    if isinstance(got, list) and len(got) == len(_SUMMARY_FIELDS) + 1 and got[0] == 1:
        return cast(DocFields, {k: tuple(v) if k in _SAMPLE_TUPLES else v
                                for k, v in zip(_SUMMARY_FIELDS, got[1:], strict=True)})
    raise ValueError(f"not a sample summary of format 1 or {SUMMARY_FORMAT}: {summary[:80]!r}")


def _packed_fields(got: list[JsonValue]) -> DocFields:
    """The fields of a format-2 summary decoded as JSON (``got``); ValueError when its lengths and its block of
    doubles do not agree."""
    lengths, packed = got[1], got[2]
    try:
        if not isinstance(lengths, list) or len(lengths) != len(_SAMPLE_FIELDS) or not isinstance(packed, str):
            raise ValueError("no lengths and block")
        raw = binascii.a2b_base64(packed, strict_mode=True)
        ends = list(accumulate(lengths))  # a TypeError for other than numbers
        if any(type(n) is not int or n < 0 for n in lengths) or len(raw) != 8 * ends[-1]:
            raise ValueError("lengths that are not those of the block")
        values = struct.unpack(f"<{ends[-1]}d", raw)
    except (TypeError, ValueError) as e:  # binascii.Error is a ValueError
        raise ValueError(f"not a sample summary of format 2 ({e}): {json.dumps(got)[:80]!r}") from e
    out: dict[str, object] = dict(zip(_SCALAR_FIELDS, got[3:], strict=True))
    out.update(zip(_SAMPLE_FIELDS, (values[a:b] for a, b in zip([0, *ends], ends, strict=False)), strict=True))
    return cast(DocFields, out)


class Samples:
    """:func:`sample` of stored results, each result's document parsed once (by result id).

    Results read in brief (:meth:`defer`: a query that read only their cell, id, run, revision and status, the
    other fields None) get their whole record from ``load`` (result ids -> the results as :func:`sample` reads
    them) when first sampled, or ahead of use for many at once (:meth:`prefetch`): drift judging reads 16
    revisions of each cell's line but samples three of them, so it leaves the other rows' columns and
    documents on the server.  A deferred result ``load`` does not return (deleted since) samples as read."""

    def __init__(self, load: Callable[[Sequence[int]], Mapping[int, StoredResult]] | None = None) -> None:
        self._by_id: dict[int, CellSample] = {}
        self._load = load
        self._deferred: set[int] = set()
        self._whole: dict[int, StoredResult | None] = {}

    def defer(self, results: Iterable[LineResult]) -> None:
        """``results`` were read in brief: fetch each whole when it is first sampled."""
        if self._load is None:
            raise ValueError("results read in brief need a Samples that can load them")
        self._deferred.update(r.id for r in results)

    def prefetch(self, results: Iterable[LineResult]) -> None:
        """Fetch, in one call of ``load``, those deferred ``results`` not fetched (nor sampled) yet."""
        ids = sorted({r.id for r in results if r.id in self._deferred and r.id not in self._whole
                      and r.id not in self._by_id})
        if ids and self._load is not None:
            got = self._load(ids)
            self._whole.update((i, got.get(i)) for i in ids)

    def __call__(self, result: LineResult) -> CellSample:
        """The CellSample of ``result``, built on its first request (with its record fetched when deferred; a
        result in brief that is not deferred is a ValueError)."""
        got = self._by_id.get(result.id)
        if got is None:
            if result.id in self._deferred:
                self.prefetch([result])
                whole = self._whole[result.id]
                if whole is None:  # deleted since it was read: its columns unknown, as a result without them
                    whole = StoredResult(result.cell, result.id, result.run_id, result.revision_sha, result.status,
                                         None, None, None, None, None, None, None, None, None)
            elif isinstance(result, BriefResult):
                raise ValueError(f"result {result.id} was read in brief and not deferred: it cannot be sampled")
            else:
                whole = result
            got = self._by_id[result.id] = sample(whole)
        return got
