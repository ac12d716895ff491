"""A timing regression's recovery is confirmed before it resolves (:mod:`service.regressions.confirm`), on the
real database (SQLite and PostgreSQL), with the stand-in worker of ``test_confirm`` answering the pairs.

Revisions a (0.3 s conversions) -> b (0.9 s: the regression, confirmed) -> c (0.3 s in its job).  c's run
marks b's regression ``suspected_resolved`` and its confirmation times b against c interleaved.
"""

from __future__ import annotations

import pytest

from service.db import Store
from service.orchestration.jobs import finish_if_complete
from service.regressions.confirm import recovery_verdict
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain
from tests.service.orchestration.test_confirm import CELL, StandInWorker, make_run, slow_conversion

TH = Thresholds()
REGRESSED = [0.9 + 0.001 * i for i in range(8)]


def test_a_recovery_needs_positive_evidence_against_the_regressed_revision() -> None:
    fixed = [x - 0.6 for x in REGRESSED]
    v = recovery_verdict("conversion_time", REGRESSED, fixed, TH, "s")
    assert v.confirmed and v.ratio == pytest.approx(0.3 / 0.9, rel=0.02)
    assert v.detail.startswith("recovery confirmed by 8 interleaved pairs against the regressed revision")
    # no difference (the lucky job's revision is as slow as the regressed one): not confirmed
    assert not recovery_verdict("conversion_time", REGRESSED, [x * 1.001 for x in REGRESSED], TH, "s").confirmed
    # faster, but within the kind's margin (x0.9 > 1/1.2) or its floor: not confirmed either
    assert not recovery_verdict("conversion_time", REGRESSED, [x * 0.9 for x in REGRESSED], TH, "s").confirmed
    assert not recovery_verdict("conversion_time", [0.2] * 8, [0.12 + 0.001 * i for i in range(8)], TH,
                                "s").confirmed
    # slower still is never a recovery
    assert not recovery_verdict("conversion_time", REGRESSED, [x + 0.6 for x in REGRESSED], TH, "s").confirmed


def regressed(store: Store, acknowledge: bool) -> tuple[list[str], int]:
    """Revisions a, b, c; b's confirmed, open (or acknowledged) conversion-time regression's id."""
    a, b, c = chain(store, 3)
    make_run(store, a, [slow_conversion(1, 0.3)], confirm_pairs=8)
    run_b = make_run(store, b, [slow_conversion(2, 0.9)], confirm_pairs=8)
    worker = StandInWorker(store, {"conversion_time": ([0.3] * 8, REGRESSED)})
    finish_if_complete(store, run_b, dispatch=worker)
    worker.work()
    (reg,) = store.regressions(run_id=run_b)
    assert reg.state == "open"
    if acknowledge:
        store.ack(reg.id, by="alice", note="known, fix coming")
    return [a, b, c], reg.id


@pytest.mark.parametrize("acknowledge", [False, True], ids=["open", "acknowledged"])
@pytest.mark.parametrize("recovered", [True, False], ids=["recovered", "lucky-job"])
def test_a_later_run_only_suspects_a_recovery_and_its_confirmation_decides(
        store: Store, recovered: bool, acknowledge: bool) -> None:
    (a, b, c), reg_id = regressed(store, acknowledge)
    before = store.get_regression(reg_id)
    run_c = make_run(store, c, [slow_conversion(3, 0.3)], confirm_pairs=8)
    worker = StandInWorker(store, {"conversion_time": (REGRESSED, [x - 0.6 if recovered else x for x in REGRESSED])})
    assert finish_if_complete(store, run_c, dispatch=worker) is False  # the run waits for the confirmation
    got = store.get_regression(reg_id)
    assert got.state == "suspected_resolved" and got.state_before == before.state
    assert got.state_note.startswith(f"recovery suspected at {c[:12]} (run {run_c})")
    (confirm_id,) = worker.sent
    assert store.get_run(confirm_id).meta["options"]["|".join(CELL)]["confirm"] == {
        "baseline": b, "kinds": ["conversion_time"], "pairs": 8}  # the regressed revision, not the baseline a
    worker.work()
    got = store.get_regression(reg_id)
    if recovered:
        assert got.state == "resolved" and got.resolved_by_result_id is not None
        assert got.state_note.startswith("recovery confirmed by 8 interleaved pairs")
    else:  # back exactly as it was (an acknowledgement is not lost), with the figures that kept it
        assert got.state == before.state and got.resolved_by_result_id is None and got.state_before is None
        assert got.state_note.startswith("recovery not confirmed by 8 interleaved pairs")
    assert store.get_run(run_c).status == "complete"


def test_without_confirmation_a_recovery_resolves_at_once(store: Store) -> None:
    (a, b, c), reg_id = regressed(store, acknowledge=False)
    run_c = make_run(store, c, [slow_conversion(3, 0.3)], confirm_pairs=0)
    assert finish_if_complete(store, run_c, dispatch=lambda _: pytest.fail("nothing to confirm")) is True
    assert store.get_regression(reg_id).state == "resolved"


def test_a_recovery_whose_confirmation_cannot_run_is_not_resolved(store: Store) -> None:
    (a, b, c), reg_id = regressed(store, acknowledge=True)
    run_c = make_run(store, c, [slow_conversion(3, 0.3)], confirm_pairs=8)

    def broken(_: int) -> None:
        raise ConnectionError("broker down")

    assert finish_if_complete(store, run_c, dispatch=broken) is True
    got = store.get_regression(reg_id)
    assert got.state == "acknowledged" and got.state_note.startswith("recovery not confirmed: confirmation could not")
