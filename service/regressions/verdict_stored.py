"""A run's verdict as stored when it was judged, and rebuilt from the store: what makes every view of the run
show the verdict decided once (issue 39), however its findings, baselines or code change later.

:func:`to_stored` writes a :class:`~service.regressions.verdict.RunVerdict` (the facts it was decided from,
the gate's decision and the state) as a JSON object; :func:`from_stored` rebuilds the same verdict from it
(equal, field for field), or None for a document it cannot read (another version, a damaged row): the
caller then decides afresh.  Both walk the dataclasses' own fields and type hints, so a field added to
:class:`~service.regressions.verdict.RunFacts`, :class:`~service.regressions.gate.CellOutcome` or
:class:`~service.regressions.gate.GateDecision` is stored and read back without a change here (a field a
stored document lacks takes its default).  Pure.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Union, get_args, get_origin, get_type_hints

from service.json_types import JsonObject, JsonValue
from service.regressions.gate import GateDecision
from service.regressions.verdict import RunFacts, RunVerdict

#: The stored document's format; another one is not read (decided afresh instead).
VERSION = 1


def _encode(value: object) -> JsonValue:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (frozenset, set)):
        return sorted((_encode(v) for v in value), key=repr)
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a verdict")


def _decode(hint: object, value: JsonValue) -> JsonValue:
    """``value`` (JSON) as the type ``hint`` says; ValueError when it does not fit."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _decode(next(a for a in args if a is not type(None)), value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"expected a list for {hint}, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        if len(args) != len(value):
            raise ValueError(f"expected {len(args)} items for {hint}, got {len(value)}")
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
    if origin in (frozenset, set):
        if not isinstance(value, list):
            raise ValueError(f"expected a list for {hint}, got {value!r}")
        return frozenset(_decode(args[0], v) for v in value)
    if origin in (dict, Mapping, typing.Mapping):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object for {hint}, got {value!r}")
        return {str(k): _decode(args[1], v) for k, v in value.items()}
    if hint in (int, float, str, bool):
        if not isinstance(value, hint if hint is not float else (int, float)) or (hint is int and isinstance(value, bool)):
            raise ValueError(f"expected {hint} , got {value!r}")
        return value
    raise ValueError(f"cannot read {hint} from a stored verdict")


def _build(cls: type, value: JsonValue) -> JsonValue:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object for {cls.__name__}, got {value!r}")
    hints = get_type_hints(cls)
    kwargs: JsonObject = {f.name: _decode(hints[f.name], value[f.name])
                          for f in dataclasses.fields(cls) if f.init and f.name in value}
    return cls(**kwargs)


def to_stored(verdict: RunVerdict) -> JsonObject:
    """``verdict`` as a JSON object (``runs.judgement``): its facts, its decision and its state."""
    return {"version": VERSION, "state": verdict.state, "facts": _encode(verdict.facts),
            "decision": _encode(verdict.decision)}


def from_stored(doc: JsonObject | None) -> RunVerdict | None:
    """The verdict :func:`to_stored` stored as ``doc``, equal to the one stored; None for no document or one
    this code cannot read (then the caller decides afresh)."""
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("state"), str):
        return None
    try:
        facts = _build(RunFacts, doc.get("facts"))
        decision = _build(GateDecision, doc.get("decision"))
    except (ValueError, TypeError, KeyError, StopIteration):
        return None
    return RunVerdict(facts, decision, str(doc["state"]))
