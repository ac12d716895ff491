"""A run's meta has one encoding (:mod:`service.run_meta`): what a sweep plans is what a job reads back,
whichever path created the run, and metas written in the older every-cell form read back the same."""

from __future__ import annotations

from service.orchestration.sweeps import PlannedCell
from service.run_meta import cell_options, encode

CELLS = [PlannedCell("resnet", "fp16", "default", "cpu", repeats=5),
         PlannedCell("resnet", "bf16", "default", "cpu", repeats=5),
         PlannedCell("bert", "fp16", "aggressive", "cuda", repeats=9, timeout=60.0),
         PlannedCell("gpt2", "fp16", "default", "cpu", repeats=5, zoo="/zoo/extra.toml")]


def test_every_planned_cell_reads_back_its_own_options() -> None:
    meta = encode(CELLS, "HEAD~1")
    assert {c.cell: cell_options(meta, c.cell) for c in CELLS} == {c.cell: c.options() for c in CELLS}
    assert meta["requested_revision"] == "HEAD~1"


def test_the_common_options_are_stored_once() -> None:
    meta = encode(CELLS, "main")
    assert meta["cell_defaults"] == {"repeats": 5, "timeout": None, "zoo": None}
    assert sorted(meta["options"]) == ["bert|fp16|aggressive|cuda", "gpt2|fp16|default|cpu"]
    assert encode([], "main") == {"cell_defaults": {}, "requested_revision": "main", "options": {}}


def test_a_meta_listing_every_cell_and_a_meta_without_options_read_back() -> None:
    every_cell = {"options": {"|".join(c.cell): c.options() for c in CELLS}, "requested_revision": "main"}
    assert [cell_options(every_cell, c.cell) for c in CELLS] == [c.options() for c in CELLS]
    assert cell_options({}, CELLS[0].cell) == {} and cell_options(None, CELLS[0].cell) == {}
    assert cell_options({"cell_defaults": {"repeats": 3}}, ("x", "fp16", "default", "cpu")) == {"repeats": 3}
