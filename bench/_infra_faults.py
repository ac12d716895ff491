"""The infrastructure-fault series of ``bench/bench_verdicts.py --infra-faults``: do ampci's own failures, stored
between the sweeps of a history with real bugs, hide a regression, file it as flaky, or pass a run in which
nothing was measured?

The history: a base commit, then per bug a noise commit and the bug commit (the deterministic bugs of
:data:`bench_verdicts.BUGS` whose models are swept: accuracy and coverage, no timing), then a last noise commit.
Every commit is swept for real against its parent (``ampci sweep``, embedded).  Around each real sweep of a commit,
at that same commit, a run of ampci's own failures is stored, as a broken worker stores it, in turn:

* **sandbox import failure** -- every cell ``error`` ("infrastructure: the sandbox cannot import onnx.inliner
  (site-packages under /tmp)"), what a sandbox hiding the interpreter's site-packages gives;
* **missing device** -- every cell ``unmeasured`` ("no CUDA device"), a worker without the target's device;
* **lost worker** -- every cell ``crashed`` (the worker died on it max_attempts times).

One before the real sweep and one after it, so the newest result at every parent a child is compared with is an
infrastructure failure, and a cell's lineage alternates measured and failed results (three flips within the
flaky window by the third commit).  Each stored run is judged as the finisher judges it (detect, verdict).

Figures: real regressions still detected (each bug commit's real run has an open regression on an expected cell
and kind), flaky misclassifications (flaky findings on any run: none is flaky here), green runs with nothing
measured (a run whose verdict is ``success`` while none of its cells converted), and the fault runs' verdicts
(each must be ``error``: neither green nor red).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The faults, in turn: (name, result status, the status code before issue 39 stored for it, message).  Run
#: against older code (``PYTHONPATH`` of an older checkout) the series stores what that code stored: the sandbox's
#: import failure as the pass's ``convert_error``, a cuda cell without a device as ``pass``.
FAULTS = (("sandbox import failure", "error", "convert_error",
           "infrastructure: the sandbox cannot import onnx.inliner (site-packages under /tmp); re-run once fixed"),
          ("missing device", "unmeasured", "pass", "no CUDA device: this worker has no usable CUDA device"),
          ("lost worker", "crashed", "crashed", "worker died 3 times on this job (max_attempts=3)"))


def inject_fault(data_dir: Path, sha: str, cells: Sequence[tuple[str, str, str, str]], fault: int) -> int:
    """Store a ``push`` run of ``cells`` at ``sha`` whose every result is fault ``fault``'s (:data:`FAULTS`),
    finished and judged as the finisher does; returns its id."""
    from service.orchestration.jobs import open_store
    from service.orchestration.judge import detect_run, record_verdict
    from service.settings import Settings
    from workers.result import STATUSES, JobResult

    _, status, before, message = FAULTS[fault % len(FAULTS)]
    status = status if status in STATUSES else before
    store = open_store(Settings(data_dir=data_dir))
    try:
        run_id = store.create_run(sha, "push", cells=list(cells))
        for model, dtype, policy, target in cells:
            store.write_result(run_id, JobResult(model=model, dtype=dtype, policy=policy, target=target,
                                                 status=status, revision=sha, message=message))
        store.finish_run(run_id)
        detect_run(store, run_id)
        record_verdict(store, run_id)
    finally:
        store.dispose()
    return run_id


def judged(data_dir: Path) -> list[dict[str, Any]]:
    """Every run's id, revision, verdict (state, measured cells) and its flaky findings."""
    from service.orchestration.jobs import open_store
    from service.orchestration.judge import run_verdict
    from service.settings import Settings
    from workers.result import CONVERSION_OK_STATUSES

    store = open_store(Settings(data_dir=data_dir))
    try:
        out = []
        for run in store.list_runs():
            if run.trigger != "push":
                continue
            v = run_verdict(store, run.id)
            measured = sum(r.status in CONVERSION_OK_STATUSES for r in store.results(run_id=run.id))
            out.append({"run": run.id, "sha": run.revision_sha, "state": v.state, "measured": measured,
                        "cells": v.cells, "flaky": len(store.regressions(run_id=run.id, category="flaky"))})
        return out
    finally:
        store.dispose()


def run_series(sweep_at: Callable[[str, str], dict[str, Any]], noise: Callable[[int], str],
               inject: Callable[[Any], str], bugs: Sequence[Any], base: str, data_dir: Path,
               matches: Callable[[list[tuple[str, str, str]], Any], bool]) -> dict[str, Any]:
    """Run the series (see the module docstring) and return its figures and rows."""
    first = sweep_at(base, base)
    cells = [(r["model"], r["dtype"], r["policy"], r["target"]) for r in first["results"]]
    fault = 0
    rows: list[dict[str, Any]] = []
    parent = base
    inject_fault(data_dir, base, cells, fault)
    fault += 1
    plan: list[tuple[str, Any]] = []
    for i, bug in enumerate(bugs):
        plan += [(f"noise {i}", None), (f"BUG: {bug.name}", bug)]
    plan.append((f"noise {len(bugs)}", None))
    fault_runs: list[int] = []
    for i, (name, bug) in enumerate(plan):
        sha = inject(bug) if bug is not None else noise(100 + i)
        fault_runs.append(inject_fault(data_dir, sha, cells, fault))
        fault += 1
        payload = sweep_at(sha, parent)
        fault_runs.append(inject_fault(data_dir, sha, cells, fault))
        fault += 1
        found = [(r["model"], r["dtype"], r["kind"]) for r in payload.get("regressions", [])
                 if r.get("category", "regression") == "regression"]
        rows.append({"commit": name, "bug": bug, "detected": bug is not None and matches(found, bug),
                     "false_alarm": bug is None and bool(found), "run": payload["run"]["id"]})
        parent = sha
    runs = judged(data_dir)
    faults = [r for r in runs if r["run"] in set(fault_runs)]
    return {
        "detected": sum(r["detected"] for r in rows), "bugs": len(bugs),
        "false_alarms": sum(r["false_alarm"] for r in rows),
        "flaky": sum(r["flaky"] for r in runs),
        "green_unmeasured": sum(r["state"] == "success" and r["measured"] == 0 for r in runs),
        "fault_runs_error": sum(r["state"] == "error" for r in faults), "fault_runs": len(faults),
        "rows": rows,
    }


def print_table(t: dict[str, Any]) -> None:
    """The series' figures as a markdown table."""
    print("| infrastructure-fault series | value | target |")
    print("|---|---|---|")
    print(f"| real regressions still detected | {t['detected']}/{t['bugs']} | all |")
    print(f"| false alarms on noise commits | {t['false_alarms']} | 0 |")
    print(f"| flaky misclassifications | {t['flaky']} | 0 |")
    print(f"| green runs with nothing measured | {t['green_unmeasured']} | 0 |")
    print(f"| fault runs judged error (neither green nor red) | {t['fault_runs_error']}/{t['fault_runs']} | all |")


def passed(t: dict[str, Any]) -> bool:
    """True when every target of the series is met."""
    return (t["detected"] == t["bugs"] and not t["false_alarms"] and not t["flaky"] and not t["green_unmeasured"]
            and t["fault_runs_error"] == t["fault_runs"])
