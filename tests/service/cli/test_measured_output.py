"""Measured graph facts as stored columns and as ``ampci check`` / ``ampci sweep`` show them."""

from __future__ import annotations

import dataclasses

from service.cli.check_cmd import graph_lines
from service.cli.sweep_table import low_compute_cell
from service.db.extract import result_columns
from tests.service.factories import make_result
from workers.result import GraphFacts

LIAR = GraphFacts(compute_nodes=16, compute_low=0, low_precision_compute_fraction=0.0, casts_inserted=0,
                  compute_by_op={"LSTM": {"total": 2, "low": 0}, "Conv": {"total": 14, "low": 0}},
                  convert_samples_s=[0.3, 0.1, 0.2], pass_iterations=100, pass_converged=False,
                  pass_report={"compute_low": 16, "compute_nodes": 16, "low_precision_compute_fraction": 1.0,
                               "casts_inserted": 5})


def test_check_shows_measured_counts_and_labels_the_report_as_information() -> None:
    lines = graph_lines(LIAR)
    assert lines[0] == ("  graph (measured): compute 0/16 low (0%) [Conv 0/14, LSTM 0/2], 0/0 nodes low, "
                        "0 kept fp32, casts +0/-0")
    assert lines[1] == "  conversion: median 0.200 s over 3 conversion(s) (min 0.100 s)"
    assert lines[2] == ("  pass report (information): compute 16/16, 100%, painting did NOT converge in 100 "
                        "iteration(s), 0 fp32 reason(s)")
    none = graph_lines(GraphFacts(nodes_total=3))
    assert none == ["  graph (measured): compute 0/0 low (n/a), 0/3 nodes low, 0 kept fp32, casts +0/-0"]


def test_stored_columns_are_the_measured_figures() -> None:
    r = make_result()
    r.graph = LIAR
    cols = result_columns(r)
    assert cols["low_precision_fraction"] == 0.0 and cols["casts_inserted"] == 0  # not the report's 1.0 / 5
    r.graph = dataclasses.replace(LIAR, compute_nodes=0, low_precision_compute_fraction=None)
    assert result_columns(r)["low_precision_fraction"] is None


def test_sweep_table_low_compute_cell() -> None:
    @dataclasses.dataclass
    class Row:
        status: str
        low_precision_fraction: float | None

    rows = [Row("pass", 0.5), Row("pass", None), Row("fail_accuracy", 1.0), Row("convert_error", None)]
    assert [low_compute_cell(r) for r in rows] == ["50", "n/a", "100", ""]
