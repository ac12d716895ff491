"""A verdict stored when its run was judged reads back equal (:mod:`service.regressions.verdict_stored`): every
field of the facts, the cells' outcomes and the gate's decision survives JSON, so the views that rebuild it say
what was decided."""

from __future__ import annotations

import dataclasses
import json

from service.regressions.gate import CellOutcome, GateDecision
from service.regressions.verdict import RunFacts, decide_run
from service.regressions.verdict_stored import VERSION, from_stored, to_stored

A, B, C = ("m", "fp16", "default", "cpu"), ("m", "bf16", "default", "cpu"), ("m", "fp16", "conservative", "cpu")
FACTS = RunFacts(7, "partial", 3, pending=1,
                 outcomes=(CellOutcome(A, "convert_error", "boom", "convert_error", "abc"),
                           CellOutcome(B, "timeout", "slow", None, "abc"),
                           CellOutcome(C, "pass", "", "pass", "abc")),  # measured: the gate counts it
                 with_baseline=frozenset({A}), regressions={"latency": 2}, others={"flaky": {"accuracy": 1}},
                 waiting_for=(5, 6), errored_jobs=1)


def test_every_field_is_set_in_the_example() -> None:
    """The example below leaves no field at its default, so the round trip checks each one (a field added later
    must be set here too)."""
    for cls, obj in ((RunFacts, FACTS), (CellOutcome, FACTS.outcomes[0])):
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert getattr(obj, f.name) != default, f"{cls.__name__}.{f.name}"
    decision = decide_run(FACTS).decision
    unset = [f.name for f in dataclasses.fields(GateDecision) if getattr(decision, f.name) == f.default]
    assert unset == [], unset


def test_a_stored_verdict_reads_back_equal_through_json() -> None:
    verdict = decide_run(FACTS)
    back = from_stored(json.loads(json.dumps(to_stored(verdict))))
    assert back == verdict and back.headline() == verdict.headline() and back.to_dict() == verdict.to_dict()


def test_a_document_it_cannot_read_is_none() -> None:
    doc = to_stored(decide_run(FACTS))
    assert from_stored(None) is None and from_stored({**doc, "version": VERSION + 1}) is None
    assert from_stored({**doc, "facts": {**doc["facts"], "cells": "three"}}) is None
    assert from_stored({**doc, "decision": []}) is None
