"""The conversion subprocess, cold (fresh interpreter) and warm (forked from a zygote), is isolated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.workers.fakes import BEHAVIOURS, fake_pass
from workers.revision.convert import convert_in_subprocess
from workers.sandbox import zygotes
from workers.zoo.synthetic import synthetic_model_path

EXPECTED = {
    "perturb": ("ok", ""),
    "reject": ("convert_error", "rejected the input: amp_pass: error: policy 'nope'"),
    "internal": ("convert_error", "failed (exit 1): RuntimeError: walk"),
    "no_model": ("convert_error", "wrote no model"),
    "segfault": ("crash", "killed by SIGSEGV"),
    "memory": ("crash", "out of memory"),
    "hang": ("timeout", "time limit of 1.5s"),
}


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
@pytest.mark.parametrize("behaviour", sorted(EXPECTED))
def test_outcomes(tmp_path: Path, behaviour: str, warm: bool) -> None:
    assert behaviour in BEHAVIOURS
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", behaviour)
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=1.5 if behaviour == "hang" else 60.0, memory_bytes=1024**3, warm=warm)
    status, message = EXPECTED[behaviour]
    assert out.status == status and message in out.message, out
    if status == "ok":
        assert out.report["dtype"] == "fp16" and (tmp_path / "out.onnx").is_file()


def test_zygote_survives_child_failures_and_restarts_when_the_pass_changes(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", "segfault")

    def convert() -> str:
        return convert_in_subprocess(src, tmp_path / "o.onnx", tmp_path / "r.json", "fp16", "default", "cpu",
                                     root, timeout_s=30, memory_bytes=1024**3).status

    assert convert() == "crash"
    first = zygotes.zygote_of(root)
    assert first is not None
    assert convert() == "crash" and zygotes.zygote_of(root) is first  # the zygote itself lives on
    fake_pass(root, "reject")  # a new pass version (new sources) must be picked up
    os.utime(root / "amp_pass" / "__main__.py", ns=(1, 1))
    assert convert() == "convert_error"
    assert zygotes.zygote_of(root) is not first


def test_pass_root_that_cannot_import_falls_back_to_cold_and_reports(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = tmp_path / "broken"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text("import no_such_dependency\n")
    out = convert_in_subprocess(src, tmp_path / "o.onnx", tmp_path / "r.json", "fp16", "default", "cpu", root,
                                timeout_s=30, memory_bytes=1024**3)
    assert out.status == "convert_error" and "No module named 'no_such_dependency'" in out.message
    missing = convert_in_subprocess(src, tmp_path / "o.onnx", tmp_path / "r.json", "fp16", "default", "cpu",
                                    tmp_path / "nothing", timeout_s=30, memory_bytes=1024**3)
    assert missing.status == "convert_error" and "has no amp_pass package" in missing.message


def test_stderr_tail_is_bounded_and_redacted(tmp_path: Path) -> None:
    """A failed pass's stderr tail keeps its last lines, bounded, with credentials redacted (the pass
    printed a GitHub token: what a result stores never holds it)."""
    from workers.revision.convert import TAIL_CHARS, TAIL_LINES, stderr_tail

    text = "\n".join(f"line {i}" for i in range(100)) + "\n\n   \n"
    assert stderr_tail(text).splitlines() == [f"line {i}" for i in range(100 - TAIL_LINES, 100)]
    assert len(stderr_tail("x" * 10 * TAIL_CHARS)) == TAIL_CHARS
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", "internal")
    main = root / "amp_pass" / "__main__.py"
    token = "ghp_" + "a1B2" * 9
    main.write_text(main.read_text().replace('raise RuntimeError(', f'print("auth {token}", file=sys.stderr)\nraise RuntimeError(', 1))
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=60.0, memory_bytes=1024**3, warm=False)
    assert out.status == "convert_error" and "RuntimeError: walk" in out.stderr_tail
    assert token not in out.stderr_tail and "[redacted]" in out.stderr_tail
