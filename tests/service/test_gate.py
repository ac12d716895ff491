"""The CI gate decision as a table: regressions, new failing cells, cells with a baseline."""

from __future__ import annotations

import pytest

from service.regressions.gate import NEW_CELL_FAILURES, CellOutcome, decide

A = ("conv_net", "fp16", "default", "cpu")
B = ("conv_net", "bf16", "default", "cpu")

CASES = [
    # (outcomes, cells with a baseline result, regressions, exit code, reasons contain)
    ([CellOutcome(A, "pass")], [], 0, 0, []),
    ([CellOutcome(A, "pass")], [A], 0, 0, []),
    ([CellOutcome(A, "pass")], [A], 2, 1, ["2 regression(s)"]),
    ([CellOutcome(A, "convert_error", "boom\ntrace")], [], 0, 1, ["new cell fails: conv_net/fp16/default/cpu "
                                                                  "convert_error (no baseline result): boom"]),
    ([CellOutcome(A, "fail_accuracy")], [], 0, 1, ["fail_accuracy"]),
    ([CellOutcome(A, "diverged")], [], 0, 1, ["diverged"]),
    ([CellOutcome(A, "crashed")], [], 0, 1, ["crashed"]),
    ([CellOutcome(A, "timeout")], [], 0, 1, ["timeout"]),
    ([CellOutcome(A, "crash")], [], 0, 1, ["crash"]),
    # a failing cell that has a baseline is judged by the regression rules, not here
    ([CellOutcome(A, "convert_error")], [A], 0, 0, []),
    # the model or its reference is broken, not the pass
    ([CellOutcome(A, "bad_model")], [], 0, 0, []),
    ([CellOutcome(A, "reference_error")], [], 0, 0, []),
    ([CellOutcome(A, "pass"), CellOutcome(B, "convert_error")], [A], 1, 1, ["1 regression(s)", "new cell fails: "
                                                                            "conv_net/bf16"]),
]


@pytest.mark.parametrize(("outcomes", "based", "regressions", "code", "reasons"), CASES)
def test_gate_table(outcomes: list[CellOutcome], based: list[tuple[str, str, str, str]], regressions: int,
                    code: int, reasons: list[str]) -> None:
    got = decide(outcomes, based, regressions)
    assert got.exit_code == code
    assert len(got.reasons) == len(reasons)
    for want, line in zip(reasons, got.reasons, strict=True):
        assert want in line
    assert got.to_dict()["exit_code"] == code


def test_every_listed_status_fails_a_new_cell() -> None:
    for status in NEW_CELL_FAILURES:
        assert decide([CellOutcome(A, status)], [], 0).new_cell_failures == (A,)
