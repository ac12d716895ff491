"""Every finding kind is one module plus one registry entry: enumerated from the registry (never a copy of its
list), every kind renders with its own CSS class, has a bisection, confirmation limits exactly when it is timed;
a kind that is not registered raises everywhere a kind is looked up, instead of falling to a default."""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from datetime import UTC, datetime

import pytest

import service.regressions.kinds as kinds_pkg
from service.dashboard import routes, views
from service.db.records import RegressionInfo
from service.regressions import bisect, paired, rules
from service.regressions.findings import CellSample
from service.regressions.kinds.base import BISECT_VERDICTS, BISECTIONS, FindingKind
from service.regressions.kinds.registry import UnknownKind, all_kinds, kind, names
from service.regressions.thresholds import Thresholds
from workers.jobs.confirm import CONFIRMABLE

KINDS = all_kinds()
TH = Thresholds()
CSS = routes.CSS  # the stylesheet served
BASE = CellSample("pass", max_abs=1e-3, final_error=1e-3, diverged=False, low_precision_fraction=0.9,
                  casts_inserted=4, latency_samples=(1.0,) * 12, env_fingerprint="e", pass_iterations=3,
                  pass_converged=True, convert_samples=(1.0,) * 12)


def test_every_kind_module_is_registered_and_every_entry_has_a_module() -> None:
    modules = {m.name for m in pkgutil.iter_modules(kinds_pkg.__path__)} - {"base", "registry"}
    assert modules == set(names()) and len(names()) == len(KINDS)  # a module per kind, named after it
    for name in modules:
        got = getattr(importlib.import_module(f"service.regressions.kinds.{name}"), "KIND", None)
        assert got is None or got is kind(name), f"kinds/{name}.py defines a KIND the registry does not list"


def test_the_rule_tables_are_the_registry() -> None:
    assert rules.KINDS == names() and set(rules.RULES) == set(names())
    assert set(rules.TIMING_KINDS) == {k.name for k in KINDS if k.confirm_limits is not None}
    assert set(rules.TIMING_KINDS) <= set(CONFIRMABLE)  # the worker can time every timing kind
    assert all(rules.DRIFT_METRICS[m] == k.name for k in KINDS for m in k.drift_metrics)


def _finding(kind_name: str) -> RegressionInfo:
    """An open regression of ``kind_name``."""
    return RegressionInfo(id=1, run_id=1, revision_sha="a" * 40, baseline_sha=None, model="m", dtype="fp16",
                          policy="default", target="cpu", kind=kind_name, category="regression", severity="minor",
                          metric="x", baseline_value=None, value=None, delta=None, ratio=None, p_value=None,
                          detail="", result_id=None, baseline_result_id=None, state="open", state_by=None,
                          state_at=None, state_note=None, resolved_by_result_id=None,
                          created_at=datetime(2026, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize("k", KINDS, ids=lambda k: k.name)
def test_every_kind_renders_with_its_own_css_class_and_a_style(k: FindingKind) -> None:
    state = views.kind_state(k.name)
    assert state.css == k.css == k.display.css and state.label == k.display.label and state.icon
    assert re.fullmatch(r"reg-[a-z_]+", k.css)
    finding = _finding(k.name)
    assert views.finding_state(finding) is state
    assert views.cell_state(None, None, [finding]) is state
    assert f".st-{k.css} " in CSS or f".st-{k.css}," in CSS, f"no style for .st-{k.css}"


@pytest.mark.parametrize("k", KINDS, ids=lambda k: k.name)
def test_every_kind_has_a_bisection_and_limits_when_timed(k: FindingKind) -> None:
    assert k.bisection in BISECTIONS
    regressed = CellSample("convert_error")
    for cand in (BASE, CellSample("convert_error"), CellSample("bad_model")):
        assert bisect.classify(k.name, BASE, regressed, cand, TH, "m", "fp16") in BISECT_VERDICTS
    assert isinstance(rules.comparable(k.name, BASE, BASE, TH), bool)
    if k.timing:
        ratio, floor, p = paired.limits(k.name, TH)
        assert ratio > 1 and floor >= 0 and 0 < p < 1 and math.isfinite(ratio)
    else:
        with pytest.raises(ValueError, match="not a timing kind"):
            paired.limits(k.name, TH)


@pytest.mark.parametrize("lookup", [
    lambda: kind("nope"),
    lambda: rules.comparable("nope", BASE, BASE, TH),
    lambda: rules.returned_to_baseline("nope", BASE, BASE, TH, "m", "fp16"),
    lambda: rules.compare_cells(BASE, BASE, TH, "m", "fp16", kinds=("nope",)),
    lambda: rules.timing_kind("nope", None),
    lambda: paired.limits("nope", TH),
    lambda: bisect.classify("nope", BASE, BASE, BASE, TH, "m", "fp16"),
    lambda: views.kind_state("nope"),
    lambda: views.finding_state(_finding("nope")),
    lambda: views.cell_state(None, None, [_finding("nope")]),
    lambda: views.cell_state(None, None, [_finding("nope"), _finding("latency")]),
], ids=["kind", "comparable", "returned_to_baseline", "compare_cells", "timing_kind", "limits", "classify", "views",
        "finding_state", "cell_state", "cell_state_mixed"])
def test_an_unknown_kind_raises_everywhere(lookup: object) -> None:
    with pytest.raises(UnknownKind, match="unknown finding kind 'nope'; the kinds are: conversion"):
        lookup()  # type: ignore[operator]


def test_the_stylesheet_takes_each_kinds_colours_from_the_kind() -> None:
    for k in KINDS:
        assert k.display.style() in CSS
    assert views.KIND_STYLES_MARKER not in CSS
    with pytest.raises(ValueError, match="no place for the finding kinds' styles"):
        views.stylesheet(".st-pass { color: #000; }")
