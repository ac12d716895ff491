"""Whose failure is it (:mod:`workers.infra`): an import failure of a module the trusted interpreter has, outside
the pass's own package and this project's source, is ampci's (the sandbox hid it); any other is the pass's."""

from __future__ import annotations

import sys

import pytest

from workers.infra import hidden_module, import_failure_cause


@pytest.mark.parametrize(("line", "module"), [
    ("ModuleNotFoundError: No module named 'onnx.inliner'", "onnx.inliner"),
    ("ModuleNotFoundError: No module named 'numpy'", "numpy"),
    ("ImportError: cannot import name 'helper' from 'onnx'", "onnx"),
    # the pass's own package, this project's own modules, modules nobody has: the pass's failure
    ("ModuleNotFoundError: No module named 'amp_pass.policy'", None),
    ("ModuleNotFoundError: No module named 'service.settings'", None),
    ("ModuleNotFoundError: No module named 'no_such_dependency_anywhere'", None),
    ("ModuleNotFoundError: No module named 'onnx.no_such_submodule'", None),
    ("RuntimeError: walk: node has no producer", None),
])
def test_whose_import_failure(line: str, module: str | None) -> None:
    got = hidden_module(line)
    assert (got[0] if got else None) == module


def test_the_named_module_is_searched_never_imported() -> None:
    """A hostile pass names the module: finding it must run none of its code (``antigravity`` opens a browser)."""
    sys.modules.pop("antigravity", None)
    assert hidden_module("ModuleNotFoundError: No module named 'antigravity'") is not None
    assert "antigravity" not in sys.modules


def test_the_cause_is_one_line_saying_infrastructure_and_the_remedy() -> None:
    cause = import_failure_cause("ModuleNotFoundError: No module named 'onnx.inliner'")
    assert cause is not None and "\n" not in cause
    assert cause.startswith("infrastructure: the sandbox cannot import onnx.inliner") and "re-run" in cause
