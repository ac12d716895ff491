"""How the creep bench scores its rows (``bench/_creep.py``): a series cell's drift first reported on the noise
commit after the creep is the creep reported late, not a false alarm; a second report of it is one, and so is
any finding of a cell no series moves."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _creep import CreepPlan, score  # noqa: E402

PLAN = CreepPlan(n=2, convert_step_s=0.07)
BASE = "b" * 40


def row(commit: str, step: str, drifts: list[tuple[str, str, str, str]] | None = None,
        findings: list[tuple[str, ...]] | None = None) -> dict[str, Any]:
    return {"commit": commit * 40, "step": step, "drifts": drifts or [], "findings": findings or []}


def test_a_series_drift_first_reported_on_the_noise_commit_after_the_creep_is_late_not_false() -> None:
    rows = [row("1", "1"), row("2", "2", drifts=[("conv_net", "bf16", "convert_s", BASE)]),
            row("3", "", drifts=[("conv_net", "fp16", "convert_s", BASE)])]
    got = score(PLAN, rows, ["conv_net"], BASE, lambda ref: "the base")
    assert got["alarms"] == []
    assert [(c[2], c[3]) for c in got["late"]] == [("conv_net", "fp16")]
    assert got["kinds"]["conversion time"]["step"] == "2"


def test_a_second_report_of_a_series_drift_and_an_unmoved_cell_are_false_alarms() -> None:
    rows = [row("1", "1"), row("2", "2", drifts=[("conv_net", "fp16", "convert_s", BASE)]),
            row("3", "", drifts=[("conv_net", "fp16", "convert_s", BASE), ("conv_net", "bf16", "max_abs", BASE)],
                findings=[("conv_net", "fp16", "latency")])]
    got = score(PLAN, rows, ["conv_net"], BASE, lambda ref: "the base")
    assert sorted(a[-1] for a in got["alarms"]) == ["drift of convert_s", "drift of max_abs", "latency"]
    assert got["late"] == []
