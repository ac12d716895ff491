"""The sandbox canary (issue 39): a tiny conversion through the real sandbox says, before any job, whether the
pass's imports work there -- and in one line what is missing when they do not."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from workers import canary, zygotes
from workers import sandbox as sb

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
@pytest.mark.parametrize("warm", [False, True], ids=["one-shot", "warm"])
def test_a_healthy_sandbox_passes_the_canary(warm: bool) -> None:
    got = canary.run_canary(sb.SandboxPolicy(mode="require"), warm=warm)
    assert got.ok and got.reason == "" and got.sandbox == "full", got
    assert canary.last() == got
    assert (zygotes.zygote_of(Path(__file__).resolve().parents[2]) is not None) is warm  # one-shot leaves none


def test_a_pass_that_cannot_import_its_dependency_fails_it_in_one_line(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # readable by the sandbox's uid
    (tmp_path / "amp_pass").mkdir()
    (tmp_path / "amp_pass" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'onnx.inliner'\", name='onnx.inliner')\n")
    got = canary.run_canary(sb.SandboxPolicy(mode="auto"), pass_root=tmp_path)
    assert not got.ok and "\n" not in got.reason
    assert got.reason.startswith("the pass sandbox cannot import onnx.inliner"), got.reason
    assert canary.last() == got


@needs_full
def test_a_sandbox_that_cannot_fork_a_conversion_fails_it() -> None:
    got = canary.run_canary(sb.SandboxPolicy(mode="require", max_procs=1))  # the pass process is one already
    assert not got.ok and got.reason.startswith("the pass sandbox failed its canary conversion (crash)"), got
