"""The sandbox canary (issue 39): a tiny conversion through the real sandbox says, before any job, whether the
pass's imports work there -- and in one line what is missing when they do not."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from workers.revision import canary
from workers.sandbox import policy as sb
from workers.sandbox import zygotes

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    yield
    canary.forget()
    zygotes.shutdown()


def test_the_tiny_model_is_a_valid_matmul_add_relu() -> None:
    model = onnx.load_model_from_string(canary.tiny_model())
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add", "Relu"]


@needs_full
def test_a_healthy_sandbox_passes_the_canary_and_leaves_no_process() -> None:
    got = canary.run_canary(sb.SandboxPolicy(mode="require"))
    assert got.ok and got.reason == "" and got.sandbox == "full", got
    assert canary.last() == got
    assert zygotes.zygote_of(Path(__file__).resolve().parents[3]) is None  # one-shot: nothing kept


def test_the_canary_imports_what_the_pass_imports_and_this_interpreter_has(tmp_path: Path) -> None:
    got = canary.pass_imports()
    assert {"onnx", "onnx.inliner", "onnx_ir", "numpy"} <= set(got), got
    assert not any(n.split(".")[0] == "amp_pass" for n in got)
    (tmp_path / "amp_pass").mkdir()
    (tmp_path / "amp_pass" / "x.py").write_text("import json\nimport no_such_module_anywhere\nfrom . import y\n")
    assert canary.pass_imports(tmp_path) == ["json"]  # what no interpreter has is the pass's problem


@needs_full
def test_a_sandbox_hiding_site_packages_fails_it_in_one_line() -> None:
    """The issue's failure: the directory the interpreter imports onnx from is hidden in the sandbox (there, by
    the policy), so a module of it not imported before the sandbox was made is missing."""
    import onnx

    site = str(Path(onnx.__file__).resolve().parents[1])
    got = canary.run_canary(sb.SandboxPolicy(mode="require", hide=(site,)), modules=["onnx.inliner"])
    assert not got.ok and "\n" not in got.reason
    assert got.reason.startswith("the pass sandbox cannot import onnx.inliner, which this interpreter imports"), got


@needs_full
def test_a_sandbox_that_cannot_fork_a_conversion_fails_it() -> None:
    got = canary.run_canary(sb.SandboxPolicy(mode="require", max_procs=1))  # the pass process is one already
    assert not got.ok and got.reason.startswith("the pass sandbox failed its canary conversion (error): infrastructure: "), got
