"""The CI gate decision as a table: regressions, new failing cells, cells with a baseline."""

from __future__ import annotations

import pytest

from service.regressions.gate import NEVER_KNOWN, NEW_CELL_FAILURES, UNMEASURED_STATUSES, CellOutcome, decide
from workers.result import CONVERSION_OK_STATUSES, NOT_OF_THE_PASS, STATUSES

A = ("conv_net", "fp16", "default", "cpu")
B = ("conv_net", "bf16", "default", "cpu")
#: A measured cell beside the one a case is about.
P = CellOutcome(("tiny_mlp", "fp16", "default", "cpu"), "pass")

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
    # no silent pass: a cell that could not measure fails whether or not it has a baseline result ...
    ([CellOutcome(A, "convert_error", "boom", "pass")], [A], 0, 1,
     ["cell could not measure: conv_net/fp16/default/cpu convert_error (baseline: pass): boom"]),
    ([CellOutcome(A, "bad_spec", "commit x is not in the pass repository", "pass")], [A], 0, 1, ["bad_spec"]),
    ([CellOutcome(A, "timeout", "", "pass")], [A], 0, 1, ["timeout (baseline: pass)"]),
    ([CellOutcome(A, "fail_accuracy", "", "pass")], [A], 1, 1, ["1 regression(s)", "fail_accuracy"]),
    ([CellOutcome(A, "crash", "", "convert_error")], [A], 0, 1, ["crash (baseline: convert_error)"]),
    ([CellOutcome(A, "job_error", "")], [], 0, 1, ["job_error"]),
    # ... unless its baseline failed the same way (a known failure), while another cell was measured
    ([P, CellOutcome(A, "convert_error", "", "convert_error")], [A], 0, 0, []),
    ([P, CellOutcome(A, "bad_spec", "", "bad_spec")], [A], 0, 0, []),
    ([P, CellOutcome(A, "bad_spec", "zoo entry: no input 'x'", "bad_spec", "ab" * 20)], [A], 0, 0, []),
    # nothing unmeasured is green: no cell measured fails the gate whatever the baseline did
    ([CellOutcome(A, "convert_error", "", "convert_error")], [A], 0, 1, ["nothing measured: none of the 1 cells"]),
    ([CellOutcome(A, "convert_error", "", "convert_error"), CellOutcome(B, "convert_error", "", "convert_error")],
     [A, B], 0, 1, ["nothing measured: none of the 2 cells converted"]),
    ([CellOutcome(A, "bad_model")], [], 0, 1, ["nothing measured"]),
    # ampci's failures are never a known failure, whatever the baseline says
    ([P, CellOutcome(A, "error", "infrastructure: x", "error")], [A], 0, 1, ["error (baseline: error)"]),
    ([P, CellOutcome(A, "unmeasured", "no CUDA device", "unmeasured")], [A], 0, 1,
     ["1 cpu cell not measured: no CPU device"]),
    # cells that could not run where they were sent: one line per target, however many
    ([P, *(CellOutcome((f"m{i}", "fp16", "default", "cuda"), "unmeasured") for i in range(84))], [], 0, 1,
     ["84 cuda cells not measured: no CUDA device where they ran"]),
    ([P, CellOutcome(A, "crashed", "", "crashed")], [A], 0, 1, ["crashed (baseline: crashed)"]),
    # ... but a failure that names the run's own revision is about that revision, never "the same way"
    ([CellOutcome(A, "bad_spec", f"commit {'ab' * 20} is not in the pass repository", "bad_spec", "ab" * 20)],
     [A], 0, 1, ["bad_spec (baseline: bad_spec): commit abab"]),
    # the model or its reference is broken, not the pass (while another cell was measured)
    ([P, CellOutcome(A, "bad_model")], [], 0, 0, []),
    ([P, CellOutcome(A, "reference_error")], [], 0, 0, []),
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


def test_every_listed_status_fails_a_compared_cell_unless_the_baseline_failed_alike() -> None:
    for status in UNMEASURED_STATUSES:
        got = decide([CellOutcome(A, status, "", "pass")], [A], 0)
        assert got.exit_code == 1 and got.unmeasured == ((A, status),) and got.not_compared == ()
        same = decide([P, CellOutcome(A, status, "", status)], [A], 0)
        if status in NEVER_KNOWN:  # not a result of the pass: never a known failure
            assert same.exit_code == 1 and same.known_failures == () and same.unmeasured == ((A, status),)
        else:
            assert same.exit_code == 0 and same.known_failures == ((A, status),) and same.unmeasured == ()
        alone = decide([CellOutcome(A, status, "", status)], [A], 0)
        if status not in CONVERSION_OK_STATUSES:
            assert alone.exit_code == 1 and alone.measured == 0  # nothing measured is never green


def test_every_status_that_is_not_the_pass_is_never_known_nor_green() -> None:
    assert NOT_OF_THE_PASS <= NEVER_KNOWN <= UNMEASURED_STATUSES
    for status in STATUSES:
        measured = decide([CellOutcome(A, status, "", status)], [A], 0).measured
        assert measured == (status in CONVERSION_OK_STATUSES)
        assert (status in NOT_OF_THE_PASS) == (status in ("error", "unmeasured", "crashed"))


def test_the_issue_statuses_are_unmeasured() -> None:
    assert {"bad_spec", "crash", "timeout", "convert_error", "fail_accuracy"} <= UNMEASURED_STATUSES
    assert not {"pass", "bad_model", "reference_error"} & UNMEASURED_STATUSES


def test_cells_without_a_baseline_are_not_compared() -> None:
    got = decide([CellOutcome(A, "pass"), CellOutcome(B, "pass", "", "pass")], [B], 0)
    assert got.exit_code == 0 and got.not_compared == (A,) and got.compared == 1
